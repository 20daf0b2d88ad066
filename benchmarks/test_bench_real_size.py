"""Benchmark: a Qwen2.5-0.5B-shaped checkpoint on this machine — load, decode, train, memory.

Run alone (about 6 minutes on 2 cores, ~18 GB of memory at its peak; needs the `reference`
extra to build the checkpoint; docs/model.md has the measured numbers):
    python -m pytest benchmarks/test_bench_real_size.py -q -s

The checkpoint: `transformers.Qwen2ForCausalLM` with Qwen2.5-0.5B's config.json values (D=896,
L=24, H=14, K=2, F=4864, V=151936, tied embeddings, q/k/v biases; 494M parameters), random
weights, saved in bfloat16 as the real one ships (0.99 GB), with a small BPE tokenizer and a
chat template beside it (tests/hf_tiny.py; the vocabulary size of the model is the real one).
Nothing is downloaded. Every figure is a ratio to a baseline measured in the same run
(docs/benchmarking.md):

  load        `minirl.hf.model_files.load_hf` (bf16 files -> float32 master weights) vs reading the same
              bytes raw from the page cache
  decode      engine tokens/s at 1 and 32 slots (prompt 16 tokens, 32 new, temperature 1), as a
              fraction of the same-run float32 matmul peak, counting 2 x (non-embedding params +
              the LM head's V x D) FLOPs per token; at 1 slot also as memory traffic: the fp32
              weights read once per token over a same-run numpy copy bandwidth
  train       a train step (GRPO, 4 rows x 128 tokens) in tokens/s and as a fraction of peak,
              counting 6 x (non-embedding params + V x D) per token
  memory      peak resident memory of a 2-step `minirl train --model DIR --data FILE` run in a
              fresh process (engine + trainer + AdamW state), without and with remat, as a
              multiple of the model's float32 bytes; the accounting is printed beside it

Nothing about time or memory is asserted beyond "it ran and fits in this machine's 24 GiB".
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from roofline import decode_engine, decode_requests, grpo_trainer, train_batch  # noqa: E402
from test_bench_trainer import matmul_peak  # noqa: E402

from minirl.modeling.model import ModelConfig  # noqa: E402

pytest.importorskip("transformers")
PRESET = ModelConfig.preset("qwen2.5-0.5b")


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    return time.perf_counter() - t0, out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Built in a child process, so this one never holds torch's copy of the model (measured on
    2026-11-25: the RL run below peaks at ~23 GB on its own; with a parent holding a few GB more,
    the kernel killed it)."""
    path = tmp_path_factory.mktemp("qwen2.5-0.5b-shaped")
    code = (
        f"import sys; sys.path[:0] = {[str(ROOT / 'benchmarks'), str(ROOT / 'tests')]!r}; "
        f"from test_bench_real_size import build_checkpoint; build_checkpoint({str(path)!r})"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    return path


def build_checkpoint(path, c: ModelConfig = PRESET) -> None:
    """A random-weight `transformers.Qwen2ForCausalLM` of shape `c` in bf16, a small tokenizer and
    chat template, and 32 arithmetic questions (`data.jsonl`) in `path`."""
    import torch
    import transformers
    from hf_tiny import make_tokenizer_dir

    path = Path(path)
    config = transformers.Qwen2Config(
        vocab_size=c.vocab_size,
        hidden_size=c.dim,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        intermediate_size=c.mlp_dim,
        max_position_embeddings=4096,
        rope_theta=c.rope_theta,
        rms_norm_eps=c.norm_eps,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    make_tokenizer_dir(path, "qwen")
    (path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [2, 0], "pad_token_id": 0})
    )
    data = path / "data.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
            for i in range(32)
        )
    )


def non_embedding_flops_params(cfg: ModelConfig) -> int:
    return cfg.num_params(embeddings=False) + cfg.vocab_size * cfg.dim  # + the LM head matmul


def test_real_size(checkpoint):
    from minirl.hf.model_files import load_hf

    # Memory first, in fresh processes, before this one holds anything: measured on 2026-11-24,
    # this process at 15 GB (weights, Adam state, a 4 x 128 x 151936 logits batch) plus the RL
    # run's child did not fit in 24 GiB together and the kernel killed the parent.
    cfg0 = ModelConfig.preset("qwen2.5-0.5b", dtype="float32", param_dtype="float32")
    fp32_bytes = 4 * cfg0.num_params()
    report = {
        "memory": {
            remat: _rl_run_peak_rss(checkpoint, remat) / fp32_bytes for remat in ("none", "nothing")
        },
        "memory_accounting_gb": _accounting(cfg0),
    }
    peak = matmul_peak()
    report["matmul_peak_gflops"] = peak / 1e9

    # load vs raw read (both from the page cache: the files were just written / read)
    files = sorted(checkpoint.glob("*.safetensors"))
    raw = min(_timed(lambda: [f.read_bytes() for f in files])[0] for _ in range(2))
    load_s, (cfg, model) = _timed(lambda: load_hf(checkpoint))
    report["load"] = {
        "seconds": load_s,
        "raw_read_seconds": raw,
        "raw_over_load": raw / load_s,
        "file_gb": sum(f.stat().st_size for f in files) / 1e9,
    }
    params = nnx.to_pure_dict(nnx.split(model)[1])
    report["decode"] = {slots: _decode(cfg, params, slots, peak, fp32_bytes) for slots in (1, 32)}
    report["train"] = _train(cfg, params, peak)
    print(json.dumps(report, indent=2, default=float))
    assert all(v * fp32_bytes < 24 * 2**30 for v in report["memory"].values())


