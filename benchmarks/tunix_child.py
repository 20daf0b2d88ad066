"""The side-by-side benchmark's Tunix run: the same GRPO work with `google-tunix` (JAX, Flax NNX).

Runs in Tunix's own environment (benchmarks/setup_tunix.sh makes it; it never imports minirl):

    VENV/bin/python benchmarks/tunix_child.py DIR '{"steps": 12, "prompts": 8, ...}' [bf16]

Reads DIR/model (the random Qwen2 transformers saved), DIR/train.jsonl; prints one line
`SIDE-BY-SIDE-RESULT {"step_s": [...], "generate_s": [...], "tokens": [...], "peak_rss_gb": G}`
(lists: one entry per global step).

Tunix's settings, its best on a CPU as its docs and code allow: the vanilla rollout engine (its
JAX sampler; vLLM and SGLang need an accelerator), one 1 x 1 device mesh the model is loaded
onto (so RLCluster keeps it rather than copying it there), the Dr. GRPO learner (`DrGRPOConfig`:
Dr. GRPO advantages and aggregation), beta 0 and no reference model (Tunix computes no
reference log-probs at beta 0, so it would only hold a copy of the weights), one iteration per
batch (so no old-policy forward), the whole batch (8 prompts x 8 samples) in one rollout call,
one log-prob pass and one training micro-batch (the 0.5B shape: log-probs and training in
micro-batches of 2 prompts), temperature 1 without top-k/top-p, a KV cache of prompt + 64
positions, AdamW at 1e-5. `bf16` loads the weights in bfloat16 and computes in it (AdamW's
moments follow the weights' dtype), as Tunix's own examples load models; it only helps where
XLA runs bf16 dots natively. The prompts are rendered with the tokenizer's chat template, as the
other two libraries do.

At the 0.5B shape Tunix in float32 outgrows a 24 GiB machine in its first step; with bf16
weights it fits, narrowly (peak 23.6 GB). docs/trainer.md, "Where Tunix's memory goes at 0.5B",
says what it holds.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

RESULT = "SIDE-BY-SIDE-RESULT "


def _reward(prompts, completions, answer, **_):
    """1 when the last `#### N` (or else the last number) equals the row's answer (the same
    rule as the other libraries' reward)."""
    out = []
    for text, want in zip(completions, answer, strict=True):
        marked = re.findall(r"####\s*(-?[\d,]+)", text)
        numbers = marked or re.findall(r"-?\d+", text)
        got = numbers[-1].replace(",", "") if numbers else None
        out.append(float(got == want.split("####")[-1].strip()))
    return out


def _model(path: Path, bf16: bool, mesh):
    import jax.numpy as jnp
    from tunix.models.qwen2 import model as qwen2
    from tunix.models.qwen2 import params as qwen2_params

    hf = json.loads((path / "config.json").read_text())
    dtype = jnp.bfloat16 if bf16 else jnp.float32  # compute and weights (so AdamW's moments)
    cfg = qwen2.ModelConfig(
        num_layers=hf["num_hidden_layers"],
        vocab_size=hf["vocab_size"],
        embed_dim=hf["hidden_size"],
        hidden_dim=hf["intermediate_size"],
        num_heads=hf["num_attention_heads"],
        head_dim=hf["hidden_size"] // hf["num_attention_heads"],
        num_kv_heads=hf["num_key_value_heads"],
        rope_theta=int(hf.get("rope_theta", 10000)),
        norm_eps=hf["rms_norm_eps"],
        use_tied_embedding=hf.get("tie_word_embeddings", False),
        dtype=dtype,
    )
    # loaded onto the mesh: RLCluster keeps a model already there instead of copying it
    return qwen2_params.create_model_from_safe_tensors(str(path), cfg, mesh, dtype=dtype)


