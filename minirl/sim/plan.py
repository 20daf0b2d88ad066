"""`minirl plan`: what a cluster would do with a model, before renting it.

    minirl plan --model qwen2.5-7b --device v5p --engine-devices 64 --trainer-devices 64 \\
        --lengths lognormal:7,1 --staleness 1,2,1 --scheduler async
    minirl plan --model qwen2.5-7b --device h100 --calibrate-device accelerator_check.json

runs the real controller on simulated parts (minirl/sim/) for --steps steps and prints
throughput (trained tokens/s, steps/hour), each pool's busy share, the token lag of trained
batches and the share of generated tokens thrown away. `--sweep KNOB=V1,V2,...` repeats it for
each value of one knob (engine-devices, trainer-devices, eta, reload-every, max-lag,
reload-policy, scheduler, slots) and, with --plot FILE, draws steps/hour against it.
`--calibrate-device` replaces --device's rates and efficiencies by those the accelerator check
(benchmarks/accelerator_check.py) measured on one such device.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

from minirl.config import RLConfig
from minirl.inference.engine_config import EngineConfig
from minirl.sim.costs import DEVICES, SHAPES, Costs, Device
from minirl.sim.run import Setup, simulate
from minirl.sim.workload import Lengths

SWEEPABLE = (
    "engine_devices",
    "trainer_devices",
    "eta",
    "reload_every",
    "max_lag",
    "reload_policy",
    "scheduler",
    "slots",
)
# Every number `minirl plan` takes, checked once (options, --staleness's parts and --sweep's
# values alike): name -> (lowest allowed, highest allowed or None, is the lowest excluded).
NUMBERS = {
    "engine_devices": (1, None, False),
    "trainer_devices": (1, None, False),
    "replica_devices": (0, None, False),
    "mfu": (0, 1, True),
    "decode_eff": (0, 1, True),
    "max_new_tokens": (1, None, False),
    "prompt_len": (1, None, False),
    "prompts": (1, None, False),
    "group_size": (1, None, False),
    "slots": (1, None, False),
    "verify_s": (0, None, False),
    "steps": (2, None, False),
    "seed": (0, None, False),
    "reload_every": (1, None, False),
    "max_lag": (0, None, False),
    "eta": (0, None, False),
}


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default (an option without one says
    in its own words what happens when it is not given)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def add_plan_parser(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="simulate a cluster's RL run: throughput, utilisation, lag, waste",
        description=__doc__,
        formatter_class=_Help,
    )
    _cluster_arguments(p)
    _workload_arguments(p)
    p.set_defaults(fn=cmd_plan)


def _cluster_arguments(p) -> None:
    """What runs where: the model, the devices and how they are split."""
    p.add_argument(
        "--model",
        default="qwen2.5-7b",
        help=f"a shape ({', '.join(sorted(SHAPES))}) or a checkpoint directory",
    )
    p.add_argument(
        "--device",
        default="v5p",
        choices=sorted(DEVICES),
        help="datasheet figures: minirl/sim/costs.py",
    )
    p.add_argument(
        "--calibrate",
        metavar="RUN_DIR",
        type=Path,
        help="this machine instead of --device: per-call costs fitted to a lockstep "
        "minirl run (minirl.sim.calibrate; the run's model, one device per pool)",
    )
    p.add_argument(
        "--calibrate-device",
        metavar="CHECK_JSON",
        type=Path,
        help="--device with the rates and efficiencies that benchmarks/accelerator_check.py "
        "measured on one such device (minirl.sim.measured_device; memory and link stay "
        "--device's)",
    )
    p.add_argument("--engine-devices", type=int, default=8, help="devices of the engine pool")
    p.add_argument("--trainer-devices", type=int, default=8, help="devices of the trainer")
    p.add_argument(
        "--replica-devices",
        type=int,
        default=0,
        help="devices per engine replica (0: the fewest whose memory holds weights and KV cache)",
    )
    p.add_argument("--mfu", type=float, help="trainer's share of peak (default: the device's)")
    p.add_argument(
        "--decode-eff", type=float, help="engine's share of its roofline (default: the device's)"
    )


def _workload_arguments(p) -> None:
    """What is asked of the cluster (lengths, batch, staleness) and what to report."""
    p.add_argument(
        "--lengths",
        default="lognormal:7,1",
        help="completion lengths: lognormal:MU,SIGMA | fixed:N | RUN_DIR",
    )
    p.add_argument("--max-new-tokens", type=int, default=8192, help="completion cap (tokens)")
    p.add_argument("--prompt-len", type=int, default=256, help="prompt tokens")
    p.add_argument("--prompts", type=int, default=64, help="prompts per step")
    p.add_argument("--group-size", type=int, default=8, help="samples per prompt")
    p.add_argument("--slots", type=int, default=128, help="sequences per engine replica")
    p.add_argument(
        "--staleness",
        default="1,1,0",
        metavar="J,K,ETA",
        help="reload every j versions, max lag k (0 = unbounded), run ahead eta",
    )
    p.add_argument(
        "--scheduler", default="lockstep", choices=["lockstep", "async"], help="as rl.scheduler"
    )
    p.add_argument(
        "--reload-policy",
        default="continue",
        choices=["discard", "continue"],
        help="in-flight requests at a reload (async), as rl.reload_policy",
    )
    p.add_argument("--verify-s", type=float, default=0.0, help="verifier seconds per rollout")
    p.add_argument("--steps", type=int, default=20, help="simulated train steps per setting")
    p.add_argument("--seed", type=int, default=0, help="keys every length and reward draw")
    p.add_argument("--sweep", metavar="KNOB=V1,V2", help=f"one of {', '.join(SWEEPABLE)}")
    p.add_argument("--plot", type=Path, help="with --sweep: a PNG of steps/hour against it")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def _model(name: str):
    if name in SHAPES:
        return SHAPES[name]
    if Path(name, "config.json").is_file():
        from minirl.hf.hf_config import config_from_hf, read_config

        return config_from_hf(read_config(Path(name)), source=str(Path(name, "config.json")))
    raise ValueError(
        f"--model {name!r}: not a known shape ({sorted(SHAPES)}) or a checkpoint "
        "directory with config.json"
    )


def check_number(name: str, value, where: str):
    """`value` if it is in NUMBERS[name]'s range (finite), else a ValueError naming `where`."""
    low, high, excluded = NUMBERS[name]
    above = value > low if excluded else value >= low
    if above and (high is None or value <= high) and math.isfinite(value):
        return value
    bound = f"in ({low}, {high}]" if excluded else f">= {low}"
    finite = "" if math.isfinite(value) else "a finite number "
    raise ValueError(f"{where} must be {finite}{bound}, got {value}")


