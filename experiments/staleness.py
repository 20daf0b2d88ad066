"""Staleness experiments: RLAX Fig. 4 and AReaL's speed-up, in miniature (issue #8).

    PYTHONPATH=. python experiments/staleness.py speedup   # sync vs async on the long tail
    PYTHONPATH=. python experiments/staleness.py curves    # (j, k) reward curves
    PYTHONPATH=. python experiments/staleness.py all       # both, then the result files
    PYTHONPATH=. python experiments/staleness.py speedup --fast   # a smoke run (tests use it)

`speedup` trains the scratchpad-arithmetic preset (completions of 13..~260 tokens, so a few long
ones hold a synchronous batch) four ways from the same warm start, for the same number of steps:

  sync        lockstep, j = k = 1, eta = 0: generate the batch, verify, train, reload
  async       the async scheduler, k = 4, eta = 1, j = 1, in-flight requests continued with the
              new weights at each reload (AReaL): the engine keeps its slots full with the next
              batch's prompts while the trainer trains (eta = 1: one batch generated ahead; generation
              is the shorter part here, so more run-ahead would only wait; k = 4: nothing goes stale)
  async_1core the same, with XLA's multi-threaded Eigen off (`--xla_cpu_multi_thread_eigen=false`),
              meant to run each part's matmuls on the thread that launched them (one core for
              the engine, one for the trainer) instead of both sharing XLA's thread pool. Measured
              on jax 0.10.2: it does not change how many cores a run uses (docs/staleness.md)
  sync_1core  the synchronous run with the same flag (the baseline for async_1core)

and reports: seconds per step; the time each run needs to reach the synchronous run's final
reward, measured two ways (training reward smoothed over the last `--window` steps, and held-out
pass@1 of checkpoints evaluated afterwards by one common evaluator, which the async run's bias
towards quickly finished short problems cannot inflate); each part's time split (engine: decode
/ verify / reload / idle, trainer: train / idle); and the engine's slot occupancy (kept tokens /
slot-steps computed), and how many cores each run really got (its process's CPU seconds / wall
seconds). Time is measured from the start of RL, step 1 included; a short warm-up of
every configuration runs first so that both arms load compiled code from JAX's persistent
cache, and the seconds still spent compiling are reported per run. `--arms sync async` runs a
subset of the arms (sync, the baseline, always runs); `--set KEY=VALUE` overrides the config of
every run (both commands).

`curves` trains once per staleness setting (j, k) in {(1,1), (1,2), (4,8), (4,16)} with the async
scheduler (eta = k - 1, so generation may run ahead as far as k allows) and plots reward against
steps and against wall-clock time; (1,1) is synchronous (eta = 0).

Every run is a subprocess (XLA flags are per process); each prints os.getloadavg() before and
after, and the result JSON holds them. Timings depend on the machine's load: rerun on a quiet
machine for numbers to quote. Run time on the 2-core machine alone (load ~2): curves 10 min
(measured); speedup ~20 min (estimated: with `--steps 12 --warmup 2 --checkpoint-every 4
--heldout-prompts 64 --heldout-samples 2` it took 4 min); the first run adds the warm start
(~5 min, cached in ~/.cache/minirl); docs/staleness.md has the measured results. Output: --out
(default runs/staleness: run directories with checkpoints) and --results (default
experiments/results/staleness: the JSON and PNGs only).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = [(1, 1), (1, 2), (4, 8), (4, 16)]
ONE_CORE_EACH = "--xla_cpu_multi_thread_eigen=false"
SYNC = ["rl.scheduler=lockstep", "rl.reload_every=1", "rl.max_lag=1", "rl.eta=0"]
ASYNC = [
    "rl.scheduler=async",
    "rl.reload_every=1",
    "rl.max_lag=4",
    "rl.eta=1",
    "rl.reload_policy=continue",
]
ARMS = {
    "sync": (SYNC, ""),
    "sync_1core": (SYNC, ONE_CORE_EACH),
    "async": (ASYNC, ""),
    "async_1core": (ASYNC, ONE_CORE_EACH),
}
# Checkpoints (params at known wall-clock times) for the held-out evaluation afterwards; the
# in-run evaluation before/after RL is cut to a token size (it is not what we compare).
COMMON = ["rl.keep_checkpoints=1000", "eval.prompts=8", "eval.samples=1"]
FAST = ["sft.steps=2", "rl.prompts_per_step=4", "rl.group_size=2", "rl.checkpoint_every=2"]


# ---- one run, in its own process ---------------------------------------------------------------


def child(spec: dict) -> None:
    """Runs inside the subprocess: one training run, with compile time and load recorded."""
    import jax

    from minirl.run.presets import make_config
    from minirl.run.runner import Run

    compile_s = [0.0]

    def on_event(event: str, seconds: float, **_) -> None:
        if event.startswith(
            "/jax/core/compile/"
        ):  # tracing, lowering, backend compile / cache load
            compile_s[0] += seconds

    jax.monitoring.register_event_duration_secs_listener(on_event)
    run_dir = Path(spec["run_dir"])
    shutil.rmtree(run_dir, ignore_errors=True)  # this script's own output: start afresh
    load_before, t0, cpu0 = os.getloadavg(), time.perf_counter(), time.process_time()
    Run(
        make_config(spec["preset"], spec["overrides"]), run_dir, log=lambda *a: None, progress=False
    ).train(resume=False)
    (run_dir / "timing.json").write_text(
        json.dumps(
            {
                "seconds": time.perf_counter() - t0,
                "compile_seconds": compile_s[0],
                "cpu_seconds": time.process_time() - cpu0,  # all threads of this process
                "load_before": load_before,
                "load_after": os.getloadavg(),
                "xla_flags": os.environ.get("XLA_FLAGS", ""),
            },
            indent=2,
        )
    )


def run(name: str, preset: str, overrides: list[str], out: Path, xla_flags: str = "") -> Path:
    run_dir = out / name
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    env["XLA_FLAGS"] = " ".join(f for f in (env.get("XLA_FLAGS", ""), xla_flags) if f)
    spec = {"run_dir": str(run_dir), "preset": preset, "overrides": overrides}
    print(f"  {name}: load {_load()} ...", flush=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, __file__, "_child", json.dumps(spec)], check=True, env=env)
    timing = json.loads((run_dir / "timing.json").read_text())
    print(
        f"  {name}: {time.perf_counter() - t0:.0f}s (compiling {timing['compile_seconds']:.1f}s), "
        f"load {_load()}",
        flush=True,
    )
    return run_dir


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# ---- reading a run -------------------------------------------------------------------------------


def records_of(run_dir: Path) -> list[dict]:
    from minirl.measure.metrics_log import read_metrics

    return read_metrics(run_dir)


def elapsed(records: list[dict]) -> np.ndarray:
    """Seconds since RL began (the first step's start), at the end of each step."""
    wall = np.array([r["wall_time"] for r in records])
    return wall - (wall[0] - records[0]["time/step"])


def trailing_mean(x: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last `window` values at each index (fewer at the start)."""
    c = np.cumsum(np.insert(np.asarray(x, np.float64), 0, 0.0))
    idx = np.arange(1, len(x) + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def first_time(
    times: np.ndarray, values: np.ndarray, target: float, start: int = 0
) -> float | None:
    """The first time (from index `start` on) at which `values` >= target."""
    hit = np.nonzero(values[start:] >= target - 1e-12)[0]
    return None if len(hit) == 0 else float(times[start + hit[0]])


def value_at(times: np.ndarray, values: np.ndarray, t: float) -> float:
    """The last value recorded at or before time t (the first one if none was)."""
    i = int(np.searchsorted(times, t, side="right")) - 1
    return float(values[max(i, 0)])


def heldout(
    run_dir: Path, preset: str, overrides: list[str], prompts: int, samples: int
) -> list[dict]:
    """pass@1 on `prompts` test prompts x `samples` of every checkpoint, with one evaluator (a
    fresh default engine), paired with the wall-clock time the checkpoint's step ended."""
    from minirl.control.evaluation import evaluate, heldout_prompts
    from minirl.run.presets import make_config
    from minirl.run.runner import Run
    from minirl.run.warmstart import warm_start
    from minirl.store.checkpoints import CheckpointManager

    run = Run(make_config(preset, overrides), run_dir, log=lambda *a: None, progress=False)
    ckpts = CheckpointManager(run_dir, keep=10**6)
    records = records_of(run_dir)
    times = dict(zip([r["step"] for r in records], elapsed(records), strict=True))
    test = heldout_prompts(run.task, prompts)
    base, _ = warm_start(run.cfg, run.tokenizer, run.task, progress=False, log=lambda *a: None)
    points = [(0, 0.0, base)] + [
        (s, float(times[s]), ckpts.restore(step=s).params) for s in ckpts.all_steps()
    ]
    out = []
    for step, t, params in points:
        res = evaluate(run.engine(step, params), run.task, run.tokenizer, test, samples)
        out.append({"step": step, "time": t, "pass@1": res["pass@1"]})
    ckpts.close()
    return out


def time_split(records: list[dict], timing: dict) -> dict:
    """Where each part's time went, in seconds over the whole RL run (step 1 included)."""
    wall = float(elapsed(records)[-1])
    last = records[-1]
    if "engine/busy_seconds" in last:  # async: the rollout thread's own accounts
        engine = {p: last[f"engine/{p}_seconds"] for p in ("busy", "verify", "reload")}
    else:
        engine = {
            "busy": sum(r["time/generate"] for r in records),
            "verify": sum(r["time/verify"] for r in records),
            "reload": 0.0,
        }
    train = sum(r["time/train"] for r in records)
    occupancy = sum(r["engine/decode_tokens"] for r in records) / max(
        sum(r["engine/slot_steps"] for r in records), 1.0
    )
    return {
        "wall": wall,
        "engine": {
            "generate": engine["busy"],
            "verify": engine["verify"],
            "reload": engine["reload"],
            "idle": max(0.0, wall - sum(engine.values())),
        },
        "trainer": {"train": train, "idle": max(0.0, wall - train)},
        "overlap": (engine["busy"] + engine["verify"] + train) / wall,  # > 1: parts ran together
        "occupancy": occupancy,
        "compile_seconds": timing["compile_seconds"],
        # CPU seconds / wall seconds of the whole child (warm-start load and the token-sized
        # evaluations included): how many of the 2 cores the run really got
        "cores_used": timing["cpu_seconds"] / timing["seconds"]
        if "cpu_seconds" in timing
        else None,
        "load": [timing["load_before"], timing["load_after"]],
    }


# ---- the two experiments ---------------------------------------------------------------------------


def speedup(args) -> dict:
    base = [
        *COMMON,
        f"rl.steps={args.steps}",
        f"rl.checkpoint_every={args.checkpoint_every}",
        *(["rl.dynamic_filter=true"] if args.dynamic_filter else []),
        *args.set,
        *(FAST if args.fast else []),
    ]
    if args.warmup:  # fill JAX's persistent compilation cache for every arm (not measured)
        for name, (arm, flags) in args.arms.items():
            run(
                f"warmup_{args.prefix}{name}",
                args.preset,
                base + arm + [f"rl.steps={args.warmup}"],
                args.out,
                flags,
            )
    result, runs = {"preset": args.preset, "steps": args.steps, "load_start": os.getloadavg()}, {}
    for name, (arm, flags) in args.arms.items():
        run_dir = run(args.prefix + name, args.preset, base + arm, args.out, flags)
        recs = records_of(run_dir)
        timing = json.loads((run_dir / "timing.json").read_text())
        evals = heldout(
            run_dir, args.preset, base + arm, args.heldout_prompts, args.heldout_samples
        )
        runs[name] = {"records": recs, "heldout": evals}
        result[name] = {
            "seconds_per_step": float(elapsed(recs)[-1] / len(recs)),
            "split": time_split(recs, timing),
            "heldout": evals,
            "final_reward": float(trailing_mean([r["reward/mean"] for r in recs], args.window)[-1]),
            "stale_groups": recs[-1]["count/groups_stale"],
            "mean_lag": float(np.mean([r["lag/mean"] for r in recs])),
        }

    # The target: the synchronous run's final reward, smoothed the same way for every run
    # (training reward: trailing mean over `window` steps; held-out: over the last 2 checkpoints).
    def heldout_curve(r):
        return (
            np.array([e["time"] for e in r["heldout"]]),
            trailing_mean([e["pass@1"] for e in r["heldout"]], 2),
        )

    target_train = result["sync"]["final_reward"]
    target_heldout = float(heldout_curve(runs["sync"])[1][-1])
    result["target"] = {
        "train_reward_smoothed": target_train,
        "heldout_pass@1_smoothed": target_heldout,
    }
    for name, r in runs.items():
        t, rew = (
            elapsed(r["records"]),
            trailing_mean([x["reward/mean"] for x in r["records"]], args.window),
        )
        ev_t, ev_v = heldout_curve(r)
        result[name]["time_to_target"] = {
            "train_reward": first_time(t, rew, target_train, start=min(args.window, len(t)) - 1),
            "heldout": first_time(ev_t, ev_v, target_heldout, start=1),
        }
        # and the other way round: how far each run got by the time the sync run ended
        t_end = float(elapsed(runs["sync"]["records"])[-1])
        result[name]["at_sync_end"] = {
            "train_reward": value_at(t, rew, t_end),
            "heldout": value_at(ev_t, ev_v, t_end),
        }
    for name in args.arms:
        ratios = {"per_step": result["sync"]["seconds_per_step"] / result[name]["seconds_per_step"]}
        for key, t in result[name]["time_to_target"].items():
            ts = result["sync"]["time_to_target"][key]
            ratios[f"to_target_{key}"] = (ts / t) if ts and t else None
        result[name]["speedup_vs_sync"] = ratios
    result["load_end"] = os.getloadavg()
    result["plots"] = [str(plot_speedup(runs, result, args)), str(plot_split(result, args))]
    return result


def curves(args) -> dict:
    result, dirs, labels = (
        {"preset": args.preset, "steps": args.steps, "load_start": os.getloadavg()},
        [],
        [],
    )
    for j, k in SETTINGS:
        name = f"j{j}_k{k}"
        overrides = [
            *COMMON,
            f"rl.steps={args.steps}",
            f"rl.checkpoint_every={args.steps}",
            "rl.scheduler=async",
            f"rl.reload_every={j}",
            f"rl.max_lag={k}",
            f"rl.eta={k - 1}",
            *args.set,
            *(FAST if args.fast else []),
        ]
        run_dir = run(name, args.preset, overrides, args.out)
        recs = records_of(run_dir)
        timing = json.loads((run_dir / "timing.json").read_text())
        rewards = [r["reward/mean"] for r in recs]
        result[name] = {
            "final_reward": float(trailing_mean(rewards, args.window)[-1]),
            "seconds": float(elapsed(recs)[-1]),
            "seconds_per_step": float(elapsed(recs)[-1] / len(recs)),
            "stale_groups": recs[-1]["count/groups_stale"],
            "mean_lag": float(np.mean([r["lag/mean"] for r in recs])),
            "max_step_mean_lag": float(max(r["lag/mean"] for r in recs)),
            "load": [timing["load_before"], timing["load_after"]],
            "compile_seconds": timing["compile_seconds"],
        }
        dirs.append(run_dir)
        labels.append(f"j={j}, k={k}")
    result["load_end"] = os.getloadavg()
    result["plots"] = [str(plot_curves(dirs, labels, args, x)) for x in ("step", "time")]
    return result


# ---- plots -----------------------------------------------------------------------------------------


def _figure(ncols: int = 1):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5 * ncols, 4.2), layout="constrained")
    return fig, fig.subplots(1, ncols)


