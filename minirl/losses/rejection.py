"""Rejection: drop tokens or whole sequences whose behaviour log-probs are not trusted.

The signal is the correction ratio c_it = pi_prox / mu (trainer recompute vs rollout engine):
staleness plus training–inference mismatch (TIM). VeXact §4.2 (Eq. 7, App. A.4) rejects at two
granularities, and found token filtering followed by sequence rejection closest to a zero-mismatch
run:

    token_reject(lo, hi)        keep tokens with lo <= c_it <= hi       (masked IS, IcePop-style)
    sequence_reject(stat, U)    keep sequences with stat_i <= U, stat one of
        mean_k1   |sum_t m log c_it| / n_i     (log of the geometric-mean ratio)
        sum_k1    |sum_t m log c_it|
        max_k3    max_t k3(c_it),  k3 = c - 1 - log c >= 0

Both depend only on pi_prox and mu, known before the update, so they run in phase 1 on the whole
batch and become part of the mask `m` BEFORE aggregation: the denominators (N, n_i, sum n) see
them, as if the rejected tokens had never been sampled. The sequence statistic is computed over
the tokens the token rule kept (token first, then sequence, as in VeXact's joint variant).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

SEQUENCE_STATS = ("mean_k1", "sum_k1", "max_k3")


@dataclasses.dataclass(frozen=True)
class TokenReject:
    """Keep tokens with lo <= c_it <= hi."""

    lo: float = 0.5
    hi: float = 5.0

    def __post_init__(self):
        if not (0.0 <= self.lo < 1.0 < self.hi):
            raise ValueError(f"TokenReject needs 0 <= lo < 1 < hi, got lo={self.lo}, hi={self.hi}")

    def keep(self, log_c: jax.Array, mask: jax.Array) -> jax.Array:  # [B, T] float
        c = jnp.exp(log_c)
        return mask * ((c >= self.lo) & (c <= self.hi))


@dataclasses.dataclass(frozen=True)
class SequenceReject:
    """Keep sequences whose statistic `stat` of log c is at most `threshold`."""

    stat: str = "mean_k1"
    threshold: float = 0.01

    def __post_init__(self):
        if self.stat not in SEQUENCE_STATS:
            raise ValueError(
                f"SequenceReject.stat must be one of {SEQUENCE_STATS}, got {self.stat!r}"
            )
        if self.threshold < 0.0:
            raise ValueError(f"SequenceReject.threshold must be >= 0, got {self.threshold}")

    def statistic(self, log_c: jax.Array, mask: jax.Array) -> jax.Array:  # [B]
        on = mask > 0
        total = jnp.where(on, log_c, 0.0).sum(axis=-1)
        if self.stat == "mean_k1":
            return jnp.abs(total) / jnp.maximum(mask.sum(axis=-1), 1.0)
        if self.stat == "sum_k1":
            return jnp.abs(total)
        k3 = jnp.exp(log_c) - 1.0 - log_c
        return jnp.where(on, k3, 0.0).max(axis=-1)

    def keep(self, log_c: jax.Array, mask: jax.Array) -> jax.Array:  # [B] bool
        return self.statistic(log_c, mask) <= self.threshold


def apply_rejection(
    token: TokenReject | None, sequence: SequenceReject | None, log_c: jax.Array, valid: jax.Array
):
    """Token rule, then sequence rule. Returns (mask [B, T] of kept tokens, seq_rejected [B] as
    1.0 where the sequence rule dropped a row that still had tokens)."""
    mask = valid if token is None else token.keep(log_c, valid)
    if sequence is None:
        return mask, jnp.zeros(valid.shape[0], jnp.float32)
    keep = sequence.keep(log_c, mask)  # [B]
    has_tokens = mask.sum(axis=-1) > 0
    return mask * keep[:, None], (has_tokens & ~keep).astype(jnp.float32)
