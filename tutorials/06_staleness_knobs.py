# %% [markdown]
"""Lesson 06 — the staleness knobs j and k: reward against steps and against wall-clock time.

    python tutorials/06_staleness_knobs.py         # full mode (about 3 min on 2 shared cores)
    python tutorials/06_staleness_knobs.py --fast  # fast mode (about 30 s; the `fixture` task)

Writes `reward_vs_step_and_time.png`, `results.json` and one run directory per setting (`runs/`)
into `--out` (default `runs/tutorials/06_staleness_knobs`). Uses `minirl.run.runner.Run` with the
`async` scheduler (minirl/control/async_loop.py) and the knobs `rl.reload_every` (j), `rl.max_lag` (k)
and `rl.eta`. Mirrors, in miniature: RLAX Fig. 4 (reward against steps and against wall-clock
time for two staleness settings) and RLAX §3.1.


THE IDEA
--------
A synchronous RL step has two halves that wait for each other: the engine generates while the
trainer is idle, then the trainer trains while the engine is idle. To overlap them, the engine
must generate the NEXT batches with the weights it has while the trainer is still producing newer
ones, so the trainer gets data that is a few versions old (stale). RLAX controls how stale with two
knobs (minirl/control/controller.py):

  j = rl.reload_every   the engine loads new weights only every j-th version. A reload costs
                        (an interrupt, a weight transfer), so large j reloads less often, and the
                        data it generates meanwhile grows staler.
  k = rl.max_lag        the trainer accepts a rollout only if its oldest token is at most k
                        versions behind the version this step produces (on-policy data has lag 1).
                        Older rollouts are discarded and counted (`count/groups_stale`).

and minirl adds AReaL's eta = rl.eta: generation may run at most eta batches ahead of training
(0 = synchronous). This lesson sets eta = k - 1, the furthest ahead that k can still accept.

  (j, k) = (1, 1)   on-policy and synchronous: reload every version, accept only fresh data
  (1, 2)            one-step off-policy: the engine generates batch v+1 while the trainer trains
                    on batch v (PipelineRL, "one-step-off" in many systems)
  (4, 4)            the engine reloads every 4 versions and the trainer accepts up to lag 4:
                    k = j, so when the engine's data reaches lag 4 the trainer must wait for a
                    reload. RLAX Fig. 4's "stale-16" in miniature (there j = k = 16).
  (4, 8)            the same reload interval, but the trainer also accepts lag 5..8, so it keeps
                    training on data already generated while the engine catches up: k = 2j,
                    RLAX Fig. 4's "stale-32" (j = 16, k = 32).

RLAX's result (Codeforces, a large model): the two settings of Fig. 4 gained about the same reward
per STEP, but k = 2j cut the mean step time from 75 s to 45 s, so it gained more reward per
second of WALL-CLOCK. Staleness bought throughput without hurting the learning curve. RLAX also
reports that in other runs (a 3B model, few samples) high staleness did slow learning per step:
the effect depends on the workload.

Here the four settings run with the `async` scheduler: a rollout thread drives the engine while
the trainer thread trains (JAX releases the GIL inside compiled calls, so the two really run at
the same time on two cores). The task, model and warm start are lesson 05's (reused from the cache
when lesson 05 ran first), with 16 prompts x 8 samples per step and 40 steps per setting.

Two warnings for reading the numbers. (1) Wall-clock results depend on the machine: on two cores
the engine and the trainer compete for the same cores, and XLA already spreads one computation
over both, so overlap gains less here than on separate accelerators. The lesson prints the CPU
load. (2) Async runs are not guaranteed to be bitwise reproducible: which batch gets which
rollouts may depend on timing, so the reward curves may differ a little from run to run.

ON A CORE EACH (figures/06_apart.png)
------------------------------------
What happens when generation and training do NOT share cores, as on the papers' separate
accelerators? `python experiments/apart.py` (~8 min, not run by this lesson) puts the engine in
a Ray actor pinned to core 0 and the trainer in one pinned to core 1 (scale/ray_workers.py) and
trains DAPO-style countdown (binary reward, dynamic filter: the two phases then take about as
long, 0.64-0.66 s of generation against 0.78-0.79 s of training per step). Measured twice on
2026-11-25 (docs/staleness.md has the table): the async scheduler with eta = 1 or 2 was
1.62-1.71x faster per step than lockstep on a core each, 0.89-0.94 of the ideal
(t_gen + t_train) / max(t_gen, t_train) = 1.82-1.84x, and reached the same held-out pass@1
1.20-1.53x sooner. But lockstep in ONE process on BOTH cores was just as fast (0.92-0.94 s per
step): on two cores, overlapping the phases wins back what giving each phase only one core cost.
The overlap pays where each part has devices it cannot share.
The same placement with this lesson's staler settings (`--arms apart_sync apart_eta1 apart_j4_k4
apart_j4_k8 --steps 40`, 2026-11-25): (4, 4) 0.99 s and (4, 8) 0.93 s per step, 1.54x and 1.64x
faster than lockstep apart. k = 2j saves 6% of the step here, not RLAX's 40%: the trainer is the
slower part on its core (it waits under 10 ms for a batch), so what k = j discards (777 groups
against 488) costs only the engine's spare time. Where generation is the bottleneck the gap
appears: lesson 13 runs the same comparison on simulated TPUs (0.55 of the step time).

WHAT THE SCRIPT DOES
--------------------
1. Builds one config per (j, k): `make_config("arithmetic", overrides)` with
   `rl.scheduler=async`, `rl.reload_every=j`, `rl.max_lag=k`, `rl.eta=k-1` (fast mode: the
   `fixture` task, 8 steps).
2. Runs each with `Run(cfg, run_dir).train()` and reads its metrics.jsonl.
3. Prints, per setting: the lag of the data trained on (mean, and the stalest step), the groups
   discarded as too stale, how far generation ran ahead (batches generated and still to be
   trained on after a step, what eta bounds), the mean step time, the share of it the trainer
   spent waiting for data, and the reward. Checks the bound: no batch was older than k.
4. Plots reward against steps and against wall-clock seconds (RLAX Fig. 4).

Expected output (full mode, measured)
-------------------------------------
Measured on 2026-11-23 with `python tutorials/06_staleness_knobs.py --out /tmp/st2/l06`, library
at commit ee031fa (after the eta fix: eta bounds the groups still to be trained on), on a shared
virtual machine with 2 cores (nproc = 2), under load from other jobs (load average 4-6). It took
167 s of wall time and 164 s of CPU time (user + sys): the whole lesson got about one core's worth
of the machine. The warm start was loaded from the cache that lesson 05 had filled; without it,
add about 140 s of CPU time. The figure is figures/06_staleness_knobs.png.

What reproduces, and what does not:

- The bounds hold, and the lag behaves as the knobs say. (1, 1) trained only on fresh data (lag
  1 on every step). (1, 2) trained on one-step-old data (lag 2 on almost every step). With j = 4
  the lag cycles as the engine falls behind and reloads (mean 2.5 and 3.4, worst 4 and 5).

- eta holds the run-ahead steady. After every step exactly eta batches waited to be trained on in
  (1, 2) and (4, 4) (1.00 and 3.00 in the run-ahead column); (4, 8) averaged 6.4 of its 7 (the
  engine could not always keep up). Because the trainer prefers the freshest groups, the older
  ones age past k and are discarded, and eta lets the engine replace them: 432 of the 1120 groups
  generated for (4, 4) and 384 of 1136 for (4, 8) were thrown away (39% and 34%). An earlier
  measurement, before eta stopped counting discarded groups, discarded only 48 and 96: there each
  discard shortened the run-ahead for good, until generation no longer ran ahead at all. AReaL
  trains on the oldest data first, which wastes nothing (lesson 07, `rl.batch_order=oldest`).

- Time per step: RLAX's result does NOT reproduce on this machine. One-step-off (1, 2) was 8%
  faster per step than (1, 1) (0.80 s against 0.88 s; its trainer never waited, against 24% of
  the step for (1, 1)), but the two j = 4 settings were 3-4% slower than (1, 1), although their
  trainers barely waited (6% and 1%). Their engines generated 1.75x as many groups as were trained
  on, and that discarded work ran on the same two cores as the trainer: the trainer's own time
  per step grew from 0.66 s in (1, 1) to 0.80 s in (1, 2) and 0.85-0.89 s with j = 4. RLAX runs
  generation and training on separate accelerators, where the overlap is real and extra
  generation does not slow the trainer. A warning about timing on a shared machine: a run of the
  same command at load 12-18 (library at b79de54) printed step-time ratios of 0.65x and 0.82x,
  the RLAX direction; under heavy load a process with two busy threads gets a larger share of the
  crowded CPUs than one with a single busy thread, so that "gain" came from the operating
  system's scheduler, not from the algorithm. (Steps are 2.6x shorter than in the measurement at
  commit d47d9f8, 2.28 s for (1, 1), at lower load and with a library changed since.)

- Reward per step: (1, 1) and (1, 2) printed the same final rewards (0.718 and 0.706) and
  held-out pass@1 (0.688 -> 0.746) as the earlier measurement to the last digit: sampling keys
  are counter-based, and with j = 1 a batch's rollouts depend on which prompts and weights it
  got, not on when. (4, 4) ended at 0.695 (held-out 0.748), (4, 8) at 0.670 (held-out 0.705); the
  (4, 8) curve dips to 0.62 between steps 25 and 35, the stalest data of the four. One run, and
  the earlier measurement of (4, 8) (0.693, held-out 0.736) did not show it, so it may be noise;
  at lesson 05's learning rate (1e-4) 40 steps move the policy too little for 4-8 versions of
  staleness to matter clearly. Lesson 07 makes the data much staler and shows when it does.

    mode: full   preset 'arithmetic' with ['task.args.max_operands=3', 'task.args.max_digits=2', 'model.dim=128', 'model.head_dim=32', 'model.mlp_dim=384', 'sft.steps=300', 'rl.steps=40', 'rl.prompts_per_step=16', 'rl.scheduler=async', 'rl.checkpoint_every=1000', 'eval.prompts=64']
    load average at the start: 4.1 (on 2 CPUs)

    Step 1-2. one run per (j, k) with eta = k - 1: Run(cfg, run_dir).train()
      j = 1, k = 1: 40 steps in   55s wall,   54s CPU (load average 5.0)
      j = 1, k = 2: 40 steps in   34s wall,   34s CPU (load average 5.4)
      j = 4, k = 4: 40 steps in   39s wall,   38s CPU (load average 6.3)
      j = 4, k = 8: 40 steps in   39s wall,   38s CPU (load average 6.2)

    Step 3. per setting (times exclude step 1, which compiles; final reward = mean of the last 10 steps)
       j  k  lag: mean worst  stale groups  run-ahead  step time  trainer waits  final reward  held-out pass@1
       1  1       1.00  1.00             0       0.00      0.88s           24%         0.718   0.688 -> 0.746
       1  2       1.98  2.00             0       1.00      0.80s            0%         0.706   0.688 -> 0.746
       4  4       2.50  4.00           432       3.00      0.91s            6%         0.695   0.688 -> 0.748
       4  8       3.40  5.00           384       6.41      0.91s            1%         0.670   0.688 -> 0.705
      -> every batch within its bound k: True (the controller also asserts it for every group: a violation would have stopped the run)
      -> step time relative to (1, 1): (j=1, k=1) 1.00x,  (j=1, k=2) 0.92x,  (j=4, k=4) 1.03x,  (j=4, k=8) 1.04x

    wall time 167s, CPU time 164s, load average now 6.2
    wrote /tmp/st2/l06/reward_vs_step_and_time.png and /tmp/st2/l06/results.json
"""

