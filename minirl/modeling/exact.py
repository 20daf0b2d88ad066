"""The model's reductions, each in two flavours: fast (XLA's choice) and exact (fixed order).

Why this file exists: training-inference mismatch (VeXact; RLAX §5.1) is born in reductions.
XLA's CPU matmul picks its blocking from the row count M, so a decode step (M = slots) and a
training forward (M = B*T) sum the same products in different orders and disagree in the last
bits; those bits compound through layers into |Δlogp| > 0 even when the weights are identical.

Exact mode removes the freedom: every reduction is split into fixed chunks of `CHUNK` elements
along the contraction axis (zero-padded), each chunk is one small dot product, and the partial
results are added in a fixed pairwise tree over a power-of-two number of chunks. The order of
additions then depends only on the contraction length, never on M, batch or slot, and trailing
zero padding adds exact zeros — so a length-37 attention row gives the same bits whether it
lives in a 64- or a 512-slot cache. Elementwise reductions (norms, softmax sums) use the same
pairwise tree directly. Cost: more, smaller kernels; measured in benchmarks/.

A fixed order is not enough on its own: XLA CPU may fuse a multiply into the add that consumes it
(an FMA, one rounding) or route an exp to a kernel library in one shape and not in another;
`fusion_barrier` pins those values (every term of a sum, every exp input) to one computation.

Every function takes `exact: bool` (a Python bool, static under jit).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

CHUNK = 32  # contraction elements per partial dot product in exact mode
NEG = -1e30  # mask value: finite, so a fully masked row cannot produce nan


def _pad_axis(x: jax.Array, axis: int, size: int) -> jax.Array:
    pad = size - x.shape[axis]
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def fusion_barrier(x: jax.Array) -> jax.Array:
    """x unchanged, but opaque to the two shape-dependent rewrites XLA CPU applies around it.

    1. LLVM may contract `a * b + c` into one fused multiply-add (one rounding instead of two)
       when the multiply and the add land in the same fused kernel, and which ops share a
       kernel depends on the shapes: the same product is rounded in a [B, T] training forward
       and fused in a [B, 1] decode step.
    2. For some shapes only, XLA hands a max-subtract-exp fusion to a kernel library (YNNPACK)
       whose exp differs from XLA's own in the last bit.
    This select (NaN stays NaN) is seen through by neither, so the value is rounded and computed
    the same way in every shape. Measured, not promised: tests/modeling/test_model.py checks the bits.
    """
    return jnp.where(jnp.isnan(x), jnp.nan, x)


def tree_sum(x: jax.Array, axis: int = -1) -> jax.Array:
    """Sum over `axis` in a fixed pairwise order (zero-padded to a power of two)."""
    axis = axis % x.ndim
    x = _pad_axis(fusion_barrier(x), axis, _next_pow2(x.shape[axis]))
    while x.shape[axis] > 1:
        half = x.shape[axis] // 2
        x = jax.lax.slice_in_dim(x, 0, half, axis=axis) + jax.lax.slice_in_dim(
            x, half, 2 * half, axis=axis
        )
    return jnp.squeeze(x, axis)


def _transposed_rows(x: jax.Array) -> jax.Array:
    """x [N, I] -> x^T [I, N], a real copy (barriers: XLA folded it into the dot, then ran x^T dy
    with its Eigen kernel, built for AVX without FMA, bf16 upcast): x^T dy runs in YNNPACK."""
    n, i = x.shape
    split = 16 if n % 16 == 0 else 1  # a 3-D view: over a 2-D one XLA still folds it
    x = jax.lax.optimization_barrier(x)
    return jax.lax.optimization_barrier(x.T.reshape(i, n // split, split)).reshape(i, n)


def _fast_dense(x: jax.Array, w: jax.Array, out_dtype) -> jax.Array:
    """x @ w in x's dtype (w cast here: a float32 master gets a float32 gradient), f32 sums."""
    y = jnp.einsum("...i,io->...o", x, w.astype(x.dtype), preferred_element_type=jnp.float32)
    return y.astype(out_dtype)


