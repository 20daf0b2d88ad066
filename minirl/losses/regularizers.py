"""Regularisers `G2_it` of RLAX Eq. 3: gradient terms not steered by the advantage.

    k1_kl(beta)    -beta log(pi_theta / pi_ref)            = beta log rho
    k2_kl(beta)    -beta (log rho)^2 / 2                   REINFORCE++
    k3_kl(beta)    -beta (rho - log rho - 1)               GRPO (DeepSeekMath Eq. 4)
    entropy(coef)  coef H_it                               optional exploration bonus

with rho = pi_ref / pi_theta. The k_i are Schulman's estimators of KL(pi_theta || pi_ref) from
tokens sampled by (approximately) pi_theta; J is maximised, so the penalties enter with a minus.
They sit inside Eq. 3's sg[Agg IS] (...) like G1: aggregated the same way and, when a preset has
an importance weight, weighted by it too (GRPO's per-sequence mean of `surrogate - beta KL`).

`log rho` is clamped to [-C, C] before any exp. The objective sums its regularisers; a KL part
declares `needs_ref` (the trainer must supply `ref_logp`), the entropy part `needs_entropy` (the
trainer must pass per-token entropies, computed from the same logits as `logp`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from minirl.losses.inputs import Context, clamped_difference


def log_rho(ctx: Context) -> jax.Array:
    """clamp(log pi_ref - log pi_theta, -C, C)  # [b, T] (0 off the mask: both inputs are 0 there)"""
    if ctx.ref_logp is None:
        raise ValueError(
            "a KL regulariser needs LossInputs.ref_logp (the reference policy's log-probs)"
        )
    return clamped_difference(ctx.ref_logp, ctx.logp, ctx.clamp)


@dataclasses.dataclass(frozen=True)
class KL:
    """What the three KL penalties share: a coefficient beta >= 0, and pi_ref's log-probs."""

    beta: float
    needs_ref: ClassVar[bool] = True

    def __post_init__(self):
        if self.beta < 0.0:
            raise ValueError(f"KL coefficient beta must be >= 0, got {self.beta}")


@dataclasses.dataclass(frozen=True)
class K1KL(KL):
    """G2 = -beta k1, k1 = log(pi_theta / pi_ref) = -log rho."""

    beta: float = 0.04

    def __call__(self, ctx: Context) -> jax.Array:  # [b, T]
        return self.beta * log_rho(ctx)


@dataclasses.dataclass(frozen=True)
class K2KL(KL):
    """G2 = -beta k2, k2 = (log rho)^2 / 2."""

    beta: float = 1e-3

    def __call__(self, ctx: Context) -> jax.Array:  # [b, T]
        return -self.beta * 0.5 * log_rho(ctx) ** 2


@dataclasses.dataclass(frozen=True)
class K3KL(KL):
    """G2 = -beta k3, k3 = rho - log rho - 1 >= 0 (unbiased, always non-negative)."""

    beta: float = 0.04

    def __call__(self, ctx: Context) -> jax.Array:  # [b, T]
        lr = log_rho(ctx)
        return -self.beta * (jnp.exp(lr) - lr - 1.0)


@dataclasses.dataclass(frozen=True)
class Entropy:
    """G2 = coef H_it: an entropy bonus on the per-token entropy the trainer computes."""

    coef: float = 1e-3
    needs_entropy: ClassVar[bool] = True

    def __call__(self, ctx: Context) -> jax.Array:  # [b, T]
        if ctx.entropy is None:
            raise ValueError("the Entropy regulariser needs `entropy` passed to Objective.loss")
        return self.coef * ctx.entropy


Regularizer = K1KL | K2KL | K3KL | Entropy
