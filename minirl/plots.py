"""Plots of a run: read `run_dir/metrics.jsonl`, write PNGs to `run_dir/plots/`.

Each function draws only the keys the run actually logged, labels every line with its key, and
returns the path of the PNG it wrote. A missing or empty metrics file, or a run without the
keys a plot needs, gives a PNG that says so in words (and a warning) instead of an exception,
so `minirl plot` always leaves something to look at. Only a run directory that does not exist
is an error.

- `plot_dashboard`    reward, pass@k, loss, ratio / correction, clipping, step-time split
- `plot_mismatch`     per-step |Delta logp| mean and p95, one or several runs (RLAX Fig. 5)
- `plot_lag`          lag-bucket table + ratio tails by lag (PipelineRL Table 3, §7.3)
- `plot_zero_centred` A (c - 1) by advantage sign (VeXact Eq. 5, Fig. 5)
- `plot_compare`      one metric of several runs against step or wall-clock time
- `plot_all`          the four single-run plots

Keys are found by pattern, so the same plot works whether the controller logs "loss" or
"train/loss" (the names are listed in docs/diagnostics.md). Figures are built with the
object-oriented `matplotlib.figure.Figure` and saved through the Agg canvas, so importing this
module never touches pyplot's global state or the user's backend.
"""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from minirl.metrics_log import METRICS_FILE, read_metrics

MAX_LINES = 8  # per panel; more keys than this are left out (and said so in the title)
TIME_PARTS = ("generate", "verify", "train", "other")  # keys "time/<part>", seconds per step


# ----------------------------------------------------------------------------- reading


def _run_dir(run_dir) -> Path:
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"run directory {path} does not exist")
    return path


def _out(run_dir: Path, name: str, out) -> Path:
    path = Path(out) if out is not None else run_dir / "plots" / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _keys(records: list[dict], pattern: str) -> list[str]:
    """Keys of any record matching the regex, that hold at least one number."""
    rx = re.compile(pattern)
    found = {k for r in records for k, v in r.items() if rx.search(k) and _num(v) is not None}
    return sorted(found)


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def series(records: list[dict], key: str, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
    """(xs, ys) over the records that have `key`; null -> nan. x = "step" (the record's "step",
    else its index) or "time" (wall_time minus the run's first wall_time, seconds)."""
    t0 = next((r["wall_time"] for r in records if _num(r.get("wall_time")) is not None), 0.0)
    xs, ys = [], []
    for i, r in enumerate(records):
        if key not in r:
            continue
        if x == "time":
            if _num(r.get("wall_time")) is None:
                continue
            xs.append(r["wall_time"] - t0)
        else:
            xs.append(r["step"] if _num(r.get("step")) is not None else i)
        v = _num(r[key])
        ys.append(math.nan if v is None else v)
    return np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)


# ----------------------------------------------------------------------------- drawing helpers


def _message(path: Path, title: str, message: str) -> Path:
    """A PNG that explains why there is no plot."""
    warnings.warn(f"{title}: {message}", stacklevel=3)
    fig = Figure(figsize=(7, 2.5))
    ax = fig.subplots()
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, fontsize=11)
    fig.savefig(path, dpi=100)
    return path


def _lines(ax, records, keys, title, *, x="step", logy=False, labels=None):
    shown = keys[:MAX_LINES]
    for i, key in enumerate(shown):
        xs, ys = series(records, key, x)
        ax.plot(xs, ys, marker="." if xs.size < 30 else None, label=labels[i] if labels else key)
    more = f" (+{len(keys) - len(shown)} more)" if len(keys) > len(shown) else ""
    ax.set_title(title + more)
    ax.set_xlabel("step" if x == "step" else "wall-clock time (s)")
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _grid(n: int, ncols: int = 2, size=(6.0, 3.4)):
    nrows = math.ceil(n / ncols)
    cols = min(n, ncols)
    fig = Figure(figsize=(size[0] * cols, size[1] * nrows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, cols)).ravel()
    for ax in axes[n:]:
        ax.axis("off")
    return fig, axes


# ----------------------------------------------------------------------------- dashboard


