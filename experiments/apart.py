"""The async speed-up where generation and training really run apart (issue #16, item 5).

    python experiments/apart.py                  # the four arms below, then the result files
    python experiments/apart.py --steps 3 --fast # a smoke run (tests use it)

On this 2-core machine the papers' setting (generation and training on different devices) is
two processes, each pinned to a core of its own: the engine in a Ray actor on core 0, the
trainer in a Ray actor on core 1 (scale/ray_workers.py; XLA's thread pool in each sizes itself
to its one core). The arms, from the same warm start, for the same number of steps:

  colocated_sync  `minirl train` as it is: lockstep, one process, both parts on both cores
  apart_sync      lockstep, engine actor on core 0, trainer actor on core 1
  apart_eta1      the async scheduler, same placement, eta = 1 (k = 2, in-flight requests
                  continued at each reload)
  apart_eta2      the same with eta = 2 (k = 3)
  apart_j4_k4     lesson 06's (j, k) = (4, 4) and (4, 8) with eta = k - 1 and its reload policy
  apart_j4_k8     (discard), same placement: RLAX Fig. 4's comparison where the parts run apart
                  (not in the default set: --arms apart_sync apart_j4_k4 apart_j4_k8)

The controller (the driver process) and the verifier actor are not pinned: they do little.
Reported per arm: seconds per step (median, first `--skip` steps left out: compiles), the time
to a held-out reward (pass@1 of checkpoints evaluated afterwards by one evaluator, smoothed over
two checkpoints; the target is the lowest final value of the arms, so every arm has a time),
the phase times of `apart_sync` (t_gen = generate + verify, t_train = train + publish, medians)
and the ideal overlap speed-up `(t_gen + t_train) / max(t_gen, t_train)` next to the measured
ratios, and each process's CPU seconds per wall second and the cores its threads were seen
running on (sampled from /proc every 50 ms), which shows the pinning held.

Every arm is a subprocess (and a Ray cluster of its own); each prints os.getloadavg() before
and after. Output: --out (run directories) and --results (JSON and PNG; default
experiments/results/apart).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SYNC = ["rl.scheduler=lockstep", "rl.reload_every=1", "rl.max_lag=1", "rl.eta=0"]


def async_arm(eta: int, j: int = 1, k: int | None = None, policy: str = "continue") -> list[str]:
    return [
        "rl.scheduler=async",
        f"rl.reload_every={j}",
        f"rl.max_lag={eta + 1 if k is None else k}",
        f"rl.eta={eta}",
        f"rl.reload_policy={policy}",
    ]


ARMS = {
    "colocated_sync": (SYNC, False),
    "apart_sync": (SYNC, True),
    "apart_eta1": (async_arm(1), True),
    "apart_eta2": (async_arm(2), True),
    # lesson 06's staler settings (j, k) = (4, 4) and (4, 8), eta = k - 1, its reload policy
    "apart_j4_k4": (async_arm(3, j=4, k=4, policy="discard"), True),
    "apart_j4_k8": (async_arm(7, j=4, k=8, policy="discard"), True),
}
# The workload: the default countdown task (it learns within minutes) scored as DAPO scores it:
# reward 1 for a right answer and 0 otherwise (no format reward), with DAPO's dynamic filter
# (groups whose rewards are all equal are dropped and more are generated). Early in training most
# groups fail entirely, so a step generates several batches' worth to train on one, and the two
# phases take about as long on one core each (apart_sync, 12 steps: generate + verify 0.78 s,
# train + publish 0.82 s per step). With the preset's 0.1 format reward they were 0.35 s and
# 0.77 s, without the filter 0.25 s and 0.79 s: on this CPU a generated token costs ~2 FLOPs per
# parameter and a trained one ~8 (forward, backward, the pi_prox recompute), both at matmul
# speed, so training is the longer part whenever every generated token is trained on.
WORKLOAD = [
    "task.args.format_reward=0.0",
    "rl.dynamic_filter=true",
    "rl.time_budget=0",
    "rl.keep_checkpoints=1000",
    "eval.prompts=8",
    "eval.samples=1",
]
# the smoke run's model solves nothing, so the filter could never fill a batch: off there
FAST = [
    "sft.steps=2",
    "rl.prompts_per_step=4",
    "rl.group_size=2",
    "rl.checkpoint_every=2",
    "rl.dynamic_filter=false",
    "task.args.format_reward=0.1",
]


# ---- one arm, in its own process --------------------------------------------------------------


class CoreSampler(threading.Thread):
    """Every `period` s: which core each running thread of each watched process is on."""

    def __init__(self, pids: dict[str, int], period: float = 0.05):
        super().__init__(daemon=True)
        self.pids, self.period = pids, period
        self.seen = {name: {} for name in pids}  # name -> {core: running samples}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.period):
            for name, pid in self.pids.items():
                try:
                    tids = os.listdir(f"/proc/{pid}/task")
                except OSError:
                    continue
                for tid in tids:
                    try:
                        fields = (
                            open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
                        )
                    except OSError:
                        continue
                    if fields[0] == "R":  # running: field 39 of stat is the core it runs on
                        core = int(fields[36])
                        self.seen[name][core] = self.seen[name].get(core, 0) + 1


def child(spec: dict) -> None:
    import ray

    if spec["apart"]:
        ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, configure_logging=False)
    from minirl.run.presets import make_config
    from minirl.run.runner import Run

    run_dir = Path(spec["run_dir"])
    shutil.rmtree(run_dir, ignore_errors=True)
    placement, sampler = None, None
    if spec["apart"]:
        from scale.ray_workers import RayPlacement

        placement = RayPlacement(
            1,
            engine={"num_cpus": 1, "cores": (0,)},
            trainer={"num_cpus": 1, "cores": (1,)},
            verifier={"num_cpus": 1},
        )
    load_before, t0, cpu0 = os.getloadavg(), time.perf_counter(), time.process_time()
    run = Run(
        make_config(spec["preset"], spec["overrides"]),
        run_dir,
        log=lambda *a: None,
        progress=False,
        placement=placement,
    )
    if placement is not None:  # watch the actors' cores once they exist (the first step)

        def watch():
            while len(placement.workers) < 3:
                time.sleep(0.05)
            pids = {w.name: w.pid for w in placement.workers} | {"driver": os.getpid()}
            nonlocal sampler
            sampler = CoreSampler(pids)
            sampler.start()

        threading.Thread(target=watch, daemon=True).start()
    else:
        sampler = CoreSampler({"driver": os.getpid()})
        sampler.start()
    run.train(resume=False)
    seconds = time.perf_counter() - t0
    cpu = {"driver": time.process_time() - cpu0}
    if placement is not None:
        cpu.update({w.name: w.cpu_seconds() for w in placement.workers})
        placement.close()
        ray.shutdown()
    sampler.halt.set()
    (run_dir / "timing.json").write_text(
        json.dumps(
            {
                "seconds": seconds,
                "cpu_seconds": cpu,
                "cores_seen": sampler.seen,
                "load_before": load_before,
                "load_after": os.getloadavg(),
            },
            indent=2,
        )
    )


def run_arm(name: str, preset: str, overrides: list[str], apart: bool, out: Path) -> Path:
    spec = {"run_dir": str(out / name), "preset": preset, "overrides": overrides, "apart": apart}
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    print(f"  {name}: load {_load()} ...", flush=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, __file__, "_child", json.dumps(spec)], check=True, env=env)
    print(f"  {name}: {time.perf_counter() - t0:.0f}s, load {_load()}", flush=True)
    return out / name


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# ---- reading the arms -------------------------------------------------------------------------


def _staleness():
    sys.path.insert(0, str(ROOT / "experiments"))
    import staleness

    return staleness


def phase_times(records: list[dict], skip: int) -> dict[str, float]:
    """Medians over the steps after `skip`: a lockstep step's generate and train phases."""
    rs = records[skip:] or records
    gen = [r["time/generate"] + r["time/verify"] for r in rs]
    train = [r["time/train"] + r["time/publish"] for r in rs]
    return {"t_gen": float(np.median(gen)), "t_train": float(np.median(train))}


