# %% [markdown]
"""Lesson 10 — preemption: kill a run with SIGKILL, resume it, and get the same bits.

    python tutorials/10_preemption.py            # full mode (a few minutes on 2 CPU cores)
    python tutorials/10_preemption.py --fast     # fast mode (CI)

Writes `preemption.png` and `results.json` into `--out` (default `runs/tutorials/10_preemption`),
and keeps the two runs it compares under `--out/reference` and `--out/killed`. Uses
`minirl train` (minirl/run/runner.py), `minirl/store/checkpoints.py` and `minirl/store/serialization.py`.
Mirrors, in miniature: RLAX Fig. 6 (a run preempted, resumed from its last checkpoint, and
training on "with no observable deviation") and RLAX §3.2 (deterministic resume). Here "no
observable deviation" becomes a claim the lesson checks: the final weights are bitwise equal.


THE IDEA
--------
Big RL runs live on preemptible machines, and a preemption gives no warning. The process is
killed (SIGKILL: no handler runs, no file is closed) and later started again. RLAX makes that
event invisible in the learning curve. This lesson shows how minirl does the same, and checks
the strongest version of the claim: a run that was killed several times and resumed ends with
the SAME BITS as a run that was never interrupted.

Three things make this possible:

  1. A checkpoint holds the WHOLE state. That is not only the weights: the optimizer state
     (Adam's moments), and the controller's snapshot: its counters (weight version, steps,
     groups produced), the position of the prompt mixture, the buffer of rollouts generated
     ahead but not yet trained on, and the ids of every prompt trained so far
     (`Controller.snapshot`). Anything left out would make the resumed run drift.
  2. Every random draw is a pure function of counters. The engine's sampling key for token t of
     sample i of prompt uid u is derived from (seed, u, i, t), never from a stateful generator
     that advanced in the dead process (minirl/modeling/sampling.py). Re-generating a rollout after a
     resume gives the same tokens. The `lockstep` scheduler also makes every decision (which
     groups go into which batch, when the engine reloads) from logical counts, never from
     timing.
  3. Writes are atomic. A checkpoint is written into a temporary directory, every file is
     fsync'ed, a manifest with each file's sha256 is written last, and only then is the
     directory renamed into place (a rename is atomic). A kill at any instant leaves either the
     old checkpoints or the old ones plus the new one, never half of one. A file damaged later
     fails its sha256 on restore and the checkpoint before it is used instead.

On resume, `minirl train` on the same run directory restores the newest good checkpoint, cuts
`metrics.jsonl` back to that step (the steps after it are about to be redone), and carries on.
It refuses to resume when the configuration changed (a different config hash): the result would
not be the run you asked for.

Checkpoints are written at RELOAD BOUNDARIES (steps where the engine holds the trainer's newest
version), so one set of weights describes both. The async scheduler (free-running threads) cannot
be bitwise reproducible, because its batches depend on timing; for it minirl promises less: no
prompt lost or trained twice (tests/run/test_preemption.py checks that). This lesson uses lockstep.

WHAT THE SCRIPT DOES
--------------------
1. Runs `minirl train --preset fixture` (a 2-token task, 78k-parameter model) for N steps with
   the one-step-off staleness preset (the engine generates one batch ahead, so the buffer is
   part of the state) and a checkpoint every few steps: the REFERENCE, never interrupted.
2. Starts the same command in another directory and kills it with SIGKILL at random moments,
   several times, restarting it each time. After each kill it prints what survived on disk.
   The last start runs to the end.
3. Compares the two runs: parameters and optimizer state bit for bit (`assert_trees_equal`),
   every logged metric of every step (except clocks and memory readings), and the held-out evaluation.
4. Damages the killed run's newest checkpoint (one flipped byte) and shows that restore detects
   it (sha256) and falls back to the checkpoint before it.
5. Tries to resume with a changed loss (`--set rl.loss=dapo`) and shows the refusal.
6. Plots the reward per step of both runs and the killed run's progress against wall-clock time.

Expected output (full mode, measured)
-------------------------------------
Measured on 2026-11-23 with `python tutorials/10_preemption.py --out OUT` on a shared virtual
machine with 2 cores (nproc = 2), under heavy load from other jobs (load average 9.0 at the
start, 13.4 at the end), without JAX's persistent compilation cache (every compile paid). It
took 291 s of wall time and 108 s of CPU time (this process and its children, user + sys);
most of both is starting Python and JAX six times (the reference, four starts of the killed
run, and the refused resume), each compiling its own functions (44 s of CPU time with a warm
cache). The figure is
figures/10_preemption.png. The kill moments come from a seeded generator, but where a kill
lands depends on the machine's speed: on another machine the lines of step 2 will differ, the
result of step 3 must not.

The result reproduces exactly: killed three times (after steps 6, 14 and 21 had been logged,
each time losing the steps after the last checkpoint: 1, 4 and 1 steps), the run ends with
bitwise-equal parameters and optimizer state, all 2220 logged values of its 30 steps identical
to the uninterrupted run's, and the same held-out evaluation.

    mode: full   cores: 2   load average: 9.0

    Step 1. the reference: 30 steps, a checkpoint every 5, never interrupted
      $ python -m minirl.cli train --preset fixture --staleness one_step_off --run-dir OUT/reference --quiet --set rl.steps=30 --set rl.checkpoint_every=5 --set rl.prompts_per_step=32 --set rl.group_size=8

    Step 2. the same command in another directory, SIGKILLed 3 time(s)
      start 1: killed 0.25 s after step 6 was logged -> on disk: 6 steps in metrics.jsonl, checkpoints at steps [5], unfinished saves: none
      start 2: killed 0.23 s after step 14 was logged -> on disk: 14 steps in metrics.jsonl, checkpoints at steps [5, 10], unfinished saves: none
      start 3: killed 0.13 s after step 21 was logged -> on disk: 21 steps in metrics.jsonl, checkpoints at steps [15, 20], unfinished saves: none
      start 4: resumed at step 20 and ran to the end (10 steps redone or new)
      (the reference, running alongside, took 154 s)

    Step 3. killed-and-resumed vs never interrupted
      final step                 30 vs 30
      parameters                 bitwise equal
      optimizer state            bitwise equal
      metrics.jsonl              steps 1..30; 2220 of 2220 values identical (clocks and memory left out)
      held-out after RL          {'pass@1': 0.6953125, 'pass@4': 0.75, 'reward': 0.6953125, 'length': 2.0} vs {'pass@1': 0.6953125, 'pass@4': 0.75, 'reward': 0.6953125, 'length': 2.0}
      reward per step            0.098 0.051 0.266 0.301 0.301 0.398 0.375 0.441 0.641 0.551
                                 0.551 0.488 0.598 0.617 0.695 0.633 0.672 0.668 0.746 0.637
                                 0.727 0.738 0.660 0.555 0.562 0.719 0.676 0.590 0.727 0.730
      -> the resumed run is bitwise equal to the uninterrupted one

    Step 4. one flipped byte in the newest checkpoint's params.tree
      restore: checkpoint OUT/damaged/checkpoints/step_00000030 is unusable (params.tree fails its sha256 check (damaged contents)); trying the previous one
      -> damaged step 30 skipped, restored step 25

    Step 5. resume the killed run with --set rl.loss=dapo
      exit code 2: minirl train: error: OUT/killed was started with another configuration (hash 1fda4b4795b7eb15, now f4148ef5e1ada597); use a new run directory, or --force to continue anyway
      -> refused: a resumed run must be the run that was started

    wrote OUT/preemption.png and OUT/results.json
    wall 291 s, CPU 108 s (this process and its children), load average 9.0 -> 13.4
"""

