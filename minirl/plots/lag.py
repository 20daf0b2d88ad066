"""Staleness by lag bucket: PipelineRL's Table 3 and its ratio-tail plots (§5.2, §7.3).

`lag_table(records)` pools the per-step "lag/<bucket>/<stat>" and "snis/<bucket>/<stat>" keys of
metrics.jsonl into one row per bucket; `plot_lag(run_dir)` draws that table, the per-step max ρ by
bucket, and the tails and KL by lag.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from minirl.measure.metrics_log import METRICS_FILE, cell, read_metrics
from minirl.plots.common import message, num, out_path, run_dir, series, style

_LAG_KEY = re.compile(r"^lag/(\[[^/]+\))/(\w+)$")

TABLE = (  # (column title, row key, format)
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


def _lower_edge(label: str) -> float:
    return float(label[1 : label.index(",")])


def _baseline_rmse(records: list[dict], label: str) -> tuple[float, float]:
    """(groups, pooled RMSE) of the SNIS proxy in one bucket: sqrt(sum g e^2 / sum g)."""
    groups, rmse = [], []
    for r in records:
        g, e = num(r.get(f"snis/{label}/groups")), num(r.get(f"snis/{label}/rmse_gap"))
        if g is not None and e is not None:
            groups.append(g)
            rmse.append(e)
    g, e = np.asarray(groups), np.asarray(rmse)
    return float(g.sum()), float(np.sqrt(np.sum(g * e**2) / g.sum())) if g.sum() else math.nan


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
            if m and num(v) is not None:
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
        row["groups"], row["baseline_rmse"] = _baseline_rmse(records, label)
        rows.append(row)
    return rows


def plot_lag(run, out=None) -> Path:
    """Lag-bucket table (PipelineRL Table 3), per-step max ρ by bucket, and ratio tails by lag."""
    run = run_dir(run)
    path = out_path(run, "lag", out)
    records = read_metrics(run)
    rows = lag_table(records)
    if not rows:
        msg = "no records" if not records else "no 'lag/<bucket>/tokens' and '.../max_rho' keys"
        return message(path, "lag buckets", f"{msg} in {run / METRICS_FILE}")
    fig = Figure(figsize=(13, 5.5 + 0.25 * len(rows)), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=(0.6 + 0.25 * len(rows), 4.0))
    ax = top.subplots()
    ax.axis("off")
    cells = [[cell(row[key], fmt) for _, key, fmt in TABLE] for row in rows]
    table = ax.table(cellText=cells, colLabels=[t for t, _, _ in TABLE], loc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.scale(1, 1.2)
    ax.set_title("lag-bucket summary (lag = trainer version − token version; – = no data)")
    left, right = bottom.subplots(1, 2)
    labels = [str(row["bucket"]) for row in rows]
    maxima = [series(records, f"lag/{label}/max_rho")[1] for label in labels]
    left.boxplot([m[np.isfinite(m)] for m in maxima])
    left.set_xticks(np.arange(1, len(labels) + 1), labels)
    style(left, "per-step max ρ by lag bucket", xlabel="lag (versions)", legend=False)
    xs = np.arange(len(rows))
    tails = (("p_rho_gt_2", "P(ρ>2)"), ("p_rho_gt_5", "P(ρ>5)"), ("p_rho_gt_10", "P(ρ>10)"))
    for stat, name in (*tails, ("kl_k3", "k3 KL")):
        ys = np.asarray([row[stat] for row in rows], dtype=np.float64)
        right.plot(xs, np.where(ys > 0, ys, np.nan), marker="o", label=name)
    right.set_xticks(xs, labels)
    title = "ratio tails and KL by lag (token-weighted; zeros not drawn)"
    style(right, title, xlabel="lag (versions)", yscale="log")
    fig.savefig(path, dpi=100)
    return path
