"""Advantage estimators `Adv_it` of RLAX Eq. 3, computed once per train batch, from all of it.

    group_norm(eps)   (R_i - mean_g) / (std_g + eps), std with Bessel's correction   GRPO
    group_mean        R_i - mean_g                                                   Dr. GRPO
    leave_one_out     R_i - mean_{j != i in g} R_j                                   RLOO
    batch_whiten      group_mean, then whitened over the counted tokens of the batch REINFORCE++
    gae(gamma, lam)   generalised advantage estimation from token rewards, V = 0    PPO

Group rules, whitening over counted tokens, rejection, non-finite rewards: docs/losses.md ("Where
the code deliberately differs from the papers"). Groups are contiguous runs of equal `group_ids`,
renumbered 0.. by a cumsum (jittable). Each estimator is called as `(inputs, valid, counted)` and
returns adv [B, T], zeroed off the completion mask. No critic: GAE runs with V = 0.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from minirl.losses.inputs import LossInputs, last_token_mask, masked

WHITEN_EPS = 1e-6


class GroupStats(NamedTuple):
    """Per-row statistics of the row's group.  All [B]."""

    size: jax.Array  # G, members of the group
    mean: jax.Array  # mean_g R
    std: jax.Array  # std_g R with Bessel's correction (0 for a singleton)
    informative: jax.Array  # bool: G > 1 and the rewards are not all equal


def group_statistics(rewards: jax.Array, group_ids: jax.Array) -> GroupStats:
    """Group size, mean, Bessel std and whether the group carries any signal, per row."""
    b = rewards.shape[0]
    starts = jnp.concatenate(
        [jnp.zeros((1,), jnp.int32), (group_ids[1:] != group_ids[:-1]).astype(jnp.int32)]
    )
    seg = jnp.cumsum(starts)  # [B] dense group index 0..
    gsum = lambda x: jax.ops.segment_sum(x, seg, num_segments=b)[seg]
    size = gsum(jnp.ones_like(rewards))
    mean = gsum(rewards) / size
    var = gsum((rewards - mean) ** 2) / jnp.maximum(size - 1.0, 1.0)
    spread = (
        jax.ops.segment_max(rewards, seg, num_segments=b)[seg]
        - jax.ops.segment_min(rewards, seg, num_segments=b)[seg]
    )
    return GroupStats(size, mean, jnp.sqrt(var), (size > 1) & ~(spread == 0))  # nan stays nan


def whiten(adv: jax.Array, valid: jax.Array, counted: jax.Array | None = None) -> jax.Array:
    """(A - mean) / (std + eps), mean and population std over the `counted` tokens (default: all
    of `valid`), applied to every `valid` token.  # [B, T]

    Counted advantages with no spread (all equal, or none counted) whiten to exactly 0, not to a
    rounding residue divided by eps (the group rule's reasoning, for the batch)."""
    counted = valid if counted is None else counted
    on = counted > 0
    count = jnp.maximum(counted.sum(), 1.0)
    mean = masked(adv, counted).sum() / count
    var = masked((adv - mean) ** 2, counted).sum() / count
    spread = jnp.where(on, adv, -jnp.inf).max() - jnp.where(on, adv, jnp.inf).min()
    flat = (spread == 0) | ~on.any()  # a nan advantage is not flat: it stays nan
    white = jnp.where(flat, 0.0, (adv - mean) / (jnp.sqrt(var) + WHITEN_EPS))
    return masked(white, valid)


def _per_token(adv_i: jax.Array, valid: jax.Array, counted: jax.Array | None, whiten_: bool):
    adv = masked(jnp.broadcast_to(adv_i[:, None], valid.shape), valid)
    return whiten(adv, valid, counted) if whiten_ else adv


@dataclasses.dataclass(frozen=True)
class GroupNorm:
    """(R_i - mean_g) / (std_g + eps), Bessel std; 0 for singleton or zero-spread groups."""

    eps: float = 1e-6
    whiten: bool = False

    def __post_init__(self):
        if self.eps <= 0.0:
            raise ValueError(f"GroupNorm.eps must be > 0, got {self.eps}")

    def __call__(self, inputs: LossInputs, valid: jax.Array, counted: jax.Array | None = None):
        g = group_statistics(inputs.rewards, inputs.group_ids)
        adv = jnp.where(g.informative, (inputs.rewards - g.mean) / (g.std + self.eps), 0.0)
        return _per_token(adv, valid, counted, self.whiten)


@dataclasses.dataclass(frozen=True)
class GroupMean:
    """R_i - mean_g (Dr. GRPO; REINFORCE with the group mean as baseline)."""

    whiten: bool = False

    def __call__(self, inputs: LossInputs, valid: jax.Array, counted: jax.Array | None = None):
        g = group_statistics(inputs.rewards, inputs.group_ids)
        adv = jnp.where(g.informative, inputs.rewards - g.mean, 0.0)
        return _per_token(adv, valid, counted, self.whiten)


@dataclasses.dataclass(frozen=True)
class LeaveOneOut:
    """R_i - mean of the OTHER members of the group = G/(G-1) (R_i - mean_g) (RLOO)."""

    whiten: bool = False

    def __call__(self, inputs: LossInputs, valid: jax.Array, counted: jax.Array | None = None):
        g = group_statistics(inputs.rewards, inputs.group_ids)
        others = (g.size * g.mean - inputs.rewards) / jnp.maximum(g.size - 1.0, 1.0)
        adv = jnp.where(g.informative, inputs.rewards - others, 0.0)
        return _per_token(adv, valid, counted, self.whiten)


def batch_whiten() -> GroupMean:
    """REINFORCE++-baseline: group mean subtracted, then whitened over the batch's tokens."""
    return GroupMean(whiten=True)


def gae(token_rewards, valid, gamma: float, lam: float):
    """Generalised advantage estimation (Schulman et al. 2016) along the completion tokens, with
    V = 0: delta_t = r_t, so A_t = r_t + gamma lam A_next, where "next" is the next completion
    token (A_next = 0 after the last one). Positions off the mask are skipped (the recursion
    passes through them), so prompt and padding positions cost nothing. -> adv [B, T], 0 off
    the mask."""
    r = masked(token_rewards, valid)

    def step(next_a, x):
        r_t, m_t = x  # [B] each
        a_t = r_t + gamma * lam * next_a
        keep = m_t > 0
        return jnp.where(keep, a_t, next_a), jnp.where(keep, a_t, 0.0)

    zeros = jnp.zeros(valid.shape[0], jnp.float32)
    _, adv_tb = jax.lax.scan(step, zeros, (r.T, valid.T), reverse=True)
    return adv_tb.T  # [B, T]


@dataclasses.dataclass(frozen=True)
class GAE:
    """GAE(gamma, lam) from `token_rewards` (default: R_i on the last token), V = 0."""

    gamma: float = 1.0
    lam: float = 1.0
    whiten: bool = False

    def __post_init__(self):
        if not (0.0 <= self.gamma <= 1.0 and 0.0 <= self.lam <= 1.0):
            raise ValueError(f"GAE needs gamma, lam in [0, 1], got {self.gamma}, {self.lam}")

    def __call__(self, inputs: LossInputs, valid: jax.Array, counted: jax.Array | None = None):
        if inputs.token_rewards is not None:
            token_rewards = inputs.token_rewards
        else:
            token_rewards = last_token_mask(valid) * inputs.rewards[:, None]
        adv = gae(token_rewards, valid, self.gamma, self.lam)
        return whiten(adv, valid, counted) if self.whiten else adv


Advantage = GroupNorm | GroupMean | LeaveOneOut | GAE
