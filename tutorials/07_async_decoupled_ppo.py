# %% [markdown]
"""Lesson 07 — asynchronous RL and decoupled PPO: naive PPO against decoupled PPO on stale data.

    python tutorials/07_async_decoupled_ppo.py         # full mode (about 14 min of CPU time)
    python tutorials/07_async_decoupled_ppo.py --fast  # fast mode (about 15 s; what CI runs)

Writes `naive_vs_decoupled.png`, `results.json` and one run directory per setting (`runs/`) into
`--out` (default `runs/tutorials/07_async_decoupled_ppo`). Uses `minirl.run.runner.Run` with
`rl.eta`, `rl.batch_order`, `trainer.num_minibatches`, the loss presets `naive_ppo` and
`decoupled_ppo` and `rl.behaviour_cap` (minirl/losses/presets.py). Mirrors, in miniature: AReaL Table 2 and Fig. 5 (final accuracy for
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

THE BOUND ON c. On stale data c = pi_prox/mu is heavy-tailed: a token the policy now likes far
more than when it was sampled can weigh hundreds of times more than the others. AReaL's released
trainer does not run Eq. 5 as written: a token whose c exceeds 5 is DROPPED from the loss (its
weight is 0; it still counts in the token mean's denominator). minirl's `decoupled_ppo` does the
same (`Correction(cap=5.0)`, docs/losses.md has the AReaL source); `rl.behaviour_cap=0` gives the
paper's uncapped form. The lesson runs three arms: `naive_ppo`, `decoupled_ppo` (with the bound)
and `uncapped`. Two loss metrics show what the bound does: `is_weight_zero_fraction`, the share
of tokens it dropped, and `is_weight_ess`, Kish's effective sample size of the weights as a share
of the tokens, (sum c)^2 / (n sum c^2): 1 when all weights are equal, small when a few tokens
carry the step.

THE TASK AND THE SCHEDULE. Per seed: the oracle (eta = 0) once, and the three arms at eta = 1,
4 and 16: 10 runs; three seeds, 30 runs. To fit in minutes, the lesson uses minirl's smallest
task, the one the tests use (`fixture`, minirl/tasks/fixture.py): the prompt is a number such as
`482:`, and any completion that starts with a digit of the same parity earns reward 1. A randomly
initialised model (no warm start) writes a digit about 7% of the time. Learning to "write a
digit" lifts the reward to about 0.5; reading the prompt's last digit and matching its parity
lifts it to 1. Each run has 150 steps of 32 prompts x 8 samples and, as in AReaL (its Table 3:
"PPO Minibatches 4"), FOUR mini-batch updates per step (`trainer.num_minibatches=4`) at a
learning rate of 1e-3. So decoupled PPO's own clip, centred on pi_prox, acts from the second
update on; naive PPO's, centred on mu, acts from the first.

The runs use the LOCKSTEP scheduler. Generation runs eta batches ahead LOGICALLY: the engine
produces the next batches with the weights it has, then the trainer trains. So the staleness is
exactly eta on every machine, and every run is bitwise reproducible. (Lesson 06 uses the
free-running `async` scheduler, where wall-clock time is the point.)

WHAT THE SCRIPT DOES
--------------------
1. Builds one config per (arm, eta, seed): `make_config("fixture", overrides)` with
   `rl.eta=<eta>`, `rl.batch_order=oldest`, `trainer.num_minibatches=4`, the arm's
   `rl.loss=naive_ppo|decoupled_ppo` (and `rl.behaviour_cap=0` for `uncapped`), `rl.seed` and
   `sft.seed` (the initial weights). Fast mode: 8 steps, eta in {0, 1, 4}, one seed.
2. Runs each with `Run(cfg, run_dir).train()` and reads its metrics.jsonl.
3. Checks that the staleness is what eta promises: exactly eta versions on every step after the
   first eta. Prints, per eta, how far mu is from pi_prox (KL and the largest c), the effective
   sample size of c without and with the bound and the share of tokens the bound dropped, which
   share of the tokens each clip masked, and the share of groups whose 8 samples did not all get
   the same reward (only those carry a learning signal).
4. Prints AReaL Table 2 in miniature: the training reward over the last 10 steps and held-out
   pass@1 after RL, per arm and eta, and checks the table's two findings (naive PPO degrades with
   eta; decoupled PPO stays near the oracle). Plots the reward curves and the table.

Expected output (full mode, measured)
-------------------------------------
Measured on 2026-11-25 with `python tutorials/07_async_decoupled_ppo.py --out OUT`, library at
commit e95468a, on a shared virtual machine with 2 cores (nproc = 2), under load from other jobs
(load average 1-6). It took 1,099 s of wall time and 822 s of CPU time (user + sys). Lockstep
runs do not depend on the load. The figure is figures/07_async_decoupled_ppo.png.

AReaL Table 2's shape does NOT appear here, in AReaL's own training set-up (four mini-batch
updates, its bound on c), over three seeds:

- Naive PPO does not degrade with eta: held-out pass@1 0.988, 0.902 and 0.935 at eta = 1, 4 and
  16, against 0.953 for the on-policy oracle. Its clip, centred on mu, masks 9%, 22% and 41% of
  the tokens, far more than decoupled PPO's (3-4%), exactly as AReaL describes the mechanism.

- Decoupled PPO falls behind naive PPO as eta grows, with or without the bound: 0.884 / 0.633 /
  0.605 with it, 0.868 / 0.660 / 0.486 without (eta = 1 / 4 / 16). Its failed runs collapse to
  one answer before learning the rule (held-out 0.344 = 22/64, "always odd", three times; mixed
  groups at eta = 4: 0.18-0.20 of the groups, against 0.33 for naive PPO).

- Why, in numbers: at this scale one version moves the policy far. KL(mu||pi_prox) is 0.05, 0.48
  and 1.14 per token at eta = 1, 4, 16 (lesson 09 puts one version of the paper-scale PipelineRL
  run at a few 1e-6), and c reaches 208, 2183 and 3689. The weights are so unequal that the
  uncapped decoupled step rests on an effective 88%, 69% and 30% of its tokens. AReaL's bound
  drops only 0.1-1.2% of the tokens but lifts that to 96%, 82% and 62%, and it is what keeps
  decoupled PPO above the uncapped form at eta = 16 (0.605 against 0.486); it does not close the
  gap to naive PPO. Naive PPO's badly centred clip masks precisely the tokens with the largest
  pi_theta/mu, so it takes smaller, less noisy steps: a brake that AReaL's 1.5B model at a small
  learning rate does not need, because there c stays near 1.

- Side measurements (the sweep behind this lesson, same task, two seeds, eta = 4, ONE update per
  step; held-out pass@1, seeds 0 and 1): at learning rate 1e-3 the oracle 0.754 / 0.883, naive
  0.809 / 0.973, decoupled with the bound 0.895 / 0.867, uncapped 0.598 / 0.867; at 3e-4 the
  oracle 0.836 / 0.961, naive 0.875 / 0.922, with the bound 0.754 / 0.824, uncapped 0.832 /
  0.852. Over learning rates 3e-4 to 3e-3 and one or four updates, decoupled PPO's mean over seeds
  never beat naive PPO's at eta >= 4 here (a single seed did: 0.895 against 0.809). A harder cap that truncates c at 2 instead of dropping (`decoupled_ppo_tis`, lesson
  08; 100 steps, one update, learning rate 3e-3, two seeds) gave 0.719 / 0.711 / 0.711 at eta =
  1 / 4 / 16: flat across eta as AReaL reports, but below naive PPO at eta = 1 and 4. Command for
  one such run: `minirl train --preset fixture --set rl.loss=LOSS --set rl.eta=4 --set rl.seed=S
  --set sft.seed=S --set rl.batch_order=oldest --set rl.steps=150 --set trainer.learning_rate=LR
  --set eval.prompts=64 --set rl.checkpoint_every=1000` (and `--set rl.behaviour_cap=0` for the
  uncapped form).

    mode: full   task 'fixture' (parity) with ['rl.scheduler=lockstep', 'rl.batch_order=oldest', 'trainer.num_minibatches=4', 'trainer.learning_rate=1e-3', 'rl.checkpoint_every=1000', 'rl.steps=150', 'rl.prompts_per_step=32', 'rl.group_size=8', 'eval.prompts=64']

    Step 1-2. one run per (arm, eta, seed), seeds [0, 1, 2]: Run(cfg, run_dir).train()
      seed 0  decoupled_ppo  eta =  0: 150 steps in   45s, final reward 0.803, held-out pass@1 0.062 -> 0.859
      seed 0  naive_ppo      eta =  1: 150 steps in   61s, final reward 0.952, held-out pass@1 0.062 -> 0.996
      seed 0  decoupled_ppo  eta =  1: 150 steps in   46s, final reward 0.493, held-out pass@1 0.062 -> 0.656
      seed 0  uncapped       eta =  1: 150 steps in   86s, final reward 0.748, held-out pass@1 0.062 -> 0.660
      seed 0  naive_ppo      eta =  4: 150 steps in   64s, final reward 0.807, held-out pass@1 0.062 -> 0.715
      seed 0  decoupled_ppo  eta =  4: 150 steps in   28s, final reward 0.771, held-out pass@1 0.062 -> 0.820
      seed 0  uncapped       eta =  4: 150 steps in   27s, final reward 0.720, held-out pass@1 0.062 -> 0.719
      seed 0  naive_ppo      eta = 16: 150 steps in   29s, final reward 0.889, held-out pass@1 0.062 -> 0.863
      seed 0  decoupled_ppo  eta = 16: 150 steps in   28s, final reward 0.536, held-out pass@1 0.062 -> 0.637
      seed 0  uncapped       eta = 16: 150 steps in   28s, final reward 0.662, held-out pass@1 0.062 -> 0.793
      seed 1  decoupled_ppo  eta =  0: 150 steps in   25s, final reward 0.996, held-out pass@1 0.055 -> 1.000
      seed 1  naive_ppo      eta =  1: 150 steps in   26s, final reward 0.936, held-out pass@1 0.055 -> 0.969
      seed 1  decoupled_ppo  eta =  1: 150 steps in   35s, final reward 0.991, held-out pass@1 0.055 -> 0.996
      seed 1  uncapped       eta =  1: 150 steps in   40s, final reward 0.888, held-out pass@1 0.055 -> 0.953
      seed 1  naive_ppo      eta =  4: 150 steps in   53s, final reward 0.988, held-out pass@1 0.055 -> 1.000
      seed 1  decoupled_ppo  eta =  4: 150 steps in   54s, final reward 0.738, held-out pass@1 0.055 -> 0.734
      seed 1  uncapped       eta =  4: 150 steps in   53s, final reward 0.887, held-out pass@1 0.055 -> 0.590
      seed 1  naive_ppo      eta = 16: 150 steps in   58s, final reward 0.952, held-out pass@1 0.055 -> 0.992
      seed 1  decoupled_ppo  eta = 16: 150 steps in   61s, final reward 0.754, held-out pass@1 0.055 -> 0.836
      seed 1  uncapped       eta = 16: 150 steps in   25s, final reward 0.506, held-out pass@1 0.055 -> 0.344
      seed 2  decoupled_ppo  eta =  0: 150 steps in   17s, final reward 0.996, held-out pass@1 0.086 -> 1.000
      seed 2  naive_ppo      eta =  1: 150 steps in   18s, final reward 1.000, held-out pass@1 0.086 -> 1.000
      seed 2  decoupled_ppo  eta =  1: 150 steps in   17s, final reward 0.991, held-out pass@1 0.086 -> 1.000
      seed 2  uncapped       eta =  1: 150 steps in   18s, final reward 1.000, held-out pass@1 0.086 -> 0.992
      seed 2  naive_ppo      eta =  4: 150 steps in   18s, final reward 0.981, held-out pass@1 0.086 -> 0.992
      seed 2  decoupled_ppo  eta =  4: 150 steps in   20s, final reward 0.506, held-out pass@1 0.086 -> 0.344
      seed 2  uncapped       eta =  4: 150 steps in   35s, final reward 0.963, held-out pass@1 0.086 -> 0.672
      seed 2  naive_ppo      eta = 16: 150 steps in   29s, final reward 0.954, held-out pass@1 0.086 -> 0.949
      seed 2  decoupled_ppo  eta = 16: 150 steps in   28s, final reward 0.694, held-out pass@1 0.086 -> 0.344
      seed 2  uncapped       eta = 16: 150 steps in   28s, final reward 0.545, held-out pass@1 0.086 -> 0.320

    Step 3. inside the train steps (steps after the first eta; means over steps and seeds)
      eta  lag KL(mu|pi_prox)  max c  ESS of c: uncapped capped dropped  clipped: naive decoupled  mixed groups: naive decoupled uncapped
        0  0.0         0.0000      1                1.00   1.00   0.00%            2.4%      2.4%                 0.12      0.12     0.12
        1  1.0         0.0475    208                0.88   0.96   0.08%            9.2%      2.7%                 0.20      0.15     0.16
        4  4.0         0.4829   2183                0.69   0.82   0.32%           22.1%      3.7%                 0.33      0.20     0.18
       16 16.0         1.1380   3689                0.30   0.62   1.18%           40.9%      3.9%                 0.59      0.28     0.20
      -> staleness = eta on every step after the first eta: True;  on stale data naive PPO's clip (centred on mu) masks more tokens than decoupled PPO's: True

    Step 4. AReaL Table 2 in miniature (held-out pass@1 before RL: 0.068)
      training reward, mean of the last 10 steps
             eta                   naive_ppo             decoupled_ppo                  uncapped
      0 (oracle)    0.932 (0.80, 1.00, 1.00)  0.932 (0.80, 1.00, 1.00)  0.932 (0.80, 1.00, 1.00)
               1    0.963 (0.95, 0.94, 1.00)  0.825 (0.49, 0.99, 0.99)  0.879 (0.75, 0.89, 1.00)
               4    0.925 (0.81, 0.99, 0.98)  0.671 (0.77, 0.74, 0.51)  0.857 (0.72, 0.89, 0.96)
              16    0.932 (0.89, 0.95, 0.95)  0.661 (0.54, 0.75, 0.69)  0.571 (0.66, 0.51, 0.54)
      held-out pass@1 after RL
             eta                   naive_ppo             decoupled_ppo                  uncapped
      0 (oracle)    0.953 (0.86, 1.00, 1.00)  0.953 (0.86, 1.00, 1.00)  0.953 (0.86, 1.00, 1.00)
               1    0.988 (1.00, 0.97, 1.00)  0.884 (0.66, 1.00, 1.00)  0.868 (0.66, 0.95, 0.99)
               4    0.902 (0.71, 1.00, 0.99)  0.633 (0.82, 0.73, 0.34)  0.660 (0.72, 0.59, 0.67)
              16    0.935 (0.86, 0.99, 0.95)  0.605 (0.64, 0.84, 0.34)  0.486 (0.79, 0.34, 0.32)
      naive_degrades_with_eta              False
      decoupled_near_the_oracle            False
      decoupled_beats_naive_when_stale     False
      wall time 1097s, CPU time 820s

        wrote OUT/naive_vs_decoupled.png and OUT/results.json
"""