def _fast_dense_fwd(x, w, out_dtype):
    return _fast_dense(x, w, out_dtype), (x, w)


def _fast_dense_bwd(out_dtype, residuals, dy):
    """dx = dy @ w^T, dw = x^T dy: ONE dot each, inputs in x's dtype, f32 sums (bf16 x bf16 ->
    f32 is the native kernel). Autodiff's dw [O, I] + transpose cost ~20% (docs/trainer.md)."""
    x, w = residuals
    dy = dy.astype(x.dtype)
    dx = jnp.einsum("...o,io->...i", dy, w.astype(x.dtype), preferred_element_type=jnp.float32)
    rows_x, rows_dy = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])  # [N, I], [N, O]
    dw = jnp.dot(_transposed_rows(rows_x), rows_dy, preferred_element_type=jnp.float32)
    dw = jax.lax.optimization_barrier(dw)  # a tied embedding's transpose stays out of the dot
    return dx.astype(x.dtype), dw.astype(w.dtype)


_fast_dense = jax.custom_vjp(_fast_dense, nondiff_argnums=(2,))
_fast_dense.defvjp(_fast_dense_fwd, _fast_dense_bwd)


def dense(x: jax.Array, w: jax.Array, exact: bool = False, out_dtype=None) -> jax.Array:
    """x [..., I] @ w [I, O] -> [..., O] in `out_dtype` (default x's), computed in x's dtype."""
    if not exact:
        return _fast_dense(x, w, out_dtype or x.dtype)
    i = x.shape[-1]
    # At least two chunks: with one, XLA drops the chunk axis and a single-row x takes a
    # matrix-vector kernel that sums in another order. The zero chunk adds exact zeros.
    n = max(2, _next_pow2(-(-i // CHUNK)))
    xc = _pad_axis(x, -1, n * CHUNK).reshape(*x.shape[:-1], n, CHUNK)  # [..., n, C]
    wc = _pad_axis(w.astype(x.dtype), 0, n * CHUNK).reshape(n, CHUNK, w.shape[-1])  # [n, C, O]
    # bf16 inputs are upcast: a bf16 x bf16 product is exact in float32, sums accumulate in fp32.
    # HIGHEST: true float32 products on every backend (a GPU's default runs float32 dots in TF32,
    # 10 bits of mantissa; the CPU's are float32 either way, so its bits are unchanged).
    parts = jnp.einsum(
        "...nc,nco->...no",
        xc.astype(jnp.float32),
        wc.astype(jnp.float32),
        precision=jax.lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )
    return tree_sum(parts, axis=-2).astype(out_dtype or x.dtype)


def mean_last(x: jax.Array, exact: bool = False) -> jax.Array:
    """Mean over the last axis, keeping it: [..., N] -> [..., 1]."""
    if not exact:
        return jnp.mean(x, axis=-1, keepdims=True)
    # XLA turns "/ N" into "* (1/N)"; fusion_barrier keeps that product out of a following "+ eps".
    return fusion_barrier(tree_sum(x, -1) / x.shape[-1])[..., None]


def log_softmax(x: jax.Array, exact: bool = False) -> jax.Array:
    """log softmax over the last axis (float32 in, float32 out)."""
    if not exact:
        return jax.nn.log_softmax(x, axis=-1)
    x = fusion_barrier(x)  # x is often logits * (1 / temperature): keep it out of "x - m"
    m = jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
    shifted = x - m
    return shifted - jnp.log(tree_sum(jnp.exp(fusion_barrier(shifted)), -1))[..., None]


def attention(q, k, v, visible, exact: bool = False):
    """Grouped-query attention.

    q [B, T, K, G, Dh] (G query heads per key head), k and v [B, S, K, Dh], visible [B, T, S]
    bool. Returns [B, T, K, G, Dh] in q's dtype; scores and softmax in float32.
    """
    if q.shape[1] == 1:
        return _decode_attention(q, k, v, visible, exact)
    scale = q.shape[-1] ** -0.5
    if not exact:
        scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) * scale
        scores = jnp.where(visible[:, None, None], scores, NEG)
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, v, preferred_element_type=jnp.float32)
        return out.astype(q.dtype)  # float32 sums: bf16 runs the native kernel (`dense`)
    # Exact: small-axis dot products on XLA CPU are NOT shape-invariant (a [1, S] query row takes
    # a different kernel than a [T, S] block), so attention multiplies elementwise and sums with
    # the fixed tree: over Dh for the scores, over S for the weighted values.
    scores = tree_sum(
        q.transpose(0, 2, 3, 1, 4)[:, :, :, :, None].astype(jnp.float32)
        * k.transpose(0, 2, 1, 3)[:, :, None, None].astype(jnp.float32),
        -1,
    )
    scores = jnp.where(
        visible[:, None, None], fusion_barrier(scores * scale), NEG
    )  # [B, K, G, T, S]
    m = jnp.max(scores, axis=-1, keepdims=True)
    e = jnp.exp(fusion_barrier(scores - m))
    probs = (e / tree_sum(e, -1)[..., None]).astype(v.dtype)
    vt = v.transpose(0, 2, 1, 3)[:, :, None, None].astype(jnp.float32)  # [B, K, 1, 1, S, Dh]
    out = tree_sum(probs[..., None].astype(jnp.float32) * vt, -2)  # [B, K, G, T, Dh]
    return out.transpose(0, 3, 1, 2, 4).astype(q.dtype)


def causal_attention(q, k, v, visible, exact: bool = False, blocks: int = 4):
    """`attention` for a full causal forward from position 0 (keys = the queries' own positions
    0..T-1, no cache): the query rows are cut into `blocks` blocks and block i only meets the keys
    up to its own end, so the score blocks above the diagonal, which the causal mask zeroes
    anyway, are never computed — 3/8 less score and softmax work at 4 blocks. The same numbers
    for every row (a query's softmax only ever included its visible keys). Exact mode keeps the
    one full block (its bitwise tests pin that computation)."""
    t = q.shape[1]
    if exact or t < 128:  # short rows: one block (many small kernels would cost more)
        return attention(q, k, v, visible, exact)
    size = -(-t // blocks)
    outs = []
    for start in range(0, t, size):
        end = min(start + size, t)
        outs.append(attention(q[:, start:end], k[:, :end], v[:, :end], visible[:, start:end, :end]))
    return jnp.concatenate(outs, axis=1)


def _decode_attention(q, k, v, visible, exact: bool):
    """`attention` for one query per row (T == 1: a decode step), in the cache's own layout.

    Same maths, but the [B, S, K, Dh] cache is never transposed (that would copy the whole cache
    per layer per step) and no small batched dot is used: scores reduce over Dh with the pairwise
    tree in both modes (XLA CPU vectorises it over the major axes; its own minor-axis reduce and
    the batched dot were ~3x slower), the softmax and weighted sum reduce over S with the tree
    (exact) or jnp.sum (fast). In exact mode every addition happens in the same order as in the
    general path, so the two are bitwise equal (tests/inference/test_engine.py checks it).
    """
    scale = q.shape[-1] ** -0.5
    q1 = q[:, 0].astype(jnp.float32)  # [B, K, G, Dh]
    scores = tree_sum(k.astype(jnp.float32)[:, :, :, None, :] * q1[:, None], -1)  # [B, S, K, G]
    scores = jnp.where(visible[:, 0, :, None, None], fusion_barrier(scores * scale), NEG)
    m = jnp.max(scores, axis=1, keepdims=True)
    e = jnp.exp(fusion_barrier(scores - m))
    total = tree_sum(e, 1)[:, None] if exact else jnp.sum(e, axis=1, keepdims=True)
    probs = (e / total).astype(v.dtype)
    weighted = probs[..., None].astype(jnp.float32) * v.astype(jnp.float32)[:, :, :, None, :]
    out = tree_sum(weighted, 1) if exact else jnp.sum(weighted, axis=1)  # [B, K, G, Dh]
    return out[:, None].astype(q.dtype)  # [B, 1, K, G, Dh]
