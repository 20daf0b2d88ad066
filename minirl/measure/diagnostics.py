"""Mismatch and lag diagnostics: what the controller measures on every train batch.

Pure numpy on host arrays, called once per step; each function is a few vectorised passes over
the [B, T] batch. Nothing here feeds the loss — these numbers exist to be logged and plotted
(`minirl/plots/`, `docs/diagnostics.md`).

Notation (docs/losses.md): log mu = behaviour log-prob reported by the engine, log pi = the trainer's
recompute (`prox_logp`). Per token, Delta = log pi - log mu and rho = pi / mu = exp(Delta).

- `mismatch_metrics`  training-inference mismatch (TIM): mean / p95 / max of |Delta| (RLAX §7.2,
  Fig. 5: p95 over steps of the per-step mean, 0.044 without recomputation, 0.020 with) and
  KL estimates.
- `first_update_dlogp`  RLAX Fig. 5's two series, with and without recomputation, from the
  trainer's first update (minirl/training/trainer.py calls it every step).
- `zero_centred_contributions`  VeXact Eq. 5: A (c - 1), summed separately over A > 0 and A < 0.
- `lag_buckets`        PipelineRL §5.2: ratio statistics per lag bucket (Table 3, §7.3).
- `snis_baseline_proxy` PipelineRL Eq. 7-8: plain vs self-normalised IS group baseline by lag.
- `batch_diagnostics`  all of the above from a `Batch`, nested the way metrics.jsonl names them.

KL estimators (kl_k1, kl_k3, named by formula): Schulman's k1 = -log rho and k3 = rho - 1 -
log rho estimate KL(mu || pi), as tokens are sampled from mu (docs/diagnostics.md).

Simplifications on purpose: log-ratios are clamped to [-20, 20] before `exp` (a metric-side cap,
as in PipelineRL); tokens whose log-probs are not finite are left out of every statistic and
counted (`nonfinite_tokens`); percentiles use numpy's default linear interpolation.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

CLAMP = 20.0  # |log-ratio| cap applied before exp, in every diagnostic
LAG_EDGES = (0, 1, 3, 8, 20, 50, 200, math.inf)  # PipelineRL §5.2; lower edge inclusive


# ----------------------------------------------------------------------------- helpers


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _same_shape(fn: str, **arrays: np.ndarray) -> None:
    shapes = {name: np.shape(a) for name, a in arrays.items()}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"{fn}: arrays must have the same [B, T] shape, got {shapes}")


def _counted(mask) -> np.ndarray:
    return np.asarray(mask) > 0  # [B, T] bool


def bucket_labels(edges=LAG_EDGES) -> list[str]:
    """'[0,1)', '[1,3)', ..., '[200,inf)': one label per half-open bucket [lo, hi)."""

    def fmt(e: float) -> str:
        return "inf" if math.isinf(e) else (str(int(e)) if float(e).is_integer() else f"{e:g}")

    return [f"[{fmt(lo)},{fmt(hi)})" for lo, hi in zip(edges[:-1], edges[1:], strict=True)]


def _check_edges(edges) -> np.ndarray:
    e = np.asarray(edges, dtype=np.float64)
    if e.ndim != 1 or e.size < 2 or e[0] != 0 or not np.isinf(e[-1]) or np.any(np.diff(e) <= 0):
        raise ValueError(f"lag edges must increase strictly from 0 to inf, got {tuple(edges)}")
    return e


def _bucket_index(lag: np.ndarray, edges: np.ndarray, what: str) -> np.ndarray:
    """Bucket i holds edges[i] <= lag < edges[i+1] (lower edge inclusive, upper exclusive)."""
    if lag.size and not np.all(lag >= 0):
        raise ValueError(f"{what}: lag must be >= 0 versions behind, got min {np.min(lag)}")
    return np.searchsorted(edges, lag, side="right") - 1


def _quantile(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if x.size else 0.0


# ----------------------------------------------------------------------------- mismatch (TIM)


def mismatch_metrics(
    behav_logp,
    prox_logp,
    mask,
    *,
    behav_logits=None,
    prox_logits=None,
    clamp: float = CLAMP,
) -> dict[str, float]:
    """Training-inference mismatch between engine (log mu) and trainer recompute (log pi).

    behav_logp, prox_logp, mask: [B, T]. Delta = prox - behav. Returns over counted tokens with
    finite log-probs: `mean_abs_dlogp`, `p95_abs_dlogp`, `max_abs_dlogp` (RLAX Fig. 5),
    `mean_dlogp` (signed), `kl_k1`, `kl_k2`, `kl_k3` (estimates of KL(mu || pi), see the module
    docstring), `tokens`, `nonfinite_tokens`. With full distributions (`behav_logits`,
    `prox_logits` [B, T, V], the tempered logits each side sampled / scored with) it adds
    `greedy_flip_fraction`: counted tokens whose argmax differs (VeXact Table 1's flipped top-1).
    An empty mask gives zeros, never nan.
    """
    behav, prox = _f64(behav_logp), _f64(prox_logp)
    _same_shape("mismatch_metrics", behav_logp=behav, prox_logp=prox, mask=np.asarray(mask))
    counted = _counted(mask)  # [B, T]
    valid = counted & np.isfinite(behav) & np.isfinite(prox)  # [B, T]
    d = prox[valid] - behav[valid]  # [N] Delta = log rho
    out = {"tokens": float(d.size), "nonfinite_tokens": float(counted.sum() - d.size)}
    if d.size:
        abs_d = np.abs(d)
        log_rho = np.clip(d, -clamp, clamp)
        rho = np.exp(log_rho)
        out |= {
            "mean_abs_dlogp": float(abs_d.mean()),
            "p95_abs_dlogp": _quantile(abs_d, 95),
            "max_abs_dlogp": float(abs_d.max()),
            "mean_dlogp": float(d.mean()),
            "kl_k1": float(np.mean(-log_rho)),
            "kl_k2": float(np.mean(0.5 * log_rho**2)),
            "kl_k3": float(np.mean(rho - 1.0 - log_rho)),
        }
    else:
        keys = ("mean_abs_dlogp", "p95_abs_dlogp", "max_abs_dlogp", "mean_dlogp")
        out |= dict.fromkeys(keys + ("kl_k1", "kl_k2", "kl_k3"), 0.0)
    if (behav_logits is None) != (prox_logits is None):
        raise ValueError("mismatch_metrics: pass both behav_logits and prox_logits, or neither")
    if behav_logits is not None:
        bl, pl = np.asarray(behav_logits), np.asarray(prox_logits)
        if bl.shape != pl.shape or bl.shape[:-1] != counted.shape:
            raise ValueError(
                f"mismatch_metrics: logits must both be [B, T, V] with [B, T] = {counted.shape}, "
                f"got {bl.shape} and {pl.shape}"
            )
        bl, pl = bl[counted], pl[counted]  # [N, V]; -inf (masked vocab) is fine, nan is not
        ok = ~(np.isnan(bl).any(axis=-1) | np.isnan(pl).any(axis=-1))  # [N]
        flips = np.argmax(bl[ok], axis=-1) != np.argmax(pl[ok], axis=-1)
        out["greedy_tokens"] = float(ok.sum())
        out["greedy_flip_fraction"] = float(flips.mean()) if flips.size else 0.0
    return out


def first_update_dlogp(train_logp, prox_logp, behav_logp, mask) -> dict[str, float]:
    """RLAX Fig. 5's two per-step numbers: |log pi_theta - log pi_old| over `mask` (all [B, T]),
    pi_theta = the training forward of a step's first update, with pi_old = pi_prox (the
    trainer's recompute: "with recomputation") and pi_old = mu (the engine's: "without").
    Returns `dlogp_recompute/` and `dlogp_no_recompute/` + mean / p95 / max `_abs_dlogp`."""
    out = {}
    for name, old in (("dlogp_recompute", prox_logp), ("dlogp_no_recompute", behav_logp)):
        m = mismatch_metrics(old, train_logp, mask)
        for stat in ("mean_abs_dlogp", "p95_abs_dlogp", "max_abs_dlogp"):
            out[f"{name}/{stat}"] = m[stat]
    return out


# ----------------------------------------------------------------------------- VeXact Eq. 5


def zero_centred_contributions(
    advantages, correction, mask, *, return_arrays: bool = False
) -> dict[str, Any]:
    """VeXact Eq. 5's zero-centred loss contribution z = A (c - 1), split by the sign of A.

    advantages: [B] (broadcast over tokens) or [B, T]; correction c: [B, T], e.g.
    c = pi_prox / mu; mask: [B, T]. z has the gradient of the surrogate A c but is 0 when c = 1,
    so with zero mismatch both sums vanish; their imbalance is the mismatch damage the optimizer
    sees before any KL estimate moves (VeXact §4.1, Fig. 5). Tokens with A = 0 are in neither.

    Returns `pos_*` / `neg_*` (A > 0 / A < 0): `_tokens`, `_sum`, `_mean`, `_p05`, `_p50`, `_p95`
    of z over counted tokens with finite A and c; `sum` = pos_sum + neg_sum. With
    `return_arrays=True` also `pos_values` / `neg_values`: the 1-D arrays of z (for histograms;
    `flatten_metrics` leaves arrays out of metrics.jsonl).
    """
    c = _f64(correction)
    a = _f64(advantages)
    if a.ndim == 1:
        if c.ndim != 2 or a.shape[0] != c.shape[0]:
            raise ValueError(f"advantages [B] must match correction [B, T]: {a.shape}, {c.shape}")
        a = np.broadcast_to(a[:, None], c.shape)  # [B, T]
    _same_shape("zero_centred_contributions", advantages=a, correction=c, mask=np.asarray(mask))
    valid = _counted(mask) & np.isfinite(a) & np.isfinite(c)  # [B, T]
    out: dict[str, Any] = {}
    for sign, side in (("pos", a > 0), ("neg", a < 0)):
        sel = valid & side
        z = a[sel] * (c[sel] - 1.0)  # [N_sign]
        out |= {
            f"{sign}_tokens": float(z.size),
            f"{sign}_sum": float(z.sum()),
            f"{sign}_mean": float(z.mean()) if z.size else 0.0,
            f"{sign}_p05": _quantile(z, 5),
            f"{sign}_p50": _quantile(z, 50),
            f"{sign}_p95": _quantile(z, 95),
        }
        if return_arrays:
            out[f"{sign}_values"] = z
    out["sum"] = out["pos_sum"] + out["neg_sum"]
    return out


# ----------------------------------------------------------------------------- lag buckets


def _ratio_stats(log_rho: np.ndarray, rho: np.ndarray) -> dict[str, float]:
    """PipelineRL §5.2's per-bucket accumulators, finalised (log_rho already clamped)."""
    return {
        "tokens": float(rho.size),
        "mean_rho": float(rho.mean()),
        "max_rho": float(rho.max()),
        "mean_rho2": float(np.mean(rho**2)),  # variance proxy: Var rho = E rho^2 - (E rho)^2
        "mean_log_ratio": float(log_rho.mean()),
        "mean_abs_log_ratio": float(np.abs(log_rho).mean()),
        "kl_k3": float(np.mean(rho - log_rho - 1.0)),  # PipelineRL's "forward-KL approximation"
        "kl_k1": float(np.mean(-log_rho)),  # PipelineRL's "reverse estimate"
        "p_rho_gt_2": float(np.mean(rho > 2.0)),
        "p_rho_gt_5": float(np.mean(rho > 5.0)),
        "p_rho_gt_10": float(np.mean(rho > 10.0)),
    }


