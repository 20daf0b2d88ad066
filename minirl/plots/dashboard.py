"""The run dashboard (headline curves of one run) and one metric of several runs side by side."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from minirl.metrics_log import METRICS_FILE, read_metrics
from minirl.plots.common import (
    as_runs,
    grid,
    keys,
    lines,
    message,
    num,
    out_path,
    run_dir,
    series,
    style,
)

TIME_PARTS = ("generate", "verify", "train", "other")  # keys "time/<part>", seconds per step

DASHBOARD = (  # (title, key regex, log y)
    ("reward", r"(^|/)reward(/mean)?$", False),
    ("pass@k", r"pass@\d+$", False),
    ("loss", r"(^|/)loss$", False),
    ("ratio r and correction c", r"(^|/)(ratio|correction)_(mean|p95|max)$", True),
    (
        "clipped / rejected fraction",
        r"(^|/)(clip|rejected_token|rejected_sequence)_fraction$",
        False,
    ),
)


def _time_split(ax, records):
    """Stacked seconds per step: generate / verify / train / other (other derived from
    time/step when the controller did not log it)."""
    xs = np.asarray([r.get("step", i) for i, r in enumerate(records)], dtype=np.float64)
    parts = {}
    for p in TIME_PARTS:
        vals = [num(r.get(f"time/{p}")) for r in records]
        parts[p] = np.asarray([math.nan if v is None else v for v in vals])
    if np.isnan(parts["other"]).all() and keys(records, r"^time/step$"):
        total = np.asarray([num(r.get("time/step")) for r in records], dtype=np.float64)
        known = np.nansum([parts[p] for p in TIME_PARTS[:3]], axis=0)
        parts["other"] = np.maximum(total - known, 0.0)
    present = [p for p in TIME_PARTS if not np.isnan(parts[p]).all()]
    ax.stackplot(xs, *[np.nan_to_num(parts[p]) for p in present], labels=present, alpha=0.8)
    style(ax, "step time split (s), keys time/<part>", legend=False)
    ax.legend(fontsize=7, loc="upper left")


def plot_dashboard(run, out=None) -> Path:
    """A grid of the run's headline curves; a panel per group of keys that exist."""
    run = run_dir(run)
    path = out_path(run, "dashboard", out)
    records = read_metrics(run)
    if not records:
        return message(path, "dashboard", f"no records in {run / METRICS_FILE}")
    panels = [(t, found, logy) for t, rx, logy in DASHBOARD if (found := keys(records, rx))]
    has_time = bool(keys(records, r"^time/(" + "|".join(TIME_PARTS) + "|step)$"))
    if not panels and not has_time:
        wanted = "reward/mean, pass@k, loss, ratio_*, clip_fraction, time/*"
        return message(path, "dashboard", f"none of the dashboard keys ({wanted}) in {run}")
    fig, axes = grid(len(panels) + has_time)
    for ax, (title, found, logy) in zip(axes, panels, strict=False):
        lines(ax, records, found, title, logy=logy)
    if has_time:
        _time_split(axes[len(panels)], records)
    fig.suptitle(f"{run.name}: {len(records)} records")
    fig.savefig(path, dpi=100)
    return path


def plot_compare(run_dirs, x: str = "step", y: str = "reward/mean", labels=None, out=None) -> Path:
    """One metric `y` of several runs on one plot, against "step" or "time" (wall-clock since
    each run's first record). Default output: <parent of the first run>/compare_<y>_<x>.png."""
    if x not in ("step", "time"):
        raise ValueError(f"x must be 'step' or 'time', got {x!r}")
    runs, labels = as_runs(run_dirs, labels)
    safe = re.sub(r"[^\w@.-]+", "_", y).strip("_")
    path = Path(out) if out is not None else runs[0].parent / f"compare_{safe}_{x}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    curves = {
        label: series(read_metrics(run), y, x) for run, label in zip(runs, labels, strict=True)
    }
    missing = [label for label, (_, ys) in curves.items() if not np.isfinite(ys).any()]
    if len(missing) == len(runs):
        return message(path, "compare", f"no run has values for {y!r} (against {x})")
    longest = max(xs.max() for xs, ys in curves.values() if xs.size)
    scale, unit = (60.0, "min") if x == "time" and longest > 600 else (1.0, "s")
    fig = Figure(figsize=(9, 5), layout="constrained")
    ax = fig.subplots()
    for label, (xs, ys) in curves.items():
        if label not in missing:
            ax.plot(xs / scale, ys, marker="." if xs.size < 30 else None, label=label)
    ax.set_ylabel(y)
    title = y + (f"  (no values: {', '.join(missing)})" if missing else "")
    style(ax, title, xlabel="step" if x == "step" else f"wall-clock time ({unit})", legend=False)
    ax.legend()
    fig.savefig(path, dpi=100)
    return path