# %%
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from minirl.measure.metrics_log import read_metrics
from minirl.run.presets import make_config
from minirl.run.runner import Run

# The three objectives compared, as `--set` overrides: AReaL's baseline, decoupled PPO as AReaL's
# trainer runs it (c = pi_prox/mu bounded: tokens with c > 5 leave the loss), and the paper's
# Eq. 5 as written (no bound: rl.behaviour_cap=0).
ARMS = {
    "naive_ppo": ["rl.loss=naive_ppo"],
    "decoupled_ppo": ["rl.loss=decoupled_ppo"],
    "uncapped": ["rl.loss=decoupled_ppo", "rl.behaviour_cap=0"],
}
ORACLE = "decoupled_ppo"  # eta = 0: on fresh data the three are the same loss; one run stands in
COMMON = [
    "rl.scheduler=lockstep",  # eta batches ahead, logically: the same staleness on any machine
    "rl.batch_order=oldest",  # AReaL: train on the oldest data first, so staleness = eta
    "trainer.num_minibatches=4",  # AReaL Table 3: 4 PPO mini-batch updates per train step
    "trainer.learning_rate=1e-3",
    "rl.checkpoint_every=1000",  # only the final checkpoint
]
FULL = dict(
    overrides=[
        *COMMON,
        "rl.steps=150",
        "rl.prompts_per_step=32",
        "rl.group_size=8",
        "eval.prompts=64",
    ],
    etas=(0, 1, 4, 16),
    seeds=(0, 1, 2),
    last=10,  # "final reward" = mean training reward over the last 10 steps
)
FAST = dict(overrides=[*COMMON, "rl.steps=8", "eval.prompts=8"], etas=(0, 1, 4), seeds=(0,), last=3)
STYLE = {"naive_ppo": "--", "decoupled_ppo": "-", "uncapped": ":"}


