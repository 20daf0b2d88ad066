"""Lesson 07 — asynchronous RL and decoupled PPO: naive PPO against decoupled PPO on stale data.

    python tutorials/07_async_decoupled_ppo.py         # full mode (about 6 min of CPU time)
    python tutorials/07_async_decoupled_ppo.py --fast  # fast mode (about 15 s; what CI runs)

Writes `naive_vs_decoupled.png`, `results.json` and one run directory per setting (`runs/`) into
`--out` (default `runs/tutorials/07_async_decoupled_ppo`). Uses `minirl.runner.Run` with
`rl.eta`, `rl.batch_order` and the loss presets `naive_ppo` and `decoupled_ppo`
(minirl/losses/presets.py). Mirrors, in miniature: AReaL Table 2 and Fig. 5 (final accuracy for
maximum staleness eta in {0, 1, 2, 4, 8, 16, inf}, with and without the decoupled objective).


THE IDEA
--------
In a synchronous run (lesson 05) the engine waits while the trainer trains, and the trainer waits
while the engine generates. An ASYNCHRONOUS system lets the engine keep generating while the
trainer trains (lesson 06). The price is STALENESS: a batch may have been sampled by weights that
are several versions old. AReaL bounds it with one knob, eta: generation may run at most eta
batches ahead of training (minirl: `rl.eta`; eta = 0 is synchronous). AReaL also trains on the
OLDEST data in its buffer first, so once generation is eta batches ahead, every batch is exactly
eta versions old. minirl's default is RLAX's order (the freshest data first; whatever ages past k
is discarded, lesson 06); `rl.batch_order=oldest` gives AReaL's, which this lesson uses.

Three policies meet in one train step on stale data:

    mu        the BEHAVIOUR policy: the old weights that sampled the tokens (log mu comes from
              the engine with every token, lesson 02)
    pi_prox   the PROXIMAL policy: the weights this train step starts from (the trainer
              recomputes log pi_prox for every token)
    pi_theta  the policy being optimised in this step

PPO keeps pi_theta close to an "old" policy with a clipped ratio. Which policy is the old one?

  naive PPO      (AReaL Eq. 2 with pi_old = mu) the ratio is u = pi_theta / mu, clipped to
                 [0.8, 1.2]. On stale data u is far from 1 BEFORE the step has changed anything,
                 because pi_prox has already moved away from mu over eta versions. A token with
                 A > 0 whose probability has grown by more than 20% since it was sampled, or a
                 token with A < 0 whose probability has shrunk by more than 20%, starts outside
                 the trust region, and its gradient is masked (lesson 04: the clip is a MASK).
                 The trust region sits around an old policy: AReaL calls this the "improper
                 clipping centre".
  decoupled PPO  (AReaL Eq. 5) the trust region is centred on pi_prox: the clipped ratio is
                 r = pi_theta / pi_prox, and an importance weight c = pi_prox / mu, under
                 stop-gradient, corrects for the staleness:  sum_t sg[c] min(r A, clip(r) A).

In minirl's Eq. 3 both are built from the same parts (token mean, IS = c, group-normalised and
whitened advantages, a clipped ratio); only the clip's centre differs: `ClippedRatio(centre=
"behaviour")` in `naive_ppo`, `centre="proximal"` in `decoupled_ppo`. On fresh data c = 1, up to
the tiny training-inference mismatch of lesson 01, and the two losses are the same. That is why
AReaL's Table 2 has a single "oracle" number at eta = 0, and why this lesson runs that row once.

AReaL's result (a 1.5B model, 250 steps, math): naive PPO loses accuracy on stale data (AIME24
42.0 at eta = 0, 23.3 at eta = 4, 35.8 at eta = 16), while decoupled PPO stays close to the
oracle (42.2 at eta = 4, 38.7 at eta = 16).

THE TASK AND THE SCHEDULE. The grid has 7 settings, and at this scale one run is noisy, so each
runs with two seeds: 14 runs in all. To fit in minutes, the lesson uses minirl's smallest task,
the one the tests use (`fixture`, minirl/data/fixture.py): the prompt is a number such as `482:`,
and any completion that starts with a digit of the same parity earns reward 1. A randomly
initialised model (no warm start) writes a digit about 7% of the time. Learning to "write a
digit" lifts the reward to about 0.5; reading the prompt's last digit and matching its parity
lifts it to 1. Each run has 100 steps of 32 prompts x 8 samples, with a learning rate of 3e-3
and ONE update per step (as in lessons 05 and 06). So decoupled PPO's own clip never acts (r = 1
when the gradient is taken), and the comparison isolates what differs: the centre of naive PPO's
clip, and decoupled PPO's weight c. AReaL makes several mini-batch updates per step
(`trainer.num_minibatches`).

The runs use the LOCKSTEP scheduler. Generation runs eta batches ahead LOGICALLY: the engine
produces the next batches with the weights it has, then the trainer trains. So the staleness is
exactly eta on every machine, and every run is bitwise reproducible. (Lesson 06 uses the
free-running `async` scheduler, where wall-clock time is the point.)

WHAT THE SCRIPT DOES
--------------------
1. Builds one config per (loss, eta, seed): `make_config("fixture", overrides)` with
   `rl.eta=<eta>`, `rl.batch_order=oldest`, `rl.loss=naive_ppo|decoupled_ppo`, `rl.seed` and
   `sft.seed` (the initial weights). Fast mode: 8 steps, eta in {0, 1, 4}, one seed.
2. Runs each with `Run(cfg, run_dir).train()` and reads its metrics.jsonl.
3. Checks that the staleness is what eta promises: exactly eta versions on every step after the
   first eta. Prints, per eta, how far mu is from pi_prox (KL and the largest c), which share of
   the tokens each loss clipped, and the share of groups whose 8 samples did not all get the same
   reward (only those carry a learning signal).
4. Prints AReaL Table 2 in miniature: the training reward over the last 10 steps and held-out
   pass@1 after RL, naive against decoupled, per eta. Plots the reward curves and the table.

Expected output (full mode, measured)
-------------------------------------
Measured on 2026-11-23 with `python tutorials/07_async_decoupled_ppo.py --out /tmp/t11/m07/out`,
library at commit b79de54, on a shared virtual machine with 2 cores (nproc = 2), under load from
other jobs (load average 9-15). It took 1,138 s of wall time and 328 s of CPU time (user + sys).
The numbers do not depend on the machine's load: the same 14 runs made earlier, a few at a time,
gave the same held-out pass@1 to the last printed digit. The figure is
figures/07_async_decoupled_ppo.png.

The result reproduces only in part, and the part that fails is the paper's main claim.

- The staleness is exactly eta, and the mechanism AReaL describes is there, in large numbers.
  The further mu is from pi_prox (KL 0.02 at eta = 1, 0.22 at eta = 4, 0.79 at eta = 16), the
  more tokens naive PPO's clip masks before the step has changed anything: 5.7%, 21% and 47% of
  them. Decoupled PPO, centred on pi_prox, never clips (one update per batch).

- Naive PPO degrades as eta grows, as in AReaL: held-out pass@1 0.910 at eta = 1, 0.836 at eta =
  4, 0.654 at eta = 16 (training reward 0.897, 0.832, 0.606). With two seeds per setting, eta =
  1 beating the on-policy oracle (0.910 against 0.807) is within the spread between seeds (the
  oracle's two seeds: 0.73 and 0.88).

- Decoupled PPO does NOT hold the oracle's level: it ends lower than naive PPO at eta = 1 and 4
  (0.678 and 0.662), and ties it at eta = 16 (0.656 against 0.654). All 6 of its stale runs
  stopped improving by step 40, 4 of them at a training reward of about 0.5, the level of "write
  any digit", and 2 at about 0.65. By then almost every group's 8 samples got the same reward
  (mixed groups: 0.05-0.10 of the groups on average, 0-0.03 at the end, against 0.22-0.77 for
  naive PPO), so no learning signal was left: the policy had become nearly deterministic before
  it learned the parity rule. Four of those runs (both seeds at eta = 16, seed 1 at eta = 1 and
  4) ended with held-out pass@1 0.656 = 42/64, exactly the share of even numbers among the 64
  test prompts: they answer every prompt with an even digit. The on-policy oracle lost its mixed
  groups too, but later and at a higher reward.

- A reading of why, consistent with these numbers but not proven by them: decoupled PPO
  multiplies each token's gradient by c = pi_prox/mu, which reached 34 at eta = 1 and 599 at eta
  = 4. The largest weights go to tokens the policy already favours much more than when they were
  sampled, so decoupled PPO pushed hardest exactly where the policy was already moving, and it
  collapsed early. Naive PPO's badly centred clip masks those same tokens (A > 0 and pi_theta/mu
  > 1.2), which here acted as a brake and kept the samples diverse for longer. AReaL trains a
  1.5B model with a small learning rate, where a version moves the policy far less than a step
  of 3e-3 moves this tiny one, so c stays near 1.

- Two side measurements support that reading (run with the CLI, not by this script). Capping c
  at 2 (`decoupled_ppo_tis`, lesson 08) removed the early stall: held-out pass@1 0.719, 0.711
  and 0.711 at eta = 1, 4 and 16 (mean of the same two seeds), flat across eta as AReaL reports
  for decoupled PPO, above naive PPO at eta = 16 but still below it at eta = 1 and 4. Command,
  per seed S and eta E: `minirl train --preset fixture --set rl.loss=decoupled_ppo_tis --set
  rl.eta=E --set rl.seed=S --set sft.seed=S --set rl.batch_order=oldest --set rl.steps=100 --set
  rl.prompts_per_step=32 --set rl.group_size=8 --set eval.prompts=64 --set
  rl.checkpoint_every=1000`. And on lesson 05's task (scratchpad addition, its warm start, 40
  steps of 16 prompts x 8 samples, one seed, 32 held-out prompts, before RL 0.680) the picture
  was the same: at learning rate 3e-4, held-out pass@1 0.586 on-policy, 0.496 (naive) and 0.312
  (decoupled) at eta = 4, 0.395 and 0.176 at eta = 16. At lesson 05's learning rate, 1e-4,
  staleness 16 changed nothing: 0.699 on-policy, 0.680 naive, 0.707 decoupled (naive PPO clipped
  0.9% of the tokens). Command: `minirl train --preset arithmetic --set task.args.max_operands=3
  --set task.args.max_digits=2 --set model.dim=128 --set model.head_dim=32 --set
  model.mlp_dim=384 --set sft.steps=300 --set rl.steps=40 --set rl.prompts_per_step=16 --set
  rl.batch_order=oldest --set rl.checkpoint_every=1000 --set eval.prompts=32 --set
  trainer.learning_rate=LR --set rl.loss=LOSS --set rl.eta=E`.

    mode: full   task 'fixture' (parity) with ['rl.scheduler=lockstep', 'rl.batch_order=oldest', 'rl.checkpoint_every=1000', 'rl.steps=100', 'rl.prompts_per_step=32', 'rl.group_size=8', 'eval.prompts=64']

    Step 1-2. one run per (loss, eta, seed), seeds [0, 1]: Run(cfg, run_dir).train()
      seed 0  decoupled_ppo  eta =  0: 100 steps in   54s, final reward 0.685, held-out pass@1 0.062 -> 0.730
      seed 0  naive_ppo      eta =  1: 100 steps in   72s, final reward 0.882, held-out pass@1 0.062 -> 0.883
      seed 0  decoupled_ppo  eta =  1: 100 steps in   78s, final reward 0.682, held-out pass@1 0.062 -> 0.699
      seed 0  naive_ppo      eta =  4: 100 steps in   69s, final reward 0.735, held-out pass@1 0.062 -> 0.742
      seed 0  decoupled_ppo  eta =  4: 100 steps in   87s, final reward 0.637, held-out pass@1 0.062 -> 0.668
      seed 0  naive_ppo      eta = 16: 100 steps in   90s, final reward 0.591, held-out pass@1 0.062 -> 0.562
      seed 0  decoupled_ppo  eta = 16: 100 steps in   98s, final reward 0.478, held-out pass@1 0.062 -> 0.656
      seed 1  decoupled_ppo  eta =  0: 100 steps in   98s, final reward 0.815, held-out pass@1 0.055 -> 0.883
      seed 1  naive_ppo      eta =  1: 100 steps in   83s, final reward 0.912, held-out pass@1 0.055 -> 0.938
      seed 1  decoupled_ppo  eta =  1: 100 steps in   86s, final reward 0.478, held-out pass@1 0.055 -> 0.656
      seed 1  naive_ppo      eta =  4: 100 steps in   88s, final reward 0.930, held-out pass@1 0.055 -> 0.930
      seed 1  decoupled_ppo  eta =  4: 100 steps in   73s, final reward 0.478, held-out pass@1 0.055 -> 0.656
      seed 1  naive_ppo      eta = 16: 100 steps in   70s, final reward 0.621, held-out pass@1 0.055 -> 0.746
      seed 1  decoupled_ppo  eta = 16: 100 steps in   80s, final reward 0.478, held-out pass@1 0.055 -> 0.656

    Step 3. inside the train steps (steps after the first eta; means over steps and seeds)
      eta staleness KL(mu|pi_prox)  max c   clipped tokens: naive decoupled   mixed groups: naive decoupled
        0       0.0         0.0000    1.0                    0.0%      0.0%                  0.17      0.17
        1       1.0         0.0248   33.8                    5.7%      0.0%                  0.22      0.06
        4       4.0         0.2194  599.0                   21.4%      0.0%                  0.44      0.10
       16      16.0         0.7939  524.4                   47.0%      0.0%                  0.77      0.05
      -> staleness = eta on every step after the first eta: True;  decoupled PPO never clips with one update per step (r = pi_theta/pi_prox = 1): True

    Step 4. AReaL Table 2 in miniature: mean over seeds (each seed); training reward = mean of the last 10 steps; held-out pass@1 after RL (before RL: 0.059)
             eta      train reward: naive              decoupled          held-out: naive              decoupled
      0 (oracle)                              0.750 (0.69, 0.81)                              0.807 (0.73, 0.88)
               1       0.897 (0.88, 0.91)     0.580 (0.68, 0.48)       0.910 (0.88, 0.94)     0.678 (0.70, 0.66)
               4       0.832 (0.73, 0.93)     0.558 (0.64, 0.48)       0.836 (0.74, 0.93)     0.662 (0.67, 0.66)
              16       0.606 (0.59, 0.62)     0.478 (0.48, 0.48)       0.654 (0.56, 0.75)     0.656 (0.66, 0.66)
      wall time 1126s, CPU time 326s

    wrote /tmp/t11/m07/out/naive_vs_decoupled.png and /tmp/t11/m07/out/results.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from minirl.config import make_config
from minirl.metrics_log import read_metrics
from minirl.runner import Run

LOSSES = ("naive_ppo", "decoupled_ppo")
COMMON = [
    "rl.scheduler=lockstep",  # eta batches ahead, logically: the same staleness on any machine
    "rl.batch_order=oldest",  # AReaL: train on the oldest data first, so staleness = eta
    "rl.checkpoint_every=1000",  # only the final checkpoint
]
FULL = dict(
    overrides=[
        *COMMON,
        "rl.steps=100",
        "rl.prompts_per_step=32",
        "rl.group_size=8",
        "eval.prompts=64",
    ],
    etas=(0, 1, 4, 16),
    seeds=(0, 1),
    last=10,  # "final reward" = mean training reward over the last 10 steps
)
FAST = dict(overrides=[*COMMON, "rl.steps=8", "eval.prompts=8"], etas=(0, 1, 4), seeds=(0,), last=3)


def settings(etas):
    """(loss, eta) pairs: eta = 0 once (on fresh data the two losses are the same), then both."""
    return [("decoupled_ppo", 0)] + [(loss, eta) for eta in etas if eta > 0 for loss in LOSSES]


def train(overrides: list[str], run_dir: Path) -> tuple[dict, list[dict]]:
    """One run of the parity task from scratch: (summary, metrics records)."""
    shutil.rmtree(run_dir, ignore_errors=True)  # an existing run directory would be resumed
    cfg = make_config("fixture", overrides)
    summary = Run(cfg, run_dir, log=lambda *a: None, progress=False).train()
    return summary, read_metrics(run_dir)


def mean_of(records: list[dict], key: str, start: int = 0) -> float:
    return float(np.mean([r[key] for r in records[start:]]))


def plot(runs: dict, etas, seeds, path: Path) -> None:
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    ax, bx = fig.subplots(1, 2, width_ratios=(3, 2))
    colors = dict(zip(etas, ("black", "tab:blue", "tab:orange", "tab:red"), strict=False))
    for loss, eta in settings(etas):
        reward = np.mean(
            [[r["reward/mean"] for r in runs[(loss, eta, seed)]["records"]] for seed in seeds],
            axis=0,
        )  # mean over seeds, per step
        window = min(10, len(reward))
        smooth = np.convolve(reward, np.ones(window) / window, mode="valid")
        label = "eta = 0 (oracle)" if eta == 0 else f"eta = {eta}, {loss.replace('_', ' ')}"
        ax.plot(
            np.arange(window, len(reward) + 1),
            smooth,
            color=colors[eta],
            linestyle="--" if loss == "naive_ppo" else "-",
            label=label,
        )
    ax.set_xlabel("RL step (= weight version)")
    ax.set_ylabel(f"training reward ({min(10, len(reward))}-step average, mean of seeds)")
    ax.set_ylim(0, 1)
    ax.set_title(
        "naive PPO (dashed) vs decoupled PPO (solid) on data exactly eta versions old", fontsize=9
    )
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    stale = [eta for eta in etas if eta > 0]
    x = np.arange(len(stale))
    for offset, loss, color in (
        (-0.2, "naive_ppo", "tab:gray"),
        (0.2, "decoupled_ppo", "tab:blue"),
    ):
        per_seed = np.array([[runs[(loss, eta, seed)]["after"] for seed in seeds] for eta in stale])
        bars = bx.bar(
            x + offset, per_seed.mean(axis=1), 0.4, color=color, label=loss.replace("_", " ")
        )
        bx.bar_label(bars, fmt="%.2f", fontsize=7)
        for i, values in enumerate(per_seed):  # one dot per seed
            bx.plot([x[i] + offset] * len(values), values, "k.", markersize=4)
    oracle = np.mean([runs[("decoupled_ppo", 0, seed)]["after"] for seed in seeds])
    bx.axhline(oracle, color="black", linestyle=":", label=f"eta = 0 (oracle) {oracle:.2f}")
    bx.set_xticks(x, [f"eta = {eta}" for eta in stale])
    bx.set_ylabel("held-out pass@1 after RL (bars: mean, dots: seeds)")
    bx.set_ylim(0, 1.05)
    bx.set_title("AReaL Table 2 in miniature", fontsize=9)
    bx.legend(fontsize=7, loc="upper right")
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="8 steps, one seed (CI)")
    parser.add_argument("--out", default="runs/tutorials/07_async_decoupled_ppo")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    s = FAST if args.fast else FULL
    etas, seeds, last = s["etas"], s["seeds"], s["last"]
    wall0, cpu0 = time.perf_counter(), time.process_time()
    print(
        f"mode: {'fast' if args.fast else 'full'}   task 'fixture' (parity) with {s['overrides']}"
    )

    # Step 1 and 2: one run per (loss, eta, seed).
    print(
        f"\nStep 1-2. one run per (loss, eta, seed), seeds {list(seeds)}: Run(cfg, run_dir).train()"
    )
    runs = {}
    for seed in seeds:
        for loss, eta in settings(etas):
            overrides = [
                *s["overrides"],
                f"rl.loss={loss}",
                f"rl.eta={eta}",
                f"rl.seed={seed}",
                f"sft.seed={seed}",
            ]  # sft.seed: the initial weights
            t0 = time.perf_counter()
            summary, records = train(overrides, out / "runs" / f"{loss}_eta{eta}_seed{seed}")
            run = runs[(loss, eta, seed)] = {
                "records": records,
                "before": summary["before"]["pass@1"],
                "after": summary["after"]["pass@1"],
                "final_reward": mean_of(records, "reward/mean", -last),
            }
            print(
                f"  seed {seed}  {loss:14s} eta = {eta:2d}: {len(records)} steps in "
                f"{time.perf_counter() - t0:4.0f}s, final reward {run['final_reward']:.3f}, "
                f"held-out pass@1 {run['before']:.3f} -> {run['after']:.3f}"
            )

    # Step 3: the staleness eta promises, and what it does inside a train step.
    print(
        "\nStep 3. inside the train steps (steps after the first eta; means over steps and seeds)"
    )
    print(
        f"  {'eta':>3s} {'staleness':>9s} {'KL(mu|pi_prox)':>14s} {'max c':>6s}   "
        f"{'clipped tokens: naive':>21s} {'decoupled':>9s}   {'mixed groups: naive':>19s} "
        f"{'decoupled':>9s}"
    )
    lag_ok, table3 = True, {}

    def stat(loss, eta, key, reduce=np.mean):
        return float(
            reduce([r[key] for seed in seeds for r in runs[(loss, eta, seed)]["records"][eta:]])
        )

    for eta in etas:
        naive = "decoupled_ppo" if eta == 0 else "naive_ppo"  # eta = 0: one run stands for both
        for loss in dict.fromkeys((naive, "decoupled_ppo")):  # each run once
            lag_ok &= all(
                r["lag/mean"] == eta
                for seed in seeds
                for r in runs[(loss, eta, seed)]["records"][eta:]
            )
        row = table3[eta] = {
            "staleness": stat("decoupled_ppo", eta, "lag/mean"),
            "kl_behav_k3": stat("decoupled_ppo", eta, "train/kl_behav_k3"),
            "correction_max": stat("decoupled_ppo", eta, "train/correction_max", np.max),
            "clip_naive": stat(naive, eta, "train/clip_fraction"),
            "clip_decoupled": stat("decoupled_ppo", eta, "train/clip_fraction"),
            "mixed_naive": stat(naive, eta, "reward/mixed_groups"),
            "mixed_decoupled": stat("decoupled_ppo", eta, "reward/mixed_groups"),
        }
        print(
            f"  {eta:3d} {row['staleness']:9.1f} {abs(row['kl_behav_k3']):14.4f} "
            f"{row['correction_max']:6.1f}   {row['clip_naive']:21.1%} "
            f"{row['clip_decoupled']:9.1%}   {row['mixed_naive']:19.2f} "
            f"{row['mixed_decoupled']:9.2f}"
        )
    decoupled_unclipped = all(row["clip_decoupled"] == 0.0 for row in table3.values())
    print(
        f"  -> staleness = eta on every step after the first eta: {lag_ok};  decoupled PPO "
        f"never clips with one update per step (r = pi_theta/pi_prox = 1): {decoupled_unclipped}"
    )

    # Step 4: AReaL Table 2 in miniature.
    def cell(loss, eta, key):
        values = [runs[(loss, eta, seed)][key] for seed in seeds]
        each = ", ".join(f"{v:.2f}" for v in values)
        return f"{np.mean(values):.3f} ({each})" if len(values) > 1 else f"{values[0]:.3f}"

    before = np.mean([runs[("decoupled_ppo", 0, seed)]["before"] for seed in seeds])
    print(
        f"\nStep 4. AReaL Table 2 in miniature: mean over seeds (each seed); training reward = "
        f"mean of the last {last} steps; held-out pass@1 after RL (before RL: {before:.3f})"
    )
    width = 22 if len(seeds) > 1 else 9
    print(
        f"  {'eta':>10s}   {'train reward: naive':>{width}s} {'decoupled':>{width}s}   "
        f"{'held-out: naive':>{width}s} {'decoupled':>{width}s}"
    )
    print(
        f"  {'0 (oracle)':>10s}   {cell('decoupled_ppo', 0, 'final_reward'):>{2 * width + 1}s}   "
        f"{cell('decoupled_ppo', 0, 'after'):>{2 * width + 1}s}"
    )
    for eta in etas[1:]:
        print(
            f"  {eta:10d}   {cell('naive_ppo', eta, 'final_reward'):>{width}s} "
            f"{cell('decoupled_ppo', eta, 'final_reward'):>{width}s}   "
            f"{cell('naive_ppo', eta, 'after'):>{width}s} {cell('decoupled_ppo', eta, 'after'):>{width}s}"
        )
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    print(f"  wall time {wall:.0f}s, CPU time {cpu:.0f}s")

    plot(runs, etas, seeds, out / "naive_vs_decoupled.png")
    (out / "results.json").write_text(
        json.dumps(
            {
                "mode": "fast" if args.fast else "full",
                "overrides": s["overrides"],
                "etas": list(etas),
                "seeds": list(seeds),
                "lag_equals_eta": lag_ok,
                "decoupled_never_clips": decoupled_unclipped,
                "inside_the_step": {f"eta{eta}": row for eta, row in table3.items()},
                "runs": {
                    f"{loss}/eta{eta}/seed{seed}": {
                        "final_reward": run["final_reward"],
                        "pass@1_before": run["before"],
                        "pass@1_after": run["after"],
                        "reward_per_step": [r["reward/mean"] for r in run["records"]],
                    }
                    for (loss, eta, seed), run in runs.items()
                },
                "seconds": wall,
                "cpu_seconds": cpu,
            },
            indent=1,
        )
    )
    print(f"\nwrote {out / 'naive_vs_decoupled.png'} and {out / 'results.json'}")
    if not (lag_ok and decoupled_unclipped):
        raise SystemExit("the staleness or the clip is not what this lesson claims: see above")


if __name__ == "__main__":
    main()