def _series_of(records, key) -> np.ndarray:
    return np.asarray([math.nan if (v := _num(r.get(key))) is None else v for r in records])


def time_parts(records: list[dict]) -> dict[str, np.ndarray]:
    """Seconds per step of each of TIME_PARTS present (nan where a record lacks it). "other" is
    the controller's own overhead (everything but generate, verify and train); when a run did
    not log it, it is time/step minus the three."""
    parts = {p: _series_of(records, f"time/{p}") for p in TIME_PARTS}
    if np.isnan(parts["other"]).all() and _keys(records, r"^time/step$"):
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
    xs = np.asarray([r.get("step", i) for i, r in enumerate(records)], dtype=np.float64)
    parts, shares = time_parts(records), time_shares(records)
    labels = [f"{p} {100 * shares[p]:.1f}%" for p in parts]
    ax.stackplot(xs, *[np.nan_to_num(v) for v in parts.values()], labels=labels, alpha=0.8)
    title = "step time split (s), keys time/<part>; % of the run's step time"
    if "other" in shares:  # step 1 also compiles the trainer: the share without it, too
        later = time_shares(records[1:]).get("other", math.nan)
        title += f"\ncontroller overhead (other) {100 * shares['other']:.1f}%, "
        title += f"after step 1 {100 * later:.1f}%"
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")


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


def plot_dashboard(run_dir, out=None) -> Path:
    """A grid of the run's headline curves; a panel per group of keys that exist."""
    run = _run_dir(run_dir)
    path = _out(run, "dashboard", out)
    records = read_metrics(run)
    if not records:
        return _message(path, "dashboard", f"no records in {run / METRICS_FILE}")
    panels = [(t, keys, logy) for t, rx, logy in DASHBOARD if (keys := _keys(records, rx))]
    has_time = bool(_keys(records, r"^time/(" + "|".join(TIME_PARTS) + "|step)$"))
    if not panels and not has_time:
        wanted = "reward/mean, pass@k, loss, ratio_*, clip_fraction, time/*"
        return _message(path, "dashboard", f"none of the dashboard keys ({wanted}) in {run}")
    fig, axes = _grid(len(panels) + has_time)
    for ax, (title, keys, logy) in zip(axes, panels, strict=False):
        _lines(ax, records, keys, title, logy=logy)
    if has_time:
        _time_split(axes[len(panels)], records)
    fig.suptitle(f"{run.name}: {len(records)} records")
    fig.savefig(path, dpi=100)
    return path


# ----------------------------------------------------------------------------- mismatch


def _as_runs(run_dirs, labels) -> tuple[list[Path], list[str]]:
    runs = [run_dirs] if isinstance(run_dirs, (str, Path)) else list(run_dirs)
    if not runs:
        raise ValueError("give at least one run directory")
    runs = [_run_dir(r) for r in runs]
    labels = list(labels) if labels is not None else [r.name for r in runs]
    if len(labels) != len(runs):
        raise ValueError(f"{len(labels)} labels for {len(runs)} runs")
    return runs, labels


