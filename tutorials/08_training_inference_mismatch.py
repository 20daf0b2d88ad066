# %% [markdown]
"""Lesson 08 — training–inference mismatch: where it comes from, exact mode, TIS and rejection.

    python tutorials/08_training_inference_mismatch.py            # full mode (minutes, 2 cores)
    python tutorials/08_training_inference_mismatch.py --fast     # fast mode (CI)

Writes `mismatch.png` and `results.json` into `--out` (default
`runs/tutorials/08_training_inference_mismatch`); the three runs are under `--out/<arm>`.
Uses `minirl/diagnose/` (`minirl diagnose`), `minirl/modeling/exact.py` (exact mode), the loss presets
`token_reinforce` and `token_reinforce_tis_mis` (minirl/losses/), and `minirl train`
(minirl/run/runner.py). Read `docs/mismatch.md` next: it has the same experiment over three seeds.
Mirrors, in miniature: RLAX Fig. 5 (the per-step |log π − log μ| of a run) and VeXact's
experiment (REINFORCE with a mismatched engine, with the zero-mismatch engine, and with the
TIS / rejection remedies).


THE IDEA
--------
The rollout engine samples a token and reports log μ(token), the log-prob under the policy it
sampled from. The trainer later recomputes log π(token) with the SAME weights. On paper the two
are equal; in floating point they are not (lesson 01 showed why: the engine's KV-cached decode
and the trainer's full forward add the same products in different orders). The difference

    Δ = log π − log μ          per completion token, |Δ| averaged / p95 / max over a batch

is the training–inference mismatch (TIM). Why care? Every policy-gradient loss assumes the
samples came from the policy it differentiates. With μ ≠ π the on-policy estimator is biased, and
VeXact shows the bias can collapse a REINFORCE run by itself, even without any staleness.

Where does Δ come from? `minirl diagnose` answers one source at a time. It generates ONE set of
rollouts and scores the same tokens in several ways, so every row of its table compares two
computations of the very same numbers:

  recompute  the engine's log μ against the trainer's recompute (what every step logs as
             mismatch/*), and the training forward (inside value_and_grad) against both
  graph      the trainer's remat policy: rematerialising changes how XLA fuses the forward
  batch      a sequence recomputed inside a batch against alone, padded to twice the length
  dtype      a bf16 engine against the fp32 trainer: the big one
  exact      exact mode on both sides (minirl/modeling/exact.py: fixed reduction order): must be 0

Three remedies, three runs. Each is the same on-policy REINFORCE (`token_reinforce`: one update
per batch, so any Δ is mismatch, not staleness), from the same initial weights, with the same
prompts and the same sampling keys:

  mismatch   engine.dtype=bfloat16, trainer in fp32, no correction (VeXact's baseline arm)
  exact      engine.exact=true: the engine and the trainer run the same fixed-order reductions,
             so μ == π bit for bit (VeXact's fix). It costs speed (lesson 01)
  tis_mis    the bf16 engine again, with the loss `token_reinforce_tis_mis`: each token weighted
             by min(π/μ, 2) (truncated importance sampling, TIS), tokens with π/μ outside
             [0.5, 5] and sequences whose mean log(π/μ) exceeds 0.01 in size dropped (masked
             importance sampling / rejection; VeXact §4.2)

The diagnostics the runs log (docs/diagnostics.md): `mismatch/mean_abs_dlogp` (RLAX Fig. 5 plots
it per step; RLAX reports its p95 over 512 steps: 0.044 without their fix, 0.020 with it), and
VeXact's zero-centred contributions Σ A·(π/μ − 1), split by the sign of the advantage A: exactly 0
without mismatch, and the first place where mismatch damage shows.

WHAT THE SCRIPT DOES
--------------------
1. `minirl.diagnose.diagnose`: the table of sources. Full mode on the `countdown_hard` preset's model
   (3.2M parameters, the first default) untrained (`--set sft.steps=0`, so the lesson needs no warm start; the
   numerics do not need a trained model), fast mode on the fixture preset. Exact rows must be 0.
2. The three runs on the fixture preset (a 2-token task, 78k parameters): the same `minirl train`
   with the arm's overrides. Prints reward and |Δ log p| per step, side by side.
3. Evaluates every final policy with the SAME fp32 engine (held-out pass@1), and summarises:
   reward, |Δ log p|, rejected sequences, zero-centred sums, and at how many steps each arm had
   exactly the exact arm's batch reward (the arms share sampling keys, so they sample the same
   tokens unless a bf16 rounding flips a draw).
4. Checks the claims that must hold (exact = 0 everywhere; bf16 mismatch far above fp32 noise;
   the remedies act), and says plainly what does NOT reproduce at this scale.
5. Plots |Δ log p| per step (RLAX Fig. 5 in miniature), the rewards, the sources table and the
   rejected fraction.

Expected output (full mode, measured)
-------------------------------------
Measured on 2026-11-23 with `python tutorials/08_training_inference_mismatch.py --out OUT` on a
shared virtual machine with 2 cores (nproc = 2), under heavy load from other jobs (load average
13.9 at the start, 12.4 at the end), without JAX's persistent compilation cache (every compile
paid). It took 860 s of wall time and 317 s of CPU time (user + sys); on an idle 2-core machine
expect about the CPU time. Most of it is compilation: the sources table took 513 s of the wall
time (its exact training forward and exact decode compile for every shape), the exact run
255 s, the bf16 runs 63 s and 22 s (the second reuses the first one's compiles). A rerun with a
warm cache printed the same numbers. The figure is figures/08_training_inference_mismatch.png.
The seed-0 rows of docs/mismatch.md came out the same, digit for digit: the runs are
deterministic.

What reproduces: the sources, and the remedies acting as designed. Every fp32 source is rounding
noise (means 9e-8 to 8e-7, maxima 1e-6 to 4e-6); a bf16 engine against the fp32 trainer is 11,000
times larger (mean 8.7e-3, max 4.6e-2); every exact row is exactly 0. In the runs, the exact arm
has |Δ log p| = 0 and zero-centred sums of 0 at all 40 steps, the bf16 arms 3.2e-3 / 3.0e-3 on
average (max 0.08-0.10) and non-zero zero-centred sums, and tis_mis rejects 6.8% of the sequences
(up to 26% in one step).

What does NOT reproduce at this scale: VeXact's collapse. The mismatched run is not worse than the
exact one: it had the exact run's batch reward at 37 of 40 steps (the three bf16-flipped draws
changed nothing lasting) and ends at the same held-out pass@1, 0.648. The remedies do not help
either: tis_mis rejects sequences the exact run trains on, so its trajectory departs after step 1
(equal at 4 of 40 steps) and it ends at a held-out pass@1 of 0.344 (docs/mismatch.md reads 0.344
and 0.65 as a policy that always answers the same digit). docs/mismatch.md has two more seeds: seed
1's mismatched run ended BETTER than its exact run (0.605 vs 0.344), seed 2 the same (0.656). The
reasons: 2-token sequences, a 78k-parameter model and 40 steps, against VeXact's thousands of
tokens per sequence and hundreds of steps on 1.7B-30B models; here REINFORCE's own entropy collapse
(the policy locking onto one digit, in the exact arm too) dominates, and |Δ log p| itself shrinks
(1e-2 -> 1e-4) as the policy sharpens. Note also that the table's model is the untrained countdown_hard
model (the docs' table uses the warm-started one: the same orders of magnitude, e.g. bf16 mean
2.4e-3 there, 8.7e-3 here).

    mode: full   cores: 2   load average: 13.9

    Step 1. minirl diagnose --preset countdown_hard --set sft.steps=0 (513 s)
      source     compares (a vs b)                                                mean|dlogp|  p95|dlogp|  max|dlogp|  tokens  expect
      -------------------------------------------------------------------------------------------------------------------------------
      recompute  decode vs forward, = mismatch/*: engine log mu vs fp32 recompute   7.680e-07   1.907e-06   4.292e-06    2495  >= 0
      recompute  bypass: training forward (remat=none) vs engine log mu             6.840e-07   1.907e-06   3.338e-06    2495  >= 0
      recompute  recompute: training forward (remat=none) vs fp32 recompute         7.962e-07   1.907e-06   3.815e-06    2495  >= 0
      graph      training forward (remat=none) vs fp32 recompute                    7.962e-07   1.907e-06   3.815e-06    2495  >= 0
      graph      training forward (remat=dots) vs fp32 recompute                    9.134e-08   4.768e-07   9.537e-07    2495  >= 0
      graph      training forward (remat=nothing) vs fp32 recompute                 9.134e-08   4.768e-07   9.537e-07    2495  >= 0
      graph      training forward (remat=none, exact) vs fp32 decode exact          0.000e+00   0.000e+00   0.000e+00    2495  0 ok
      batch      fp32 recompute vs fp32 recompute (alone, 2x pad)                   7.499e-07   1.907e-06   4.053e-06    2495  >= 0
      batch      fp32 recompute exact vs fp32 recompute exact (alone, 2x pad)       0.000e+00   0.000e+00   0.000e+00    2495  0 ok
      dtype      bf16 decode vs fp32 recompute                                      8.658e-03   2.231e-02   4.622e-02    2495  >= 0
      dtype      the dtype alone: bf16 decode exact vs fp32 recompute exact         9.386e-03   2.314e-02   4.477e-02    2495  >= 0
      exact      fp32 decode exact vs fp32 recompute exact                          0.000e+00   0.000e+00   0.000e+00    2495  0 ok
      exact      bf16 decode exact vs bf16 recompute exact                          0.000e+00   0.000e+00   0.000e+00    2495  0 ok
      -> bf16 engine vs fp32 trainer: mean |Δ log p| 8.7e-03, 11274x the fp32 engine's 7.7e-07; exact rows 0: True

    Step 2. three runs of 40 steps: minirl train --preset fixture --set rl.prompts_per_step=16 --set rl.group_size=8 --set eval.prompts=64 --set eval.samples=4 --set <the arm's overrides>
      mismatch  --set rl.loss=token_reinforce --set engine.dtype=bfloat16   (63 s)
      exact     --set rl.loss=token_reinforce --set engine.exact=true   (255 s)
      tis_mis   --set rl.loss=token_reinforce_tis_mis --set engine.dtype=bfloat16   (22 s)

      step  mismatch reward     exact reward   tis_mis reward  mismatch |Δ|     exact |Δ|   tis_mis |Δ|
         1            0.086            0.086            0.086      8.63e-03      0.00e+00      8.63e-03
         2            0.188            0.188            0.203      9.60e-03      0.00e+00      9.21e-03
         3            0.461            0.469            0.344      7.24e-03      0.00e+00      7.97e-03
         4            0.477            0.477            0.500      6.67e-03      0.00e+00      7.47e-03
         5            0.633            0.648            0.547      4.67e-03      0.00e+00      6.69e-03
         6            0.312            0.312            0.312      3.58e-03      0.00e+00      3.45e-03
         7            0.555            0.547            0.508      4.80e-03      0.00e+00      3.39e-03
         8            0.492            0.492            0.594      4.45e-03      0.00e+00      5.22e-03
         (steps 9-36 left out here; every step is in OUT/<arm>/metrics.jsonl)
        37            0.312            0.312            0.656      2.71e-04      0.00e+00      2.47e-03
        38            0.305            0.305            0.688      1.94e-04      0.00e+00      1.24e-03
        39            0.500            0.500            0.484      2.53e-04      0.00e+00      1.18e-03
        40            0.500            0.500            0.500      1.06e-04      0.00e+00      5.19e-04

    Step 3. summary (held-out pass@1 by one fp32 evaluator; before RL: 0.062)
      arm        reward first->last quarter held-out p@1  mean |Δ|  max |Δ| rej. seq Σ A(c-1) + Σ A(c-1) - = exact
      mismatch               0.394 -> 0.411        0.648   3.2e-03  8.3e-02    0.000    2.5e-03    2.9e-03   37/40
      exact                  0.395 -> 0.411        0.648   0.0e+00  0.0e+00    0.000    0.0e+00    0.0e+00   40/40
      tis_mis                0.398 -> 0.576        0.344   3.0e-03  9.5e-02    0.068    4.6e-03    2.5e-03    4/40

    Step 4. the claims, checked
      exact_rows_are_zero                      True
      fp32_rows_are_rounding_noise             True
      bf16_engine_100x_above_fp32              True
      exact_run_zero_mismatch_every_step       True
      exact_run_zero_centred_sums_zero         True
      bf16_runs_mismatch_above_1e-4            True
      tis_mis_rejects_sequences                True
      mismatch_run_no_rejection                True
      collapse under mismatch? mean batch reward mismatch 0.429 vs exact 0.429 (difference -0.000); held-out pass@1 0.648 vs 0.648

    wrote OUT/mismatch.png and OUT/results.json
    wall 860 s, CPU 317 s, load average 13.9 -> 12.4
"""

