"""Token sampling for the rollout engine: temperature, top-k, top-p, counter-based keys.

What it is: the maths between the model's logits and the next token.

  z = logits / temperature                      (the tempered distribution)
  z = top_k(z), then top_p(z)                   (truncation: other tokens get logit NEG)
  token ~ softmax(z)                            (Gumbel-max with a per-token key)
  log mu(token) = log softmax(z)[token]         (the behaviour log-prob; model.token_logprobs)

The behaviour log-prob is the log-prob under the TRUNCATED, renormalised distribution — the one
the token was really drawn from. `minirl.modeling.model.token_logprobs(..., top_k=, top_p=)` applies the
same truncation (it calls `truncate_logits` below), so the trainer recomputes the same quantity
for its policy: `log pi(token) = log softmax(truncate(logits_pi / T))[token]`. A token outside
pi's own truncated set gets a log-prob of about -1e30 (finite, never nan); the losses clamp the
log-ratio before `exp`. See docs/engine.md for why this choice and not "untruncated log-probs".

Determinism (docs/design.md, "Rules every part keeps"): the key of token c of sample s of prompt u is
`fold_in(fold_in(fold_in(fold_in(key(seed), u_hi), u_lo), s), c)` — a pure function of ids, so
the token does not depend on the slot, the batch, or what else is running. In exact mode the
logits are batch-invariant too, so the whole rollout is.

Simplified on purpose: ties at the top-k / top-p threshold are all kept (a few more than k
tokens when logits tie exactly); greedy (temperature 0) is a plain argmax.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from minirl.modeling import exact as exact_ops

NEG = exact_ops.NEG  # logit given to truncated tokens: finite, so nothing becomes nan


class Sampling(NamedTuple):
    """How tokens are drawn and scored — one spec for the engine, the trainer, the replay.

    The engine samples with it; every log-prob (the engine's log mu, the trainer's log pi) is
    taken under `.scoring`, the same spec except that greedy decoding (temperature 0) reports
    the untempered model's log-probs. Hashable: compiled functions are specialised on it."""

    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    exact: bool = (
        False  # fixed-order reductions (minirl/modeling/exact.py): batch-invariant results
    )

    @property
    def scoring(self) -> Sampling:
        """The distribution log-probs are reported under (temperature 0 -> 1)."""
        return self._replace(temperature=self.temperature or 1.0)


def prefix_sum(x: jax.Array, exact: bool = False) -> jax.Array:
    """Inclusive cumulative sum over the last axis. Exact mode: a Hillis-Steele scan (log2 N
    shifted adds), whose order depends only on N — not on the batch shape."""
    if not exact:
        return jnp.cumsum(x, axis=-1)
    n, shift = x.shape[-1], 1
    while shift < n:
        shifted = jnp.pad(x[..., : n - shift], [(0, 0)] * (x.ndim - 1) + [(shift, 0)])
        x = x + shifted
        shift *= 2
    return x


def truncate_logits(z: jax.Array, top_k: int = 0, top_p: float = 1.0, exact: bool = False):
    """Keep the top-k logits, then the smallest set of most likely tokens whose probability
    reaches top_p; the others get logit NEG. z [..., V] float32 (already tempered).
    top_k=0 and top_p=1.0 switch the two filters off."""
    if top_k:
        kth = jax.lax.top_k(z, top_k)[0][..., -1:]  # [..., 1] k-th largest logit
        z = jnp.where(z >= kth, z, NEG)
    if top_p < 1.0:
        ordered = -jnp.sort(-z, axis=-1)  # [..., V] descending
        probs = jnp.exp(exact_ops.log_softmax(ordered, exact))
        mass_before = prefix_sum(probs, exact) - probs  # probability of strictly better tokens
        kept = mass_before < top_p  # the most likely token is always kept
        threshold = jnp.min(jnp.where(kept, ordered, jnp.inf), axis=-1, keepdims=True)
        z = jnp.where(z >= threshold, z, NEG)
    return z