def lag_buckets(
    log_ratio, lag, mask, edges=LAG_EDGES, *, clamp: float = CLAMP
) -> dict[str, dict[str, float]]:
    """Ratio statistics per lag bucket (PipelineRL §5.2, Table 3).

    log_ratio: [B, T] log pi - log mu; lag: [B, T] int, versions behind (trainer version minus
    the version that produced the token); mask: [B, T]. Buckets are [lo, hi): lower edge
    inclusive, upper exclusive; edges must run from 0 to inf. Returns {label: stats} for the
    NON-EMPTY buckets only (an absent label means no tokens at that lag this step); stats are
    those of `_ratio_stats`, with rho = exp(clamp(log_ratio, -clamp, clamp)). A negative lag at a
    counted token is a bookkeeping bug and raises ValueError.
    """
    lr = _f64(log_ratio)
    lag = np.asarray(lag)
    _same_shape("lag_buckets", log_ratio=lr, lag=lag, mask=np.asarray(mask))
    e = _check_edges(edges)
    valid = _counted(mask) & np.isfinite(lr)  # [B, T]
    log_rho = np.clip(lr[valid], -clamp, clamp)  # [N]
    rho = np.exp(log_rho)
    idx = _bucket_index(lag[valid].astype(np.float64), e, "lag_buckets")  # [N]
    out = {}
    for i, label in enumerate(bucket_labels(edges)):
        sel = idx == i
        if sel.any():
            out[label] = _ratio_stats(log_rho[sel], rho[sel])
    return out