# %%
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import time
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from minirl.diagnose import diagnose, format_table
from minirl.measure.metrics_log import read_metrics
from minirl.run.presets import make_config
from minirl.run.runner import Run
from minirl.store.checkpoints import CheckpointManager

# %% [markdown]
# The settings. The arms are those of experiments/mismatch.py (one seed here; three there).


# %%
ARMS = {
    "mismatch": ["rl.loss=token_reinforce", "engine.dtype=bfloat16"],
    "exact": ["rl.loss=token_reinforce", "engine.exact=true"],
    "tis_mis": ["rl.loss=token_reinforce_tis_mis", "engine.dtype=bfloat16"],
}
FULL = dict(
    table_preset="countdown_hard",
    table_sets=["sft.steps=0"],
    table_prompts=16,
    table_fast=False,
    steps=40,
    budget=["rl.prompts_per_step=16", "rl.group_size=8", "eval.prompts=64", "eval.samples=4"],
)
FAST = dict(
    table_preset="fixture",
    table_sets=[],
    table_prompts=4,
    table_fast=True,
    steps=4,
    budget=["rl.prompts_per_step=8", "rl.group_size=8", "eval.prompts=16", "eval.samples=4"],
)
COLORS = {"mismatch": "tab:red", "exact": "tab:blue", "tis_mis": "tab:green"}