def first_argmax(x: jax.Array, block: int = 64) -> jax.Array:
    """`jnp.argmax(x, axis=-1)` for x [B, V] (the first index of the maximum), computed in two
    short passes: the maximum of each block of `block` logits, then the first block holding the
    row's maximum, then the first index inside it. Same result, ties included; XLA on CPU runs a
    plain argmax over a 152k vocabulary as a scalar loop (11 ms on [32, 151936] vs 0.6 ms)."""
    b, v = x.shape
    blocks = -(-v // block)
    padded = jnp.pad(x, ((0, 0), (0, blocks * block - v)), constant_values=-jnp.inf)
    padded = padded.reshape(b, blocks, block)
    first = jnp.argmax(padded.max(axis=-1), axis=-1)  # [B] the first block with the maximum
    inside = jnp.take_along_axis(padded, first[:, None, None], axis=1)[:, 0]  # [B, block]
    return first * block + jnp.argmax(inside, axis=-1)


def sample_tokens(keys: jax.Array, logits: jax.Array, sampling: Sampling) -> jax.Array:
    """One token per row: keys [B] (typed PRNG keys), logits [B, V] -> tokens [B] int32.
    Gumbel-max: the token is argmax(z + g), g ~ Gumbel(0, 1) drawn from the row's key — what
    `jax.random.categorical(key, z)` computes, token for token. temperature 0 is greedy (argmax
    of the raw logits; keys unused)."""
    s = sampling
    if s.temperature == 0:
        return first_argmax(logits).astype(jnp.int32)
    z = truncate_logits(logits.astype(jnp.float32) / s.temperature, s.top_k, s.top_p, s.exact)
    return gumbel_max(keys, z).astype(jnp.int32)


def gumbel_max(keys: jax.Array, z: jax.Array, rows_per_block: int = 4) -> jax.Array:
    """argmax(z + g) per row, g ~ Gumbel(0, 1) from the row's key: keys [B], z [B, V] -> [B].
    A block of a few rows at a time (`lax.map`), so a row's noise is drawn, added and reduced
    while it is still in cache: the same numbers as one [B, V] draw, and on [32, 151936] logits
    13 ms instead of 53 (XLA on CPU otherwise writes every threefry round of the whole [B, V]
    array to memory). Blocks are as large as `rows_per_block` allows while dividing B; on an
    accelerator, where the draw is one fused kernel, all rows go at once."""
    b, v = z.shape

    def rows(args):
        block_keys, block_z = args
        noise = jax.vmap(lambda key: jax.random.gumbel(key, (v,), block_z.dtype))(block_keys)
        return first_argmax(noise + block_z)

    block = next(n for n in range(min(rows_per_block, b), 0, -1) if b % n == 0)
    if block == b or jax.default_backend() != "cpu":
        return rows((keys, z))
    split = (keys.reshape(b // block, block), z.reshape(b // block, block, v))
    return jax.lax.map(rows, split).reshape(b)


def request_ids(uid: int, sample_index: int) -> np.ndarray:
    """The counters a request's keys are folded from: [uid high 32 bits, uid low 32 bits,
    sample index] as uint32 (uids are 64-bit; fold_in takes 32-bit data)."""
    u = int(uid) & 0xFFFF_FFFF_FFFF_FFFF
    return np.array([u >> 32, u & 0xFFFF_FFFF, int(sample_index) & 0xFFFF_FFFF], np.uint32)


def token_keys(seed: jax.Array, ids: jax.Array, positions: jax.Array) -> jax.Array:
    """Keys for token `positions[b]` (completion index) of request `ids[b]` ([B, 3] from
    `request_ids`): a pure function of (seed, uid, sample index, position). -> [B] keys."""

    def one(row, position):
        key = jax.random.key(seed)
        for counter in (row[0], row[1], row[2], position):
            key = jax.random.fold_in(key, counter)
        return key

    return jax.vmap(one)(ids.astype(jnp.uint32), positions.astype(jnp.uint32))