# ----------------------------------------------------------------------------- SNIS baseline proxy


def group_baselines(
    rewards,
    log_ratio,
    mask,
    group_ids,
    lag=None,
    *,
    weight: str = "geometric",
    clamp: float = CLAMP,
) -> dict[str, np.ndarray]:
    """Per group g: the plain baseline (PipelineRL Eq. 7) and the SNIS baseline (Eq. 8).

      b_plain(g) = mean_{i in g} R_i
      b_SNIS(g)  = sum_i w_i R_i / sum_i w_i,  log w_i = (1 / T_i) sum_t r_t   (Eq. 8, geometric)
                                        or     log w_i = sum_t r_t           (weight="sequence")

    r_t = clamp(log_ratio, -clamp, clamp) over the row's counted finite tokens, T_i their count
    (a row with none gets log w = 0). Eq. 8 uses the per-segment geometric-mean ratio; "sequence"
    is the full sequence IS weight, unbiased but heavy-tailed. The normalisation is a softmax of
    log w within the group (max subtracted first), so it cannot overflow. Rows with a non-finite
    reward are left out. `lag` ([B] per row or [B, T] per token) gives `mean_lag`: the mean over
    the group's rows, or over its counted tokens.

    Returns arrays [G']: `group_ids`, `size`, `b_plain`, `b_snis`, `gap` = |b_plain - b_snis|,
    and `mean_lag` when lag is given.
    """
    if weight not in ("geometric", "sequence"):
        raise ValueError(f"weight must be 'geometric' (Eq. 8) or 'sequence', got {weight!r}")
    R, lr = _f64(rewards), _f64(log_ratio)
    gid = np.asarray(group_ids)
    _same_shape("group_baselines", log_ratio=lr, mask=np.asarray(mask))
    if R.shape != lr.shape[:1] or gid.shape != R.shape:
        raise ValueError(f"rewards and group_ids must be [B={lr.shape[0]}]: {R.shape}, {gid.shape}")
    valid = _counted(mask) & np.isfinite(lr)  # [B, T]
    r = np.clip(np.where(valid, lr, 0.0), -clamp, clamp)  # [B, T]
    n = valid.sum(axis=1)  # [B]
    log_w = r.sum(axis=1)  # [B]
    if weight == "geometric":
        log_w = np.where(n > 0, log_w / np.maximum(n, 1), 0.0)
    rows = np.isfinite(R)  # [B]
    groups, inv = np.unique(gid[rows], return_inverse=True)  # inv: row -> group index
    R, log_w = R[rows], log_w[rows]
    size = np.bincount(inv, minlength=groups.size).astype(np.float64)
    top = np.full(groups.size, -np.inf)
    np.maximum.at(top, inv, log_w)
    w = np.exp(log_w - top[inv])  # [B'] in (0, 1], the group's largest is 1
    b_plain = np.bincount(inv, R, groups.size) / size
    b_snis = np.bincount(inv, w * R, groups.size) / np.bincount(inv, w, groups.size)
    out = {"group_ids": groups, "size": size, "b_plain": b_plain, "b_snis": b_snis}
    out["gap"] = np.abs(b_plain - b_snis)
    if lag is not None:
        out["mean_lag"] = _group_mean_lag(_f64(lag), valid, rows, inv, size)
    return out