# %%
def settings(etas):
    """(arm, eta) pairs: eta = 0 once (on fresh data the losses are the same), then every arm."""
    return [(ORACLE, 0)] + [(arm, eta) for eta in etas if eta > 0 for arm in ARMS]


# %%
def arm_at(arm: str, eta: int) -> str:
    """The run that stands for `arm` at `eta` (the oracle for every arm at eta = 0)."""
    return ORACLE if eta == 0 else arm


# %%
def train(overrides: list[str], run_dir: Path) -> tuple[dict, list[dict]]:
    """One run of the parity task from scratch: (summary, metrics records)."""
    shutil.rmtree(run_dir, ignore_errors=True)  # an existing run directory would be resumed
    cfg = make_config("fixture", overrides)
    summary = Run(cfg, run_dir, log=lambda *a: None, progress=False).train()
    return summary, read_metrics(run_dir)


# %%
def mean_of(records: list[dict], key: str, start: int = 0) -> float:
    return float(np.mean([r[key] for r in records[start:]]))


# %%
def plot(runs: dict, etas, seeds, path: Path) -> None:
    fig = Figure(figsize=(13, 4.4), layout="constrained")
    ax, bx = fig.subplots(1, 2, width_ratios=(3, 2))
    colors = dict(zip(etas, ("black", "tab:blue", "tab:orange", "tab:red"), strict=False))
    for arm, eta in settings(etas):
        reward = np.mean(
            [[r["reward/mean"] for r in runs[(arm, eta, seed)]["records"]] for seed in seeds],
            axis=0,
        )  # mean over seeds, per step
        window = min(10, len(reward))
        smooth = np.convolve(reward, np.ones(window) / window, mode="valid")
        label = "eta = 0 (oracle)" if eta == 0 else f"eta = {eta}, {arm.replace('_', ' ')}"
        ax.plot(
            np.arange(window, len(reward) + 1),
            smooth,
            color=colors[eta],
            linestyle=STYLE[arm],
            label=label,
        )
    ax.set_xlabel("RL step (= weight version)")
    ax.set_ylabel("training reward (10-step average, mean of seeds)")
    ax.set_ylim(0, 1)
    ax.set_title(
        "naive (dashed), decoupled with AReaL's bound c <= 5 (solid), uncapped Eq. 5 (dotted)",
        fontsize=9,
    )
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    stale = [eta for eta in etas if eta > 0]
    x = np.arange(len(stale))
    for offset, arm, color in (
        (-0.27, "naive_ppo", "tab:gray"),
        (0.0, "decoupled_ppo", "tab:blue"),
        (0.27, "uncapped", "tab:purple"),
    ):
        per_seed = np.array([[runs[(arm, eta, seed)]["after"] for seed in seeds] for eta in stale])
        bars = bx.bar(
            x + offset, per_seed.mean(axis=1), 0.27, color=color, label=arm.replace("_", " ")
        )
        bx.bar_label(bars, fmt="%.2f", fontsize=6)
        for i, values in enumerate(per_seed):  # one dot per seed
            bx.plot([x[i] + offset] * len(values), values, "k.", markersize=3)
    oracle = np.mean([runs[(ORACLE, 0, seed)]["after"] for seed in seeds])
    bx.axhline(oracle, color="black", linestyle=":", label=f"eta = 0 (oracle) {oracle:.2f}")
    bx.set_xticks(x, [f"eta = {eta}" for eta in stale])
    bx.set_ylabel("held-out pass@1 after RL (bars: mean, dots: seeds)")
    bx.set_ylim(0, 1.1)
    bx.set_title("AReaL Table 2 in miniature", fontsize=9)
    bx.legend(fontsize=7, loc="lower left")
    fig.savefig(path, dpi=110)


