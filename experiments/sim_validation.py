"""Does the simulator predict real runs? (issue #17, item 3)

    PYTHONPATH=. python experiments/sim_validation.py real   # the real runs (~20 min)
    PYTHONPATH=. python experiments/sim_validation.py sim    # calibrate, predict, the table

`real` trains the `arithmetic` preset (long-tailed scratchpad completions) for --steps steps in
six settings — lockstep at three (j, k, eta), async at three — each as its own `minirl train`
process, one after the other, and records each process's CPU seconds (how many of the
machine's cores it kept busy).

`sim` calibrates "this machine" on the FIRST run only (lockstep, j = k = 1, eta = 0;
minirl.sim.calibrate.fit_run: seconds per decode chunk, per prefill, per verified rollout and
per trained token, from its metrics.jsonl), then simulates every setting with the lengths each
real run logged (its samples.jsonl) and compares mean seconds per step after the first four
(which trace each new batch shape, even with the compilation cache warm). Engine and trainer share this machine's cores, so the async runs are simulated as
colocated: a part that starts while the other is busy runs slower by the calibration run's
cores used (minirl.sim.calibrate.colocated_slowdown).

With --apart DIR ... (default runs/sim_apart and runs/apart_j4, each used if it exists) it also
calibrates on experiments/apart.py's lockstep arm and predicts its async arms, engine and trainer
each in a Ray actor pinned to a core of its own (no slowdown):

    PYTHONPATH=. python experiments/apart.py --arms apart_sync apart_eta1 apart_eta2 \
        --steps 30 --set log.samples_every=1 --set log.samples_per_step=256 --out runs/sim_apart
    PYTHONPATH=. python experiments/apart.py --arms apart_sync apart_eta1 apart_j4_k4 \
        apart_j4_k8 --steps 40 --out runs/apart_j4

Output: experiments/results/sim/validation.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

# experiments/apart.py's arms: engine and trainer in Ray actors pinned to a core each
APART = ["apart_sync", "apart_eta1", "apart_eta2", "apart_j4_k4", "apart_j4_k8"]

SETTINGS = {  # name: (scheduler, j, k, eta, reload policy)
    "lockstep_j1_k1_eta0": ("lockstep", 1, 1, 0, "discard"),
    "lockstep_j2_k2_eta1": ("lockstep", 2, 2, 1, "discard"),
    "lockstep_j4_k8_eta3": ("lockstep", 4, 8, 3, "discard"),
    "async_j1_k2_eta1": ("async", 1, 2, 1, "continue"),
    "async_j1_k4_eta3": ("async", 1, 4, 3, "continue"),
    "async_j2_k4_eta2": ("async", 2, 4, 2, "discard"),
}


def real(args) -> None:
    """Each setting once, after a warm-up run of the first (not measured) that fills JAX's
    persistent compilation cache: otherwise the first run alone pays the trainer's compiles."""
    args.out.mkdir(parents=True, exist_ok=True)
    names = ["warmup"] + list(SETTINGS) if not args.only else args.only
    for name in names:
        sched, j, k, eta, policy = SETTINGS[name if name != "warmup" else next(iter(SETTINGS))]
        run_dir = args.out / name
        shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, never a resume
        sets = {
            "rl.steps": args.steps,
            "rl.scheduler": sched,
            "rl.reload_every": j,
            "rl.max_lag": k,
            "rl.eta": eta,
            "rl.reload_policy": policy,
            "eval.prompts": 16,
            "eval.samples": 1,
            "log.samples_every": 1,
            "log.samples_per_step": 256,
        }
        cmd = [str(Path(sys.executable).parent / "minirl"), "train", "--preset", "arithmetic"]
        cmd += ["--quiet"]
        cmd += ["--run-dir", str(run_dir)]
        for key, value in sets.items():
            cmd += ["--set", f"{key}={value}"]
        before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - t0
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        info = {"cmd": " ".join(cmd[1:]), "wall_s": wall, "cpu_s": cpu, "load": os.getloadavg()}
        (run_dir / "process.json").write_text(json.dumps(info, indent=1))
        print(f"{name}: {wall:.0f} s wall, {cpu / wall:.2f} cores", flush=True)


def sim(args) -> None:
    from minirl.sim.calibrate import fit_run

    rows = compare(args.out, list(SETTINGS), colocated=True)
    out = {
        "colocated": {
            "calibration": fit_run(args.out / next(iter(SETTINGS))).describe(),
            "rows": rows,
        }
    }
    for root in args.apart:  # each: experiments/apart.py's run directories, if there
        names = [n for n in APART if (root / n / "metrics.jsonl").is_file()]
        if "apart_sync" in names:
            rows = compare(root, names, colocated=False)
            out[str(root)] = {"calibration": fit_run(root / names[0]).describe(), "rows": rows}
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "validation.json").write_text(json.dumps(out, indent=1))


def compare(root: Path, names: list[str], colocated: bool) -> list[dict]:
    """Calibrate on the first run, simulate each; one row per run."""
    from minirl.sim.calibrate import fit_run, simulate_like

    machine = fit_run(root / names[0])
    rows = []
    for name in names:
        measured, predicted = simulate_like(root / name, machine, colocated)
        process = root / name / "process.json"
        info = json.loads(process.read_text()) if process.is_file() else {}
        rows.append(
            {
                "setting": name,
                "measured_s_per_step": measured,
                "simulated_s_per_step": predicted,
                "error": predicted / measured - 1,
                "cores": info.get("cpu_s", 0) / info.get("wall_s", 1),
                "load": info.get("load"),
            }
        )
        print(
            f"{name:24s} measured {measured:6.2f} s/step  simulated {predicted:6.2f}  "
            f"error {100 * (predicted / measured - 1):+5.1f}%",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["real", "sim"])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--only", nargs="+", choices=list(SETTINGS), help="(real) these settings")
    parser.add_argument("--out", type=Path, default=Path("runs/sim_validation"))
    parser.add_argument("--results", type=Path, default=Path("experiments/results/sim"))
    parser.add_argument(
        "--apart",
        type=Path,
        nargs="*",
        default=[Path("runs/sim_apart"), Path("runs/apart_j4")],
        help="(sim) directories of experiments/apart.py runs, used if there",
    )
    args = parser.parse_args()
    {"real": real, "sim": sim}[args.what](args)


if __name__ == "__main__":
    main()