# %%
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from minirl.measure.metrics_log import measures_the_machine, read_metrics
from minirl.store.checkpoints import CheckpointManager
from minirl.store.trees import tree_mismatch

ROOT = Path(__file__).resolve().parents[1]

# %% [markdown]
# The settings. Both modes use the fixture preset (seconds per step); full mode runs longer and
# kills more often.


# %%
FULL = dict(steps=30, checkpoint_every=5, kills=3, max_delay_s=0.3, seed=0)
FAST = dict(steps=10, checkpoint_every=3, kills=1, max_delay_s=0.3, seed=0)
# A bigger batch than the preset's 8 x 4, so that a step lasts long enough to be hit mid-way.
BATCH = ["--set", "rl.prompts_per_step=32", "--set", "rl.group_size=8"]


# %%
def train_command(run_dir: Path, s: dict, extra: list[str] = ()) -> list[str]:
    """`minirl train` as a user types it (through this Python, so it works uninstalled)."""
    return [
        sys.executable,
        "-m",
        "minirl.cli",
        "train",
        "--preset",
        "fixture",
        "--staleness",
        "one_step_off",
        "--run-dir",
        str(run_dir),
        "--quiet",
        "--set",
        f"rl.steps={s['steps']}",
        "--set",
        f"rl.checkpoint_every={s['checkpoint_every']}",
        *BATCH,
        *extra,
    ]


