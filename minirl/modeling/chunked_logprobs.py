"""Token log-probs (and entropies) from the final hidden states, `chunk` positions at a time: the
[rows, positions, vocabulary] logits never exist at once, forward or backward (at 151,936 ids,
4,096 positions are 2.5 GB of float32 logits per copy; Liger Kernel's fused linear + cross-entropy
and TRL's chunked entropy answer the same problem). A `lax.scan` over equal chunks (the last
zero-padded) runs head, log-softmax and gather, its body under `jax.checkpoint`: the backward
recomputes each chunk's logits (one more LM-head matmul per position; docs/trainer.md). Each
position goes through the unchunked functions on its own, so exact mode (no reduction depends on
the row count) gives the same bits chunked or not: the engine's; the fast path may differ in the
last bits (tests/modeling/test_chunked_logprobs.py). Simplified on purpose: chunks over positions
only, never the vocabulary (one position's row is 0.6 MB at 152k ids).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from minirl.modeling import exact as exact_ops
from minirl.modeling.model import token_logprobs
from minirl.modeling.sampling import Sampling


def chunk_positions(vocab_size: int, chunk_mb: float) -> int:
    """Positions whose float32 logits fit in `chunk_mb` MiB (at least 1); 0 for 0 (no chunks)."""
    return max(1, int(chunk_mb * 2**20) // (4 * vocab_size)) if chunk_mb > 0 else 0


def _head_outputs(hidden, head, targets, sampling: Sampling, entropy: bool, tied: bool):
    """hidden [..., D], head [D, V] or `tied` [V, D], targets [...] -> (log-probs, entropies or
    None) [...]. Fast and tied: no transposed [D, V] copy, forward or backward (0.5 GB at 0.5B)."""
    if tied and not sampling.exact:
        h = head.astype(hidden.dtype)
        logits = jnp.einsum("...d,vd->...v", hidden, h, preferred_element_type=jnp.float32)
    else:  # `exact.dense`, as the model's own head (and the engine) runs it: float32 logits
        logits = exact_ops.dense(hidden, head.T if tied else head, sampling.exact, jnp.float32)
    logp = token_logprobs(logits, targets, sampling)
    if not entropy:
        return logp, None
    tempered = jax.nn.log_softmax(logits.astype(jnp.float32) / sampling.temperature, axis=-1)
    return logp, -jnp.sum(jnp.exp(tempered) * tempered, axis=-1)  # untruncated, as logged


def head_logprobs(hidden, head, targets, sampling: Sampling, chunk: int, entropy=False, tied=False):
    """log softmax(hidden @ head / temperature)[targets] as `sampling` samples (and the entropies),
    `chunk` positions at a time (0 or >= B*T: all at once, as `Transformer.__call__`). hidden
    [B, T, D] (`Transformer.hidden`), head [D, V] or `tied` the embedding [V, D], targets [B, T]."""
    n = targets.size  # positions B*T
    if chunk <= 0 or n <= chunk:
        return _head_outputs(hidden, head.T if tied else head, targets, sampling, entropy, False)
    count = -(-n // chunk)
    size = -(-n // count)  # equal chunks, as few padded positions as possible
    xs = jnp.pad(hidden.reshape(n, -1), ((0, count * size - n), (0, 0))).reshape(count, size, -1)
    ts = jnp.pad(targets.reshape(n), (0, count * size - n)).reshape(count, size)
    # one chunk [S, D], [S] -> ([S], [S] or None); the backward recomputes its logits
    one_chunk = jax.checkpoint(lambda h, x, tg: _head_outputs(x, h, tg, sampling, entropy, tied))
    _, out = jax.lax.scan(lambda c, xt: (c, one_chunk(head, *xt)), None, (xs, ts))
    unchunk = lambda y: y.reshape(-1)[:n].reshape(targets.shape)  # noqa: E731  [count, S] -> [B, T]
    return unchunk(out[0]), (unchunk(out[1]) if entropy else None)