def _group_mean_lag(lag, valid, rows, inv, size) -> np.ndarray:
    """Per group: the mean of `lag` over its rows ([B]) or over its counted tokens ([B, T])."""
    if lag.shape == valid.shape:  # per token
        num = np.bincount(inv, np.where(valid, lag, 0.0)[rows].sum(axis=1), size.size)
        den = np.bincount(inv, valid[rows].sum(axis=1), size.size)
        return np.where(den > 0, num / np.maximum(den, 1), 0.0)
    if lag.shape == valid.shape[:1]:  # per row
        return np.bincount(inv, lag[rows], size.size) / size
    raise ValueError(f"lag must be [B] or [B, T] = {valid.shape}, got {lag.shape}")


def snis_baseline_proxy(
    rewards,
    log_ratio,
    mask,
    group_ids,
    lag,
    edges=LAG_EDGES,
    *,
    weight: str = "geometric",
    clamp: float = CLAMP,
) -> dict[str, dict[str, float]]:
    """PipelineRL's baseline-bias proxy: Delta b_g = |b_plain(g) - b_SNIS(g)| (Eq. 7-8, §4.3),
    reported by the group's mean lag in the same buckets as `lag_buckets`, plus "all".

    Per key: `groups`, `mean_gap`, `rmse_gap` = sqrt(mean Delta b_g^2) (Table 3's "Baseline
    RMSE"), `max_gap`. Empty buckets are left out; "all" is always there (zeros when empty).
    Arguments as in `group_baselines`.
    """
    g = group_baselines(rewards, log_ratio, mask, group_ids, lag, weight=weight, clamp=clamp)
    e = _check_edges(edges)
    idx = _bucket_index(g["mean_lag"], e, "snis_baseline_proxy")

    def stats(gap: np.ndarray) -> dict[str, float]:
        if not gap.size:
            return {"groups": 0.0, "mean_gap": 0.0, "rmse_gap": 0.0, "max_gap": 0.0}
        return {
            "groups": float(gap.size),
            "mean_gap": float(gap.mean()),
            "rmse_gap": float(np.sqrt(np.mean(gap**2))),
            "max_gap": float(gap.max()),
        }

    out = {label: stats(g["gap"][idx == i]) for i, label in enumerate(bucket_labels(edges))}
    out = {label: s for label, s in out.items() if s["groups"] > 0}
    out["all"] = stats(g["gap"])
    return out


