"""What every loss reports (docs/losses.md), in a form that survives micro-batching.

Phase 2 (`Objective.loss`) returns, per micro-batch, a flat dict of scalar SUMS, COUNTS and MAXES
(`slice_metrics`). Merge any number of them with `merge_metrics` (sum, or max for keys ending in
`_max`) — the result equals what one full-batch call would have returned, up to float summation
order — and turn the merged dict into reported numbers with `finalize_metrics`. Everything is
plain jnp, so merging and finalising can run inside `jit` as well as on the host.

Every metric `finalize_metrics` reports, with its meaning: docs/losses.md, "What the metrics mean".

Percentiles are not summable: `batch_statistics(logp, prepared, clamp)` gives the exact p95 of r and
c over the rows it is given, so call it on the full batch (docs/losses.md, "The two-phase API").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp

from minirl.losses.inputs import Context, Prepared, clamped_difference, masked


def _sum(x, mask):
    return masked(x, mask).sum()


def _max(x, mask):  # the quantities maxed here are >= 0, so 0 is the identity
    return masked(x, mask).max(initial=0.0)


def slice_metrics(
    ctx: Context,
    prepared: Prepared,
    is_weight: jax.Array,
    clipped: jax.Array,
    policy_loss: jax.Array,
    entropy: jax.Array | None,
) -> dict[str, jax.Array]:
    """Sums, counts and maxes of one micro-batch (see the module docstring)."""
    sg = jax.lax.stop_gradient
    valid, mask = prepared.valid, prepared.mask
    log_r, r = sg(ctx.log_ratio), sg(ctx.ratio)
    log_c = prepared.log_c
    c = jnp.exp(log_c)
    a = prepared.adv
    zc = a * (c - 1.0)
    out = {
        "loss": sg(policy_loss),
        "tokens": valid.sum(),
        "counted_tokens": mask.sum(),
        "sequences": (valid.sum(axis=-1) > 0).sum().astype(jnp.float32),
        "rejected_sequences": prepared.seq_rejected.sum(),
        "clipped_tokens": _sum(clipped.astype(jnp.float32), mask),
        "ratio_sum": _sum(r, valid),
        "ratio_max": _max(r, valid),
        "correction_sum": _sum(c, valid),
        "correction_max": _max(c, valid),
        "kl_prox_k1_sum": _sum(-log_r, valid),
        "kl_prox_k3_sum": _sum(r - 1.0 - log_r, valid),
        "kl_behav_k1_sum": _sum(-log_c, valid),
        "kl_behav_k3_sum": _sum(c - 1.0 - log_c, valid),
        "is_weight_sum": _sum(sg(is_weight), mask),
        "is_weight_max": _max(sg(is_weight), mask),
        "is_weight_sq_sum": _sum(sg(is_weight) ** 2, mask),
        "is_weight_zero": _sum((sg(is_weight) == 0.0).astype(jnp.float32), mask),
        "zero_centred_pos": _sum(zc, mask * (a > 0)),
        "zero_centred_neg": _sum(zc, mask * (a < 0)),
    }
    if entropy is not None:
        out["entropy_sum"] = _sum(sg(entropy), mask)
    if prepared.teacher_kl is not None:
        out["teacher_kl_sum"] = _sum(prepared.teacher_kl, valid)
        out["teacher_logp_sum"] = _sum(prepared.teacher_logp, valid)
    return out


def merge_metrics(*parts: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Combine micro-batch metrics: sum, or max for `*_max` keys. Accepts dicts or one list."""
    if len(parts) == 1 and isinstance(parts[0], Sequence):
        parts = tuple(parts[0])
    if not parts:
        raise ValueError("merge_metrics needs at least one metrics dict")
    keys = parts[0].keys()
    for p in parts[1:]:
        if p.keys() != keys:
            raise ValueError(f"metrics dicts differ in keys: {sorted(keys)} vs {sorted(p.keys())}")
    out = {}
    for k in keys:
        vals = jnp.stack([jnp.asarray(p[k], jnp.float32) for p in parts])
        out[k] = vals.max() if k.endswith("_max") else vals.sum()
    return out


def finalize_metrics(merged) -> dict[str, jax.Array]:
    """Reported numbers from merged sums (a dict from `merge_metrics`, one slice's dict, or a list
    of slice dicts, which is merged first)."""
    m = merge_metrics(merged) if isinstance(merged, Sequence) else merged
    tokens = jnp.maximum(m["tokens"], 1.0)
    counted = jnp.maximum(m["counted_tokens"], 1.0)
    out = {
        "loss": m["loss"],
        "clip_fraction": m["clipped_tokens"] / counted,
        "ratio_mean": m["ratio_sum"] / tokens,
        "ratio_max": m["ratio_max"],
        "correction_mean": m["correction_sum"] / tokens,
        "correction_max": m["correction_max"],
        "kl_prox_k1": m["kl_prox_k1_sum"] / tokens,
        "kl_prox_k3": m["kl_prox_k3_sum"] / tokens,
        "kl_behav_k1": m["kl_behav_k1_sum"] / tokens,
        "kl_behav_k3": m["kl_behav_k3_sum"] / tokens,
        "rejected_token_fraction": 1.0 - m["counted_tokens"] / tokens,
        "rejected_sequence_fraction": m["rejected_sequences"] / jnp.maximum(m["sequences"], 1.0),
        "is_weight_mean": m["is_weight_sum"] / counted,
        "is_weight_max": m["is_weight_max"],
        "is_weight_zero_fraction": m["is_weight_zero"] / counted,
        "is_weight_ess": m["is_weight_sum"] ** 2
        / jnp.maximum(counted * m["is_weight_sq_sum"], jnp.finfo(jnp.float32).tiny),
        "zero_centred_pos": m["zero_centred_pos"],
        "zero_centred_neg": m["zero_centred_neg"],
        "tokens": m["tokens"],
        "sequences": m["sequences"],
    }
    if "entropy_sum" in m:
        out["entropy"] = m["entropy_sum"] / counted
    if "teacher_kl_sum" in m:  # on-policy distillation (minirl/losses/distill.py)
        out["distill/reverse_kl"] = m["teacher_kl_sum"] / tokens
        out["distill/teacher_logp"] = m["teacher_logp_sum"] / tokens
    if "router_aux" in m:  # MoE: the load-balancing loss, micro-batches weighted by tokens
        out["router_aux"] = m["router_aux"]
    return out


def _p95(x, valid):
    q = jnp.nanquantile(jnp.where(valid > 0, x, jnp.nan), 0.95)
    return jnp.where(valid.sum() > 0, q, 0.0)


def batch_statistics(logp: jax.Array, prepared: Prepared, clamp: float) -> dict[str, jax.Array]:
    """Exact p95 of r and c over the completion tokens of the given rows (linear interpolation,
    as numpy's default). Not summable: call on the full batch."""
    valid = prepared.valid
    log_r = clamped_difference(masked(logp, valid), prepared.prox_logp, clamp)
    return {
        "ratio_p95": _p95(jnp.exp(jax.lax.stop_gradient(log_r)), valid),
        "correction_p95": _p95(jnp.exp(prepared.log_c), valid),
    }
