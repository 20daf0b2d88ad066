""" "This machine": per-call costs fitted to a real minirl run, and the run's twin on virtual time.

A tiny model on a CPU is far from its roofline: a decode chunk or a train step costs mostly
dispatch and host work, nearly the same whatever the batch. So this machine's costs are fitted,
not derived, from one lockstep run's metrics.jsonl (least squares with costs >= 0 over its
steps; the first
WARMUP = 4, which trace new shapes, left out):

    time/generate = chunk_s x decode chunks + prefill_s x rollouts generated
    time/train    = train_call_s + train_token_s x padded tokens (rows x the longest's bucket)
    time/verify   = verify_s x rollouts;  time/publish = reload_s
    time/other - time/publish = other_s (the controller's batching and diagnostics)
    unsolved = groups the dynamic filter dropped / groups made (the verifier's all-equal share)

and `colocated_slowdown` is how much slower a part runs while the other is busy, when engine
and trainer share the machine's cores: the calibration run's cores used (CPU seconds / wall
seconds, from the process.json experiments/sim_validation.py writes) over half the cores,
floored at 1 — each part alone keeps that many cores busy, together they get half each.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np

from minirl.measure.metrics_log import read_metrics
from minirl.run.run_dir import load_config
from minirl.sim.costs import Costs, Device
from minirl.sim.run import Setup, simulate
from minirl.sim.workload import Lengths
from minirl.training.batching import bucket_length


@dataclasses.dataclass(frozen=True)
class Machine:
    chunk_s: float
    prefill_s: float  # per prefilled rollout
    verify_s: float  # per rollout
    train_call_s: float
    train_token_s: float
    reload_s: float
    other_s: float = 0.0  # the controller's own work per step
    unsolved: float = 0.0  # share of groups the dynamic filter dropped
    colocated_slowdown: float = 1.0

    def describe(self) -> dict:
        return dataclasses.asdict(self)


class MeasuredCosts(Costs):
    """Costs with this machine's fitted per-call times in place of the roofline."""

    def __init__(self, machine: Machine, model):
        free = Device("this machine (fitted)", 1e30, 1e30, 1e30, 1e30)
        super().__init__(model, free)
        object.__setattr__(self, "machine", machine)

    def decode_chunk(self, rows: int, context: float, steps: int) -> float:
        return self.machine.chunk_s

    def prefill(self, rows: int, length: int) -> float:
        return self.machine.prefill_s * rows

    def train_step(self, tokens: int) -> float:
        return self.machine.train_call_s + self.machine.train_token_s * tokens

    def reload(self) -> float:
        return self.machine.reload_s


def _prompt_len(run_dir: Path) -> float:
    """Mean prompt tokens of the logged samples (character tokenizer: characters + BOS)."""
    lens = []
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        try:
            lens.append(len(json.loads(line)["prompt"]) + 1)
        except (ValueError, KeyError, TypeError):
            continue
    return float(np.mean(lens)) if lens else 1.0


WARMUP = 4  # steps left out: each new batch shape is traced (and compiled, or read from the cache)


def _per_step(records: list[dict]) -> tuple[list[dict], np.ndarray]:
    """The steps after the warm-up, and rollouts generated in each (differences of counts)."""
    made = np.diff([0.0] + [s["count/rollouts_generated"] for s in records])
    return records[WARMUP:], made[WARMUP:]


def _fit(columns: list, y) -> list[float]:
    """Least squares with coefficients >= 0 (a cost is never negative): a column whose
    coefficient comes out negative is dropped (its coefficient 0) and the rest refitted."""
    keep = list(range(len(columns)))
    while True:
        x = np.stack([np.asarray(columns[i], float) for i in keep], 1)
        coef, *_ = np.linalg.lstsq(x, np.asarray(y, float), rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            out = [0.0] * len(columns)
            for i, c in zip(keep, coef, strict=True):
                out[i] = max(float(c), 0.0)
            return out
        keep = [i for i, c in zip(keep, coef, strict=True) if c >= 0] or keep[:1]


def fit_run(run_dir) -> Machine:
    run_dir = Path(run_dir)
    cfg = load_config(run_dir)
    records = read_metrics(run_dir)
    steps, made = _per_step(records)
    if cfg.rl.scheduler != "lockstep" or len(steps) < 2:
        logged = len(records)
        raise ValueError(
            f"{run_dir}: calibration needs a lockstep run (its phases are timed one after the "
            f"other) of at least {WARMUP + 2} steps; this one is {cfg.rl.scheduler} with "
            f"{logged} logged steps"
        )
    e = cfg.engine
    chunks = np.array([s["engine/slot_steps"] / (e.slots * e.decode_chunk) for s in steps])
    gen = np.array([s["time/generate"] for s in steps])
    chunk_s, prefill_s = _fit([chunks, made], gen)
    rollouts = cfg.rl.prompts_per_step * cfg.rl.group_size
    pad = cfg.trainer.bucket_minimum  # the trainer pads rows to the bucket of the longest
    prompt_len = _prompt_len(run_dir)
    longest = [s["length/max"] + prompt_len for s in steps]
    tokens = np.array([rollouts * bucket_length(round(n), pad) for n in longest])
    train = np.array([s["time/train"] for s in steps])
    call_s, token_s = _fit([np.ones_like(tokens), tokens], train)
    verify = sum(s["time/verify"] for s in steps) / max(made.sum(), 1)
    last = records[-1]
    dropped = last["count/groups_filtered"]
    unsolved = dropped / max(dropped + last["count/groups_produced"], 1)
    slowdown = 1.0
    process = run_dir / "process.json"
    if process.is_file():
        info = json.loads(process.read_text())
        cores = info["cpu_s"] / info["wall_s"]
        slowdown = max(1.0, cores / ((os.cpu_count() or 2) / 2))
    return Machine(
        chunk_s=chunk_s,
        prefill_s=prefill_s,
        verify_s=float(verify),
        train_call_s=call_s,
        train_token_s=token_s,
        reload_s=float(np.mean([s["time/publish"] for s in steps])),
        other_s=float(np.mean([s["time/other"] - s["time/publish"] for s in steps])),
        colocated_slowdown=float(slowdown),
        unsolved=float(unsolved),
    )


def simulate_like(run_dir, machine: Machine, colocated: bool = True) -> tuple[float, float]:
    """(measured, simulated) mean seconds per step of a real run after the warm-up (the simulated
    run: the same settings, the lengths the real run logged, this machine's costs). `colocated`
    False: engine and trainer had cores of their own (experiments/apart.py), no slowdown."""
    run_dir = Path(run_dir)
    cfg = load_config(run_dir)
    steps = read_metrics(run_dir)
    lengths = Lengths.from_run(run_dir, seed=cfg.rl.seed)
    setup = Setup(
        costs=MeasuredCosts(machine, cfg.model),
        rl=cfg.rl,
        engine=cfg.engine,
        lengths=lengths,
        max_new_tokens=max(lengths.values) + 1,
        prompt_len=round(_prompt_len(run_dir)),
        verify_per_rollout_s=machine.verify_s,
        colocated_slowdown=machine.colocated_slowdown if colocated else 1.0,
        controller_s=machine.other_s,
        unsolved=machine.unsolved,
        pad_to_bucket=cfg.trainer.bucket_minimum,
        seed=cfg.rl.seed,
    )
    trace = simulate(setup, len(steps))
    measured = float(np.mean([s["time/step"] for s in steps[WARMUP:]]))
    simulated = float(np.mean([s["time/step"] for s in trace["steps"][WARMUP:]]))
    return measured, simulated
