"""`python -m scale.launch ray`: `minirl train` with its parts in Ray actors.

    python -m scale.launch ray --preset countdown --engines 2            # a local Ray cluster
    python -m scale.launch ray --engine-cores 0 --trainer-cores 1        # one core each
    ray start --head --num-cpus 4                                        # or a real one:
    python -m scale.launch ray --address auto --model DIR --data train.jsonl --engines 8 \\
        --engine-gpus 1 --trainer-gpus 8

The run is minirl.runner.Run, unchanged: the same config, run directory, checkpoints, resume and
metrics as `minirl train`; only where the parts live differs (scale/ray_workers.py's
RayPlacement). Engine replicas, the trainer and the verifier each get an actor with the Ray
resources asked for; the warm start and evaluation run in this (the driver's) process.

Without --address a local cluster is started with just the CPUs the actors ask for (logical
CPUs: Ray does not pin cores). Ray starts before JAX here, so its processes are not forked from
a multithreaded JAX process.

Simplified on purpose: weights travel by value (the trainer actor's numpy arrays through the
driver's weight store to each engine actor: fine for models that fit one host; the TensorStore
store of `python -m scale.launch trainer/engine` passes them by reference); the trainer is one
actor, so one host (a multi-host trainer job is `python -m scale.launch trainer` on each host).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    from minirl.cli import add_config_arguments

    add_config_arguments(p)
    p.add_argument("--run-dir", help="where to write the run (default: runs/<task>); an existing one resumes")
    p.add_argument("--force", action="store_true", help="resume even if the run's config changed")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--address", default=None,
                   help="Ray cluster to join ('auto': the one `ray start` began on this machine); "
                        "default: start a local one for this run")  # fmt: skip
    p.add_argument("--engines", type=int, default=1, help="engine replicas (data-parallel rollout)")
    for role, cpus in (("engine", 1.0), ("trainer", 1.0), ("verifier", 1.0)):
        p.add_argument(f"--{role}-cpus", type=float, default=cpus, help=f"Ray CPUs per {role} actor")
    for role in ("engine", "trainer"):
        p.add_argument(f"--{role}-gpus", type=float, default=0.0, help=f"Ray GPUs per {role} actor")
    for role in ("engine", "trainer", "verifier"):
        p.add_argument(f"--{role}-cores", default="", metavar="0,1",
                       help=f"pin the {role} actor(s) to these CPU cores (one machine, Linux)")
    p.add_argument("--resource", action="append", default=[], metavar="ROLE:NAME=N",
                   help="a custom Ray resource for a role's actors, e.g. engine:TPU=4 (repeatable)")


def placement_from_args(args):
    """The RayPlacement the flags describe (ValueError naming a malformed --resource)."""
    from scale.ray_workers import RayPlacement

    options = {role: {"num_cpus": getattr(args, f"{role}_cpus"), "resources": {}}
               for role in ("engine", "trainer", "verifier")}  # fmt: skip
    for role in ("engine", "trainer"):
        options[role]["num_gpus"] = getattr(args, f"{role}_gpus")
    for role in options:
        text = getattr(args, f"{role}_cores")
        try:
            cores = tuple(int(c) for c in text.split(",")) if text else ()
        except ValueError:
            cores = (-1,)
        if any(c < 0 or c >= (os.cpu_count() or 1) for c in cores):
            raise ValueError(f"--{role}-cores {text!r}: expected comma-separated core numbers "
                             f"0..{(os.cpu_count() or 1) - 1}")
        options[role]["cores"] = cores
    for item in args.resource:
        role, _, rest = item.partition(":")
        name, _, amount = rest.partition("=")
        try:
            value = float(amount)
        except ValueError:
            value = -1.0
        if role not in options or not name or value <= 0:
            raise ValueError(f"--resource {item!r}: expected ROLE:NAME=N with ROLE one of "
                             f"engine, trainer, verifier and N > 0 (e.g. engine:TPU=4)")
        options[role]["resources"][name] = value
    return RayPlacement(args.engines, **options)


def run(args) -> None:
    import ray

    from minirl.cli import _default_run_dir, config_from_args

    placement = placement_from_args(args)  # flags checked before anything starts
    cfg = config_from_args(args)
    run_dir = Path(args.run_dir) if args.run_dir else _default_run_dir(cfg)
    if args.address:
        ray.init(address=args.address, log_to_driver=not args.quiet)
    else:
        # logical CPUs for the actors; GPUs as Ray detects them; no made-up TPUs (the placement
        # check then names what this machine lacks)
        cpus = placement.needs().get("CPU", 0)
        ray.init(num_cpus=max(1, int(-(-cpus // 1))), include_dashboard=False,
                 log_to_driver=not args.quiet)  # fmt: skip
    try:
        placement.check()  # before the warm start: a cluster that can never hold it fails now
        from minirl.runner import Run

        summary = Run(cfg, run_dir, progress=not args.quiet, placement=placement).train(
            resume=True, force=args.force)
    finally:
        placement.close()
        ray.shutdown()
    print(json.dumps({"run_dir": str(run_dir), "before": summary["before"], "after": summary["after"],
                      "rl_seconds": round(summary["rl_seconds"], 1)}, indent=2))  # fmt: skip