# %%
def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


# %%
def steps_logged(run_dir: Path) -> int:
    return len(read_metrics(run_dir))


# %%
def run_watched(cmd, run_dir: Path, timeline: list, t0: float, kill_after=None) -> dict:
    """Run `cmd`, recording (seconds since t0, steps in metrics.jsonl) every 50 ms. With
    `kill_after=(steps, delay)`: SIGKILL it `delay` seconds after `steps` steps are logged."""
    start = time.perf_counter() - t0
    errors = tempfile.TemporaryFile("w+")  # a file, not a pipe: a full pipe would block the run
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL, stderr=errors)
    armed_at, killed = None, False
    while proc.poll() is None:
        now, logged = time.perf_counter() - t0, steps_logged(run_dir)
        timeline.append((now, logged))
        if kill_after is not None and armed_at is None and logged >= kill_after[0]:
            armed_at = now
        if armed_at is not None and now - armed_at >= kill_after[1]:
            proc.send_signal(signal.SIGKILL)  # no warning, no handler, no cleanup
            killed = True
            break
        time.sleep(0.05)
    proc.wait()
    errors.seek(0)
    stderr = errors.read()
    errors.close()
    timeline.append((time.perf_counter() - t0, steps_logged(run_dir)))
    if not killed and proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stderr[-3000:]}")
    return {
        "start_s": start,
        "end_s": time.perf_counter() - t0,
        "killed": killed,
        "returncode": proc.returncode,
    }


# %%
def on_disk(run_dir: Path) -> dict:
    """What a killed run left behind: finished checkpoints, cut-short saves, logged steps."""
    ckpts = run_dir / "checkpoints"
    tmp = sorted(p.name for p in ckpts.glob(".tmp-*")) if ckpts.exists() else []
    return {
        "checkpoints": CheckpointManager(run_dir).all_steps() if ckpts.exists() else [],
        "unfinished_saves": tmp,
        "steps_logged": steps_logged(run_dir),
    }


# %%
def compare_runs(ref: Path, got: Path) -> dict:
    """Bitwise comparison of the final checkpoints, and every step's metrics."""
    a, b = CheckpointManager(ref).restore(), CheckpointManager(got).restore()
    ma, mb = read_metrics(ref), read_metrics(got)
    compared = differing = 0
    first_difference = None
    for x, y in zip(ma, mb, strict=True):
        if set(x) != set(y):
            differing += 1
            first_difference = first_difference or (x["step"], "keys", sorted(set(x) ^ set(y)))
        for key in x:
            if measures_the_machine(key):  # clocks, rates, peak memory: differ between any two runs
                continue
            compared += 1
            if x[key] != y.get(key):
                differing += 1
                first_difference = first_difference or (x["step"], key, x[key], y.get(key))
    summary_a = json.loads((ref / "summary.json").read_text())
    summary_b = json.loads((got / "summary.json").read_text())
    return {
        "final_step": [a.step, b.step],
        "params": tree_mismatch(b.params, a.params) or "bitwise equal",
        "opt_state": tree_mismatch(b.opt_state, a.opt_state) or "bitwise equal",
        "steps": [[r["step"] for r in ma], [r["step"] for r in mb]],
        "metric_values_compared": compared,
        "metric_values_different": differing,
        "first_difference": first_difference,
        "after": [summary_a["after"], summary_b["after"]],
        "reward": [[r["reward/mean"] for r in ma], [r["reward/mean"] for r in mb]],
    }


# %%
def flip_one_byte(run_dir: Path, work: Path) -> dict:
    """Copy the run's checkpoints, flip one byte in the newest params file, restore."""
    import logging

    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(run_dir / "checkpoints", work / "checkpoints")
    manager = CheckpointManager(work)
    newest = manager.all_steps()[-1]
    path = manager.path(newest) / "params.tree"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one weight
    path.write_bytes(bytes(data))
    warnings: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("minirl.store.checkpoints").addHandler(handler)
    try:
        restored = manager.restore()
    finally:
        logging.getLogger("minirl.store.checkpoints").removeHandler(handler)
    return {"damaged_step": newest, "restored_step": restored.step, "warnings": warnings}