# %%
def run_all(s: dict, out: Path) -> dict:
    """Steps 1-2: one run per (arm, eta, seed)."""
    runs = {}
    for seed in s["seeds"]:
        for arm, eta in settings(s["etas"]):
            overrides = [
                *s["overrides"],
                *ARMS[arm],
                f"rl.eta={eta}",
                f"rl.seed={seed}",
                f"sft.seed={seed}",  # the initial weights
            ]
            t0 = time.perf_counter()
            summary, records = train(overrides, out / "runs" / f"{arm}_eta{eta}_seed{seed}")
            run = runs[(arm, eta, seed)] = {
                "records": records,
                "before": summary["before"]["pass@1"],
                "after": summary["after"]["pass@1"],
                "final_reward": mean_of(records, "reward/mean", -s["last"]),
            }
            print(
                f"  seed {seed}  {arm:14s} eta = {eta:2d}: {len(records)} steps in "
                f"{time.perf_counter() - t0:4.0f}s, final reward {run['final_reward']:.3f}, "
                f"held-out pass@1 {run['before']:.3f} -> {run['after']:.3f}"
            )
    return runs


# %%
def inside_the_step(runs: dict, etas, seeds) -> tuple[dict, bool]:
    """Step 3: per eta, means over the steps after the first eta (and over seeds)."""
    print(
        f"  {'eta':>3s} {'lag':>4s} {'KL(mu|pi_prox)':>14s} {'max c':>6s}  "
        f"{'ESS of c: uncapped':>18s} {'capped':>6s} {'dropped':>7s}  "
        f"{'clipped: naive':>14s} {'decoupled':>9s}  {'mixed groups: naive':>19s} "
        f"{'decoupled':>9s} {'uncapped':>8s}"
    )

    def stat(arm, eta, key, reduce=np.mean):
        records = [
            r for seed in seeds for r in runs[(arm_at(arm, eta), eta, seed)]["records"][eta:]
        ]
        return float(reduce([r[key] for r in records]))

    lag_ok, table = True, {}
    for eta in etas:
        lag_ok &= all(
            r["lag/mean"] == eta
            for arm in ARMS
            for seed in seeds
            for r in runs[(arm_at(arm, eta), eta, seed)]["records"][eta:]
        )
        row = table[eta] = {
            "staleness": stat(ORACLE, eta, "lag/mean"),
            "kl_behav_k3": stat(ORACLE, eta, "train/kl_behav_k3"),
            "correction_max": stat("uncapped", eta, "train/correction_max", np.max),
            "ess_uncapped": stat("uncapped", eta, "train/is_weight_ess"),
            "ess_capped": stat("decoupled_ppo", eta, "train/is_weight_ess"),
            "dropped": stat("decoupled_ppo", eta, "train/is_weight_zero_fraction"),
            **{
                f"clip_{a}": stat(a, eta, "train/clip_fraction")
                for a in ("naive_ppo", "decoupled_ppo")
            },
            **{f"mixed_{a}": stat(a, eta, "reward/mixed_groups") for a in ARMS},
        }
        print(
            f"  {eta:3d} {row['staleness']:4.1f} {abs(row['kl_behav_k3']):14.4f} "
            f"{row['correction_max']:6.0f}  {row['ess_uncapped']:18.2f} {row['ess_capped']:6.2f} "
            f"{row['dropped']:7.2%}  {row['clip_naive_ppo']:14.1%} {row['clip_decoupled_ppo']:9.1%}  "
            f"{row['mixed_naive_ppo']:19.2f} {row['mixed_decoupled_ppo']:9.2f} "
            f"{row['mixed_uncapped']:8.2f}"
        )
    return table, lag_ok


