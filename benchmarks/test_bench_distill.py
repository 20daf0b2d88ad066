"""Benchmark: what a distillation teacher costs per RL step, as ratios measured in the same run
(docs/benchmarking.md, docs/distillation.md).

  train step  the student's `trainer.train_step(batch, on_policy=True)` (a lockstep on-policy
              step: one update, the recompute skipped) against the teacher's scoring of the same
              batch (`recompute_logprobs` of a loss-free Trainer: what the controller calls),
              interleaved over ROUNDS rounds, the median of the per-round ratios. Student: the
              `tiny` preset (3.2M parameters); teachers: the same shape, and `small` (25M, ~8x the
              student's non-embedding parameters). Batch: 8 rows x 256 positions (random_batch of
              test_bench_trainer.py), loss "distill" (no reference forward).
  RL step     a whole `minirl train` step (generate, verify, teacher, train, publish) of the
              `countdown` preset (0.75M-parameter student) with rl.loss=distill and a `tiny`
              teacher: the median over steps 2..STEPS of time/teacher / (time/step - time/teacher),
              the teacher's share against the same step without it.

Run (2 minutes at load 5, 3 at load 10, compiles included; the whole-step test is marked slow):
    python -m pytest benchmarks/test_bench_distill.py -q -s -m ""
Nothing about time is asserted.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from flax import nnx

from benchmarks.test_bench_trainer import random_batch
from minirl.losses import get_preset
from minirl.modeling.model import ModelConfig, init_model
from minirl.training.trainer import Trainer, TrainerConfig

ROUNDS = 5
STEPS = 8


def _params(cfg: ModelConfig, seed: int) -> dict:
    return nnx.to_pure_dict(nnx.split(init_model(cfg, seed=seed))[1])


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def test_teacher_scoring_against_the_students_train_step(benchmark):
    student = ModelConfig.preset("tiny")
    batch = random_batch(student)
    batch.teacher_logprobs = np.where(batch.mask > 0, batch.behaviour_logprobs - 0.1, 0.0)
    trainer = Trainer(student, _params(student, 0), get_preset("distill"), TrainerConfig())
    teachers = {
        name: Trainer(cfg, _params(cfg, 1), None, TrainerConfig())
        for name, cfg in (
            ("same", student),
            ("small", ModelConfig.preset("small", vocab_size=student.vocab_size)),
        )
    }
    trainer.train_step(batch, on_policy=True)  # compiles
    for teacher in teachers.values():
        teacher.recompute_logprobs(batch)
    rows = []
    for _ in range(ROUNDS):
        step = _time(lambda: trainer.train_step(batch, on_policy=True))
        row = {"step_s": step}
        for name, teacher in teachers.items():
            row[f"{name}_s"] = _time(lambda t=teacher: t.recompute_logprobs(batch))
            row[f"{name}_ratio"] = (step + row[f"{name}_s"]) / step
        rows.append(row)
        print("\nround: " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()), end="")
    median = {k: float(np.median([r[k] for r in rows])) for k in rows[0]}
    median["load_average"] = os.getloadavg()[0]
    benchmark.extra_info.update(median)
    print(f"\n\n{batch.tokens.size} tokens, student `tiny`, medians over {ROUNDS} rounds:")
    print(f"  student train step {median['step_s']:.3f} s")
    for name in teachers:
        print(
            f"  teacher {name:5s} scoring {median[f'{name}_s']:.3f} s: "
            f"step with it / step without = {median[f'{name}_ratio']:.2f}x"
        )
    print(f"  load average {median['load_average']:.1f}")


@pytest.mark.slow
def test_teacher_share_of_a_whole_rl_step(benchmark, tmp_path):
    from minirl.measure.metrics_log import read_metrics
    from minirl.run.presets import make_config
    from minirl.run.runner import Run

    sets = [f"rl.steps={STEPS}", "rl.loss=distill", "rl.teacher=tiny", "rl.time_budget=0"]
    sets += ["eval.prompts=8", "eval.samples=1", "sft.steps=40", f"rl.checkpoint_every={STEPS}"]
    Run(
        make_config("countdown", sets), tmp_path / "run", progress=False, log=lambda *a: None
    ).train()
    records = read_metrics(tmp_path / "run")[1:]  # step 1 compiles
    teacher = np.array([r["time/teacher"] for r in records])
    step = np.array([r["time/step"] for r in records])
    share = float(np.median(teacher / (step - teacher)))
    benchmark.extra_info.update(teacher_share=share, load_average=os.getloadavg()[0])
    print(
        f"\ncountdown preset, `tiny` teacher, steps 2..{STEPS}: teacher {np.median(teacher):.3f} s, "
        f"step {np.median(step):.3f} s; step with it / without = {1 + share:.2f}x "
        f"(load average {os.getloadavg()[0]:.1f})"
    )