def plot_mismatch(run_dirs, labels=None, out=None) -> Path:
    """Per-step |Delta logp| mean (solid) and p95 (dashed), RLAX Fig. 5 style.

    `run_dirs` is one run or several (e.g. exact mode on / off). Every key family "<P>/mean_abs_dlogp"
    is drawn, so a run that logs both "mismatch/..." (against the trainer's recompute) and a second
    family (e.g. "mismatch_plain/...") shows both. Each legend entry carries RLAX's summary number:
    the p95 over steps of the per-step mean. A second panel shows kl_k3, a third the greedy flip
    fraction, when logged.
    """
    runs, labels = _as_runs(run_dirs, labels)
    path = _out(runs[0], "mismatch", out)
    curves = []  # (label, records, prefix)
    for run, label in zip(runs, labels, strict=True):
        records = read_metrics(run)
        for key in _keys(records, r"/mean_abs_dlogp$"):
            prefix = key[: -len("/mean_abs_dlogp")]
            curves.append((label if prefix == "mismatch" else f"{label} {prefix}", records, prefix))
    if not curves:
        where = ", ".join(str(r) for r in runs)
        return _message(path, "mismatch", f"no '<prefix>/mean_abs_dlogp' keys in {where}")
    extras = [s for s in ("kl_k3", "greedy_flip_fraction") if any(_has(c, s) for c in curves)]
    fig, axes = _grid(1 + len(extras), ncols=1, size=(9.0, 3.4))
    ax = axes[0]
    for i, (label, records, prefix) in enumerate(curves):
        color = f"C{i}"
        xs, mean = series(records, f"{prefix}/mean_abs_dlogp")
        summary = np.nanpercentile(mean, 95) if np.isfinite(mean).any() else math.nan
        ax.plot(xs, mean, color=color, label=f"{label} mean (p95 over steps {summary:.3g})")
        xs, p95 = series(records, f"{prefix}/p95_abs_dlogp")
        if xs.size:
            ax.plot(xs, p95, color=color, ls="--", alpha=0.7, label=f"{label} per-step p95")
    ax.set_yscale("log")
    ax.set_title("|Δlogp| = |log π_trainer − log μ_engine| over counted tokens")
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    for ax, stat in zip(axes[1:], extras, strict=False):
        for i, (label, records, prefix) in enumerate(curves):
            xs, ys = series(records, f"{prefix}/{stat}")
            if xs.size:
                ax.plot(xs, ys, color=f"C{i}", label=label)
        ax.set_title(stat + (": k3 estimate of KL(μ‖π)" if stat == "kl_k3" else ""))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=100)
    return path


def _has(curve, stat) -> bool:
    _, records, prefix = curve
    return any(f"{prefix}/{stat}" in r for r in records)


# ----------------------------------------------------------------------------- lag buckets

_LAG_KEY = re.compile(r"^lag/(\[[^/]+\))/(\w+)$")


def _lower_edge(label: str) -> float:
    return float(label[1 : label.index(",")])


def lag_table(records: list[dict]) -> list[dict[str, float | str]]:
    """PipelineRL Table 3 from per-step "lag/<bucket>/<stat>" and "snis/<bucket>/<stat>" keys.

    Per bucket, over the steps where it was non-empty: `steps`, `tokens` (total),
    `median_max_rho`, `p95_max_rho`, `max_rho` (of the per-step maxima), `median_mean_rho`;
    token-weighted means of `kl_k3`, `kl_k1`, `p_rho_gt_2`, `p_rho_gt_5`, `p_rho_gt_10`; and from
    the SNIS proxy `groups` and `baseline_rmse` = sqrt(sum groups * rmse^2 / sum groups).
    Rows are sorted by lag.
    """
    per: dict[str, dict[str, list[float]]] = {}
    for r in records:
        for k, v in r.items():
            m = _LAG_KEY.match(k)
            if m and _num(v) is not None:
                per.setdefault(m.group(1), {}).setdefault(m.group(2), []).append(v)
    rows = []
    for label in sorted(per, key=_lower_edge):
        s = {k: np.asarray(v, dtype=np.float64) for k, v in per[label].items()}
        if "tokens" not in s or "max_rho" not in s or len(s["tokens"]) != len(s["max_rho"]):
            continue
        tok = s["tokens"]
        w = tok / max(tok.sum(), 1.0)
        row: dict[str, float | str] = {
            "bucket": label,
            "steps": float(tok.size),
            "tokens": float(tok.sum()),
            "median_max_rho": float(np.median(s["max_rho"])),
            "p95_max_rho": float(np.percentile(s["max_rho"], 95)),
            "max_rho": float(s["max_rho"].max()),
            "median_mean_rho": float(np.median(s.get("mean_rho", [math.nan]))),
        }
        for stat in ("kl_k3", "kl_k1", "p_rho_gt_2", "p_rho_gt_5", "p_rho_gt_10"):
            ok = stat in s and s[stat].size == tok.size
            row[stat] = float(np.sum(w * s[stat])) if ok else math.nan
        groups, rmse = [], []
        for r in records:
            g, e = _num(r.get(f"snis/{label}/groups")), _num(r.get(f"snis/{label}/rmse_gap"))
            if g is not None and e is not None:
                groups.append(g)
                rmse.append(e)
        g, e = np.asarray(groups), np.asarray(rmse)
        row["groups"] = float(g.sum())
        row["baseline_rmse"] = float(np.sqrt(np.sum(g * e**2) / g.sum())) if g.sum() else math.nan
        rows.append(row)
    return rows


