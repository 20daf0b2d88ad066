"""Aggregation weights `Agg_it` of RLAX Eq. 3: how per-token terms are averaged into one number.

    sequence_mean   Agg_it = 1 / (N n_i)        GRPO, GSPO (RLAX: 1/(G |o_i|) per group)
    token_mean      Agg_it = 1 / sum_j n_j      DAPO, CISPO, PPO, REINFORCE++
    max_length      Agg_it = 1 / (N L_max)      Dr. GRPO, token-level REINFORCE, RLOO
    last_token      Agg_it = 1[t = last_i] / N  sequence-level REINFORCE (RLAX App. A)

Each part is called ONCE in phase 1 on the whole train batch, so the normalisers N, sum_j n_j and
L_max are those of the batch, never of a micro-batch: splitting a batch into micro-batches does not
change the gradient. The weights are 0 off the counted mask (after rejection), and rejection
shrinks the denominators: a rejected token or sequence is as if it had never been sampled.

N counts the rows with at least one counted token (padding rows and fully rejected rows are not
sequences). Simplification: with `max_length=None`, L_max is the longest completion in the batch
rather than the generation budget; pass the budget to match Dr. GRPO exactly.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from minirl.losses.inputs import last_token_mask


def num_sequences(mask: jax.Array) -> jax.Array:
    """N: rows with at least one counted token (at least 1, so it can divide)."""
    return jnp.maximum((mask.sum(axis=-1) > 0).sum(), 1).astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class SequenceMean:
    """Agg_it = m_it / (N n_i): every sequence weighs the same, whatever its length."""

    def __call__(self, mask: jax.Array, valid: jax.Array) -> jax.Array:  # [B, T]
        n = jnp.maximum(mask.sum(axis=-1, keepdims=True), 1.0)  # [B, 1]
        return mask / (num_sequences(mask) * n)


@dataclasses.dataclass(frozen=True)
class TokenMean:
    """Agg_it = m_it / sum_j n_j: every token weighs the same (DAPO's token-level loss)."""

    def __call__(self, mask: jax.Array, valid: jax.Array) -> jax.Array:  # [B, T]
        return mask / jnp.maximum(mask.sum(), 1.0)


@dataclasses.dataclass(frozen=True)
class MaxLength:
    """Agg_it = m_it / (N L_max): a constant per token, so no length bias (Dr. GRPO).

    `max_length`: the generation budget L_max; None = the longest completion in the batch."""

    max_length: int | None = None

    def __post_init__(self):
        if self.max_length is not None and self.max_length < 1:
            raise ValueError(f"MaxLength.max_length must be >= 1 or None, got {self.max_length}")

    def __call__(self, mask: jax.Array, valid: jax.Array) -> jax.Array:  # [B, T]
        if self.max_length is None:
            l_max = jnp.maximum(valid.sum(axis=-1).max(), 1.0)
        else:
            l_max = float(self.max_length)
        return mask / (num_sequences(mask) * l_max)


@dataclasses.dataclass(frozen=True)
class LastToken:
    """Agg_it = 1[t = last_i] / N: one weight per sequence, on its last counted token. Pairs with
    a sequence-level gradient term that puts the whole sequence's log-prob there."""

    def __call__(self, mask: jax.Array, valid: jax.Array) -> jax.Array:  # [B, T]
        return last_token_mask(mask) / num_sequences(mask)


Aggregation = SequenceMean | TokenMean | MaxLength | LastToken
