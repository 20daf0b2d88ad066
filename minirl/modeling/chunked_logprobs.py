"""Token log-probs (and entropies) from the final hidden states, in chunks: the [rows, positions,
vocabulary] logits never exist at once, forward or backward (at 151,936 ids, 4,096 positions are
2.5 GB of float32 logits per copy; Liger Kernel's fused linear + cross-entropy and TRL's chunked
entropy answer the same problem). Two ways, one budget (`chunk` positions' worth of logits):

  over the vocabulary  the fast path (no exact mode, no top-k / top-p): a custom VJP runs the head
                       a slice of ids at a time with an online log-sum-exp; the backward pass
                       recomputes each slice's logits once and writes the head's gradient slice by
                       slice (disjoint rows, nothing accumulated). One more head matmul than the
                       whole logits at once, and no skinny ones.
  over positions       exact mode and truncated sampling: a `lax.scan` over equal chunks of
                       positions (the last zero-padded) runs head, log-softmax and gather, its
                       body under `jax.checkpoint`. Each position goes through the unchunked
                       functions on its own, so exact mode (no reduction depends on the row count)
                       gives the same bits chunked or not: the engine's.

The fast path may differ from the whole logits in the last bits (tests/modeling/
test_chunked_logprobs.py; docs/trainer.md, "The LM head in chunks").
"""

from __future__ import annotations

import functools

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


# ---- over the vocabulary (the fast path) ------------------------------------------------------

MIN_IDS = 16  # the narrowest slice of the vocabulary a chunk takes, however many positions


def _for_slices(vocab: int, size: int, body, carry):
    """carry = body(start, width, carry) over [0, vocab) in slices of `size` ids: a fori_loop over
    the whole slices, then the rest (a static width) once."""
    whole, rest = divmod(vocab, size)
    carry = jax.lax.fori_loop(0, whole, lambda i, c: body(i * size, size, c), carry)
    return body(whole * size, rest, carry) if rest else carry


def _slice(w, start, width: int, axis: int):
    return jax.lax.dynamic_slice_in_dim(w, start, width, axis)


def _slice_logits(h, w, start, width: int, axis: int, temperature: float):
    """z = (h @ head[:, start:start+width]) / temperature, float32 [N, width]."""
    eq = "nd,vd->nv" if axis == 0 else "nd,dv->nv"
    wc = _slice(w, start, width, axis).astype(h.dtype)
    return jnp.einsum(eq, h, wc, preferred_element_type=jnp.float32) / temperature


def _vocab_forward(h, w, t, size: int, axis: int, temperature: float, entropy: bool):
    """(log-probs [N], entropies [N] or None, log-sum-exp [N]) from a running max m and the
    running sums s = sum exp(z - m) and u = sum exp(z - m) (z - m): lse = m + log s and
    H = lse - E[z] = log s - u / s (small terms, no cancellation of two large ones)."""
    n, vocab = h.shape[0], w.shape[axis]

    def body(start, width, c):
        m, s, u, zt = c
        z = _slice_logits(h, w, start, width, axis, temperature)
        m2 = jnp.maximum(m, z.max(axis=1))
        e, fade = jnp.exp(z - m2[:, None]), jnp.exp(m - m2)
        if entropy:  # the old terms' (z - m) become (z - m2) = (z - m) + (m - m2)
            u = fade * (u + (m - m2) * s) + jnp.sum(e * (z - m2[:, None]), axis=1)
        k = t - start
        picked = jnp.take_along_axis(z, jnp.clip(k, 0, width - 1)[:, None], axis=1)[:, 0]
        zt = jnp.where((k >= 0) & (k < width), picked, zt)
        return m2, s * fade + e.sum(axis=1), u, zt

    zero, lowest = jnp.zeros(n, jnp.float32), jnp.full(n, jnp.finfo(jnp.float32).min)
    m, s, u, zt = _for_slices(vocab, size, body, (lowest, zero, zero, zero))
    lse = m + jnp.log(s)
    return zt - lse, (jnp.log(s) - u / s if entropy else None), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _vocab_chunked(h, w, t, size: int, axis: int, temperature: float, entropy: bool):
    logp, ent, _ = _vocab_forward(h, w, t, size, axis, temperature, entropy)
    return logp, ent