def plot_curves(dirs, labels, args, x: str) -> Path:
    fig, ax = _figure()
    for run_dir, label in zip(dirs, labels, strict=True):
        recs = records_of(run_dir)
        xs = elapsed(recs) if x == "time" else np.array([r["step"] for r in recs])
        ys = trailing_mean([r["reward/mean"] for r in recs], args.window)
        ax.plot(xs, ys, label=label)
    ax.set_xlabel("step" if x == "step" else "wall-clock since RL began (s)")
    ax.set_ylabel(f"training reward (mean of last {args.window} steps)")
    ax.set_title(f"{args.preset}: staleness (j, k), async scheduler, eta = k - 1")
    ax.grid(alpha=0.3)
    ax.legend()
    path = args.results / f"curves_reward_vs_{x}.png"
    fig.savefig(path, dpi=90)
    return path


def plot_speedup(runs: dict, result: dict, args) -> Path:
    fig, (left, right) = _figure(2)
    for name, r in runs.items():
        t = elapsed(r["records"])
        (line,) = left.plot(
            t, trailing_mean([x["reward/mean"] for x in r["records"]], args.window), label=name
        )
        right.plot(
            [e["time"] for e in r["heldout"]],
            [e["pass@1"] for e in r["heldout"]],
            "o-",
            color=line.get_color(),
            label=name,
        )
    left.axhline(
        result["target"]["train_reward_smoothed"], color="gray", ls="--", lw=1, label="target"
    )
    right.axhline(
        result["target"]["heldout_pass@1_smoothed"],
        color="gray",
        ls="--",
        lw=1,
        label="target (sync, last 2 points)",
    )
    left.set_ylabel(f"training reward (mean of last {args.window} steps)")
    right.set_ylabel(f"held-out pass@1 ({args.heldout_prompts} prompts x {args.heldout_samples})")
    for ax in (left, right):
        ax.set_xlabel("wall-clock since RL began (s)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"{args.preset}{' + dynamic filter' if args.dynamic_filter else ''} {' '.join(args.set)}: sync vs async, "
        f"{args.steps} steps each (load at start "
        f"{result['load_start'][0]:.1f})"
    )
    path = args.results / f"{args.tag}_reward_vs_time.png"
    fig.savefig(path, dpi=90)
    return path