# %%
def table_2(runs: dict, etas, seeds, key: str, title: str) -> dict:
    """Step 4: one of AReaL Table 2's halves, per eta and arm: mean over seeds (each seed)."""
    print(f"  {title}")
    width = 7 + 6 * len(seeds)
    print(f"  {'eta':>10s}   " + " ".join(f"{arm:>{width}s}" for arm in ARMS))
    means = {}
    for eta in etas:
        cells = []
        for arm in ARMS:
            values = [runs[(arm_at(arm, eta), eta, seed)][key] for seed in seeds]
            means[(arm, eta)] = float(np.mean(values))
            each = ", ".join(f"{v:.2f}" for v in values)
            cells.append(
                f"{np.mean(values):.3f} ({each})" if len(values) > 1 else f"{values[0]:.3f}"
            )
        label = "0 (oracle)" if eta == 0 else str(eta)
        print(f"  {label:>10s}   " + " ".join(f"{c:>{width}s}" for c in cells))
    return means


# %%
def shape_of_table_2(held_out: dict, etas) -> dict:
    """AReaL Table 2's two findings, read off held-out pass@1 (means over seeds)."""
    stale = [eta for eta in etas if eta > 0]
    oracle = held_out[(ORACLE, 0)]
    return {
        "naive_degrades_with_eta": all(
            held_out[("naive_ppo", b)] < held_out[("naive_ppo", a)]
            for a, b in zip(stale, stale[1:], strict=False)
        ),
        "decoupled_near_the_oracle": all(
            held_out[("decoupled_ppo", eta)] >= oracle - 0.05 for eta in stale
        ),
        "decoupled_beats_naive_when_stale": held_out[("decoupled_ppo", stale[-1])]
        > held_out[("naive_ppo", stale[-1])],
    }


