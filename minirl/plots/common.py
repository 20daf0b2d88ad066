"""What every plot shares: finding a run's keys and series, message PNGs, panels and their style.

Keys are found by regex, so a plot works whether the controller logs "loss" or "train/loss".
Figures are built with the object-oriented `matplotlib.figure.Figure` and saved through the Agg
canvas, so nothing here touches pyplot's global state or the user's backend.
"""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

MAX_LINES = 8  # per panel; more keys than this are left out (and said so in the title)


# ----------------------------------------------------------------------------- reading


def run_dir(path) -> Path:
    """The run directory as a Path; a directory that does not exist is the one error."""
    path = Path(path)
    if not path.is_dir():
        why = "is a file, not a run directory" if path.exists() else "does not exist"
        raise FileNotFoundError(f"run directory {path} {why}")
    return path


def as_runs(run_dirs, labels) -> tuple[list[Path], list[str]]:
    """One run or several, with one label each (default: the directory names)."""
    runs = [run_dirs] if isinstance(run_dirs, (str, Path)) else list(run_dirs)
    if not runs:
        raise ValueError("give at least one run directory")
    runs = [run_dir(r) for r in runs]
    if labels is None:  # the names, or the paths where two names are one (a/countdown b/countdown)
        labels = [r.name for r in runs]
        labels = labels if len(set(labels)) == len(labels) else [str(r) for r in runs]
    labels = list(labels)
    if len(labels) != len(runs):
        raise ValueError(f"{len(labels)} labels for {len(runs)} runs")
    if len(set(labels)) < len(labels):  # one curve per label: a second would hide the first
        twice = sorted({x for x in labels if labels.count(x) > 1})
        raise ValueError(f"{', '.join(twice)} given twice (a run is one curve, with its own label)")
    return runs, labels


def out_path(run: Path, name: str, out) -> Path:
    """`out`, or run/plots/<name>.png; the parent directory is created."""
    return png_path(out if out is not None else run / "plots" / f"{name}.png")


def png_path(path) -> Path:
    """`path` as the file a figure is saved to, its parent directory created: without a suffix,
    with ".png" (what matplotlib adds when it saves, so the path printed is the file written)."""
    path = Path(path)
    path = path if path.suffix else path.with_name(path.name + ".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def keys(records: list[dict], pattern: str) -> list[str]:
    """Keys of any record matching the regex, that hold at least one number."""
    rx = re.compile(pattern)
    found = {k for r in records for k, v in r.items() if rx.search(k) and num(v) is not None}
    return sorted(found)


def step_of(record: dict, index: int) -> float:
    """The record's "step", or its index in the file where it has no number there (a line
    written by hand or by another program)."""
    step = num(record.get("step"))
    return index if step is None else step


def has_key(records: list[dict], key: str) -> bool:
    return any(key in r for r in records)


def series(records: list[dict], key: str, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
    """(xs, ys) over the records that have `key`; null -> nan. x = "step" (the record's "step",
    else its index) or "time" (wall_time minus the run's first wall_time, seconds)."""
    t0 = next((r["wall_time"] for r in records if num(r.get("wall_time")) is not None), 0.0)
    xs, ys = [], []
    for i, r in enumerate(records):
        if key not in r:
            continue
        if x == "time":
            if num(r.get("wall_time")) is None:
                continue
            xs.append(r["wall_time"] - t0)
        else:
            xs.append(step_of(r, i))
        v = num(r[key])
        ys.append(math.nan if v is None else v)
    return np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)


def p95_over_steps(ys: np.ndarray) -> float:
    """RLAX's summary of a per-step curve: the 95th percentile over steps (nan if none)."""
    finite = ys[np.isfinite(ys)]
    return float(np.percentile(finite, 95)) if finite.size else math.nan


# ----------------------------------------------------------------------------- drawing


def message(path: Path, title: str, text: str) -> Path:
    """A PNG that explains why there is no plot (and the same words as a warning)."""
    warnings.warn(f"{title}: {text}", stacklevel=3)
    fig = Figure(figsize=(7, 2.5))
    ax = fig.subplots()
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=11)
    fig.savefig(path, dpi=100)
    return path


def _has_positive(ax) -> bool:
    """Whether any line drawn on `ax` has a finite value above zero."""
    for line in ax.get_lines():
        ys = np.asarray(line.get_ydata(), dtype=np.float64)
        if np.any(np.isfinite(ys) & (ys > 0)):
            return True
    return False


def style(ax, title: str, *, xlabel: str = "step", yscale: str | None = None, legend=True):
    """The look every panel shares: title, x label, grid, optional y scale, small legend."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    if yscale == "log" and not _has_positive(ax):
        yscale = "symlog"  # a log axis of nothing positive (exact mode: every tail 0) cannot draw
    if yscale == "symlog":  # log-like, but exact zeros (exact mode) stay on the plot
        ax.set_yscale("symlog", linthresh=1e-8)
    elif yscale is not None:
        ax.set_yscale(yscale)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=7)


def lines(ax, records, names, title, *, x="step", logy=False, labels=None):
    """One line per key in `names` (at most MAX_LINES), against step or wall-clock time."""
    shown = names[:MAX_LINES]
    for i, key in enumerate(shown):
        xs, ys = series(records, key, x)
        ax.plot(xs, ys, marker="." if xs.size < 30 else None, label=labels[i] if labels else key)
    more = f" (+{len(names) - len(shown)} more)" if len(names) > len(shown) else ""
    xlabel = "step" if x == "step" else "wall-clock time (s)"
    style(ax, title + more, xlabel=xlabel, yscale="log" if logy else None)


def grid(n: int, ncols: int = 2, size=(6.0, 3.4)):
    """A figure with n panels in rows of `ncols` (unused cells hidden): (figure, axes [n+])."""
    nrows = math.ceil(n / ncols)
    cols = min(n, ncols)
    fig = Figure(figsize=(size[0] * cols, size[1] * nrows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, cols)).ravel()
    for ax in axes[n:]:
        ax.axis("off")
    return fig, axes