def check_options(args) -> None:
    """Every number given as an option, in range (argparse has checked its type)."""
    for name in NUMBERS:
        value = getattr(args, name, None)
        if value is not None:
            check_number(name, value, "--" + name.replace("_", "-"))


def knobs_of(args) -> dict:
    try:
        j, k, eta = (int(x) for x in args.staleness.split(","))
    except ValueError:
        raise ValueError(f"--staleness {args.staleness!r}: expected J,K,ETA integers") from None
    for name, value in (("reload_every", j), ("max_lag", k), ("eta", eta)):
        check_number(name, value, f"--staleness {args.staleness}: {name}")
    return {
        "engine_devices": args.engine_devices,
        "trainer_devices": args.trainer_devices,
        "reload_every": j,
        "max_lag": k,
        "eta": eta,
        "reload_policy": args.reload_policy,
        "scheduler": args.scheduler,
        "slots": args.slots,
    }


def _device(args) -> Device:
    """--device, calibrated from an accelerator check if asked, then --mfu / --decode-eff (an
    explicit efficiency replaces the measured ones)."""
    device = DEVICES[args.device]
    if args.calibrate_device:
        if args.calibrate:
            raise ValueError("--calibrate and --calibrate-device: give one")
        from minirl.sim.measured_device import device_from_file

        device = device_from_file(args.calibrate_device, device)
    tweaks = {"mfu": args.mfu, "decode_eff": args.decode_eff}
    if args.decode_eff is not None:
        tweaks |= {"decode_eff_at": (), "prefill_eff": None}
    return dataclasses.replace(device, **{k: v for k, v in tweaks.items() if v is not None})


