"""Make a base model the way a user gets one, as a Hugging Face directory: BPE tokenizer, chat
template, a small Qwen2-architecture model supervised on worked solutions of word problems.

    python experiments/make_base_model.py --out /tmp/minirl_base            # ~5 min, cached
    minirl train --model /tmp/minirl_base --data /tmp/minirl_base/data/train.jsonl \\
        --eval-data /tmp/minirl_base/data/test.jsonl --verifier math ...      # the user's path

Why: pretrained weights cannot be downloaded here, yet issue #15's proof must start where a user
starts — a checkpoint directory with its tokenizer and chat template, and a dataset file. This
script makes all three from nothing, with the libraries a model maker uses:

  1. data: experiments/word_problems.py writes train.jsonl / test.jsonl (GSM8K format, `#### N`)
     into OUT/data;
  2. tokenizer: a byte-level BPE trained by `tokenizers` on the training text, digits split one
     per token (as Qwen's and Llama 3's pre-tokenizers do), the specials `<|endoftext|>`,
     `<|im_start|>`, `<|im_end|>` and a ChatML chat template (the Qwen layout);
  3. model: a small Qwen2 decoder (q/k/v biases, tied embeddings) trained with minirl's own
     supervised step on chat-formatted examples — the prompt is the chat template around the
     question and "Put the final answer in \\\\boxed{}.", the completion the worked solution
     ending in `\\\\boxed{N}` and `<|im_end|>`;
  4. saved by minirl.hf.model_files.save_hf with the tokenizer files and generation_config.json (EOS ids
     `<|im_end|>` and `<|endoftext|>`), then checked: transformers loads it with minirl's logits
     and its tokenizer gives the same ids (`--check`).

The SFT is stopped early on purpose, at a base that solves some problems but not most (pass@1
well below pass@8), like a pretrained model that RL can sharpen. OUT/minirl_build.json records
the arguments; a second call with the same arguments does nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import word_problems
from flax import nnx
from tqdm.auto import tqdm

from minirl.hf.hf_tokenizer import HFTokenizer
from minirl.hf.model_files import TokenIds, save_hf
from minirl.modeling.model import ModelConfig, init_model
from minirl.training.batching import make_batch
from minirl.training.trainer import Trainer, TrainerConfig
from minirl.types import Prompt, Rollout, Score

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
INSTRUCTION = " Put the final answer in \\boxed{}."


@dataclasses.dataclass(frozen=True)
class Build:
    """Everything that determines the base model (hashed into minirl_build.json)."""

    train: int = 20000
    test: int = 500
    vocab: int = 512
    dim: int = 128
    layers: int = 4
    steps: int = 300  # docs/your_own_model.md: what 120, 200 and 300 steps give
    batch: int = 64
    lr: float = 3e-3
    seed: int = 0


def train_tokenizer(texts, vocab: int, out: Path) -> HFTokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 512,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
    }
    hf = HFTokenizer(
        tok,
        "<|im_end|>",
        None,
        "<|endoftext|>",
        CHATML,
        (tok.token_to_id("<|endoftext|>"),),
        config,
    )
    hf.save(out)
    return hf


def examples(rows, tokenizer, start: int, count: int) -> list[Rollout]:
    """Chat-formatted SFT examples: prompt tokens, completion tokens (solution + <|im_end|>)."""
    out = []
    for i in range(start, start + count):
        row = rows[i % len(rows)]
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": row["question"] + INSTRUCTION}]
        )
        prompt = Prompt(i, "sft", text, tokenizer.encode(text, bos=False))
        tokens = tokenizer.encode(row["solution_text"], bos=False, eos=True)
        zeros = np.zeros(len(tokens), np.float32)
        out.append(
            Rollout(prompt, 0, tokens, zeros, zeros.astype(np.int32), "eos", score=Score(0.0))
        )
    return out


def build(out: Path, b: Build, log=print) -> Path:
    recipe = [dataclasses.asdict(b), CHATML, INSTRUCTION, SPECIALS]
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()
    stamp = out / "minirl_build.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("key") == key:
        log(f"{out}: already built with these arguments")
        return out
    t0 = time.perf_counter()
    data = out / "data"
    word_problems.write(data, "train", b.train, b.seed)
    word_problems.write(data, "test", b.test, b.seed)
    rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    texts = [r["question"] + INSTRUCTION + "\n" + r["solution_text"] for r in rows]
    tokenizer = train_tokenizer(texts, b.vocab, out)
    vocab = -(-tokenizer.vocab_size // 64) * 64  # padded, as Qwen pads its vocabulary
    cfg = ModelConfig(
        vocab_size=vocab,
        dim=b.dim,
        num_layers=b.layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=b.dim // 4,
        mlp_dim=3 * b.dim,
        qkv_bias=True,
        tie_embeddings=True,
        max_seq_len=512,
        rope_theta=10000.0,
    )
    params = nnx.to_pure_dict(nnx.split(init_model(cfg, seed=b.seed))[1])
    trainer = Trainer(
        cfg,
        params,
        None,
        TrainerConfig(learning_rate=b.lr, schedule="cosine", warmup_steps=20, total_steps=b.steps),
    )
    order = np.random.default_rng(b.seed).permutation(len(rows))
    rows = [rows[i] for i in order]
    bar = tqdm(range(b.steps), desc="SFT (the base model's 'pretraining')")
    for step in bar:
        batch = make_batch(examples(rows, tokenizer, step * b.batch, b.batch), tokenizer.pad_id)
        bar.set_postfix(loss=f"{trainer.sft_step(batch)['loss']:.3f}")
    token_ids = TokenIds(bos=None, eos=tokenizer.eos_ids, pad=tokenizer.pad_id)
    save_hf(
        trainer.params(host=True), cfg, out, architecture="Qwen2ForCausalLM", token_ids=token_ids
    )
    seconds = time.perf_counter() - t0
    stamp.write_text(
        json.dumps(
            {"key": key, "args": dataclasses.asdict(b), "seconds": round(seconds, 1)}, indent=2
        )
    )
    log(f"built {out} in {seconds:.0f} s ({cfg.num_params() / 1e6:.2f}M parameters)")
    return out


def check(out: Path) -> dict:
    """transformers loads the directory with minirl's logits and its tokenizer's ids."""
    import jax
    import jax.numpy as jnp
    import torch
    import transformers

    from minirl.hf.model_files import load_hf

    tok = HFTokenizer.from_dir(out)
    row = json.loads((out / "data" / "test.jsonl").read_text().splitlines()[0])
    text = tok.apply_chat_template([{"role": "user", "content": row["question"] + INSTRUCTION}])
    ids = tok.encode(text, bos=False)
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    same_ids = theirs(text, add_special_tokens=False)["input_ids"] == ids.tolist()
    _, model = load_hf(out)
    graphdef, state = nnx.split(model)
    mine = np.asarray(
        jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))(state, jnp.asarray(ids[None]))
    )
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        ref = hf_model(torch.tensor(ids[None], dtype=torch.long)).logits.numpy()
    return {"same_ids": same_ids, "max_abs_logit_diff": float(np.abs(mine - ref).max())}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, default=Path("/tmp/minirl_base"))
    for f in dataclasses.fields(Build):
        p.add_argument(f"--{f.name}", type=type(f.default), default=f.default)
    p.add_argument("--check", action="store_true", help="compare with transformers after building")
    args = p.parse_args(argv)
    b = Build(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Build)})
    build(args.out, b)
    if args.check:
        print(json.dumps(check(args.out)))


if __name__ == "__main__":
    main()
