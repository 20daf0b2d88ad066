# %% [markdown]
"""Lesson 05 — the first RL run: synchronous GRPO on scratchpad addition, pass@k before and after.

    python tutorials/05_first_rl_run.py         # full mode (about 3 min on 2 free cores)
    python tutorials/05_first_rl_run.py --fast  # fast mode (about 30 s; the `fixture` task)

Writes `pass_at_k.png`, `results.json` and the run directory `run/` (config.json, metrics.jsonl,
summary.json, checkpoints/) into `--out` (default `runs/tutorials/05_first_rl_run`). Uses the
whole system through `minirl.run.runner.Run(cfg, run_dir).train()`, the same call as `minirl train
--preset arithmetic`. Mirrors, in miniature: RLAX Fig. 2 (training reward over steps, and
held-out accuracy and pass@8 before and after RL).


THE IDEA
--------
Lessons 01-04 built the parts. An RL step joins them, and reads like pseudocode
(minirl/control/controller.py):

    prompts  -> engine      G = 8 samples of each prompt, with log mu and versions (lesson 02)
    rollouts -> verifier    reward 1 if the final answer is right, else 0 (lesson 03)
    groups   -> batch       prompt + completion rows, right-padded (minirl/training/batching.py)
    batch    -> trainer     recompute log pi, GRPO loss (lesson 04), one AdamW update
    weights  -> store       a new version, and the engine reloads it

This run is SYNCHRONOUS (on-policy): the engine always samples with the newest weights, so every
token has lag 1 and the importance ratio starts each step at 1, up to mismatch (lesson 01).
Lessons 06 and 07 relax this.

The task is multi-operand addition with a scratchpad, written least-significant digit first:

    prompt      12+345+6=
    completion  21+543=753        (12 + 345 = 357, reversed)
                753+6=363         (357 + 6 = 363, reversed)
                #### 363          (363, reversed: the answer 363)

To fit in a few minutes on 2 cores, the lesson changes a few knobs of the preset (the
FULL list below): 2-3 operands of 1-2 digits instead of up to 20 of 1-3 (the long tail of
lengths is the subject of lessons 02 and 06), a 0.8M-parameter model instead of 3.2M, 300
warm-start steps, and 100 RL steps of 32 prompts x 8 samples.

A model with random weights cannot even produce this format, so reward would be 0 everywhere and
GRPO's group-normalised advantage would be 0 too: no signal at all. The run therefore starts with
a short supervised WARM START on reference solutions (minirl/run/warmstart.py). It is deliberately
cut short, so the base model is sometimes right. It is cached (under $MINIRL_CACHE, default
~/.cache/minirl), so a second run of the lesson skips it. RL then sharpens the model: within a
group of 8 samples the right ones get a positive advantage and the wrong ones a negative one.

What to measure: held-out pass@1 (the chance that one sample is right) and pass@8 (the chance that
at least one of 8 samples is right), on the same 128 test prompts and the same sampling keys
before and after RL, so the comparison is paired. RLAX Fig. 2 shows the test reward (pass@1),
pass@8 and pass@32 all rising over training on Codeforces. A common finding since (for example
Yue et al., 2025) is that RL raises pass@1 more than pass@k, and at large k can even lower it: RL
mostly moves probability onto answers the model could already find sometimes, so its samples
become less diverse.

Read the measured numbers below with two facts from docs/tasks.md in mind. On this task the
reference solutions teach EVERYTHING: more supervised steps would raise pass@1 as well, or
better, than RL. So this run shows the mechanics of RL, not a case where RL beats SFT (issue #7
and experiments/rl_vs_sft.py test that claim on countdown). And at ~4.5 CPU-minutes the whole run
has only 100 RL steps of 256 rollouts each, with one AdamW update of learning rate 1e-4 per step.

WHAT THE SCRIPT DOES
--------------------
1. Builds the config: `make_config("arithmetic", overrides)` (full) or `make_config("fixture",
   overrides)` (fast: a 2-token task on a tiny model). The overrides and every other knob are
   printed, and `minirl config` explains each one.
2. Runs `Run(cfg, out / "run").train()`: warm start, held-out evaluation, RL steps, evaluation.
   `out/run` is deleted first: a run directory that exists is RESUMED, not restarted.
3. Reads metrics.jsonl (one line per step) and prints the reward curve. Checks that every batch
   was on-policy (lag 1) and that the clip never acted (one update per batch, ratio 1).
4. Prints pass@1 and pass@8 before and after, and plots both with the reward curve.

Expected output (full mode, measured)
-------------------------------------
Measured on 2026-11-24 with `MINIRL_CACHE=/tmp/l05/cache python tutorials/05_first_rl_run.py
--out /tmp/l05/out` (an empty cache, so the warm start is included), library at commit 5164670,
on a virtual machine with 2 cores (nproc = 2) and nothing else running (load average 1.2-1.7).
It took 165 s of wall time and 265 s of CPU time (user + sys); the warm start was 61 s of wall
time. (An earlier measurement at commit b79de54, load 8-15, took 1,499 s of wall time and gave
pass@1 0.701 -> 0.756 and pass@8 0.992 -> 0.945. Since then the trainer's backward pass was
rewritten for speed and the arithmetic preset's engine shapes changed (cache_len 224, prefill
buckets 32/64/128); both change floating-point sums, so the warm start, the sampled rollouts and
everything after them differ. Lockstep runs are bitwise reproducible for one library version on
one machine, not across such changes.) The figure is figures/05_first_rl_run.png.

What the numbers say. RL did what it does, in a small way: held-out pass@1 rose from 0.727 to
0.787 (+0.061, on the same 1,024 prompt-and-key pairs before and after), and the training reward
from 0.766 (mean of the first 50 steps) to 0.788 (the last 50), a trend smaller than the
step-to-step noise of one batch (standard deviation 0.054). pass@8 did not move (0.977: 125 of
128 prompts solved by at least one of 8 samples, before and after), unlike RLAX Fig. 2, where
pass@8 rose. RLAX's base model was far from solving every problem; this one already found a right
answer for almost every prompt within 8 tries, so there was no pass@8 left to gain, and RL's
gain is in pass@1: the model became surer of the answers it could already find (the pass@k
pattern described above; in the earlier measurement pass@8 even fell, 0.992 -> 0.945). Every
step was on-policy and no token was clipped: with one update per batch the ratio is exactly 1
when the gradient is taken, so GRPO's clip has nothing to do here (lessons 04 and 07 show it
acting).

    mode: full   preset 'arithmetic' with ['task.args.max_operands=3', 'task.args.max_digits=2', 'model.dim=128', 'model.head_dim=32', 'model.mlp_dim=384', 'sft.steps=300', 'rl.steps=100', 'rl.prompts_per_step=32', 'rl.checkpoint_every=25', 'eval.prompts=128']

    Step 1. task {'name': 'arithmetic', 'args': {'max_digits': 2, 'max_operands': 3}}, model 0.80M parameters, loss 'grpo', 100 steps x 32 prompts x 8 samples, warm start 300 SFT steps, learning rate 0.0001, temperature 1.0

    Step 2. Run(cfg, run_dir).train(): warm start -> evaluate -> RL -> evaluate
      [   61s wall,    99s cpu] warm start: 300 SFT steps in 61s, loss 0.021
      [   64s wall,   102s cpu] held-out before RL: pass@1 0.727  pass@8 0.977  reward 0.727  length 22.689
      [  165s wall,   265s cpu] held-out after RL:  pass@1 0.787  pass@8 0.977  reward 0.787  length 22.675

    Step 3. training reward, mean over blocks of 10 steps (100 steps; mean step time 1.0s)
      steps      reward  mixed groups  clip fraction  length
        1-10       0.776          0.48         0.0000    21.8
       11-20       0.754          0.48         0.0000    22.8
       21-30       0.759          0.55         0.0000    23.2
       31-40       0.781          0.48         0.0000    22.3
       41-50       0.760          0.50         0.0000    22.4
       51-60       0.805          0.47         0.0000    22.3
       61-70       0.818          0.46         0.0000    22.6
       71-80       0.784          0.41         0.0000    22.5
       81-90       0.736          0.50         0.0000    22.8
       91-100      0.794          0.43         0.0000    22.5
      every batch sampled by the weights it trained (lag 1): True;  one update per batch starts at ratio 1, so the clip never acts: True

    Step 4. held-out (128 test prompts x 8 samples)
                   pass@1   pass@8   length
      before RL     0.727    0.977     22.7
      after RL      0.787    0.977     22.7
      change       +0.061   +0.000
      wall time 165s, CPU time 265s (warm start 61s, RL 101s wall, the rest is evaluation and compiling)

    wrote /tmp/l05/out/pass_at_k.png, /tmp/l05/out/results.json and /tmp/l05/out/run/
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

from minirl.configlib import to_dict
from minirl.measure.metrics_log import read_metrics
from minirl.run.presets import make_config
from minirl.run.runner import Run

# The knobs this lesson changes; everything else is the preset's default (`minirl config`).
FULL = (
    "arithmetic",
    [
        "task.args.max_operands=3",  # 2-3 operands ...
        "task.args.max_digits=2",  # ... of 1-2 digits: completions of ~15-30 tokens
        "model.dim=128",  # a 0.8M-parameter model (the preset's is 3.2M): 4x cheaper steps
        "model.head_dim=32",
        "model.mlp_dim=384",
        "sft.steps=300",  # warm start: the base model is right 70% of the time
        "rl.steps=100",
        "rl.prompts_per_step=32",  # x group_size 8 = 256 rollouts per step
        "rl.checkpoint_every=25",
        "eval.prompts=128",  # held-out prompts; 8 samples each
    ],
)
FAST = ("fixture", ["rl.steps=6", "eval.prompts=16"])


# %%
class Clock:
    """`Run`'s log function, with wall and CPU seconds since the start in front of each message.
    CPU seconds tell what the run costs on a machine that other jobs share."""

    def __init__(self):
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()

    def __call__(self, message: str) -> None:
        wall, cpu = time.perf_counter() - self.wall0, time.process_time() - self.cpu0
        print(f"  [{wall:5.0f}s wall, {cpu:5.0f}s cpu] {message}", flush=True)


# %%
def plot(records, summary, samples: int, path: Path) -> None:
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax, bx = fig.subplots(1, 2, width_ratios=(3, 2))
    steps = np.array([r["step"] for r in records])
    reward = np.array([r["reward/mean"] for r in records])
    mixed = np.array([r["reward/mixed_groups"] for r in records])
    window = min(10, len(reward))
    smooth = np.convolve(reward, np.ones(window) / window, mode="valid")  # moving average
    ax.plot(steps, mixed, color="tab:orange", alpha=0.4, lw=1, label="groups with mixed rewards")
    ax.plot(steps, reward, color="tab:blue", alpha=0.4, lw=1, label="train reward (mean)")
    ax.plot(
        steps[window - 1 :],
        smooth,
        color="tab:blue",
        lw=2.5,
        label=f"train reward, {window}-step average",
    )
    ax.set_xlabel("RL step (= weight version)")
    ax.set_ylim(0, 1)
    ax.set_title("training reward: 8 samples of each prompt, synchronous GRPO", fontsize=9)
    ax.legend(fontsize=8)
    keys = ["pass@1", f"pass@{samples}"]
    x = np.arange(len(keys))
    for offset, when, color in ((-0.2, "before", "tab:gray"), (0.2, "after", "tab:blue")):
        bars = bx.bar(
            x + offset, [summary[when][k] for k in keys], 0.4, color=color, label=f"{when} RL"
        )
        bx.bar_label(bars, fmt="%.3f", fontsize=8)
    bx.set_xticks(x, keys)
    bx.set_ylim(0, 1.05)
    bx.set_title("held-out: same prompts, same keys", fontsize=9)
    bx.legend(fontsize=8)
    fig.savefig(path, dpi=110)


# %%
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="the fixture task, seconds (CI)")
    parser.add_argument("--out", default="runs/tutorials/05_first_rl_run")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    preset, overrides = FAST if args.fast else FULL

    # Step 1: the configuration.
    cfg = make_config(preset, overrides)
    c = to_dict(cfg)
    print(f"mode: {'fast' if args.fast else 'full'}   preset {preset!r} with {overrides}")
    print(
        f"\nStep 1. task {c['task']}, model {cfg.model.num_params() / 1e6:.2f}M parameters, "
        f"loss {cfg.rl.loss!r}, {cfg.rl.steps} steps x {cfg.rl.prompts_per_step} prompts x "
        f"{cfg.rl.group_size} samples, warm start {cfg.sft.steps} SFT steps, "
        f"learning rate {cfg.trainer.learning_rate}, temperature {cfg.engine.temperature}"
    )

    # Step 2: the run.
    run_dir = out / "run"
    if run_dir.exists():
        print(f"(removing the previous {run_dir}: an existing run directory would be resumed)")
        shutil.rmtree(run_dir)
    print("\nStep 2. Run(cfg, run_dir).train(): warm start -> evaluate -> RL -> evaluate")
    clock = Clock()
    summary = Run(cfg, run_dir, log=clock, progress=False).train()
    seconds = time.perf_counter() - clock.wall0
    cpu_seconds = time.process_time() - clock.cpu0

    # Step 3: the reward curve, from metrics.jsonl (one record per step), in blocks of steps.
    records = read_metrics(run_dir)
    block = max(1, len(records) // 10)
    print(
        f"\nStep 3. training reward, mean over blocks of {block} steps ({len(records)} steps; "
        f"mean step time {np.mean([r['time/step'] for r in records]):.1f}s)"
    )
    print("  steps      reward  mixed groups  clip fraction  length")
    for i in range(0, len(records), block):
        part = records[i : i + block]
        reward, mixed, clip, length = (
            np.mean([r.get(key, np.nan) for r in part])
            for key in ("reward/mean", "reward/mixed_groups", "train/clip_fraction", "length/mean")
        )
        print(
            f"  {part[0]['step']:3d}-{part[-1]['step']:<3d}  {reward:9.3f}  {mixed:12.2f}  "
            f"{clip:13.4f}  {length:6.1f}"
        )

    # The run was synchronous and each batch got one update: check both on every step.
    on_policy = all(r["lag/mean"] == 0.0 for r in records)
    unclipped = all(r["train/clip_fraction"] == 0.0 for r in records)
    print(
        f"  every batch sampled by the weights it trained (lag 1): {on_policy};  one update "
        f"per batch starts at ratio 1, so the clip never acts: {unclipped}"
    )

    # Step 4: before and after.
    k = cfg.eval.samples
    before, after = summary["before"], summary["after"]
    warm = summary.get("warm_start", {})
    print(f"\nStep 4. held-out ({cfg.eval.prompts} test prompts x {k} samples)")
    print(f"  {'':10s} {'pass@1':>8s} {f'pass@{k}':>8s} {'length':>8s}")
    for name, m in (("before RL", before), ("after RL", after)):
        print(f"  {name:10s} {m['pass@1']:8.3f} {m[f'pass@{k}']:8.3f} {m['length']:8.1f}")
    d1, dk = after["pass@1"] - before["pass@1"], after[f"pass@{k}"] - before[f"pass@{k}"]
    print(f"  change     {d1:+8.3f} {dk:+8.3f}")
    sft = "from cache" if warm.get("cached") else f"{warm.get('seconds', 0.0):.0f}s"
    print(
        f"  wall time {seconds:.0f}s, CPU time {cpu_seconds:.0f}s (warm start {sft}, RL "
        f"{summary['rl_seconds']:.0f}s wall, the rest is evaluation and compiling)"
    )

    plot(records, summary, k, out / "pass_at_k.png")
    (out / "results.json").write_text(
        json.dumps(
            {
                "mode": "fast" if args.fast else "full",
                "preset": preset,
                "overrides": overrides,
                "samples": k,
                "before": before,
                "after": after,
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "rl_seconds": summary["rl_seconds"],
                "warm_start": warm,
                "on_policy": on_policy,
                "unclipped": unclipped,
                "reward_per_step": [r["reward/mean"] for r in records],
            },
            indent=1,
            default=float,
        )
    )
    print(f"\nwrote {out / 'pass_at_k.png'}, {out / 'results.json'} and {run_dir}/")
    if not (on_policy and unclipped):
        raise SystemExit("the run was not synchronous, or the clip acted: see Step 3")


# %%
if __name__ == "__main__":
    main()