def summarize(args, dirs: dict[str, Path]) -> dict:
    st = _staleness()
    out: dict = {"preset": args.preset, "steps": args.steps, "overrides": args.set}
    curves = {}
    for name, run_dir in dirs.items():
        recs = st.records_of(run_dir)
        timing = json.loads((run_dir / "timing.json").read_text())
        arm, _ = ARMS[name]
        evals = st.heldout(
            run_dir,
            args.preset,
            [*WORKLOAD, *args.set, *arm, f"rl.steps={args.steps}"],
            args.heldout_prompts,
            args.heldout_samples,
        )
        t = np.array([e["time"] for e in evals])
        v = st.trailing_mean([e["pass@1"] for e in evals], 2)
        curves[name] = (t, v)
        step_s = np.diff(np.concatenate([[0.0], st.elapsed(recs)]))[args.skip :]
        cores = {
            p: {str(c): n for c, n in sorted(seen.items())}
            for p, seen in timing["cores_seen"].items()
        }
        out[name] = {
            "seconds_per_step": float(np.median(step_s)),
            "wall": float(st.elapsed(recs)[-1]),
            "heldout": evals,
            "cpu_per_wall": {p: s / timing["seconds"] for p, s in timing["cpu_seconds"].items()},
            "cores_seen": cores,
            "load": [timing["load_before"], timing["load_after"]],
        }
        if name in ("colocated_sync", "apart_sync"):
            out[name]["phases"] = phase_times(recs, args.skip)
    target = min(float(v[-1]) for _, v in curves.values())
    out["target_heldout_pass@1"] = target
    for name, (t, v) in curves.items():
        out[name]["time_to_target"] = st.first_time(t, v, target, start=1)
    ph = out["apart_sync"]["phases"]
    ideal = (ph["t_gen"] + ph["t_train"]) / max(ph["t_gen"], ph["t_train"])
    base = out["apart_sync"]["seconds_per_step"]
    out["ideal_speedup"] = ideal
    for name in dirs:
        ratio = base / out[name]["seconds_per_step"]
        out[name]["per_step_vs_apart_sync"] = ratio
        out[name]["of_ideal"] = ratio / ideal
        t0, t1 = out["apart_sync"]["time_to_target"], out[name]["time_to_target"]
        out[name]["to_target_vs_apart_sync"] = (t0 / t1) if t0 and t1 else None
    out["plot"] = str(plot(curves, out, args))
    return out