def run(directory: Path, work: dict, bf16: bool) -> dict:
    import jax
    import numpy as np
    import optax
    from transformers import AutoTokenizer
    from tunix.rl import rl_cluster as rl
    from tunix.rl.grpo.drgrpo_learner import DrGRPOConfig, DrGRPOLearner
    from tunix.rl.rollout import base_rollout

    tok = AutoTokenizer.from_pretrained(str(directory / "model"))
    rows = [json.loads(x) for x in (directory / "train.jsonl").read_text().splitlines()]
    render = lambda q: tok.apply_chat_template(
        [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
    )
    prompts, answers = [render(r["question"]) for r in rows], [r["answer"] for r in rows]
    longest = max(len(tok(p)["input_ids"]) for p in prompts)
    n = work["prompts"]
    batches = [  # as a batched grain dataset yields them: columns of numpy arrays
        {"prompts": np.array(prompts[i : i + n]), "answer": np.array(answers[i : i + n])}
        for i in range(0, len(prompts) - n + 1, n)
    ]
    batches = (batches * (work["steps"] // len(batches) + 1))[: work["steps"]]
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    model = _model(directory / "model", bf16, mesh)
    micro = work["prompts"] if model.config.vocab_size < 100_000 else 2
    config = rl.ClusterConfig(
        role_to_mesh={r: mesh for r in (rl.Role.ACTOR, rl.Role.REFERENCE, rl.Role.ROLLOUT)},
        rollout_engine="vanilla",
        training_config=rl.RLTrainingConfig(
            actor_optimizer=optax.adamw(work["lr"], weight_decay=0.0),
            eval_every_n_steps=10**9,
            max_steps=work["steps"],
            mini_batch_size=work["prompts"],
            train_micro_batch_size=micro,
            rollout_micro_batch_size=work["prompts"],
            compute_logps_micro_batch_size=micro,  # [rows, T, 151,936] float32 logits
        ),
        rollout_config=base_rollout.RolloutConfig(
            max_tokens_to_generate=work["new_tokens"],
            max_prompt_length=longest,
            kv_cache_size=longest + work["new_tokens"],
            temperature=1.0,
            top_p=1.0,
            top_k=None,
            eos_tokens=[tok.eos_token_id],
        ),
    )
    # no reference model: with beta 0 Tunix never computes its log-probs (a copy of the weights)
    cluster = rl.RLCluster(actor=model, reference=None, tokenizer=tok, cluster_config=config)
    times = {"generate": 0.0, "tokens": 0, "step": [], "gen": [], "tok": []}
    generate = cluster.generate

    def timed_generate(*args, **kwargs):
        t0 = time.perf_counter()
        out = generate(*args, **kwargs)
        times["generate"] += time.perf_counter() - t0
        eos = tok.eos_token_id
        for ids in out.tokens:  # up to and including the first EOS, as the others count
            ids = list(ids)
            times["tokens"] += ids.index(eos) + 1 if eos in ids else len(ids)
        return out

    cluster.generate = timed_generate
    sync = cluster.sync_weights

    def timed_sync():  # after each global step: part of the step, as publishing is for the others
        t0 = time.perf_counter()
        sync()
        times["step"][-1] += time.perf_counter() - t0

    cluster.sync_weights = timed_sync

    class Timed(DrGRPOLearner):
        def _run_global_step(self, *args, **kwargs):
            t0, g0, k0 = time.perf_counter(), times["generate"], times["tokens"]
            out = super()._run_global_step(*args, **kwargs)
            times["step"].append(time.perf_counter() - t0)
            times["gen"].append(times["generate"] - g0)
            times["tok"].append(times["tokens"] - k0)
            return out

    algo = DrGRPOConfig(num_generations=work["group"], num_iterations=1, beta=0.0, epsilon=0.2)
    Timed(rl_cluster=cluster, algo_config=algo, reward_fns=[_reward]).train(batches)
    out = {"step_s": times["step"], "generate_s": times["gen"], "tokens": times["tok"]}
    return out | {"peak_rss_gb": _peak_rss_gb()}


def _peak_rss_gb() -> float | None:
    """This process's peak resident memory in GB (VmHWM; minirl's own reader is not importable
    here, in Tunix's environment)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    line = next((x for x in status.splitlines() if x.startswith("VmHWM:")), None)
    return int(line.split()[1]) * 1024 / 1e9 if line else None


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):  # started by hand: say how
        sys.exit("\n\n".join(__doc__.split("\n\n")[:3]))  # what it is, where, the command
    out = run(Path(sys.argv[1]), json.loads(sys.argv[2]), bf16="bf16" in sys.argv[3:])
    print(RESULT + json.dumps(out))