# %%
def sources_table(s: dict) -> list:
    """Step 1: `minirl diagnose` as a function: one Row per comparison."""
    cfg = make_config(s["table_preset"], s["table_sets"])
    return diagnose(cfg, prompts=s["table_prompts"], fast=s["table_fast"], log=lambda *a: None)


# %%
def train_arm(arm: str, s: dict, out: Path, seed: int = 0) -> list[dict]:
    """`minirl train --preset fixture --set ...` for one arm; returns its metrics.jsonl."""
    sets = [*s["budget"], *ARMS[arm], f"rl.steps={s['steps']}", f"rl.seed={seed}"]
    shutil.rmtree(out / arm, ignore_errors=True)
    Run(make_config("fixture", sets), out / arm, log=lambda *a: None, progress=False).train()
    return read_metrics(out / arm)


# %%
def column(records: list[dict], key: str) -> np.ndarray:
    return np.array([np.nan if r.get(key) is None else r[key] for r in records], np.float64)


# %%
def summarise(arm: str, records: list[dict], exact_reward: np.ndarray, heldout: dict) -> dict:
    reward = column(records, "reward/mean")
    q = max(1, len(reward) // 4)
    return {
        "reward_first_quarter": float(np.mean(reward[:q])),
        "reward_last_quarter": float(np.mean(reward[-q:])),
        "reward_mean": float(np.mean(reward)),
        "heldout_pass@1": heldout["pass@1"],
        "dlogp_mean": float(np.nanmean(column(records, "mismatch/mean_abs_dlogp"))),
        "dlogp_max": float(np.nanmax(column(records, "mismatch/max_abs_dlogp"))),
        "dlogp_max_per_step": column(records, "mismatch/max_abs_dlogp").tolist(),
        "rejected_sequences": float(
            np.nanmean(column(records, "train/rejected_sequence_fraction"))
        ),
        "zero_centred_pos": float(np.nanmean(column(records, "train/zero_centred_pos"))),
        "zero_centred_neg": float(np.nanmean(column(records, "train/zero_centred_neg"))),
        "zero_centred_abs_max": float(
            np.nanmax(
                np.abs(
                    np.r_[
                        column(records, "train/zero_centred_pos"),
                        column(records, "train/zero_centred_neg"),
                    ]
                )
            )
        ),
        "steps_equal_to_exact": int(np.sum(reward == exact_reward)),
    }


# %%
def plot(rows, runs: dict, summary: dict, path: Path) -> None:
    fig = Figure(figsize=(13, 8.5), layout="constrained")
    (a, b), (c, d) = fig.subplots(2, 2)
    for arm, records in runs.items():
        steps = column(records, "step")
        dlogp = column(records, "mismatch/mean_abs_dlogp")
        if np.all(dlogp == 0):
            a.plot([], [], color=COLORS[arm], label=f"{arm}: 0 at every step (not drawable on log)")
        else:
            p95 = float(np.percentile(dlogp, 95))
            a.semilogy(
                steps, dlogp, ".-", color=COLORS[arm], label=f"{arm} (p95 over steps {p95:.1e})"
            )
        wide = arm == "exact"  # drawn wide and pale: where mismatch equals it, both show
        b.plot(
            steps,
            column(records, "reward/mean"),
            "-" if wide else ".--",
            color=COLORS[arm],
            lw=4 if wide else 1.2,
            alpha=0.45 if wide else 1.0,
            label=arm,
            zorder=1 if wide else 2,
        )
    a.set_title("mean |log π − log μ| per step (RLAX Fig. 5 in miniature)", fontsize=10)
    a.set_xlabel("step")
    a.legend(fontsize=8)
    b.set_title("batch reward (the arms share prompts and sampling keys)", fontsize=10)
    b.set_xlabel("step")
    b.legend(fontsize=8)
    names = [f"{r.source}: {r.compares.split(': ')[-1]}"[:60] for r in rows]
    y = np.arange(len(rows))
    floor = 1e-9  # zeros are drawn at the floor, and labelled
    c.barh(y - 0.2, [max(r.mean, floor) for r in rows], 0.4, label="mean |Δ log p|")
    c.barh(y + 0.2, [max(r.max, floor) for r in rows], 0.4, label="max |Δ log p|")
    for i, r in enumerate(rows):
        if r.max == 0:
            c.text(2 * floor, i, "exactly 0", va="center", fontsize=7)
    c.set_xscale("log")
    c.set_yticks(y, names, fontsize=7)
    c.invert_yaxis()
    c.set_title("sources of mismatch on the same rollouts (minirl diagnose)", fontsize=10)
    c.legend(fontsize=8)
    records = runs["tis_mis"]
    d.plot(
        column(records, "step"),
        column(records, "train/rejected_sequence_fraction"),
        ".-",
        color=COLORS["tis_mis"],
        label="tis_mis: sequences rejected",
    )
    for arm, records in runs.items():
        net = column(records, "train/zero_centred_pos") + column(records, "train/zero_centred_neg")
        d.plot(
            column(records, "step"),
            net,
            color=COLORS[arm],
            lw=0.8,
            ls="--",
            label=f"{arm}: Σ A·(π/μ − 1), net",
        )
    d.axhline(0, color="gray", lw=0.5)
    d.set_title("rejected sequences (tis_mis) and Σ A·(π/μ − 1) per step", fontsize=10)
    d.set_xlabel("step")
    d.legend(fontsize=8)
    fig.suptitle("Training–inference mismatch in miniature (fixture task, token REINFORCE)")
    fig.savefig(path, dpi=100)


# %%
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="a small table and short runs (CI)")
    parser.add_argument("--out", default="runs/tutorials/08_training_inference_mismatch")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    s = FAST if args.fast else FULL
    t0, load0 = time.perf_counter(), os.getloadavg()
    print(
        f"mode: {'fast' if args.fast else 'full'}   cores: {os.cpu_count()}   "
        f"load average: {load0[0]:.1f}"
    )

    # Step 1: the sources, one at a time, on the same rollouts.
    t = time.perf_counter()
    rows = sources_table(s)
    sets = "".join(f" --set {x}" for x in s["table_sets"])
    print(
        f"\nStep 1. minirl diagnose --preset {s['table_preset']}{sets}"
        f"{' --fast' if s['table_fast'] else ''} ({time.perf_counter() - t:.0f} s)"
    )
    print("  " + format_table(rows).replace("\n", "\n  "))
    by_source = {}
    for r in rows:
        by_source.setdefault(r.source, r)  # the first row of each source
    fp32, bf16 = by_source["recompute"], by_source["dtype"]
    table_claims = {
        "exact_rows_are_zero": all(r.ok for r in rows),
        "fp32_rows_are_rounding_noise": all(r.max < 1e-4 for r in rows if r.source != "dtype"),
        "bf16_engine_100x_above_fp32": bf16.mean > 100 * fp32.mean,
    }
    print(
        f"  -> bf16 engine vs fp32 trainer: mean |Δ log p| {bf16.mean:.1e}, "
        f"{bf16.mean / max(fp32.mean, 1e-12):.0f}x the fp32 engine's {fp32.mean:.1e}; "
        f"exact rows 0: {table_claims['exact_rows_are_zero']}"
    )

    # Step 2: the three runs.
    print(
        f"\nStep 2. three runs of {s['steps']} steps: minirl train --preset fixture "
        f"--set {' --set '.join(s['budget'])} --set <the arm's overrides>"
    )
    runs, seconds = {}, {}
    for arm in ARMS:
        t = time.perf_counter()
        runs[arm] = train_arm(arm, s, out)
        seconds[arm] = time.perf_counter() - t
        print(f"  {arm:9s} --set {' --set '.join(ARMS[arm])}   ({seconds[arm]:.0f} s)")
    print(
        f"\n  {'step':>4s}"
        + "".join(f"{a + ' reward':>17s}" for a in ARMS)
        + "".join(f"{a + ' |Δ|':>14s}" for a in ARMS)
    )
    for i in range(s["steps"]):
        rewards = "".join(f"{runs[a][i]['reward/mean']:17.3f}" for a in ARMS)
        dl = "".join(f"{runs[a][i]['mismatch/mean_abs_dlogp']:14.2e}" for a in ARMS)
        print(f"  {i + 1:4d}{rewards}{dl}")

    # Step 3: one evaluator for every final policy, and the summary.
    base = Run(
        make_config("fixture", s["budget"]), out / "eval", log=lambda *a: None, progress=False
    )
    exact_reward = column(runs["exact"], "reward/mean")
    summary = {}
    for arm in ARMS:
        ckpt = CheckpointManager(out / arm).restore()
        heldout = base.evaluate(base.engine(ckpt.step, ckpt.params))
        summary[arm] = summarise(arm, runs[arm], exact_reward, heldout)
    before = json.loads((out / "exact" / "summary.json").read_text())["before"]["pass@1"]
    print(f"\nStep 3. summary (held-out pass@1 by one fp32 evaluator; before RL: {before:.3f})")
    print(
        f"  {'arm':9s}{'reward first->last quarter':>28s}{'held-out p@1':>13s}{'mean |Δ|':>10s}"
        f"{'max |Δ|':>9s}{'rej. seq':>9s}{'Σ A(c-1) +':>11s}{'Σ A(c-1) -':>11s}"
        f"{'= exact':>8s}"
    )
    for arm, r in summary.items():
        print(
            f"  {arm:9s}{r['reward_first_quarter']:19.3f} -> {r['reward_last_quarter']:.3f}"
            f"{r['heldout_pass@1']:13.3f}{r['dlogp_mean']:10.1e}{r['dlogp_max']:9.1e}"
            f"{r['rejected_sequences']:9.3f}{r['zero_centred_pos']:11.1e}"
            f"{r['zero_centred_neg']:11.1e}{r['steps_equal_to_exact']:5d}/{s['steps']}"
        )

    # Step 4: the claims.
    claims = {
        **table_claims,
        "exact_run_zero_mismatch_every_step": all(
            x == 0.0 for x in summary["exact"]["dlogp_max_per_step"]
        ),
        "exact_run_zero_centred_sums_zero": summary["exact"]["zero_centred_abs_max"] == 0.0,
        "bf16_runs_mismatch_above_1e-4": min(
            summary[a]["dlogp_mean"] for a in ("mismatch", "tis_mis")
        )
        > 1e-4,
        "tis_mis_rejects_sequences": summary["tis_mis"]["rejected_sequences"] > 0,
        "mismatch_run_no_rejection": summary["mismatch"]["rejected_sequences"] == 0,
    }
    print("\nStep 4. the claims, checked")
    for name, ok in claims.items():
        print(f"  {name:40s} {ok}")
    gap = summary["mismatch"]["reward_mean"] - summary["exact"]["reward_mean"]
    print(
        f"  collapse under mismatch? mean batch reward mismatch {summary['mismatch']['reward_mean']:.3f}"
        f" vs exact {summary['exact']['reward_mean']:.3f} (difference {gap:+.3f}); "
        f"held-out pass@1 {summary['mismatch']['heldout_pass@1']:.3f} vs "
        f"{summary['exact']['heldout_pass@1']:.3f}"
    )
    if not all(claims.values()):
        raise SystemExit(f"a claim of the lesson failed: {claims}")

    # Step 5: the figure.
    plot(rows, runs, summary, out / "mismatch.png")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    results = {
        "mode": "fast" if args.fast else "full",
        "settings": {k: v for k, v in s.items()},
        "arms": ARMS,
        "sources": [r.__dict__ for r in rows],
        "runs": summary,
        "seconds_per_arm": seconds,
        "claims": claims,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "load_average": [load0, os.getloadavg()],
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out / 'mismatch.png'} and {out / 'results.json'}")
    print(
        f"wall {results['wall_s']:.0f} s, CPU {results['cpu_s']:.0f} s, load average "
        f"{load0[0]:.1f} -> {os.getloadavg()[0]:.1f}"
    )


# %%
if __name__ == "__main__":
    main()