# %%
def plot(results: dict, path: Path) -> None:
    fig = Figure(figsize=(12, 4.4), layout="constrained")
    left, right = fig.subplots(1, 2)
    ref, got = results["comparison"]["reward"]
    steps = np.arange(1, len(ref) + 1)
    left.plot(steps, ref, "-", color="tab:blue", lw=2.5, label="never interrupted")
    left.plot(steps, got, "o", color="tab:red", ms=5, label="killed and resumed (same values)")
    for kill in results["kills"]:
        left.axvline(kill["steps_logged_at_kill"] + 0.5, color="gray", ls=":", lw=1)
    left.set_xlabel("training step")
    left.set_ylabel("batch reward (mean)")
    left.set_title("reward per step; dotted: where a SIGKILL hit")
    left.legend(fontsize=8)
    for name, color in (("reference", "tab:blue"), ("killed", "tab:red")):
        t, n = np.asarray(results["timelines"][name]).T
        right.step(t, n, where="post", color=color, label=f"{name} run")
    for p in results["processes"]:
        if p["killed"]:
            right.axvline(p["end_s"], color="tab:red", ls=":", lw=1)
    right.set_xlabel("seconds since the lesson started (shared machine)")
    right.set_ylabel("steps in metrics.jsonl")
    right.set_title("progress: a kill loses the steps after the last checkpoint")
    right.legend(fontsize=8)
    fig.suptitle("Preemption in miniature (RLAX Fig. 6): SIGKILL, resume, the same bits")
    fig.savefig(path, dpi=110)