def _vocab_fwd(h, w, t, size, axis, temperature, entropy):
    logp, ent, lse = _vocab_forward(h, w, t, size, axis, temperature, entropy)
    return (logp, ent), (h, w, t, lse, ent)


def _vocab_bwd(size, axis, temperature, entropy, res, grads):
    """d logp/dz = onehot(t) - p; d H/dz = -p (log p + H); d/dlogits = (d/dz) / temperature.
    Each slice's logits are recomputed once; its rows of the head's gradient are written, not
    added (slices are disjoint); the hidden states' gradient sums over the slices."""
    h, w, t, lse, ent = res
    g_logp, g_ent = grads
    vocab = w.shape[axis]

    def body(start, width, c):
        dh, dw = c
        z = _slice_logits(h, w, start, width, axis, temperature)
        logp = z - lse[:, None]
        p = jnp.exp(logp)
        onehot = (t - start)[:, None] == jnp.arange(width)[None, :]
        g = g_logp[:, None] * (onehot - p)
        if entropy:
            g = g - g_ent[:, None] * p * (logp + ent[:, None])
        g = (g / temperature).astype(h.dtype)
        wc = _slice(w, start, width, axis).astype(h.dtype)
        if axis == 0:  # tied embedding [V, D]
            dh = dh + jnp.einsum("nv,vd->nd", g, wc, preferred_element_type=jnp.float32)
            part = jnp.einsum("nv,nd->vd", g, h, preferred_element_type=jnp.float32)
        else:  # head [D, V]
            dh = dh + jnp.einsum("nv,dv->nd", g, wc, preferred_element_type=jnp.float32)
            part = jnp.einsum("nv,nd->dv", g, h, preferred_element_type=jnp.float32)
        dw = jax.lax.dynamic_update_slice_in_dim(dw, part.astype(dw.dtype), start, axis)
        return dh, dw

    dh0 = jnp.zeros(h.shape, jnp.float32)
    dh, dw = _for_slices(vocab, size, body, (dh0, jnp.zeros_like(w)))
    return dh.astype(h.dtype), dw, None


_vocab_chunked.defvjp(_vocab_fwd, _vocab_bwd)


def head_logprobs(hidden, head, targets, sampling: Sampling, chunk: int, entropy=False, tied=False):
    """log softmax(hidden @ head / temperature)[targets] as `sampling` samples (and the entropies),
    with the logits of at most `chunk` positions at once (0 or >= B*T: all at once, as
    `Transformer.__call__`). hidden [B, T, D] (`Transformer.hidden`), head [D, V] or `tied` the
    embedding [V, D], targets [B, T]."""
    n = targets.size  # positions B*T
    if chunk <= 0 or n <= chunk:
        return _head_outputs(hidden, head.T if tied else head, targets, sampling, entropy, False)
    if not (sampling.exact or sampling.top_k or sampling.top_p < 1.0):
        axis = 0 if tied else 1
        vocab = head.shape[axis]
        size = min(vocab, max(MIN_IDS, chunk * vocab // n))  # the same logits budget, in ids
        logp, ent = _vocab_chunked(
            hidden.reshape(n, -1),
            head,
            targets.reshape(n),
            size,
            axis,
            float(sampling.temperature),
            entropy,
        )
        unflat = lambda y: y.reshape(targets.shape)  # noqa: E731
        return unflat(logp), (unflat(ent) if entropy else None)
    # ---- over positions (exact mode, truncated sampling) ----
    count = -(-n // chunk)
    size = -(-n // count)  # equal chunks, as few padded positions as possible
    xs = jnp.pad(hidden.reshape(n, -1), ((0, count * size - n), (0, 0))).reshape(count, size, -1)
    ts = jnp.pad(targets.reshape(n), (0, count * size - n)).reshape(count, size)
    # one chunk [S, D], [S] -> ([S], [S] or None); the backward recomputes its logits
    one_chunk = jax.checkpoint(lambda h, x, tg: _head_outputs(x, h, tg, sampling, entropy, tied))
    _, out = jax.lax.scan(lambda c, xt: (c, one_chunk(head, *xt)), None, (xs, ts))
    unchunk = lambda y: y.reshape(-1)[:n].reshape(targets.shape)  # noqa: E731  [count, S] -> [B, T]
    return unchunk(out[0]), (unchunk(out[1]) if entropy else None)