def plot_split(result: dict, args) -> Path:
    """Two bars per run (engine, trainer), each split into its parts, in seconds."""
    colours = {
        "generate": "tab:blue",
        "verify": "tab:cyan",
        "reload": "tab:purple",
        "train": "tab:orange",
        "idle": "lightgray",
    }
    fig, ax = _figure()
    ticks, labelled = [], set()
    for i, name in enumerate(n for n in ARMS if n in result):
        for j, part in enumerate(("engine", "trainer")):
            y, left = 3 * i + j, 0.0
            for key, seconds in result[name]["split"][part].items():
                ax.barh(
                    y,
                    seconds,
                    left=left,
                    color=colours[key],
                    label=None if key in labelled else key,
                )
                labelled.add(key)
                left += seconds
            ticks.append((y, f"{name} {part}"))
    ax.set_yticks([y for y, _ in ticks], [label for _, label in ticks])
    ax.invert_yaxis()
    ax.set_xlabel("seconds (whole RL run)")
    ax.set_title("where each part's time went (whole RL run)")
    ax.legend(fontsize=8, loc="lower right")
    path = args.results / f"{args.tag}_time_split.png"
    fig.savefig(path, dpi=90)
    return path


# ---- the command line --------------------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "_child":
        return child(json.loads(sys.argv[2]))
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("what", choices=["speedup", "curves", "all"])
    p.add_argument("--preset", default="arithmetic")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--window", type=int, default=5, help="steps in the reward's trailing mean")
    p.add_argument("--checkpoint-every", type=int, default=5, help="speedup: held-out points")
    p.add_argument("--heldout-prompts", type=int, default=128)
    p.add_argument("--heldout-samples", type=int, default=4)
    p.add_argument(
        "--warmup", type=int, default=3, help="speedup: warm-up steps per arm (0 = none)"
    )
    p.add_argument("--out", type=Path, default=Path("runs/staleness"))
    p.add_argument(
        "--results", type=Path, default=None, help="default: experiments/results/staleness"
    )
    p.add_argument(
        "--dynamic-filter",
        action="store_true",
        help="speedup: DAPO dynamic filtering in every arm (generation-heavy steps)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for every run (repeatable), e.g. engine.slots=32",
    )
    p.add_argument(
        "--arms",
        nargs="+",
        choices=list(ARMS),
        default=list(ARMS),
        help="speedup: which arms to run (sync, the baseline, always runs)",
    )
    p.add_argument("--fast", action="store_true", help="a seconds-long smoke run (tests use it)")
    args = p.parse_args()
    args.arms = {name: ARMS[name] for name in ARMS if name == "sync" or name in args.arms}
    if args.fast:
        args.preset, args.steps, args.warmup = "fixture", min(args.steps, 4), 0
        args.checkpoint_every, args.heldout_prompts, args.heldout_samples, args.window = 2, 4, 1, 2
    args.results = args.results or (
        args.out if args.fast else ROOT / "experiments/results/staleness"
    )
    args.prefix = "filter_" if args.dynamic_filter else ""
    args.tag = "speedup_filter" if args.dynamic_filter else "speedup"
    args.out.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    for what in ["speedup", "curves"] if args.what == "all" else [args.what]:
        results = speedup(args) if what == "speedup" else curves(args)
        name = args.tag if what == "speedup" else what
        (args.results / f"{name}.json").write_text(json.dumps(results, indent=2))
        print(json.dumps(summary(what, results), indent=2))


def summary(what: str, results: dict) -> dict:
    """The headline numbers (the JSON file has everything)."""
    if what == "curves":
        return {k: v for k, v in results.items() if k != "plots"}
    keep = (
        "seconds_per_step",
        "final_reward",
        "time_to_target",
        "at_sync_end",
        "speedup_vs_sync",
        "stale_groups",
    )
    out = {
        "target": results["target"],
        "load_start": results["load_start"],
        "load_end": results["load_end"],
    }
    for name in (n for n in ARMS if n in results):
        out[name] = {k: results[name][k] for k in keep if k in results[name]}
        s = results[name]["split"]
        out[name]["split"] = {
            k: s.get(k)
            for k in (
                "wall",
                "engine",
                "trainer",
                "overlap",
                "occupancy",
                "cores_used",
                "compile_seconds",
            )
        }
    return out


if __name__ == "__main__":
    main()
