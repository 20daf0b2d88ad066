"""`minirl diagnose`: the mismatch table on the command line.

    minirl diagnose [--preset NAME] [--set KEY=VALUE ...] [--fast] [--sources a,b] [--json]

The exit status is 1 if an exact row (one that must be 0) is not 0. `python -m scale.diagnose`
takes the same arguments and adds the "sharding" source (scale/diagnose.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time

import jax

from minirl.diagnose.table import diagnose, format_table, source_names
from minirl.run.config_args import add_config_arguments, config_from_args

DESCRIPTION = (
    "Training-inference mismatch, one source at a time, on the same rollouts: mean / p95 / max "
    "|log p_a - log p_b| per comparison. Exact rows must be 0."
)


def add_diagnose_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `minirl diagnose` (also used by `python -m scale.diagnose`)."""
    add_config_arguments(
        p, staleness=False, preset_help="run configuration (default: countdown; --fast: fixture)"
    )
    p.add_argument(
        "--fast",
        action="store_true",
        help="a small table for CI: fixture preset, 4 prompts, one row per source",
    )
    p.add_argument(
        "--prompts", type=int, default=None, help="prompts to roll out (default 16; --fast 4)"
    )
    p.add_argument(
        "--samples", type=int, default=None, help="samples per prompt (default rl.group_size)"
    )
    p.add_argument(
        "--sources", default=None, help=f"comma-separated subset of: {', '.join(source_names())}"
    )
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")


def add_diagnose_parser(subparsers) -> argparse.ArgumentParser:
    """`minirl diagnose`: add the subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "diagnose",
        help="training-inference mismatch per source on the same rollouts (a table)",
        description=DESCRIPTION,
    )
    add_diagnose_arguments(p)
    p.set_defaults(fn=cmd_diagnose)
    return p


def cmd_diagnose(args) -> int:
    cfg = config_from_args(args, default_preset="fixture" if args.fast else None)
    sources = args.sources.split(",") if args.sources else None
    prompts = args.prompts or (4 if args.fast else 16)
    t0 = time.perf_counter()
    rows = diagnose(
        cfg,
        prompts=prompts,
        samples=args.samples,
        sources=sources,
        fast=args.fast,
        log=lambda *a: None,
    )
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
    else:
        print(
            f"minirl diagnose: task {cfg.task.name}, {prompts} prompts x "
            f"{args.samples or cfg.rl.group_size} samples, model {cfg.model.dtype}, "
            f"{platform.machine()} {jax.devices()[0].platform} x{jax.device_count()}, "
            f"{time.perf_counter() - t0:.0f}s"
        )
        print(format_table(rows))
    return 0 if all(r.ok for r in rows) else 1
