"""Importance weights `IS_it` of RLAX Eq. 3: re-weight a sampled token for a distribution shift.

    (none)                          1                           GRPO, DAPO, Dr. GRPO, PPO
    token_ratio                     r_it                        token-level REINFORCE, RLOO
    sequence_ratio                  exp(sum_t m_it l_it)        sequence-level REINFORCE
    clipped_ratio(eps_lo, eps_hi)   clip(r_it, 1-eps_lo, 1+eps_hi)   CISPO (MiniMax-M1 Eq. 4)
    geometric_sequence_ratio        s_i = exp(sum_t m_it l_it / n_i) GSPO
    correction                      c_it = pi_prox / mu         decoupled PPO (AReaL Eq. 5)
    correction(cap)                 c_it 1[c_it <= cap]         decoupled PPO as AReaL runs it
    truncated_correction(C_tis)     min(c_it, C_tis)            TIS (Yao et al.; VeXact Eq. 6)

An objective holds a tuple of these; IS is their product (the empty tuple is IS = 1). RLAX
requires that IS never contributes a gradient: the objective wraps the product in
`stop_gradient`, so the parts here are plain functions of a `Context`. A part that clips also
says which tokens it clipped (`clipped`), for the clip-fraction metric.

Every exp here is of a log-ratio already clamped to [-C, C]; the sequence sum is clamped again
before its exp (a sum of T clamped terms could still overflow).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from minirl.losses.inputs import Context


@dataclasses.dataclass(frozen=True)
class TokenRatio:
    """IS_it = r_it = pi_theta / pi_prox (RLAX App. A, token-level REINFORCE)."""

    def __call__(self, ctx: Context) -> jax.Array:  # [b, T]
        return ctx.ratio


@dataclasses.dataclass(frozen=True)
class SequenceRatio:
    """IS_i = prod_t r_it = exp(clamp(sum_t m_it l_it, -C, C)) (RLAX Eq. 6)."""

    def __call__(self, ctx: Context) -> jax.Array:  # [b, T]
        total = jnp.clip(ctx.row_sum(ctx.log_ratio), -ctx.clamp, ctx.clamp)  # [b]
        return jnp.broadcast_to(jnp.exp(total)[:, None], ctx.ratio.shape)


@dataclasses.dataclass(frozen=True)
class ClippedTokenRatio:
    """IS_it = clip(r_it, 1 - eps_lo, 1 + eps_hi) (CISPO). The clipped weight still multiplies a
    log-prob gradient: the clip is a regulariser, not a mask (RLAX §4.1). eps_lo = 1: no floor."""

    eps_lo: float = 1.0
    eps_hi: float = 0.28

    def __post_init__(self):
        if not (0.0 <= self.eps_lo <= 1.0) or self.eps_hi < 0.0:
            raise ValueError(
                f"need 0 <= eps_lo <= 1 and eps_hi >= 0, got {self.eps_lo}, {self.eps_hi}"
            )

    def __call__(self, ctx: Context) -> jax.Array:  # [b, T]
        return jnp.clip(ctx.ratio, 1.0 - self.eps_lo, 1.0 + self.eps_hi)

    def clipped(self, ctx: Context) -> jax.Array:  # [b, T] bool
        return (ctx.ratio < 1.0 - self.eps_lo) | (ctx.ratio > 1.0 + self.eps_hi)


@dataclasses.dataclass(frozen=True)
class GeometricSequenceRatio:
    """IS_i = s_i = exp(sum_t m_it l_it / n_i): the length-normalised sequence ratio of GSPO."""

    def __call__(self, ctx: Context) -> jax.Array:  # [b, T]
        return jnp.broadcast_to(jnp.exp(ctx.row_mean(ctx.log_ratio))[:, None], ctx.ratio.shape)


@dataclasses.dataclass(frozen=True)
class Correction:
    """IS_it = c_it = pi_prox / mu: behaviour-to-proximal correction of decoupled PPO (AReaL).

    With a `cap`, a token whose c_it exceeds it is DROPPED (IS_it = 0) while the denominators
    still count it: what AReaL's released trainer does with its behaviour-weight bound
    (`rejection_sampling: {level: token, action: mask, metric: ratio, upper: 5.0}` in its example
    configs, formerly `behave_imp_weight_cap=5.0` with mode `token_mask`; the loss keeps the
    token count from before the mask, areal/utils/functional/functional.py, `ppo_actor_loss_fn`).
    On stale data the uncapped c of Eq. 5 can reach hundreds on a few tokens (lesson 07); the cap
    stops those tokens from steering the step. `cap=None` is the paper's uncapped form. The
    share of dropped tokens is the loss metric `is_weight_zero_fraction`."""

    cap: float | None = None

    def __post_init__(self):
        if self.cap is not None and not self.cap >= 1.0:
            raise ValueError(f"Correction.cap must be >= 1 (or None: uncapped), got {self.cap}")

    def __call__(self, ctx: Context) -> jax.Array:  # [b, T]
        c = jnp.exp(ctx.log_c)
        return c if self.cap is None else jnp.where(c <= self.cap, c, 0.0)


@dataclasses.dataclass(frozen=True)
class TruncatedCorrection:
    """IS_it = min(c_it, cap): truncated importance sampling (TIS), default cap 2."""

    cap: float = 2.0

    def __post_init__(self):
        if self.cap <= 0.0:
            raise ValueError(f"TruncatedCorrection.cap must be > 0, got {self.cap}")

    def __call__(self, ctx: Context) -> jax.Array:  # [b, T]
        return jnp.minimum(jnp.exp(ctx.log_c), self.cap)

    def clipped(self, ctx: Context) -> jax.Array:  # [b, T] bool
        return jnp.exp(ctx.log_c) > self.cap


ImportanceWeight = (
    TokenRatio
    | SequenceRatio
    | ClippedTokenRatio
    | GeometricSequenceRatio
    | Correction
    | TruncatedCorrection
)
