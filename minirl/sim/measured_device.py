"""A device preset from the accelerator check's JSON: the planner's figures from measured steps.

`benchmarks/accelerator_check.py` times, on one device, a decode step of a known model shape at
several slot counts, its prefill and its train step, and measures in the same run the copy rate
and the square matmul rate. `device_from_check` turns that into a `Device`:

    peak_flops        the check's bfloat16 square matmul rate (FLOP/s)
    hbm_bytes_per_s   the check's copy rate (bytes read + written per second)
    decode_eff_at     per measured slot count s: the simulator's own roofline of that step
                      (Costs.decode_chunk at efficiency 1: max(bytes / bandwidth, FLOPs / peak)
                      for the check's shape, s slots, its mean context) / the measured step
    prefill_eff       the same for the prefill rows (mean over rows)
    mfu               the simulator's train step at MFU 1 (8 x params x tokens / peak) / the
                      measured train step (mean over rows)

so the simulated decode step of the check's model at a measured slot count IS the measured step
(and the train step of the mean row its measured time); between slot counts the efficiency is
interpolated, and another model is assumed to reach the same shares of its own roofline (an
assumption: a 7B model's matmuls use the device better than a 0.5B one's). Memory size and link
bandwidth are not measured: they stay those of the `base` preset. Only bfloat16 rows are used
(the simulator counts 2 bytes a parameter).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from minirl.sim.costs import SHAPES, Costs, Device


def load_check(path) -> dict:
    """The check's JSON, or a one-line ValueError saying what is wrong with it."""
    path = Path(path)
    try:
        report = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(report, dict) or not {"limits", "rows", "plan"} <= set(report):
        raise ValueError(
            f"{path}: not a finished accelerator check (no limits, rows or plan; "
            "benchmarks/accelerator_check.py writes one)"
        )
    return report


def _ok(report: dict, kind: str, dtype: str | None = None) -> list[dict]:
    return [
        r
        for r in report["rows"]
        if r.get("kind") == kind and r.get("ok") and (dtype is None or r.get("dtype") == dtype)
    ]


def device_from_check(report: dict, base: Device, source: str = "check") -> Device:
    """`base` with the check's measured rates and efficiencies (module docstring)."""
    shape = report["plan"].get("shape")
    if shape not in SHAPES:
        raise ValueError(
            f"{source}: the check's model shape {shape!r} is not one the planner knows"
        )
    rates = report["limits"]["matmul_flops_per_s"]
    decode = sorted(_ok(report, "decode", "bfloat16"), key=lambda r: r["slots"])
    if "bfloat16" not in rates or not decode:
        raise ValueError(f"{source}: no bfloat16 matmul rate or bfloat16 decode row succeeded")
    timed = [*decode, *_ok(report, "train")]
    if any(not r["step_s"] > 0 or not r.get("prefill_s", 1) > 0 for r in timed):
        raise ValueError(
            f"{source}: a measured time is not > 0 (timing noise: run the check again)"
        )
    kind = report.get("device", {}).get("device_kind", "?")
    raw = dataclasses.replace(
        base,
        name=f"{kind} (measured)",
        peak_flops=float(rates["bfloat16"]),
        hbm_bytes_per_s=float(report["limits"]["copy_bytes_per_s"]),
        decode_eff=1.0,
        mfu=1.0,
        call_s=0.0,
        train_call_s=0.0,
        itemsize=2,
        source=f"measured by the accelerator check ({source}, commit {report.get('commit')}); "
        f"memory and link: {base.source}",
    )
    ideal = Costs(SHAPES[shape], raw)  # the roofline of each measured step at efficiency 1
    at = tuple(
        (r["slots"], ideal.decode_chunk(r["slots"], r["context"], 1) / r["step_s"]) for r in decode
    )
    fills = [ideal.prefill(r["prefill_rows"], r["prefill_length"]) / r["prefill_s"] for r in decode]
    trains = [ideal.train_step(r["tokens"]) / r["step_s"] for r in _ok(report, "train")]
    return dataclasses.replace(
        raw,
        decode_eff=at[-1][1],
        decode_eff_at=at,
        prefill_eff=sum(fills) / len(fills),
        mfu=sum(trains) / len(trains) if trains else base.mfu,
    )


def device_from_file(path, base: Device) -> Device:
    """`device_from_check` of the JSON at `path`; any missing field is a one-line ValueError."""
    try:
        return device_from_check(load_check(path), base, source=str(path))
    except (KeyError, TypeError, ZeroDivisionError) as e:
        raise ValueError(
            f"{path}: not a usable accelerator check ({type(e).__name__}: {e})"
        ) from None
