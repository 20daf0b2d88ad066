"""Benchmark: what the LM head in chunks saves (minirl/modeling/chunked_logprobs.py: slices of the
vocabulary on the fast path these runs take, `trainer.logit_chunk_mb`, default 64 MiB of logits
at once), each figure a ratio of two arms
measured in the same benchmark run. The other arm is `trainer.logit_chunk_mb=0`: the whole
micro-batch's [rows, positions, vocabulary] logits at once, the code before the chunks.

  smoke   peak RSS (VmHWM: minirl/run/memory.py) of the README's smoke command, `minirl train --model
          DIR --data FILE --set rl.steps=2 --set rl.prompts_per_step=4 --set
          data.max_new_tokens=64`, on a 2-layer model with Qwen's vocabulary (151,680 ids, D 64;
          tests/hf_tiny.py builds it, nothing is downloaded), in fresh processes, chunked and
          not: GB, ÷ the model's fp32 bytes, chunked ÷ unchunked, and the run's own last
          `memory/peak_rss_gb` (metrics.jsonl) beside each.
  real    the same for the Qwen2.5-0.5B-shaped 2-step run of benchmarks/test_bench_real_size.py
          (its `_rl_run_peak_rss`: 8 rollouts of 32 new tokens a step, no remat), full
          fine-tune and LoRA rank 16, and a third arm chunked with `trainer.remat=nothing`: six
          fresh processes (the unchunked full arm peaks at ~14 GB: run it alone). Then the
          full fine-tune's remat run resumed from its last checkpoint for a third step, in a
          seventh process: its peak, and ÷ the run it resumes (`full-resumed`).
          `MEMORY_BENCH_ARMS=lora` runs only the LoRA arms.
  step    train_step seconds chunked ÷ unchunked, one trainer whose spec is switched between
          the arms, interleaved over ROUNDS rounds (median of the per-round ratios): the smoke
          shape (32 x 128 positions) and, in `real`, the 0.5B shape (8 x 128, ~14 GB), where
          remat "nothing" ÷ chunked is timed too.

Run: `python -m pytest benchmarks/test_bench_memory.py -q -s` (~25 min alone; `-k smoke` ~6
min; the full arms need ~14 GB free). Needs the `reference` extra (transformers builds the
checkpoints). Nothing about time or memory is asserted beyond "it ran"; at a small vocabulary the chunked setting compiles
the same program as the unchunked one (tests/training/test_trainer.py checks it), so issue
#40's work (a 300-token vocabulary) is unchanged by construction.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]
from test_bench_real_size import minirl_peak_gb  # noqa: E402
from test_bench_trainer import random_batch  # noqa: E402

from minirl.losses import get_preset  # noqa: E402
from minirl.modeling.model import ModelConfig, init_model  # noqa: E402
from minirl.training.trainer import Trainer, TrainerConfig  # noqa: E402

pytest.importorskip("transformers")
ROUNDS = 5
SMOKE_SETS = ("rl.steps=2", "rl.prompts_per_step=4", "data.max_new_tokens=64")
ARMS = {"chunked": (), "unchunked": ("trainer.logit_chunk_mb=0",)}
REAL_ARMS = {**ARMS, "remat": ("trainer.remat=nothing",)}  # chunked, each block recomputed


def peak_rss(model_dir: Path, data: Path, run_dir: Path, sets) -> tuple[float, float]:
    """(peak RSS in GB of a fresh `minirl train` process, the last `memory/peak_rss_gb` it
    logged)."""
    args = ["train", "--quiet", "--model", str(model_dir), "--data", str(data)]
    gb = minirl_peak_gb([*args, "--run-dir", str(run_dir)], sets)
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    return gb, logged[-1]["memory/peak_rss_gb"]


def resumed_peak_rss(run_dir: Path) -> float:
    """Peak RSS in GB of a fresh `minirl train --resume` process: one step past `run_dir`'s
    2-step run, from its last checkpoint."""
    return minirl_peak_gb(["train", "--quiet", "--resume", str(run_dir)], ["rl.steps=3"])


def _time(fn) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def step_time_ratio(cfg: ModelConfig, rows: int, length: int, remat: bool = False) -> dict:
    """train_step seconds chunked ÷ unchunked (and `remat`: chunked with remat "nothing" ÷
    chunked) on one trainer (GRPO, random batch), its forward spec switched between the arms
    each round."""
    params = nnx.to_pure_dict(nnx.split(init_model(cfg, seed=0))[1])
    trainer = Trainer(cfg, params, get_preset("grpo"), TrainerConfig(learning_rate=1e-6))
    del params
    batch = random_batch(cfg, rows, length)
    specs = {"chunked": trainer._spec, "unchunked": trainer._spec._replace(logit_chunk=0)}
    if remat:
        specs["remat"] = trainer._spec._replace(remat="nothing")
    times = {arm: [] for arm in specs}
    for rnd in range(ROUNDS + 1):
        for arm, spec in specs.items():
            trainer._spec = spec
            seconds = _time(lambda: trainer.train_step(batch, on_policy=True))
            if rnd:  # round 0 compiles
                times[arm].append(seconds)
    ratios = [c / u for c, u in zip(times["chunked"], times["unchunked"], strict=True)]
    report = {
        "rows_x_positions": f"{rows} x {length}",
        "positions_per_chunk": specs["chunked"].logit_chunk,
        "chunked_s_median": float(np.median(times["chunked"])),
        "unchunked_s_median": float(np.median(times["unchunked"])),
        "chunked_over_unchunked_median": float(np.median(ratios)),
        "rounds": [round(r, 3) for r in ratios],
    }
    if remat:
        ratios = [r / c for r, c in zip(times["remat"], times["chunked"], strict=True)]
        report["remat_s_median"] = float(np.median(times["remat"]))
        report["remat_over_chunked_median"] = float(np.median(ratios))
        report["remat_rounds"] = [round(r, 3) for r in ratios]
    return report


@pytest.fixture(scope="module")
def smoke_model(tmp_path_factory):
    from hf_tiny import make_model_dir

    path = tmp_path_factory.mktemp("smoke")
    model = make_model_dir(path / "m", vocab_tokens=151_643, max_positions=32768)
    data = path / "train.jsonl"
    rows = [{"question": f"What is {i} + 2?", "answer": f"#### {i + 2}"} for i in range(64)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return model, data


def test_smoke_command_memory_and_step(smoke_model):
    from minirl.hf.hf_config import config_from_hf, read_config

    model, data = smoke_model
    cfg = config_from_hf(read_config(model), dtype="float32")
    fp32 = 4 * cfg.num_params() / 1e9
    report = {"model": "tiny, V 151680", "model_fp32_gb": fp32, "load_before": os.getloadavg()[0]}
    for arm, extra in ARMS.items():  # chunked first: nothing of the other arm's is cached
        gb, logged = peak_rss(model, data, model.parent / f"run-{arm}", (*SMOKE_SETS, *extra))
        report[arm] = {"peak_rss_gb": gb, "logged_peak_rss_gb": logged, "over_fp32": gb / fp32}
    report["chunked_over_unchunked"] = (
        report["chunked"]["peak_rss_gb"] / (report["unchunked"]["peak_rss_gb"])
    )
    report["step"] = step_time_ratio(cfg, 32, 128)
    report["load_after"] = os.getloadavg()[0]
    print("\n" + json.dumps(report, indent=2, default=float))


def test_real_size_memory_and_step(tmp_path_factory):
    from test_bench_lora import RANK
    from test_bench_real_size import _rl_run_peak_rss

    path = tmp_path_factory.mktemp("qwen2.5-0.5b-shaped")
    code = (  # in a child process: this one never holds torch's copy of the model
        f"import sys; sys.path[:0] = {[str(ROOT / 'benchmarks'), str(ROOT / 'tests')]!r}; "
        f"from test_bench_real_size import build_checkpoint; build_checkpoint({str(path)!r})"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    cfg = ModelConfig.preset("qwen2.5-0.5b", dtype="float32", param_dtype="float32")
    fp32 = 4 * cfg.num_params() / 1e9
    report = {"model": "Qwen2.5-0.5B shape", "model_fp32_gb": fp32}
    kinds = {"lora": (f"model.lora_rank={RANK}",), "full": ()}
    wanted = os.environ.get("MEMORY_BENCH_ARMS", "lora,full").split(",")
    for kind in (k for k in kinds if k in wanted):
        for arm, extra in REAL_ARMS.items():
            name = f"{kind}-{arm}"
            gb = _rl_run_peak_rss(path, "none", (*kinds[kind], *extra), name=name) / 1e9
            metrics = (path.parent / f"run-{name}" / "metrics.jsonl").read_text().splitlines()
            logged = json.loads(metrics[-1])
            report[name] = {
                "peak_rss_gb": gb,
                "logged_peak_rss_gb": logged["memory/peak_rss_gb"],
                "over_fp32": gb / fp32,
            }
            print(name, json.dumps(report[name], default=float), flush=True)
            if name != "full-remat":  # the one resumed below; the others' 3-6 GB of disk go
                shutil.rmtree(path.parent / f"run-{name}" / "checkpoints")
        report[f"{kind}_chunked_over_unchunked"] = (
            report[f"{kind}-chunked"]["peak_rss_gb"] / report[f"{kind}-unchunked"]["peak_rss_gb"]
        )
    if "full" in wanted:  # a resume holds the checkpoint it reads once, as the trainer's own
        gb = resumed_peak_rss(path.parent / "run-full-remat")
        fresh = report["full-remat"]["peak_rss_gb"]
        report["full-resumed"] = {
            "peak_rss_gb": gb,
            "over_fp32": gb / fp32,
            "over_fresh": gb / fresh,
        }
        print("full-resumed", json.dumps(report["full-resumed"], default=float), flush=True)
        shutil.rmtree(path.parent / "run-full-remat" / "checkpoints")
    if os.environ.get("MEMORY_BENCH_STEP", "1") == "1":
        report["step"] = step_time_ratio(cfg, 8, 128, remat=True)
    report["load_average"] = os.getloadavg()[0]
    print("\n" + json.dumps(report, indent=2, default=float))
