"""The model's reductions, each in two flavours: fast (XLA's choice) and exact (fixed order).

Why this file exists: training-inference mismatch (VeXact; RLAX §5.1) is born in reductions.
XLA's CPU matmul picks its blocking from the row count M, so a decode step (M = slots) and a
training forward (M = B*T) sum the same products in different orders and disagree in the last
bits; those bits compound through layers into |Δlogp| > 0 even when the weights are identical.

Exact mode removes the freedom: every contraction is split into fixed chunks of at most `CHUNK`
elements (zero-padded), each chunk is one small dot product, and the partial results are added
in a fixed order (`dense`). The order of additions then depends only on the contraction length,
never on M, batch or slot, and trailing zero padding adds exact zeros — so a length-37 attention
row gives the same bits whether it lives in a 64- or a 512-slot cache. Elementwise reductions
(norms, softmax sums) use the same pairwise tree directly. Cost: more, smaller kernels; measured
in benchmarks/.

On any device layout too: a contraction is first cut into `GROUPS` equal groups (`chunking`)
and `tree_sum` pairs neighbours, so a weight split 2, 4 or 8 ways over devices leaves every
chunk's dot on one device, each device adds its own subtree, and the partial sums meet in the
tree's top levels as plain adds (no psum picks an order; max is exact in any order). Any other
split is refused (`check_layout`). docs/mismatch.md, "Sharding", draws the tree.

Every function takes `exact: bool` (a Python bool, static under jit). On a GPU the dense
product is a Pallas kernel with the same order (minirl/modeling/exact_kernels.py, `kernel_mode`).
"""

from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp

CHUNK = 32  # contraction elements per partial dot product in exact mode
GROUPS = 8  # equal groups a contraction is first cut into: its shards may be 2, 4 or 8
KERNEL_ENV = "MINIRL_EXACT_KERNEL"  # auto | xla | pallas | interpret: see kernel_mode
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


