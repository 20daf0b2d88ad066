"""Token log-probs (and entropies) from the final hidden states, in chunks: the [rows, positions,
vocabulary] logits never exist at once, forward or backward (at 151,936 ids, 4,096 positions are
2.5 GB of float32 logits per copy; Liger Kernel's fused linear + cross-entropy and TRL's chunked
entropy answer the same problem). The fast path runs the head over slices of the vocabulary
(online log-sum-exp, custom VJP); exact mode and truncated sampling over chunks of positions,
each through the unchunked functions (the engine's bits). docs/trainer.md, "The LM head in
chunks"; tests/modeling/test_chunked_logprobs.py.
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


MIN_IDS = 16  # the fast path's narrowest slice of the vocabulary, however many positions


def _for_slices(vocab: int, size: int, body, carry):
    """carry = body(start, width, carry) over [0, vocab) in slices of `size` ids (a fori_loop),
    then the rest (a static width)."""
    whole, rest = divmod(vocab, size)
    carry = jax.lax.fori_loop(0, whole, lambda i, c: body(i * size, size, c), carry)
    return body(whole * size, rest, carry) if rest else carry


def _slice_logits(h, w, start, width: int, axis: int, temperature: float):
    """(z = h @ head[ids start..start+width] / temperature, float32 [N, width], that slice)."""
    wc = jax.lax.dynamic_slice_in_dim(w, start, width, axis).astype(h.dtype)
    eq = "nd,vd->nv" if axis == 0 else "nd,dv->nv"  # tied embedding [V, D] or head [D, V]
    return jnp.einsum(eq, h, wc, preferred_element_type=jnp.float32) / temperature, wc


def _vocab_forward(h, w, t, size: int, axis: int, temperature: float, entropy: bool):
    """(log-probs [N], entropies [N] or None, log-sum-exp [N]) from a running max m and sums
    s = sum exp(z - m), u = sum exp(z - m) (z - m): lse = m + log s, H = log s - u / s."""
    n = h.shape[0]

    def body(start, width, c):
        m, s, u, zt = c
        z = _slice_logits(h, w, start, width, axis, temperature)[0]
        m2 = jnp.maximum(m, z.max(axis=1))
        e, fade = jnp.exp(z - m2[:, None]), jnp.exp(m - m2)
        if entropy:  # the old terms' (z - m) become (z - m2) = (z - m) + (m - m2)
            u = fade * (u + (m - m2) * s) + jnp.sum(e * (z - m2[:, None]), axis=1)
        k = t - start
        picked = jnp.take_along_axis(z, jnp.clip(k, 0, width - 1)[:, None], axis=1)[:, 0]
        return m2, s * fade + e.sum(axis=1), u, jnp.where((k >= 0) & (k < width), picked, zt)

    zero, lowest = jnp.zeros(n, jnp.float32), jnp.full(n, jnp.finfo(jnp.float32).min)
    m, s, u, zt = _for_slices(w.shape[axis], size, body, (lowest, zero, zero, zero))
    lse = m + jnp.log(s)
    return zt - lse, (jnp.log(s) - u / s if entropy else None), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _vocab_chunked(h, w, t, size: int, axis: int, temperature: float, entropy: bool):
    return _vocab_forward(h, w, t, size, axis, temperature, entropy)[:2]


def _vocab_fwd(h, w, t, size, axis, temperature, entropy):
    logp, ent, lse = _vocab_forward(h, w, t, size, axis, temperature, entropy)
    return (logp, ent), (h, w, t, lse, ent)


def _vocab_bwd(size, axis, temperature, entropy, res, grads):
    """d logp/dz = onehot(t) - p, d H/dz = -p (log p + H), d/dlogits = (d/dz) / temperature.
    The head's gradient is written slice by slice (disjoint rows, nothing added)."""
    (h, w, t, lse, ent), (g_logp, g_ent) = res, grads
    ws = "vd" if axis == 0 else "dv"

    def body(start, width, c):
        z, wc = _slice_logits(h, w, start, width, axis, temperature)
        logp = z - lse[:, None]
        p = jnp.exp(logp)
        g = g_logp[:, None] * (((t - start)[:, None] == jnp.arange(width)) - p)
        if entropy:
            g = g - g_ent[:, None] * p * (logp + ent[:, None])
        g = (g / temperature).astype(h.dtype)
        dh = c[0] + jnp.einsum(f"nv,{ws}->nd", g, wc, preferred_element_type=jnp.float32)
        part = jnp.einsum(f"nv,nd->{ws}", g, h, preferred_element_type=jnp.float32)
        return dh, jax.lax.dynamic_update_slice_in_dim(c[1], part.astype(w.dtype), start, axis)

    zeros = (jnp.zeros(h.shape, jnp.float32), jnp.zeros_like(w))
    dh, dw = _for_slices(w.shape[axis], size, body, zeros)
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
        vocab, dim = head.shape[axis], head.shape[1 - axis]
        # the budget holds a slice's logits [n, ids] and its head rows [ids, D], float32
        size = min(vocab, max(MIN_IDS, chunk * vocab // (n + dim)))
        args = (size, axis, float(sampling.temperature), entropy)
        logp, ent = _vocab_chunked(hidden.reshape(n, -1), head, targets.reshape(n), *args)
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