# %%
from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from minirl.measure.metrics_log import read_metrics
from minirl.run.presets import make_config
from minirl.run.runner import Run

SETTINGS = ((1, 1), (1, 2), (4, 4), (4, 8))  # (j, k)
# Lesson 05's task, model and warm start (reused from the cache when lesson 05 ran first).
LESSON_05 = [
    "task.args.max_operands=3",
    "task.args.max_digits=2",
    "model.dim=128",
    "model.head_dim=32",
    "model.mlp_dim=384",
    "sft.steps=300",
]
FULL = dict(
    preset="arithmetic",
    overrides=[
        *LESSON_05,
        "rl.steps=40",
        "rl.prompts_per_step=16",  # x group_size 8 = 128 rollouts per step
        "rl.scheduler=async",
        "rl.checkpoint_every=1000",  # only the final checkpoint
        "eval.prompts=64",
    ],
    last=10,  # "final reward" = mean training reward over the last 10 steps
)
FAST = dict(
    preset="fixture",
    overrides=["rl.steps=8", "rl.scheduler=async", "rl.checkpoint_every=1000", "eval.prompts=8"],
    last=3,
)


# %%
def train(preset: str, overrides: list[str], run_dir: Path) -> tuple[dict, list[dict], dict]:
    """One run from scratch: (summary, metrics records, wall/CPU seconds and load)."""
    shutil.rmtree(run_dir, ignore_errors=True)  # an existing run directory would be resumed
    t0, c0 = time.perf_counter(), time.process_time()
    summary = Run(
        make_config(preset, overrides), run_dir, log=lambda *a: None, progress=False
    ).train()
    cost = {
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - c0,
        "load_after": os.getloadavg()[0],
    }
    return summary, read_metrics(run_dir), cost


