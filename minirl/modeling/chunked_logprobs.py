"""Token log-probs (and entropies) from the final hidden states, a chunk of positions at a time,
so that the [rows, positions, vocabulary] logits never exist at once — forward or backward.

    logp, entropy = head_logprobs(hidden, head, targets, sampling, chunk=110, entropy=True)

Why: the LM head's output dominates a training step's memory at modern vocabulary sizes. A
micro-batch of 4,096 positions over Qwen's 151,936 ids is 2.5 GB of float32 logits per copy,
and the forward, the log-softmax and their gradients hold several copies at once, while the
model itself may be a few megabytes. Liger Kernel's fused linear + cross-entropy, Unsloth's
chunked log-softmax and TRL's chunked entropy exist for this reason; nothing in the idea is
specific to PyTorch.

How: the hidden states [B, T, D] are flattened to N = B*T positions and cut into equal chunks
of `chunk` positions (the last one zero-padded). A `lax.scan` runs the LM head, the log-softmax
and the target gather on one chunk at a time; the chunk's body is wrapped in `jax.checkpoint`,
so the backward pass recomputes each chunk's [chunk, V] logits instead of keeping them: live
memory is one chunk's logits and their gradient, plus the head's gradient [D, V] (which the
model's gradient holds anyway). The cost is one more LM-head matmul per position in the
backward pass (docs/trainer.md measures it).

Numbers: every position's log-prob is computed by the same functions as the unchunked path
(`exact.dense`, `model.token_logprobs`, `model.token_entropy`), row by row independent, so
exact mode (whose contractions and sums do not depend on the row count; minirl/modeling/exact.py)
gives the same bits chunked or not, and the same bits as the rollout engine. The fast path may
differ from the unchunked one in the last bits (XLA's matmul blocking depends on the row count):
tests/modeling/test_chunked_logprobs.py states the bound.

Simplified on purpose: chunks run over positions only, never over the vocabulary (one position's
[V] row is 0.6 MB at 152k ids, far below any useful budget); no custom kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from minirl.modeling import exact as exact_ops
from minirl.modeling.model import token_entropy, token_logprobs
from minirl.modeling.sampling import Sampling


def chunk_positions(vocab_size: int, chunk_mb: float) -> int:
    """Positions per chunk such that one chunk's float32 logits take at most `chunk_mb` MiB
    (at least one position); 0 when `chunk_mb` is 0 (no chunking)."""
    if chunk_mb <= 0:
        return 0
    return max(1, int(chunk_mb * 2**20) // (4 * vocab_size))


def _logits(hidden, head, tied: bool, exact: bool):
    """hidden [..., D] @ the LM head -> float32 logits [..., V]. head [D, V], or with `tied` the
    embedding [V, D]: the fast path then contracts D of both as they lie, so neither the
    forward nor the backward pass (d hidden = d logits @ embedding) makes a transposed [D, V]
    copy of it (0.5 GB at Qwen2.5-0.5B's size); exact mode goes through `exact.dense` as the
    engine does (which pads the head into its fixed chunks: one copy)."""
    head = head.astype(hidden.dtype)
    if tied and not exact:
        return jnp.einsum("...d,vd->...v", hidden, head, preferred_element_type=jnp.float32)
    logits = exact_ops.dense(hidden, head.T if tied else head, exact)
    return logits.astype(jnp.float32)


def _head_outputs(hidden, head, targets, sampling: Sampling, entropy: bool, tied: bool):
    """The unchunked computation: hidden [..., D], head [D, V] (`tied`: [V, D]), targets [...]
    -> (log-probs [...], entropies [...] or None)."""
    logits = _logits(hidden, head, tied, sampling.exact)  # [..., V]
    logp = token_logprobs(logits, targets, sampling)
    return logp, (token_entropy(logits, sampling.temperature) if entropy else None)


def head_logprobs(
    hidden: jax.Array,
    head: jax.Array,
    targets: jax.Array,
    sampling: Sampling,
    chunk: int,
    entropy: bool = False,
    tied: bool = False,
):
    """log softmax(hidden @ head / temperature)[targets] (truncated as `sampling` samples), and
    with `entropy` the entropy of softmax(hidden @ head / temperature), `chunk` positions at a
    time. hidden [B, T, D] (the model's final-normed states, `Transformer.hidden`), head [D, V]
    or with `tied` the embedding [V, D] (`Transformer.head()`: transposed inside each chunk, so
    no transposed copy of it is made), targets [B, T] int -> (log-probs [B, T] float32,
    entropies [B, T] or None). `chunk` 0, or at least B*T: all positions at once (the [B, T, V]
    logits exist)."""
    b, t, d = hidden.shape
    n = b * t
    if chunk <= 0 or n <= chunk:
        head = head.T if tied else head  # [D, V]: the model's own head, as the engine runs it
        return _head_outputs(hidden, head, targets, sampling, entropy, tied=False)
    count = -(-n // chunk)
    size = -(-n // count)  # equal chunks, as few padded positions as possible
    pad = count * size - n
    xs = jnp.pad(hidden.reshape(n, d), ((0, pad), (0, 0))).reshape(count, size, d)
    ts = jnp.pad(targets.reshape(n), (0, pad)).reshape(count, size)

    @jax.checkpoint  # the backward recomputes the chunk's logits rather than keep them
    def one_chunk(head, x, tgt):  # [D, V] or [V, D], [S, D], [S] -> ([S], [S] or None)
        return _head_outputs(x, head, tgt, sampling, entropy, tied)

    def step(carry, chunk_in):
        return carry, one_chunk(head, *chunk_in)

    def unchunk(y):  # [count, size] -> [B, T]
        return y.reshape(count * size)[:n].reshape(b, t)

    _, (logp, ent) = jax.lax.scan(step, None, (xs, ts))  # [count, size] each
    return unchunk(logp), (unchunk(ent) if entropy else None)