# ----------------------------------------------------------------------------- one call per step


def batch_diagnostics(
    batch,
    prox_logp,
    current_version: int,
    advantages=None,
    *,
    edges=LAG_EDGES,
    weight: str = "geometric",
    clamp: float = CLAMP,
) -> dict[str, Any]:
    """Every diagnostic of one train batch, nested as metrics.jsonl names them.

    batch: a `minirl.types.Batch`; prox_logp: [B, T] the trainer's recompute under weight
    version `current_version`; advantages: [B] or [B, T], optional. lag = current_version -
    batch.versions. Returns {"mismatch": ..., "lag": {bucket: ...}, "snis": {bucket: ...},
    "zero_centred": ...} (the last only with advantages), with c = exp(clamp(prox - behav)).
    Pass it through `flatten_metrics` (or straight to `MetricsWriter.write`).
    """
    behav, prox, mask = _f64(batch.behaviour_logprobs), _f64(prox_logp), batch.mask
    _same_shape("batch_diagnostics", behaviour_logprobs=behav, prox_logp=prox, mask=mask)
    valid = _counted(mask) & np.isfinite(behav) & np.isfinite(prox)  # [B, T]
    log_ratio = np.subtract(prox, behav, out=np.zeros_like(prox), where=valid)  # [B, T], 0 off
    lag = current_version - np.asarray(batch.versions, dtype=np.int64)  # [B, T]
    out: dict[str, Any] = {
        "mismatch": mismatch_metrics(behav, prox, mask, clamp=clamp),
        "lag": lag_buckets(log_ratio, lag, valid, edges, clamp=clamp),
        "snis": snis_baseline_proxy(
            batch.rewards,
            log_ratio,
            valid,
            batch.group_ids,
            lag,
            edges,
            weight=weight,
            clamp=clamp,
        ),
    }
    if advantages is not None:
        c = np.exp(np.clip(log_ratio, -clamp, clamp))  # [B, T]
        out["zero_centred"] = zero_centred_contributions(advantages, c, valid)
    return out