# %%
def plot(runs: dict, path: Path) -> None:
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    ax, bx = fig.subplots(1, 2, sharey=True)
    for (j, k), run in runs.items():
        records = run["records"]
        reward = np.array([r["reward/mean"] for r in records])
        window = min(5, len(reward))
        smooth = np.convolve(reward, np.ones(window) / window, mode="valid")
        seconds = np.array([r["wall_time"] for r in records]) - records[0]["wall_time"]
        style = dict(
            label=f"j = {j}, k = {k}",
            color="tab:blue" if j == 1 else "tab:orange",  # one colour per reload interval j
            linestyle="-" if k > j else "--",
        )
        ax.plot(np.arange(window, len(reward) + 1), smooth, **style)
        bx.plot(seconds[window - 1 :], smooth, **style)
    ax.set_xlabel("RL step (= weight version)")
    ax.set_ylabel("training reward (5-step moving average)")
    ax.set_title("reward per step", fontsize=9)
    bx.set_xlabel("wall-clock seconds since the end of step 1 (which compiles)")
    bx.set_title("reward per second (k = j dashed, k > j solid)", fontsize=9)
    for a in (ax, bx):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.savefig(path, dpi=110)


# %%
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="the fixture task, seconds (CI)")
    parser.add_argument("--out", default="runs/tutorials/06_staleness_knobs")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    s = FAST if args.fast else FULL
    last = s["last"]
    wall0, cpu0 = time.perf_counter(), time.process_time()
    print(
        f"mode: {'fast' if args.fast else 'full'}   preset {s['preset']!r} with {s['overrides']}"
        f"\nload average at the start: {os.getloadavg()[0]:.1f} (on {os.cpu_count()} CPUs)"
    )

    # Step 1 and 2: one run per (j, k), eta = k - 1.
    print("\nStep 1-2. one run per (j, k) with eta = k - 1: Run(cfg, run_dir).train()")
    runs = {}
    for j, k in SETTINGS:
        overrides = [*s["overrides"], f"rl.reload_every={j}", f"rl.max_lag={k}", f"rl.eta={k - 1}"]
        summary, records, cost = train(s["preset"], overrides, out / "runs" / f"j{j}_k{k}")
        pps = make_config(s["preset"], overrides).rl.prompts_per_step
        runs[(j, k)] = {"records": records, "summary": summary, "prompts_per_step": pps, **cost}
        print(
            f"  j = {j}, k = {k}: {len(records)} steps in {cost['seconds']:4.0f}s wall, "
            f"{cost['cpu_seconds']:4.0f}s CPU (load average {cost['load_after']:.1f})"
        )

    # Step 3: what each setting did.
    print(
        f"\nStep 3. per setting (times exclude step 1, which compiles; final reward = mean of "
        f"the last {last} steps)"
    )
    print(
        f"  {'j':>2s} {'k':>2s}  {'lag: mean':>9s} {'worst':>5s}  {'stale groups':>12s}  "
        f"{'run-ahead':>9s}  {'step time':>9s}  {'trainer waits':>13s}  {'final reward':>12s}  "
        f"{'held-out pass@1':>15s}"
    )
    rows, bound_ok = {}, True
    for (j, k), run in runs.items():
        rec = run["records"]
        lags = [r["lag/mean"] + 1 for r in rec]  # lag of each batch (mean over its groups)
        bound_ok &= max(lags) <= k
        step, wait = (
            float(np.mean([r[key] for r in rec[1:]])) for key in ("time/step", "time/wait")
        )
        # how far generation ran ahead: batches generated and still to be trained on after a
        # step (the quantity eta bounds; stale discards are out of it, so they get replaced)
        ahead = [
            (r["count/groups_produced"] - r["count/groups_stale"] - r["count/groups_trained"])
            / run["prompts_per_step"]
            for r in rec
        ]
        row = {
            "mean_lag": float(np.mean(lags)),
            "worst_step_lag": float(max(lags)),
            "stale_groups": int(rec[-1]["count/groups_stale"]),
            "run_ahead_batches": float(np.mean(ahead)),
            "step_seconds": step,
            "wait_fraction": wait / step,
            "final_reward": float(np.mean([r["reward/mean"] for r in rec[-last:]])),
            "pass@1_before": run["summary"]["before"]["pass@1"],
            "pass@1_after": run["summary"]["after"]["pass@1"],
        }
        rows[f"j{j}_k{k}"] = row
        print(
            f"  {j:2d} {k:2d}  {row['mean_lag']:9.2f} {row['worst_step_lag']:5.2f}  "
            f"{row['stale_groups']:12d}  {row['run_ahead_batches']:9.2f}  {step:8.2f}s  "
            f"{row['wait_fraction']:12.0%}  "
            f"{row['final_reward']:12.3f}  {row['pass@1_before']:6.3f} -> {row['pass@1_after']:.3f}"
        )
    base = rows["j1_k1"]["step_seconds"]
    print(
        f"  -> every batch within its bound k: {bound_ok} (the controller also asserts it for "
        "every group: a violation would have stopped the run)"
    )
    print(
        "  -> step time relative to (1, 1): "
        + ",  ".join(
            f"(j={name[1]}, k={name.split('k')[1]}) {row['step_seconds'] / base:.2f}x"
            for name, row in rows.items()
        )
    )

    plot(runs, out / "reward_vs_step_and_time.png")
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    print(
        f"\nwall time {wall:.0f}s, CPU time {cpu:.0f}s, load average now {os.getloadavg()[0]:.1f}"
    )
    (out / "results.json").write_text(
        json.dumps(
            {
                "mode": "fast" if args.fast else "full",
                "preset": s["preset"],
                "overrides": s["overrides"],
                "bound_holds": bound_ok,
                "settings": rows,
                "reward_per_step": {
                    f"j{j}_k{k}": [r["reward/mean"] for r in run["records"]]
                    for (j, k), run in runs.items()
                },
                "seconds": wall,
                "cpu_seconds": cpu,
            },
            indent=1,
        )
    )
    print(f"wrote {out / 'reward_vs_step_and_time.png'} and {out / 'results.json'}")
    if not bound_ok:
        raise SystemExit("a batch was staler than its bound k: see the table above")


# %%
if __name__ == "__main__":
    main()
