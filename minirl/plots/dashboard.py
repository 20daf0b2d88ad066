"""The run dashboard (headline curves of one run) and one metric of several runs side by side."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from minirl.measure.metrics_log import METRICS_FILE, read_metrics
from minirl.plots.common import (
    as_runs,
    grid,
    keys,
    lines,
    message,
    num,
    out_path,
    png_path,
    run_dir,
    series,
    step_of,
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
    ("peak resident memory (GB), this process so far", r"^memory/peak_rss_gb$", False),
)


def _series_of(records, key) -> np.ndarray:
    return np.asarray([math.nan if (v := num(r.get(key))) is None else v for r in records])


def time_parts(records: list[dict]) -> dict[str, np.ndarray]:
    """Seconds per step of each of TIME_PARTS present (nan where a record lacks it). "other" is
    the controller's own overhead (everything but generate, verify and train); when a run did
    not log it, it is time/step minus the three."""
    parts = {p: _series_of(records, f"time/{p}") for p in TIME_PARTS}
    if np.isnan(parts["other"]).all() and keys(records, r"^time/step$"):
        known = np.nansum([parts[p] for p in TIME_PARTS[:3]], axis=0)
        parts["other"] = np.maximum(_series_of(records, "time/step") - known, 0.0)
    return {p: v for p, v in parts.items() if not np.isnan(v).all()}


def time_shares(records: list[dict]) -> dict[str, float]:
    """Each part's share of the run's total step time (sums over all steps)."""
    parts = time_parts(records)
    total = float(np.nansum(_series_of(records, "time/step")))
    if not total > 0:
        total = float(sum(np.nansum(v) for v in parts.values()))
    return {p: float(np.nansum(v)) / total for p, v in parts.items()} if total > 0 else {}


def _time_split(ax, records):
    """Stacked seconds per step: generate / verify / train / other, each with its share."""
    xs = np.asarray([step_of(r, i) for i, r in enumerate(records)], dtype=np.float64)
    parts, shares = time_parts(records), time_shares(records)
    labels = [f"{p} {100 * shares[p]:.1f}%" for p in parts]
    ax.stackplot(xs, *[np.nan_to_num(v) for v in parts.values()], labels=labels, alpha=0.8)
    title = "step time split (s), keys time/<part>; % of the run's step time"
    if "other" in shares:  # step 1 also compiles the trainer: the share without it, too
        later = time_shares(records[1:]).get("other", math.nan)
        title += f"\ncontroller overhead (other) {100 * shares['other']:.1f}%, "
        title += f"after step 1 {100 * later:.1f}%"
    style(ax, title, legend=False)
    ax.legend(fontsize=7, loc="upper left")


def dashboard_panels(records: list[dict]) -> list[tuple[str, list[str], bool]]:
    """(title, keys, log y) of each DASHBOARD panel whose keys the records hold."""
    return [(t, found, logy) for t, rx, logy in DASHBOARD if (found := keys(records, rx))]


def plot_dashboard(run, out=None) -> Path:
    """A grid of the run's headline curves; a panel per group of keys that exist."""
    run = run_dir(run)
    path = out_path(run, "dashboard", out)
    records = read_metrics(run)
    if not records:
        return message(path, "dashboard", f"no records in {run / METRICS_FILE}")
    panels = dashboard_panels(records)
    has_time = bool(keys(records, r"^time/(" + "|".join(TIME_PARTS) + "|step)$"))
    if not panels and not has_time:
        wanted = "reward/mean, pass@k, loss, ratio_*, clip_fraction, memory/*, time/*"
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
    path = png_path(out if out is not None else runs[0].parent / f"compare_{safe}_{x}.png")
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
