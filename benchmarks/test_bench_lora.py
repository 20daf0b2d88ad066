"""Benchmark: what LoRA (rank 16 on every projection) saves against full fine-tuning, each
figure a ratio of two arms measured in the same run (docs/benchmarking.md, docs/lora.md).

  memory      peak RSS of a fresh 2-step `minirl train --model DIR --data FILE` process on a
              Qwen2.5-0.5B-shaped checkpoint (benchmarks/test_bench_real_size.py's), with
              `--set model.lora_rank=16` and without, and a third arm with the frozen base
              stored in bf16 (`--set model.param_dtype=bfloat16`, the adapters float32),
              reported beside them; the LoRA arms run first. Also the bytes of
              one published version (`store/version_bytes` of the LoRA run's metrics) against the
              model's fp32 bytes, beside the same figure from the shapes (`adapter_bytes`).
  train       `trainer.train_step` tokens/s with and without LoRA on the same shape and batch
              (`tiny` and `small`, 8 rows x 256 positions, loss "dapo"), interleaved over ROUNDS
              rounds; the median of the per-round ratios.

Run (the memory test: 6-12 minutes on 2 cores and ~19 GB of memory at its peak, needs the
`reference` extra to build the checkpoint; the train test: ~3 minutes):
    python -m pytest benchmarks/test_bench_lora.py -q -s
With `LORA_BENCH_SHAPE=dev` the memory test uses a 4-layer, 8192-token-vocabulary cut of the
same shape (~2 GB at its peak), to try the benchmark itself. Nothing about time or memory is
asserted beyond "it ran"; the published bytes are asserted equal to the formula.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx

from benchmarks.test_bench_real_size import PRESET, ROOT, _rl_run_peak_rss
from benchmarks.test_bench_trainer import random_batch
from minirl.losses import get_preset
from minirl.modeling import lora
from minirl.modeling.model import ModelConfig, init_model
from minirl.training.trainer import Trainer, TrainerConfig

RANK = 16
ROUNDS = 5
SHAPES = {"qwen2.5-0.5b": PRESET, "dev": dataclasses.replace(PRESET, num_layers=4, vocab_size=8192)}


def adapter_bytes(cfg: ModelConfig, rank: int = RANK) -> int:
    """fp32 bytes of rank-`rank` adapters on every projection: 4 r (I + O) per projection and layer."""
    shapes = lora._shapes(cfg).values()
    return 4 * rank * cfg.num_layers * sum(i + o for i, o in shapes)


@pytest.fixture(scope="module")
def shape_checkpoint(tmp_path_factory):
    """The checkpoint, built in a child process (as test_bench_real_size's, and for the same
    reason: this process never holds torch's copy of the model)."""
    name = os.environ.get("LORA_BENCH_SHAPE", "qwen2.5-0.5b")
    cfg = SHAPES[name]
    path = tmp_path_factory.mktemp(f"{name}-shaped")
    overrides = {f: getattr(cfg, f) for f in ("num_layers", "vocab_size")}
    code = (
        f"import sys, dataclasses; sys.path[:0] = {[str(ROOT / 'benchmarks'), str(ROOT / 'tests')]!r}; "
        "from test_bench_real_size import build_checkpoint, PRESET; "
        f"build_checkpoint({str(path)!r}, dataclasses.replace(PRESET, **{overrides!r}))"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    return name, cfg, path


def test_lora_memory_and_version_bytes(shape_checkpoint):
    name, cfg, path = shape_checkpoint
    fp32_bytes = 4 * cfg.num_params()
    lora_peak = _rl_run_peak_rss(path, "none", (f"model.lora_rank={RANK}",), name="lora")
    bf16 = (f"model.lora_rank={RANK}", "model.param_dtype=bfloat16")
    bf16_peak = _rl_run_peak_rss(path, "none", bf16, name="lora-bf16")
    full_peak = _rl_run_peak_rss(path, "none", name="full")
    rows = [json.loads(line) for line in (path.parent / "run-lora" / "metrics.jsonl").open()]
    published = {r["store/version_bytes"] for r in rows if "store/version_bytes" in r}
    report = {
        "shape": name,
        "params": cfg.num_params(),
        "model_fp32_gb": fp32_bytes / 1e9,
        "lora_peak_rss_gb": lora_peak / 1e9,
        "full_peak_rss_gb": full_peak / 1e9,
        "lora_bf16_base_peak_rss_gb": bf16_peak / 1e9,
        "lora_over_full": lora_peak / full_peak,
        "lora_bf16_base_over_full": bf16_peak / full_peak,
        "lora_peak_over_model_fp32": lora_peak / fp32_bytes,
        "full_peak_over_model_fp32": full_peak / fp32_bytes,
        "version_bytes": sorted(published),
        "version_bytes_over_model_fp32": max(published) / fp32_bytes,
        "load_average": os.getloadavg()[0],
    }
    print("\n" + json.dumps(report, indent=2, default=float))
    assert published == {float(adapter_bytes(cfg))}


def _time(fn) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_lora_train_tokens_per_s(preset):
    """Train steps with and without LoRA on the same base weights and batch, back to back."""
    full_cfg = ModelConfig.preset(preset)
    lora_cfg = dataclasses.replace(full_cfg, lora_rank=RANK)
    params = nnx.to_pure_dict(nnx.split(init_model(lora_cfg, seed=0))[1])
    batch = random_batch(full_cfg)
    arms = {}
    for arm, cfg in (("full", full_cfg), ("lora", lora_cfg)):
        p = params if cfg.lora_rank else lora.partition(params, lora.is_adapter)[1]
        trainer = Trainer(cfg, p, get_preset("dapo"), TrainerConfig())
        prox = trainer.recompute_logprobs(batch)
        trainer.train_step(batch, prox)  # compile
        arms[arm] = (trainer, prox)
    times = {arm: [] for arm in arms}
    for _ in range(ROUNDS):
        for arm, (trainer, prox) in arms.items():
            times[arm].append(_time(lambda t=trainer, p=prox: t.train_step(batch, p)))
    ratios = [f / lo for f, lo in zip(times["full"], times["lora"], strict=True)]
    tokens = batch.tokens.size
    print(
        f"\n{preset}: full {tokens / np.median(times['full']):.0f} tokens/s, LoRA r={RANK} "
        f"{tokens / np.median(times['lora']):.0f} tokens/s; LoRA / full tokens/s median "
        f"{np.median(ratios):.2f}x (rounds {', '.join(f'{r:.2f}' for r in ratios)}); "
        f"load average {os.getloadavg()[0]:.1f}"
    )