_TABLE = (  # (column title, row key, format)
    ("lag", "bucket", "{}"),
    ("steps", "steps", "{:.0f}"),
    ("tokens", "tokens", "{:.0f}"),
    ("median max ρ", "median_max_rho", "{:.3f}"),
    ("p95 max ρ", "p95_max_rho", "{:.3f}"),
    ("max ρ", "max_rho", "{:.3f}"),
    ("median mean ρ", "median_mean_rho", "{:.6f}"),
    ("k3 KL", "kl_k3", "{:.2e}"),
    ("P(ρ>2)", "p_rho_gt_2", "{:.2e}"),
    ("baseline RMSE", "baseline_rmse", "{:.2e}"),
)


def _cell(value, fmt: str) -> str:
    return "–" if isinstance(value, float) and math.isnan(value) else fmt.format(value)


def plot_lag(run_dir, out=None) -> Path:
    """Lag-bucket table (PipelineRL Table 3), per-step max ρ by bucket, and ratio tails by lag."""
    run = _run_dir(run_dir)
    path = _out(run, "lag", out)
    records = read_metrics(run)
    rows = lag_table(records)
    if not rows:
        msg = "no records" if not records else "no 'lag/<bucket>/tokens' and '.../max_rho' keys"
        return _message(path, "lag buckets", f"{msg} in {run / METRICS_FILE}")
    fig = Figure(figsize=(13, 5.5 + 0.25 * len(rows)), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=(0.6 + 0.25 * len(rows), 4.0))
    ax = top.subplots()
    ax.axis("off")
    cells = [[_cell(row[key], fmt) for _, key, fmt in _TABLE] for row in rows]
    table = ax.table(cellText=cells, colLabels=[t for t, _, _ in _TABLE], loc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.scale(1, 1.2)
    ax.set_title("lag-bucket summary (lag = trainer version − token version; – = no data)")
    left, right = bottom.subplots(1, 2)
    labels = [str(row["bucket"]) for row in rows]
    maxima = [series(records, f"lag/{label}/max_rho")[1] for label in labels]
    left.boxplot([m[np.isfinite(m)] for m in maxima])
    left.set_xticks(np.arange(1, len(labels) + 1), labels)
    left.set_title("per-step max ρ by lag bucket")
    left.set_xlabel("lag (versions)")
    left.grid(alpha=0.3)
    xs = np.arange(len(rows))
    tails = (("p_rho_gt_2", "P(ρ>2)"), ("p_rho_gt_5", "P(ρ>5)"), ("p_rho_gt_10", "P(ρ>10)"))
    for stat, name in (*tails, ("kl_k3", "k3 KL")):
        ys = np.asarray([row[stat] for row in rows], dtype=np.float64)
        right.plot(xs, np.where(ys > 0, ys, np.nan), marker="o", label=name)
    right.set_xticks(xs, labels)
    right.set_yscale("log")
    right.set_title("ratio tails and KL by lag (token-weighted; zeros not drawn)")
    right.set_xlabel("lag (versions)")
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    fig.savefig(path, dpi=100)
    return path


# ----------------------------------------------------------------------------- zero-centred


def plot_zero_centred(run_dir, out=None) -> Path:
    """VeXact Eq. 5 by advantage sign: per-step sums, their distribution over steps, and the
    per-token quantile bands when logged ("zero_centred/{pos,neg}_{sum,p05,p50,p95}"; the loss's
    "zero_centred_pos/neg" sums are used when the diagnostics' keys are absent)."""
    run = _run_dir(run_dir)
    path = _out(run, "zero_centred", out)
    records = read_metrics(run)
    pos = _keys(records, r"(^|/)zero_centred(/pos_sum|_pos)$")
    neg = _keys(records, r"(^|/)zero_centred(/neg_sum|_neg)$")
    if not pos or not neg:
        msg = "no records" if not records else "no zero_centred/pos_sum and neg_sum keys"
        return _message(path, "zero-centred contributions", f"{msg} in {run / METRICS_FILE}")
    bands = bool(_keys(records, r"^zero_centred/(pos|neg)_p50$"))
    fig, axes = _grid(3 if bands else 2, ncols=1, size=(9.0, 3.2))
    xs, p = series(records, pos[0])
    _, n = series(records, neg[0])
    ax = axes[0]
    ax.plot(xs, p, color="C2", label=f"A>0: {pos[0]}")
    ax.plot(xs, n, color="C3", label=f"A<0: {neg[0]}")
    ax.plot(xs, p + n, color="k", lw=1, label="net (pos + neg)")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_title("Σ A·(c − 1) per step, by advantage sign (0 when μ = π)")
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[1]
    for vals, color, name in ((p, "C2", "A>0"), (n, "C3", "A<0"), (p + n, "k", "net")):
        vals = vals[np.isfinite(vals)]
        if vals.size:
            ax.hist(vals, bins=min(40, max(5, vals.size // 3)), alpha=0.5, color=color, label=name)
    ax.set_title("distribution over steps of the per-step sums")
    ax.set_xlabel("Σ A·(c − 1)")
    ax.legend(fontsize=7)
    if bands:
        ax = axes[2]
        for sign, color in (("pos", "C2"), ("neg", "C3")):
            xs, mid = series(records, f"zero_centred/{sign}_p50")
            _, lo = series(records, f"zero_centred/{sign}_p05")
            _, hi = series(records, f"zero_centred/{sign}_p95")
            if lo.size == xs.size and hi.size == xs.size:
                ax.fill_between(xs, lo, hi, color=color, alpha=0.25)
            ax.plot(
                xs, mid, color=color, label=f"A{'>' if sign == 'pos' else '<'}0 p50 (band p5-p95)"
            )
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_title("per-token A·(c − 1): median and 5-95% band")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=100)
    return path


# ----------------------------------------------------------------------------- compare runs


def plot_compare(run_dirs, x: str = "step", y: str = "reward/mean", labels=None, out=None) -> Path:
    """One metric `y` of several runs on one plot, against "step" or "time" (wall-clock since
    each run's first record). Default output: <parent of the first run>/compare_<y>_<x>.png."""
    if x not in ("step", "time"):
        raise ValueError(f"x must be 'step' or 'time', got {x!r}")
    runs, labels = _as_runs(run_dirs, labels)
    safe = re.sub(r"[^\w@.-]+", "_", y).strip("_")
    path = Path(out) if out is not None else runs[0].parent / f"compare_{safe}_{x}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    curves = {
        label: series(read_metrics(run), y, x) for run, label in zip(runs, labels, strict=True)
    }
    missing = [label for label, (_, ys) in curves.items() if not np.isfinite(ys).any()]
    if len(missing) == len(runs):
        return _message(path, "compare", f"no run has values for {y!r} (against {x})")
    longest = max(xs.max() for xs, ys in curves.values() if xs.size)
    scale, unit = (60.0, "min") if x == "time" and longest > 600 else (1.0, "s")
    fig = Figure(figsize=(9, 5), layout="constrained")
    ax = fig.subplots()
    for label, (xs, ys) in curves.items():
        if label not in missing:
            ax.plot(xs / scale, ys, marker="." if xs.size < 30 else None, label=label)
    ax.set_xlabel("step" if x == "step" else f"wall-clock time ({unit})")
    ax.set_ylabel(y)
    ax.set_title(y + (f"  (no values: {', '.join(missing)})" if missing else ""))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=100)
    return path


def plot_all(run_dir) -> list[Path]:
    """Dashboard, mismatch, lag and zero-centred plots of one run (what `minirl plot` draws)."""
    return [f(run_dir) for f in (plot_dashboard, plot_mismatch, plot_lag, plot_zero_centred)]