def plot(curves, out, args) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(curves)
    palette = ["#888888", "#4477aa", "#ee6677", "#228833", "#ccbb44", "#aa3377"]
    colors = dict(zip(ARMS, palette, strict=True))
    rates = [out[n]["seconds_per_step"] for n in names]
    a.bar(range(len(names)), rates, color=[colors[n] for n in names])
    a.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names])
    a.set_ylabel("seconds per step (median)")
    a.set_title(f"ideal overlap {out['ideal_speedup']:.2f}x of apart_sync")
    for i, n in enumerate(names):
        a.text(i, rates[i], f"{out[n]['per_step_vs_apart_sync']:.2f}x", ha="center", va="bottom")
    for n, (t, v) in curves.items():
        b.plot(t, v, marker="o", label=n, color=colors[n])
    b.axhline(out["target_heldout_pass@1"], color="k", lw=0.8, ls="--")
    b.set_xlabel("seconds since RL began")
    b.set_ylabel("held-out pass@1 (2-checkpoint mean)")
    b.legend()
    fig.tight_layout()
    path = args.results / "apart.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--preset", default="countdown")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--skip", type=int, default=2, help="first steps left out of the medians")
    p.add_argument("--heldout-prompts", type=int, default=128)
    p.add_argument("--heldout-samples", type=int, default=2)
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS)[:4])
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override (every arm)",
    )
    p.add_argument("--out", type=Path, default=Path("runs/apart"))
    p.add_argument("--results", type=Path, default=ROOT / "experiments" / "results" / "apart")
    p.add_argument("--fast", action="store_true", help="a smoke run: tiny batches")
    p.add_argument(
        "--summarize", action="store_true", help="do not train: summarize the runs in --out"
    )
    args = p.parse_args(argv)
    if "apart_sync" not in args.arms:
        p.error("apart_sync is the baseline: keep it in --arms")
    args.results.mkdir(parents=True, exist_ok=True)
    common = [
        *WORKLOAD,
        *args.set,
        f"rl.steps={args.steps}",
        f"rl.checkpoint_every={args.checkpoint_every}",
        *(FAST if args.fast else []),
    ]
    if args.fast:
        args.set = [*args.set, *FAST]
    if args.summarize:  # the runs exist: evaluate and summarize them again
        dirs = {name: args.out / name for name in args.arms}
    else:
        dirs = {
            name: run_arm(name, args.preset, common + ARMS[name][0], ARMS[name][1], args.out)
            for name in args.arms
        }
    result = summarize(args, dirs)
    (args.results / "apart.json").write_text(json.dumps(result, indent=1, default=float))
    for name in args.arms:
        r = result[name]
        print(
            f"{name:15s} {r['seconds_per_step']:.2f} s/step  {r['per_step_vs_apart_sync']:.2f}x "
            f"({r['of_ideal']:.2f} of ideal {result['ideal_speedup']:.2f}x)  to target "
            f"{r['time_to_target']}  cpu/wall {json.dumps({k: round(v, 2) for k, v in r['cpu_per_wall'].items()})}"
        )
    return result


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "_child":
        child(json.loads(sys.argv[2]))
    else:
        main()