# %%
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="8 steps, one seed (CI)")
    parser.add_argument("--out", default="runs/tutorials/07_async_decoupled_ppo")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    s = FAST if args.fast else FULL
    etas, seeds = s["etas"], s["seeds"]
    wall0, cpu0 = time.perf_counter(), time.process_time()
    print(
        f"mode: {'fast' if args.fast else 'full'}   task 'fixture' (parity) with {s['overrides']}"
    )

    print(
        f"\nStep 1-2. one run per (arm, eta, seed), seeds {list(seeds)}: Run(cfg, run_dir).train()"
    )
    runs = run_all(s, out)

    print(
        "\nStep 3. inside the train steps (steps after the first eta; means over steps and seeds)"
    )
    table3, lag_ok = inside_the_step(runs, etas, seeds)
    naive_clips_more = all(
        row["clip_naive_ppo"] > row["clip_decoupled_ppo"] for eta, row in table3.items() if eta > 0
    )
    print(
        f"  -> staleness = eta on every step after the first eta: {lag_ok};  on stale data naive "
        f"PPO's clip (centred on mu) masks more tokens than decoupled PPO's: {naive_clips_more}"
    )

    before = np.mean([runs[(ORACLE, 0, seed)]["before"] for seed in seeds])
    print(f"\nStep 4. AReaL Table 2 in miniature (held-out pass@1 before RL: {before:.3f})")
    reward = table_2(
        runs, etas, seeds, "final_reward", f"training reward, mean of the last {s['last']} steps"
    )
    held_out = table_2(runs, etas, seeds, "after", "held-out pass@1 after RL")
    shape = shape_of_table_2(held_out, etas)
    for claim, holds in shape.items():
        print(f"  {claim:36s} {holds}")
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    print(f"  wall time {wall:.0f}s, CPU time {cpu:.0f}s")

    plot(runs, etas, seeds, out / "naive_vs_decoupled.png")
    (out / "results.json").write_text(
        json.dumps(
            {
                "mode": "fast" if args.fast else "full",
                "overrides": s["overrides"],
                "arms": ARMS,
                "etas": list(etas),
                "seeds": list(seeds),
                "lag_equals_eta": lag_ok,
                "naive_clips_more_when_stale": naive_clips_more,
                "inside_the_step": {f"eta{eta}": row for eta, row in table3.items()},
                "final_reward": {f"{a}/eta{e}": v for (a, e), v in reward.items()},
                "held_out": {f"{a}/eta{e}": v for (a, e), v in held_out.items()},
                "shape_of_table_2": shape,
                "runs": {
                    f"{arm}/eta{eta}/seed{seed}": {
                        "final_reward": run["final_reward"],
                        "pass@1_before": run["before"],
                        "pass@1_after": run["after"],
                        "reward_per_step": [r["reward/mean"] for r in run["records"]],
                    }
                    for (arm, eta, seed), run in runs.items()
                },
                "seconds": wall,
                "cpu_seconds": cpu,
            },
            indent=1,
        )
    )
    print(f"\nwrote {out / 'naive_vs_decoupled.png'} and {out / 'results.json'}")
    if not (lag_ok and naive_clips_more):
        raise SystemExit("the staleness or the clip is not what this lesson claims: see above")


# %%
if __name__ == "__main__":
    main()