# %%
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="fewer steps and kills (CI)")
    parser.add_argument("--out", default="runs/tutorials/10_preemption")
    args = parser.parse_args()
    out = Path(args.out)
    s = FAST if args.fast else FULL
    ref_dir, killed_dir = out / "reference", out / "killed"
    for d in (ref_dir, killed_dir, out / "damaged"):
        shutil.rmtree(d, ignore_errors=True)  # a fresh start every time
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(s["seed"])
    t0, load0 = time.perf_counter(), os.getloadavg()
    print(
        f"mode: {'fast' if args.fast else 'full'}   cores: {os.cpu_count()}   "
        f"load average: {os.getloadavg()[0]:.1f}"
    )

    # Steps 1 and 2 run side by side (2 cores): the reference in a thread, the kills here.
    print(
        f"\nStep 1. the reference: {s['steps']} steps, a checkpoint every "
        f"{s['checkpoint_every']}, never interrupted"
    )
    print("  $ python " + " ".join(train_command(ref_dir, s)[1:]).replace(str(out), "OUT"))
    timelines = {"reference": [], "killed": []}
    ref_proc: dict = {}
    reference = threading.Thread(
        target=lambda: ref_proc.update(
            run_watched(train_command(ref_dir, s), ref_dir, timelines["reference"], t0)
        )
    )
    reference.start()

    print(f"\nStep 2. the same command in another directory, SIGKILLed {s['kills']} time(s)")
    kills, processes = [], []
    for k in range(s["kills"]):
        # Spread the kills over the run; each lands after the checkpoint the last one left.
        target = 1 + (k + 1) * s["steps"] // (s["kills"] + 1) - s["checkpoint_every"] // 2
        delay = rng.uniform(0.0, s["max_delay_s"])
        p = run_watched(
            train_command(killed_dir, s), killed_dir, timelines["killed"], t0, (target, delay)
        )
        processes.append(p)
        left = on_disk(killed_dir)
        kills.append({"target_step": target, "delay_s": delay, **left})
        kills[-1]["steps_logged_at_kill"] = left["steps_logged"]
        state = "killed" if p["killed"] else f"finished before the kill (exit {p['returncode']})"
        print(
            f"  start {k + 1}: {state} {delay:.2f} s after step {target} was logged -> on disk: "
            f"{left['steps_logged']} steps in metrics.jsonl, checkpoints at steps "
            f"{left['checkpoints']}, unfinished saves: {left['unfinished_saves'] or 'none'}"
        )
    resume_from = kills[-1]["checkpoints"][-1] if kills[-1]["checkpoints"] else 0
    p = run_watched(train_command(killed_dir, s), killed_dir, timelines["killed"], t0)
    processes.append(p)
    print(
        f"  start {s['kills'] + 1}: resumed at step {resume_from} and ran to the end "
        f"({s['steps'] - resume_from} steps redone or new)"
    )
    if not any(q["killed"] for q in processes):
        raise SystemExit("no start was killed: the run finished before the first kill")
    reference.join()
    print(
        f"  (the reference, running alongside, took {ref_proc['end_s'] - ref_proc['start_s']:.0f} s)"
    )

    # Step 3: the comparison.
    cmp = compare_runs(ref_dir, killed_dir)
    print("\nStep 3. killed-and-resumed vs never interrupted")
    print(f"  final step                 {cmp['final_step'][1]} vs {cmp['final_step'][0]}")
    print(f"  parameters                 {cmp['params']}")
    print(f"  optimizer state            {cmp['opt_state']}")
    print(
        f"  metrics.jsonl              steps {cmp['steps'][1][0]}..{cmp['steps'][1][-1]}; "
        f"{cmp['metric_values_compared'] - cmp['metric_values_different']} of "
        f"{cmp['metric_values_compared']} values identical (clocks and memory left out)"
    )
    print(f"  held-out after RL          {cmp['after'][1]} vs {cmp['after'][0]}")
    rewards = [f"{r:.3f}" for r in cmp["reward"][1]]
    for i in range(0, len(rewards), 10):
        label = "reward per step" if i == 0 else ""
        print(f"  {label:27s}{' '.join(rewards[i : i + 10])}")
    ok = (
        cmp["params"] == cmp["opt_state"] == "bitwise equal"
        and cmp["metric_values_different"] == 0
        and cmp["steps"][0] == cmp["steps"][1] == list(range(1, s["steps"] + 1))
        and cmp["after"][0] == cmp["after"][1]
    )
    if not ok:
        raise SystemExit(f"the resumed run differs from the reference: {cmp['first_difference']}")
    print("  -> the resumed run is bitwise equal to the uninterrupted one")

    # Step 4: a damaged checkpoint is detected and skipped.
    damage = flip_one_byte(killed_dir, out / "damaged")
    print("\nStep 4. one flipped byte in the newest checkpoint's params.tree")
    print(f"  restore: {damage['warnings'][0] if damage['warnings'] else 'no warning'}")
    print(
        f"  -> damaged step {damage['damaged_step']} skipped, restored step "
        f"{damage['restored_step']}"
    )
    if not (damage["restored_step"] < damage["damaged_step"] and damage["warnings"]):
        raise SystemExit("the damaged checkpoint was not detected")

    # Step 5: a resume with another configuration is refused.
    changed = subprocess.run(
        train_command(killed_dir, s, ["--set", "rl.loss=dapo"]),
        env=child_env(),
        capture_output=True,
        text=True,
    )
    reason = (changed.stderr.strip().splitlines() or ["(no message)"])[-1]
    print("\nStep 5. resume the killed run with --set rl.loss=dapo")
    print(f"  exit code {changed.returncode}: {reason}")
    if changed.returncode == 0:
        raise SystemExit("a resume with a changed configuration was accepted")
    print("  -> refused: a resumed run must be the run that was started")

    results = {
        "mode": "fast" if args.fast else "full",
        "settings": s,
        "kills": kills,
        "processes": processes,
        "comparison": cmp,
        "bitwise_equal": ok,
        "damaged_checkpoint": damage,
        "changed_config_refused": {"returncode": changed.returncode, "message": reason},
        "timelines": timelines,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": sum(
            u.ru_utime + u.ru_stime
            for u in (
                resource.getrusage(resource.RUSAGE_SELF),
                resource.getrusage(resource.RUSAGE_CHILDREN),
            )
        ),
        "load_average": [load0, os.getloadavg()],
    }
    plot(results, out / "preemption.png")
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"\nwrote {out / 'preemption.png'} and {out / 'results.json'}")
    print(
        f"wall {results['wall_s']:.0f} s, CPU {results['cpu_s']:.0f} s (this process and its "
        f"children), load average {load0[0]:.1f} -> {os.getloadavg()[0]:.1f}"
    )


# %%
if __name__ == "__main__":
    main()
