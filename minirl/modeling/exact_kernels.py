"""Exact mode's dense product as a Pallas kernel: batch-invariant on a GPU, the CPU's bits in tests.

Why: on a GPU, XLA hands every dot to a matmul library (cuBLAS, cuBLASLt) that picks its tiling,
split-K and even its algorithm from the shapes, the row count M included, so the chunked dots of
minirl/modeling/exact.py are not enough there: a decode step and a training forward would sum a
chunk's products in different orders (VeXact; He 2025, "Defeating nondeterminism in LLM
inference"). This kernel fixes every choice itself:

    grid     one program per (expert, BLOCK_ROWS rows, BLOCK_COLS columns) tile of the output;
             a row's result never depends on which other rows share its tile or how many
             tiles there are (rows are padded to whole tiles with zeros)
    inside   the contraction walked exactly as `exact.chunking` cuts it: for each of the G groups,
             chunk dots of C elements in float32 (HIGHEST: no TF32), added in order; then the
             G group sums added in `exact.tree_sum`'s pairwise tree

so the additions happen in one fixed order for every row, every batch and every layout, and it is
the order of exact.py's XLA path: on the CPU, Pallas's interpret mode (`interpret=True`) runs this
same kernel through XLA and gives exactly the XLA path's bits (tests/modeling/test_exact_kernels.py
compares them with ==). `exact.dense` selects the kernel on a GPU backend (`exact.use_kernel`).

The backward pass of the training forward is ordinary XLA dots (`jax.custom_vjp`): exact mode
promises the forward's bits (log-probs), not the gradient's.

Simplified on purpose (and unmeasured here: this repository's CI has no GPU; the `gpu` tests say
what to check): the Triton backend (`jax.experimental.pallas.triton`) with fixed, untuned tiles;
float32 products on the CUDA cores even for bf16 weights; norms, softmax and attention stay in
XLA (their exact forms are elementwise adds in a fixed tree, which no library reorders). Under a
device mesh, XLA cannot split a custom kernel: it gathers the kernel's operands, so each device
computes the whole product — bitwise the same on any layout, without the layout's saving. TPUs
keep the XLA path (Mosaic wants 128-lane-aligned chunks).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from minirl.modeling import exact

BLOCK_ROWS = 16  # output rows per program (a GPU dot needs >= 16)
BLOCK_COLS = 32  # output columns per program


def _kernel(x_ref, w_ref, o_ref, *, groups: int, chunks: int, width: int):
    """One output tile: x_ref [BLOCK_ROWS, G*n*C], w_ref [G*n*C, BLOCK_COLS] -> o_ref, float32."""

    def chunk(k):  # chunk k's dot: [BLOCK_ROWS, C] @ [C, BLOCK_COLS], rounded on its own
        at = pl.ds(k * width, width)
        x, w = x_ref[:, at].astype(jnp.float32), w_ref[at, :].astype(jnp.float32)
        part = jnp.dot(
            x, w, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32
        )
        return exact.fusion_barrier(part)

    sums = []
    for g in range(groups):  # static: at most exact.GROUPS per expert
        first = g * chunks
        add = lambda k, acc, first=first: acc + chunk(first + k)  # noqa: E731
        sums.append(jax.lax.fori_loop(1, chunks, add, chunk(first)))  # left to right
    while len(sums) > 1:  # exact.tree_sum's pairs (G is a power of two)
        sums = [a + b for a, b in zip(sums[0::2], sums[1::2], strict=True)]
    o_ref[...] = sums[0]


def _pad_rows(x: jax.Array, axis: int, block: int) -> jax.Array:
    pad = -x.shape[axis] % block
    return (
        x if not pad else jnp.pad(x, [(0, pad if a == axis % x.ndim else 0) for a in range(x.ndim)])
    )


def _call(x: jax.Array, w: jax.Array, interpret: bool) -> jax.Array:
    """The kernel on `exact.chunk_layout`'s operands: [..., I] @ [I, O] (or experts [E, F, O])
    -> float32 [E, M, O] (E = 1 for a 2-D w), not yet summed over the experts."""
    xc, wc = exact.chunk_layout(x, w)  # [..., S, n, C], [S, n, C, O]
    s, n, c, o = wc.shape
    e = math.prod(w.shape[:-2])  # experts (1: a plain dense)
    g, rows = s // e, xc.shape[:-3]
    m, width = math.prod(rows), g * n * c
    xk = xc.reshape(m, e, width).transpose(1, 0, 2)  # [E, M, G*n*C]: experts lead
    xk = _pad_rows(xk, 1, BLOCK_ROWS)
    wk = _pad_rows(wc.reshape(e, width, o), 2, BLOCK_COLS)  # [E, G*n*C, O]
    grid = (e, xk.shape[1] // BLOCK_ROWS, wk.shape[2] // BLOCK_COLS)
    params = None
    if not interpret:
        from jax.experimental.pallas import triton as pl_triton

        params = pl_triton.CompilerParams(num_warps=4, num_stages=2)
    out = pl.pallas_call(
        functools.partial(_kernel, groups=g, chunks=n, width=c),
        out_shape=jax.ShapeDtypeStruct((e, xk.shape[1], wk.shape[2]), jnp.float32),
        grid=grid,
        in_specs=[
            pl.BlockSpec((None, BLOCK_ROWS, width), lambda k, i, j: (k, i, 0)),
            pl.BlockSpec((None, width, BLOCK_COLS), lambda k, i, j: (k, 0, j)),
        ],
        out_specs=pl.BlockSpec((None, BLOCK_ROWS, BLOCK_COLS), lambda k, i, j: (k, i, j)),
        interpret=interpret,
        compiler_params=params,
        name="minirl_exact_dense",
    )(xk, wk)
    return out[:, :m, :o].reshape(e, *rows, o)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def dense_kernel(x: jax.Array, w: jax.Array, interpret: bool = False) -> jax.Array:
    """`exact.dense(x, w, exact=True)` as the kernel: x [..., I] @ w [I, O] -> [..., O] in x's
    dtype (a 3-D w [E, F, O]: x [..., E, F], the experts' results added in exact.tree_sum's
    tree). `interpret`: run through XLA on any backend (the CPU tests)."""
    out = _call(x, w, interpret)  # [E, ..., O]
    y = out[0] if w.ndim == 2 else exact.tree_sum(out, axis=0)
    return y.astype(x.dtype)


def _forward(x, w, interpret):
    return dense_kernel(x, w, interpret), (x, w)


def _backward(interpret, residuals, dy):
    """Plain XLA dots: dx = dy w^T, dw = x^T dy (over every row); the gradient is not exact."""
    x, w = residuals
    dy = dy.astype(jnp.float32)
    if w.ndim == 2:
        dx = jnp.einsum("...o,io->...i", dy, w.astype(jnp.float32))
        dw = jnp.einsum("...i,...o->io", x.astype(jnp.float32), dy)
    else:
        dx = jnp.einsum("...o,efo->...ef", dy, w.astype(jnp.float32))
        dw = jnp.einsum("...ef,...o->efo", x.astype(jnp.float32), dy)
    return dx.astype(x.dtype), dw.astype(w.dtype)


dense_kernel.defvjp(_forward, _backward)
