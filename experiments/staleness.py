"""Staleness experiments (RLAX Fig. 4 and AReaL's speed-up, in miniature).

    python experiments/staleness.py curves  [--preset countdown] [--steps 40] [--fast]
    python experiments/staleness.py speedup [--preset arithmetic] [--steps 30] [--fast]

`curves` trains once for each staleness setting (j, k) in {(1,1), (1,2), (4,8), (4,16)} (the
engine reloads every j-th version; the trainer accepts data at most k versions behind; eta = k-1
lets generation run that far ahead) and plots reward against steps and against wall-clock time.

Times exclude step 1, which carries the one-off JIT compiles. `speedup` compares the synchronous on-policy run (lockstep, j = k = 1) with the asynchronous
scheduler at k = 4 on the long-tailed scratchpad task: wall-clock time for the async run to reach
the synchronous run's final reward, and each run's time split (generate / verify / train / wait).

Both write JSON and PNGs under --out (default runs/staleness) and print a table. Numbers depend
on the machine's load: run it on a quiet machine and report `uptime` with the results.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np

from minirl.config import make_config
from minirl.metrics_log import read_metrics
from minirl.plots import plot_compare
from minirl.runner import Run

SETTINGS = [(1, 1), (1, 2), (4, 8), (4, 16)]


def run(preset: str, overrides: list[str], run_dir: Path) -> list[dict]:
    cfg = make_config(preset, overrides)
    shutil.rmtree(run_dir, ignore_errors=True)  # this script's own output: start afresh
    t0 = time.perf_counter()
    Run(cfg, run_dir, log=lambda *a: None).train(resume=False)
    records = read_metrics(run_dir)
    print(f"  {run_dir.name}: {time.perf_counter() - t0:.0f}s")
    return records


def fast_overrides(fast: bool) -> list[str]:
    return ["sft.steps=2", "eval.prompts=8", "eval.samples=2", "rl.prompts_per_step=4",
            "rl.group_size=2"] if fast else []


def curves(args) -> dict:
    results = {}
    for j, k in SETTINGS:
        name = f"j{j}_k{k}"
        overrides = [f"rl.steps={args.steps}", f"rl.reload_every={j}", f"rl.max_lag={k}",
                     f"rl.eta={k - 1}", f"rl.scheduler={args.scheduler}", *fast_overrides(args.fast)]
        recs = run(args.preset, overrides, args.out / name)
        results[name] = {"final_reward": float(np.mean([r["reward/mean"] for r in recs[-5:]])),
                         "seconds_after_step_1": float(elapsed(recs)[-1]),
                         "stale_groups": recs[-1]["count/groups_stale"],
                         "mean_lag": float(np.mean([r["lag/mean"] for r in recs]))}
    dirs = [args.out / f"j{j}_k{k}" for j, k in SETTINGS]
    labels = [f"j={j}, k={k}" for j, k in SETTINGS]
    results["plots"] = [str(plot_compare(dirs, x=x, y="reward/mean", labels=labels,
                                         out=args.out / f"reward_vs_{x}.png")) for x in ("step", "time")]
    return results


def elapsed(records: list[dict]) -> np.ndarray:
    """Seconds since the end of the first step (which carries the one-off JIT compiles)."""
    return np.array([r["wall_time"] for r in records]) - records[0]["wall_time"]


def time_to_reach(records: list[dict], target: float, window: int = 5) -> float | None:
    """Wall-clock seconds (after step 1) until the running mean reward first reaches `target`."""
    rewards = np.array([r["reward/mean"] for r in records])
    t = elapsed(records)
    smooth = np.convolve(rewards, np.ones(window) / window, mode="valid")
    hit = np.nonzero(smooth >= target)[0]
    return None if len(hit) == 0 else float(t[hit[0] + window - 1])


def speedup(args) -> dict:
    base = [f"rl.steps={args.steps}", *fast_overrides(args.fast)]
    sync = run(args.preset, base + ["rl.scheduler=lockstep", "rl.max_lag=1", "rl.eta=0"], args.out / "sync")
    asyn = run(args.preset, base + ["rl.scheduler=async", "rl.max_lag=4", "rl.eta=3"], args.out / "async")
    target = float(np.mean([r["reward/mean"] for r in sync[-5:]]))
    t_sync, t_async = time_to_reach(sync, target), time_to_reach(asyn, target)

    def split(recs):
        keys = ("time/generate", "time/verify", "time/train", "time/wait", "time/step")
        return {k: float(sum(r.get(k, 0.0) for r in recs[1:])) for k in keys}  # step 1 compiles

    plot = plot_compare([args.out / "sync", args.out / "async"], x="time", y="reward/mean",
                        labels=["sync (lockstep, k=1)", "async (k=4, eta=3)"], out=args.out / "speedup.png")
    return {"target_reward": target, "sync_seconds": t_sync, "async_seconds": t_async,
            "speedup": (t_sync / t_async) if t_sync and t_async else None,
            "sync_split": split(sync), "async_split": split(asyn), "plot": str(plot)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["curves", "speedup"])
    p.add_argument("--preset", default=None, help="countdown for curves, arithmetic for speedup")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--scheduler", default="async", choices=["lockstep", "async"], help="curves only")
    p.add_argument("--out", type=Path, default=Path("runs/staleness"))
    p.add_argument("--fast", action="store_true", help="a seconds-long smoke run (tests use it)")
    args = p.parse_args()
    args.preset = args.preset or ("countdown" if args.what == "curves" else "arithmetic")
    if args.fast:
        args.preset, args.steps = "fixture", min(args.steps, 6)
    args.out.mkdir(parents=True, exist_ok=True)
    results = curves(args) if args.what == "curves" else speedup(args)
    (args.out / f"{args.what}.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