def make_setup(args, knobs: dict) -> Setup:
    model = _model(args.model)
    device = _device(args)
    cache = args.prompt_len + args.max_new_tokens
    engine = EngineConfig(
        slots=knobs["slots"], cache_len=cache, prefill_buckets=(args.prompt_len,), decode_chunk=16
    )
    per = args.replica_devices or Costs(model, device).replica_devices_needed(
        knobs["slots"] * cache
    )
    per = 1 if args.calibrate else per
    if knobs["engine_devices"] < per or knobs["engine_devices"] % per:
        raise ValueError(
            f"--engine-devices {knobs['engine_devices']} is not a multiple of the "
            f"{per} devices one replica needs"
        )
    if knobs["trainer_devices"] < 1:
        raise ValueError("--trainer-devices must be >= 1")
    rl = RLConfig(
        prompts_per_step=args.prompts,
        group_size=args.group_size,
        reload_every=knobs["reload_every"],
        max_lag=knobs["max_lag"],
        eta=knobs["eta"],
        scheduler=knobs["scheduler"],
        reload_policy=knobs["reload_policy"],
        seed=args.seed,
    )
    costs = Costs(model, device, per, knobs["trainer_devices"])
    if args.calibrate:
        from minirl.sim.calibrate import MeasuredCosts, fit_run

        costs = MeasuredCosts(fit_run(args.calibrate), model)
    return Setup(
        costs=costs,
        rl=rl,
        engine=engine,
        lengths=Lengths.parse(args.lengths, seed=args.seed),
        replicas=knobs["engine_devices"] // per,
        max_new_tokens=args.max_new_tokens,
        prompt_len=args.prompt_len,
        verify_per_rollout_s=args.verify_s,
        seed=args.seed,
    )


def summarize(trace: dict) -> dict:
    hist = trace["lag_histogram"]
    total = max(sum(hist), 1)
    return {
        "seconds_per_step": round(trace["seconds_per_step"], 2),
        "steps_per_hour": round(trace["steps_per_hour"], 1),
        "trained_tokens_per_s": round(trace["trained_tokens_per_s"]),
        "engine_busy": round(trace["busy"]["engine"], 3),
        "trainer_busy": round(trace["busy"]["trainer"], 3),
        "mean_token_lag": round(sum(i * n for i, n in enumerate(hist)) / total, 3),
        "wasted_share": round(trace["wasted_tokens"] / max(trace["generated_tokens"], 1), 3),
    }


def _sweep(args) -> tuple[str, list]:
    knob, _, values = args.sweep.partition("=")
    knob = knob.replace("-", "_")
    if knob not in SWEEPABLE or not values:
        raise ValueError(
            f"--sweep {args.sweep!r}: expected KNOB=V1,V2 with KNOB one of {SWEEPABLE}"
        )
    text = knob in ("reload_policy", "scheduler")
    try:
        values = [v if text else int(v) for v in values.split(",")]
    except ValueError:
        raise ValueError(f"--sweep {args.sweep!r}: {knob} takes integers") from None
    for value in values if not text else ():
        check_number(knob, value, f"--sweep {args.sweep}: {knob}")
    return knob, values


def cmd_plan(args) -> int:
    check_options(args)
    if args.plot and not args.sweep:
        raise ValueError("--plot draws a sweep: give --sweep KNOB=V1,V2 too")
    base = knobs_of(args)
    knob, values = _sweep(args) if args.sweep else (None, [None])
    rows = []
    for value in values:
        knobs = base if knob is None else {**base, knob: value}
        setup = make_setup(args, knobs)
        row = {"replicas": setup.replicas, **summarize(simulate(setup, args.steps))}
        rows.append({knob: value, **row} if knob else row)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        keys = list(rows[0])
        print("  ".join(f"{k:>14s}" for k in keys))
        for row in rows:
            print("  ".join(f"{row[k]!s:>14s}" for k in keys))
    if args.plot and knob:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([str(v) for v in values], [r["steps_per_hour"] for r in rows], "o-")
        ax.set_xlabel(knob)
        ax.set_ylabel("steps / hour (simulated)")
        ax.set_title(f"{args.model} on {args.device}", fontsize=9)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")
    return 0