def check_layout(params, what: str = "exact mode") -> None:
    """ValueError naming the first array of `params` split over devices other than 1, 2, 4 or 8
    equal ways along some dim: such a split cuts a group of `chunking`, so one chunk's dot would
    be summed on two devices and finished by a collective."""
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        shape = getattr(x, "shape", ())
        shard = getattr(getattr(x, "sharding", None), "shard_shape", lambda s: s)(shape)
        for dim, (size, part) in enumerate(zip(shape, shard, strict=True)):
            ways = -(-size // max(part, 1))
            if ways > 1 and (GROUPS % ways or size % ways):
                name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
                raise ValueError(
                    f"{what}: {name} {tuple(shape)} is split {ways} ways along dim {dim}; "
                    f"exact mode adds a contraction's shards in a fixed tree of {GROUPS} equal "
                    "groups, so a weight may be split only 2, 4 or 8 ways (evenly)"
                )


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
    """Sum over `axis` in a fixed pairwise tree of neighbours, (0+1), (2+3), ..., zero-padded to a
    power of two: any aligned block of 2^j elements is one subtree (a shard's own sum)."""
    axis = axis % x.ndim
    n = _next_pow2(x.shape[axis])
    x = _pad_axis(fusion_barrier(x), axis, n)
    while n > 1:
        x = jax.lax.slice_in_dim(x, 0, n, 2, axis) + jax.lax.slice_in_dim(x, 1, n, 2, axis)
        n //= 2
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
    """x [..., I] @ w [I, O] -> [..., O] in `out_dtype` (default x's), computed in x's dtype (w
    is cast: a float32 master weight meets bf16 activations as bf16); a 3-D w [E, F, O] takes
    x [..., E, F] and contracts both (the MoE down projection: each expert's F chunked on its
    own). Exact: cut as `chunking` says, one float32 dot per chunk, a group's chunks added in
    order, the group sums by `tree_sum`."""
    out_dtype = out_dtype or x.dtype
    if not exact:
        if w.ndim == 3:
            x, w = x.reshape(*x.shape[:-2], -1), w.reshape(-1, w.shape[-1])
        return _fast_dense(x, w, out_dtype)
    w = w.astype(x.dtype)
    if kernel_mode() != "xla":
        return kernel_dense(x, w, kernel_mode() == "interpret").astype(out_dtype)
    xc, wc = chunk_layout(x, w)  # [..., S, n, C], [S, n, C, O]: S groups of n chunks
    s, n, c = wc.shape[:3]
    # One batched dot over all S * n chunks (a size-1 batch axis lets XLA pick another kernel).
    # bf16 is upcast (its products are exact in float32); HIGHEST: no TF32 on a GPU.
    parts = jnp.einsum(
        "...nc,nco->...no",
        xc.reshape(*xc.shape[:-3], s * n, c).astype(jnp.float32),
        wc.reshape(s * n, c, -1).astype(jnp.float32),
        precision=jax.lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )
    parts = fusion_barrier(parts).reshape(*parts.shape[:-2], s, n, -1)  # each dot rounded alone
    sums = parts[..., 0, :]  # [..., S, O]
    for k in range(1, n):  # each group left to right
        sums = sums + parts[..., k, :]
    return tree_sum(sums, axis=-2).astype(out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def kernel_dense(x: jax.Array, w: jax.Array, interpret: bool) -> jax.Array:
    """`dense`'s exact sums as the Pallas kernel, in float32; the backward pass is plain XLA
    dots (exact mode promises the forward's bits, not the gradient's)."""
    from minirl.modeling.exact_kernels import group_sums

    experts = math.prod(w.shape[:-2])  # 1: a 2-D w
    out = group_sums(*chunk_layout(x, w), experts, interpret)  # [E, ..., O] float32
    return out[0] if w.ndim == 2 else tree_sum(out, axis=0)


def kernel_dense_bwd(interpret, residuals, dy):
    x, w = residuals
    rows = (x.reshape(*dy.shape[:-1], -1), w.reshape(-1, w.shape[-1]))
    dx, dw = _fast_dense_bwd(x.dtype, rows, dy)
    return dx.reshape(x.shape), dw.reshape(w.shape)


kernel_dense.defvjp(
    lambda x, w, interpret: (kernel_dense(x, w, interpret), (x, w)), kernel_dense_bwd
)


def kernel_mode() -> str:
    """How exact dense products run, from $MINIRL_EXACT_KERNEL (read when a function traces):
    "xla" (the chunked XLA dots: row-invariant on the CPU), "pallas" (the kernel, for a GPU,
    whose matmul library picks its blocking from the row count), "interpret" (the kernel run
    through XLA: the CPU tests), or "auto" (the default): "pallas" on a GPU, else "xla"."""
    mode = os.environ.get(KERNEL_ENV, "auto")
    if mode == "auto":
        return "pallas" if jax.default_backend() in ("gpu", "cuda", "rocm") else "xla"
    if mode not in ("xla", "pallas", "interpret"):
        raise ValueError(f"${KERNEL_ENV} must be auto, xla, pallas or interpret, got {mode!r}")
    return mode


def chunking(i: int) -> tuple[int, int, int]:
    """(groups G, chunks per group n, chunk size C) of an exact contraction over `i` elements:
    G = gcd(i, GROUPS) equal groups, each cut into n chunks of C = 32 elements (16 for a group
    of at most 16: sizes a GPU dot accepts), zero-padded to n * C. At least two chunks: with
    one, XLA drops the chunk axis and a single row takes a matrix-vector kernel."""
    g = math.gcd(i, GROUPS)
    c = 16 if i // g <= 16 else CHUNK
    return g, max(-(-(i // g) // c), 2 // g), c


def chunk_layout(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """x [..., I], w [I, O] cut by `chunking(I)`: [..., G, n, C] and [G, n, C, O]. A 3-D w
    [E, F, O] (x [..., E, F]): each expert cut by `chunking(F)`, [..., E*G, n, C], [E*G, n, C, O]."""
    i, o = w.shape[-2:]
    g, n, c = chunking(i)
    groups = math.prod(w.shape[:-2]) * g
    rows = x.shape[: x.ndim - w.ndim + 1]
    xc = _pad_axis(x.reshape(*rows, groups, i // g), -1, n * c)
    wc = _pad_axis(w.reshape(groups, i // g, o), 1, n * c)
    return xc.reshape(*rows, groups, n, c), wc.reshape(groups, n, c, o)


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
        return _decode_attention(q, k, v, visible)
    k, v = k.astype(q.dtype), v.astype(q.dtype)
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


def _decode_attention(q, k, v, visible):
    """`attention` for one query per row (T == 1: a decode step), in the cache's own layout.

    Same maths, but the [B, S, K, Dh] cache is read as stored (never transposed or upcast
    whole), no small batched dot is used, and every sum is the pairwise tree in both modes: the
    fastest form on XLA CPU (jnp.sum over S, the minor-axis reduce and the batched dot were
    1.4-3x slower: docs/engine.md). Probabilities round to q's dtype as in the general path, so
    in exact mode the two are bitwise equal (tests/inference/test_engine.py checks it).
    """
    scale = q.shape[-1] ** -0.5
    q1 = q[:, 0].astype(jnp.float32)  # [B, K, G, Dh]
    scores = tree_sum(k.astype(jnp.float32)[:, :, :, None, :] * q1[:, None], -1)  # [B, S, K, G]
    scores = jnp.where(visible[:, 0, :, None, None], fusion_barrier(scores * scale), NEG)
    m = jnp.max(scores, axis=1, keepdims=True)
    e = jnp.exp(fusion_barrier(scores - m))
    probs = (e / tree_sum(e, 1)[:, None]).astype(q.dtype)
    weighted = probs[..., None].astype(jnp.float32) * v.astype(jnp.float32)[:, :, :, None, :]
    out = tree_sum(weighted, 1)  # [B, K, G, Dh]
    return out[:, None].astype(q.dtype)  # [B, 1, K, G, Dh]