def _copy_bandwidth() -> float:
    """Bytes/s of a numpy copy of 1 GiB (read + write), for the 1-slot decode view."""
    src = np.ones(2**28, np.float32)
    return 2 * src.nbytes / min(_timed(src.copy)[0] for _ in range(3))


def _decode(cfg, params, slots: int, peak: float, fp32_bytes: int) -> dict:
    engine = decode_engine(cfg, slots, params)
    requests = lambda seed: decode_requests(cfg, slots, 32, seed)
    engine.generate(requests(1))  # compiles
    seconds, rollouts = _timed(lambda: engine.generate(requests(2)))
    tps = sum(len(r.tokens) for r in rollouts) / seconds
    row = {
        "tokens_per_s": tps,
        "fraction_of_peak": tps * 2 * non_embedding_flops_params(cfg) / peak,
    }
    if slots == 1:
        row["weight_bytes_per_s_over_copy_bandwidth"] = tps * fp32_bytes / _copy_bandwidth()
    return row


def _train(cfg, params, peak: float, rows: int = 4, length: int = 128) -> dict:
    trainer = grpo_trainer(cfg, params)
    batch = train_batch(rows, length)
    trainer.train_step(batch)  # compiles
    seconds = min(_timed(lambda: trainer.train_step(batch))[0] for _ in range(2))
    tokens = rows * length  # every position goes through forward and backward
    return {
        "tokens_per_s": tokens / seconds,
        "fraction_of_peak": tokens * 6 * non_embedding_flops_params(cfg) / seconds / peak,
    }


# `minirl train` in a fresh process that prints its own peak RSS at the end (VmHWM on Linux, not
# getrusage's ru_maxrss, which a child inherits from the benchmark's bigger process)
PEAK_CODE = (
    "import sys; from minirl.cli import main; from minirl.run.memory import peak_rss_gb; "
    "rc = main(sys.argv[1:]); print('PEAK_GB', peak_rss_gb()); sys.exit(rc)"
)


def minirl_peak_gb(args: list[str], sets=()) -> float:
    """Peak RSS in GB of a fresh process running `minirl ARGS --set S ...` (it must succeed)."""
    argv = [sys.executable, "-c", PEAK_CODE, *args, *(a for s in sets for a in ("--set", s))]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return float(out.split("PEAK_GB")[1].split()[0])


def _rl_run_peak_rss(checkpoint: Path, remat: str, extra: tuple = (), name: str = "") -> int:
    """Peak RSS (bytes) of a fresh `minirl train` process doing 2 RL steps on the checkpoint
    (`extra`: more `--set` overrides; the run directory is `run-{name or remat}` beside it)."""
    run_dir = checkpoint.parent / f"run-{name or remat}"
    sets = [
        "rl.steps=2",
        "rl.prompts_per_step=2",
        "rl.group_size=4",
        "eval.prompts=2",
        "eval.samples=2",
        "engine.slots=8",
        "engine.cache_len=96",
        "engine.prefill_buckets=(64,)",
        "data.max_new_tokens=32",
        "rl.export_hf=false",
        f"trainer.remat={remat}",
        *extra,
    ]
    args = [
        "train",
        "--quiet",
        "--model",
        str(checkpoint),
        "--data",
        str(checkpoint / "data.jsonl"),
    ]
    return int(minirl_peak_gb([*args, "--run-dir", str(run_dir)], sets) * 1e9)


def _accounting(cfg: ModelConfig) -> dict:
    """GB of what a lockstep run holds at once on one host (minirl/run/runner.py, optimizer.py)."""
    n = cfg.num_params()
    kv = 8 * 96 * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 4  # the run above
    logits = 8 * 128 * cfg.vocab_size * 4
    return {
        "params_fp32": 4 * n / 1e9,  # the trainer's; the in-process engine uses the same arrays
        "adam_m_and_v": 8 * n / 1e9,
        # the update writes the new params into the accumulator and m, v in place (donated)
        "gradients_and_accumulator": 8 * n / 1e9,
        "weight_store_host_copy": 4 * n / 1e9,  # one version (released on reload)
        "checkpoint_host_copy": 12 * n / 1e9,  # params + m + v as numpy, at a save
        "kv_cache": kv / 1e9,
        "logits_of_one_micro_batch": logits / 1e9,
    }
