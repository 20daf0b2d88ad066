"""Training-inference mismatch over a run: RLAX Fig. 5 and VeXact's zero-centred contributions.

`plot_mismatch` draws, per step, what the PPO ratio of the first update sees WITH recomputation
(log pi_theta - log pi_prox) and WITHOUT it (log pi_theta - log mu): RLAX's Fig. 5, both series
from the same run (minirl/training/trainer.py logs them as train/dlogp_recompute/* and
train/dlogp_no_recompute/*), then the engine-vs-recompute mismatch the controller logs
(mismatch/*) and its KL estimate. `plot_zero_centred` draws A (c - 1) by advantage sign
(VeXact Eq. 5, Fig. 5).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from minirl.measure.metrics_log import METRICS_FILE, read_metrics
from minirl.plots.common import (
    as_runs,
    grid,
    has_key,
    keys,
    message,
    out_path,
    p95_over_steps,
    run_dir,
    series,
    style,
)

# RLAX Fig. 5's two runs, as two series of one minirl run: (key prefix, label, line style)
FIG5 = (
    ("train/dlogp_no_recompute", "without recomputation: π_old = μ (engine)", "--"),
    ("train/dlogp_recompute", "with recomputation: π_old = π_prox (trainer)", "-"),
)


def _families(runs, labels):
    """([(label, records, prefix, name, ls)] of the Fig. 5 series, [(label, records, prefix)] of
    every other "<prefix>/mean_abs_dlogp" family, e.g. the controller's "mismatch")."""
    fig5, other = [], []
    for run, label in zip(runs, labels, strict=True):
        records = read_metrics(run)
        for prefix, name, ls in FIG5:
            if has_key(records, f"{prefix}/mean_abs_dlogp"):
                fig5.append((label, records, prefix, name, ls))
        for key in keys(records, r"/mean_abs_dlogp$"):
            prefix = key[: -len("/mean_abs_dlogp")]
            if prefix not in {p for p, _, _ in FIG5}:
                other.append(
                    (label if prefix == "mismatch" else f"{label} {prefix}", records, prefix)
                )
    return fig5, other


def plot_mismatch(run_dirs, labels=None, out=None) -> Path:
    """Per-step |Δ log p| of one run or several (e.g. exact mode on / off), RLAX Fig. 5 style.

    Top panel (when logged): the first update's |log π_θ − log π_old| per step, mean over
    tokens, without recomputation (dashed) and with it (solid). Next: every other family
    "<P>/mean_abs_dlogp" (the controller's "mismatch": engine μ vs the trainer's recompute), mean
    solid and per-step p95 dashed. Every legend entry carries RLAX's summary number, the p95 over
    steps of the per-step mean. Then kl_k3 and the greedy flip fraction of those families, when
    logged. Exact zeros stay visible (symmetric-log axis, linear below 1e-8).
    """
    runs, labels = as_runs(run_dirs, labels)
    path = out_path(runs[0], "mismatch", out)
    fig5, other = _families(runs, labels)
    if not fig5 and not other:
        where = ", ".join(str(r) for r in runs)
        return message(path, "mismatch", f"no '<prefix>/mean_abs_dlogp' keys in {where}")
    extras = [
        s
        for s in ("kl_k3", "greedy_flip_fraction")
        if any(has_key(rec, f"{p}/{s}") for _, rec, p in other)
    ]
    fig, axes = grid(bool(fig5) + bool(other) + len(extras), ncols=1, size=(9.0, 3.4))
    axes = list(axes)
    if fig5:
        ax = axes.pop(0)
        for label, records, prefix, name, ls in fig5:
            xs, mean = series(records, f"{prefix}/mean_abs_dlogp")
            color = f"C{labels.index(label)}"
            summary = f"p95 over steps {p95_over_steps(mean):.3g}"
            ax.plot(xs, mean, color=color, ls=ls, label=f"{label}: {name} ({summary})")
        title = "RLAX Fig. 5: first update's mean |log π_θ − log π_old| per step"
        style(ax, title, yscale="symlog")
    if other:
        ax = axes.pop(0)
        for i, (label, records, prefix) in enumerate(other):
            xs, mean = series(records, f"{prefix}/mean_abs_dlogp")
            summary = f"p95 over steps {p95_over_steps(mean):.3g}"
            ax.plot(xs, mean, color=f"C{i}", label=f"{label} mean ({summary})")
            xs, p95 = series(records, f"{prefix}/p95_abs_dlogp")
            if xs.size:
                ax.plot(xs, p95, color=f"C{i}", ls="--", alpha=0.7, label=f"{label} per-step p95")
        style(ax, "|Δlogp| = |log π_recompute − log μ_engine| over counted tokens", yscale="symlog")
    for ax, stat in zip(axes, extras, strict=False):
        for i, (label, records, prefix) in enumerate(other):
            xs, ys = series(records, f"{prefix}/{stat}")
            if xs.size:
                ax.plot(xs, ys, color=f"C{i}", label=label)
        style(ax, stat + (": k3 estimate of KL(μ‖π)" if stat == "kl_k3" else ""))
    fig.savefig(path, dpi=100)
    return path


def plot_zero_centred(run, out=None) -> Path:
    """VeXact Eq. 5 by advantage sign: per-step sums, their distribution over steps, and the
    per-token quantile bands when logged ("zero_centred/{pos,neg}_{sum,p05,p50,p95}"; the loss's
    "zero_centred_pos/neg" sums are used when the diagnostics' keys are absent)."""
    run = run_dir(run)
    path = out_path(run, "zero_centred", out)
    records = read_metrics(run)
    pos = keys(records, r"(^|/)zero_centred(/pos_sum|_pos)$")
    neg = keys(records, r"(^|/)zero_centred(/neg_sum|_neg)$")
    if not pos or not neg:
        msg = "no records" if not records else "no zero_centred/pos_sum and neg_sum keys"
        return message(path, "zero-centred contributions", f"{msg} in {run / METRICS_FILE}")
    bands = bool(keys(records, r"^zero_centred/(pos|neg)_p50$"))
    fig, axes = grid(3 if bands else 2, ncols=1, size=(9.0, 3.2))
    xs, p = series(records, pos[0])
    _, n = series(records, neg[0])
    ax = axes[0]
    ax.plot(xs, p, color="C2", label=f"A>0: {pos[0]}")
    ax.plot(xs, n, color="C3", label=f"A<0: {neg[0]}")
    ax.plot(xs, p + n, color="k", lw=1, label="net (pos + neg)")
    ax.axhline(0, color="grey", lw=0.5)
    style(ax, "Σ A·(c − 1) per step, by advantage sign (0 when μ = π)")
    ax = axes[1]
    for vals, color, name in ((p, "C2", "A>0"), (n, "C3", "A<0"), (p + n, "k", "net")):
        vals = vals[np.isfinite(vals)]
        if vals.size:
            ax.hist(vals, bins=min(40, max(5, vals.size // 3)), alpha=0.5, color=color, label=name)
    style(ax, "distribution over steps of the per-step sums", xlabel="Σ A·(c − 1)")
    if bands:
        ax = axes[2]
        for sign, color in (("pos", "C2"), ("neg", "C3")):
            xs, mid = series(records, f"zero_centred/{sign}_p50")
            _, lo = series(records, f"zero_centred/{sign}_p05")
            _, hi = series(records, f"zero_centred/{sign}_p95")
            if lo.size == xs.size and hi.size == xs.size:
                ax.fill_between(xs, lo, hi, color=color, alpha=0.25)
            sign_text = ">" if sign == "pos" else "<"
            ax.plot(xs, mid, color=color, label=f"A{sign_text}0 p50 (band p5-p95)")
        ax.axhline(0, color="grey", lw=0.5)
        style(ax, "per-token A·(c − 1): median and 5-95% band")
    fig.savefig(path, dpi=100)
    return path
