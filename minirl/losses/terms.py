"""Gradient terms `G1_it` of RLAX Eq. 3: the only place the policy gradient comes from.

    clipped_ratio(eps_lo, eps_hi, dual_c)  M_it r_it       PPO, GRPO, DAPO, Dr. GRPO, REINFORCE++
    clipped_ratio(..., centre="behaviour") M(c r)_it r_it  naive PPO on stale data (AReaL Eq. 2)
    logprob                                log pi_theta_it  REINFORCE, RLOO, CISPO
    sequence_logprob                       1[t = last_i] sum_t' m log pi_theta_it'   REINFORCE
    gspo_clipped(eps_lo, eps_hi)           M_i log pi_theta_it                       GSPO

The objective multiplies G1 by sg[Agg IS] sg[Adv]. `M` is the clip mask of RLAX (MiniMax-M1
Eq. 7): it is 0 where PPO's `min(r A, clip(r) A)` takes the clipped (constant) branch, so
`sg[A] M r` has exactly PPO's gradient, and a clipped token contributes NO gradient: PPO-style
clipping is a gradient mask. The mask is a function of r and A only, computed under
`stop_gradient` (it is piecewise constant anyway). The dual clip (Ye et al. 2020) also masks
tokens with A < 0 and r > dual_c, where PPO's max(..., dual_c A) takes its constant branch.

Ties are measure-zero: the mask uses strict inequalities, so r = 1 + eps_hi counts as inside.

WHERE THE CLIP IS CENTRED. By default the mask tests r = pi_theta / pi_prox, the trainer's own
recompute (AReaL's "proximal" policy): the trust region is centred on the weights the step starts
from. `centre="behaviour"` tests c r = pi_theta / mu instead, the ratio against the policy that
SAMPLED the tokens, as standard PPO does when it takes pi_old = mu. With IS = c this gives
sg[c] M(c r) r, whose gradient is (pi_theta / mu) M A grad log pi_theta: exactly the gradient of
min(u A, clip(u) A) with u = pi_theta / mu (AReaL Eq. 2). On stale data c is far from 1 before
the step begins, so many tokens start outside the trust region: AReaL's "improper clipping centre".
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from minirl.losses.inputs import Context, last_token_mask


def clip_mask(ratio, adv, eps_lo: float, eps_hi: float, dual_clip: float | None = None):
    """M = 0 if (A > 0 and r > 1 + eps_hi) or (A < 0 and r < 1 - eps_lo) [or (A < 0 and r >
    dual_clip)], else 1. Broadcasts; float result."""
    off = ((adv > 0) & (ratio > 1.0 + eps_hi)) | ((adv < 0) & (ratio < 1.0 - eps_lo))
    if dual_clip is not None:
        off = off | ((adv < 0) & (ratio > dual_clip))
    return 1.0 - off.astype(jnp.float32)


def _check_eps(eps_lo: float, eps_hi: float) -> None:
    if not (0.0 <= eps_lo <= 1.0) or eps_hi < 0.0:
        raise ValueError(
            f"need 0 <= eps_lo <= 1 and eps_hi >= 0, got eps_lo={eps_lo}, eps_hi={eps_hi}"
        )


CENTRES = ("proximal", "behaviour")


@dataclasses.dataclass(frozen=True)
class ClippedRatio:
    """G1_it = M_it r_it: PPO's clipped surrogate as a masked ratio (optionally dual-clipped).
    `centre`: the policy the clip is centred on, "proximal" (r) or "behaviour" (c r; module doc)."""

    eps_lo: float = 0.2
    eps_hi: float = 0.2
    dual_clip: float | None = None
    centre: str = "proximal"

    def __post_init__(self):
        _check_eps(self.eps_lo, self.eps_hi)
        if self.dual_clip is not None and self.dual_clip <= 1.0 + self.eps_hi:
            raise ValueError(
                f"dual_clip must exceed 1 + eps_hi = {1 + self.eps_hi}, got {self.dual_clip}"
            )
        if self.centre not in CENTRES:
            raise ValueError(f"centre must be one of {CENTRES}, got {self.centre!r}")

    def mask(self, ctx: Context) -> jax.Array:  # [b, T]
        ratio = ctx.ratio  # pi_theta / pi_prox
        if self.centre == "behaviour":  # pi_theta / mu = c r, clamped before exp like every ratio
            ratio = jnp.exp(jnp.clip(ctx.log_ratio + ctx.log_c, -ctx.clamp, ctx.clamp))
        ratio = jax.lax.stop_gradient(ratio)
        return clip_mask(ratio, ctx.adv, self.eps_lo, self.eps_hi, self.dual_clip)

    def __call__(self, ctx: Context) -> jax.Array:  # [b, T]
        return self.mask(ctx) * ctx.ratio

    def clipped(self, ctx: Context) -> jax.Array:  # [b, T] bool
        return self.mask(ctx) == 0


@dataclasses.dataclass(frozen=True)
class LogProb:
    """G1_it = log pi_theta_it: the score-function (REINFORCE) gradient."""

    def __call__(self, ctx: Context) -> jax.Array:  # [b, T]
        return ctx.logp


@dataclasses.dataclass(frozen=True)
class SequenceLogProb:
    """G1_it = 1[t = last_i] sum_t' m_it' log pi_theta_it': the whole sequence's log-prob, placed
    on its last token (pairs with the `last_token` aggregation, RLAX App. A)."""

    def __call__(self, ctx: Context) -> jax.Array:  # [b, T]
        return last_token_mask(ctx.mask) * ctx.row_sum(ctx.logp)[:, None]


@dataclasses.dataclass(frozen=True)
class GSPOClipped:
    """G1_it = M_i log pi_theta_it, M_i the clip mask of the sequence ratio s_i against A_i.

    With IS = s_i and Agg = 1/(N n_i) this is the gradient of GSPO's
    (1/N) sum_i min(s_i A_i, clip(s_i, 1 - eps_lo, 1 + eps_hi) A_i), since
    grad s_i = s_i (1/n_i) sum_t grad log pi_theta_it. A_i is the row's mean advantage."""

    eps_lo: float = 3e-4
    eps_hi: float = 4e-4

    def __post_init__(self):
        _check_eps(self.eps_lo, self.eps_hi)

    def mask(self, ctx: Context) -> jax.Array:  # [b, 1]
        s = jnp.exp(jax.lax.stop_gradient(ctx.row_mean(ctx.log_ratio)))  # [b]
        return clip_mask(s, ctx.row_mean(ctx.adv), self.eps_lo, self.eps_hi)[:, None]

    def __call__(self, ctx: Context) -> jax.Array:  # [b, T]
        return self.mask(ctx) * ctx.logp

    def clipped(self, ctx: Context) -> jax.Array:  # [b, T] bool
        return jnp.broadcast_to(self.mask(ctx) == 0, ctx.logp.shape)


GradientTerm = ClippedRatio | LogProb | SequenceLogProb | GSPOClipped
