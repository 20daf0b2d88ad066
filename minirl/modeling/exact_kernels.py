"""Exact mode's dense product as a Pallas kernel: batch-invariant on a GPU, the CPU's bits in tests.

A GPU's matmul library picks tiling, split-K and algorithm from the shapes, the row count
included (VeXact; He 2025, "Defeating nondeterminism in LLM inference"). Here all is fixed: one
program per (expert, BLOCK_ROWS, BLOCK_COLS) output tile, rows zero-padded to whole tiles, and
inside it exact.dense's order: per group, float32 chunk dots added in order, then the groups in
exact.tree_sum's tree. Pallas's interpret mode runs it through XLA on the CPU with exactly the XLA
path's bits (tests/modeling/test_exact_kernels.py). Simplified, and unmeasured here (no GPU in
CI; `pytest -m gpu` checks it): Triton backend, fixed untuned tiles, float32 products for bf16
too; norms and softmax stay in XLA (fixed elementwise trees). XLA cannot split a custom kernel
over a mesh: it gathers the operands, so each device computes the whole product, same bits.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK_ROWS = 16  # output rows per program (a GPU dot needs >= 16)
BLOCK_COLS = 32  # output columns per program


def _kernel(x_ref, w_ref, o_ref, *, groups: int, chunks: int, width: int):
    """One tile: x_ref [BLOCK_ROWS, G*n*C], w_ref [G*n*C, BLOCK_COLS] -> o_ref float32."""

    def chunk(k):  # chunk k's dot, rounded on its own (no fused multiply-add across chunks)
        at = pl.ds(k * width, width)
        x, w = x_ref[:, at].astype(jnp.float32), w_ref[at, :].astype(jnp.float32)
        part = jnp.dot(
            x, w, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32
        )
        return jnp.where(jnp.isnan(part), jnp.nan, part)  # exact.fusion_barrier

    sums = []
    for g in range(groups):  # static: at most exact.GROUPS
        add = lambda k, acc, first=g * chunks: acc + chunk(first + k)  # noqa: E731
        sums.append(jax.lax.fori_loop(1, chunks, add, chunk(g * chunks)))  # left to right
    while len(sums) > 1:  # exact.tree_sum's neighbours (G is a power of two)
        sums = [a + b for a, b in zip(sums[0::2], sums[1::2], strict=True)]
    o_ref[...] = sums[0]


def _padded(x: jax.Array, axis: int, block: int) -> jax.Array:
    widths = [(0, -x.shape[axis] % block if a == axis else 0) for a in range(x.ndim)]
    return jnp.pad(x, widths)


def group_sums(xc: jax.Array, wc: jax.Array, experts: int, interpret: bool) -> jax.Array:
    """exact.chunk_layout's operands xc [..., E*G, n, C], wc [E*G, n, C, O] -> float32
    [E, ..., O]: each expert's sum over its G groups (the caller adds the experts)."""
    s, n, c, o = wc.shape
    g, rows = s // experts, xc.shape[:-3]
    m, width = math.prod(rows), g * n * c
    xk = _padded(xc.reshape(m, experts, width).transpose(1, 0, 2), 1, BLOCK_ROWS)  # [E, M, K]
    wk = _padded(wc.reshape(experts, width, o), 2, BLOCK_COLS)  # [E, K, O]
    params = None
    if not interpret:
        from jax.experimental.pallas import triton as pl_triton

        params = pl_triton.CompilerParams(num_warps=4, num_stages=2)
    out = pl.pallas_call(
        functools.partial(_kernel, groups=g, chunks=n, width=c),
        out_shape=jax.ShapeDtypeStruct((experts, xk.shape[1], wk.shape[2]), jnp.float32),
        grid=(experts, xk.shape[1] // BLOCK_ROWS, wk.shape[2] // BLOCK_COLS),
        in_specs=[
            pl.BlockSpec((None, BLOCK_ROWS, width), lambda e, i, j: (e, i, 0)),
            pl.BlockSpec((None, width, BLOCK_COLS), lambda e, i, j: (e, 0, j)),
        ],
        out_specs=pl.BlockSpec((None, BLOCK_ROWS, BLOCK_COLS), lambda e, i, j: (e, i, j)),
        interpret=interpret,
        compiler_params=params,
        name="minirl_exact_dense",
    )(xk, wk)
    return out[:, :m, :o].reshape(experts, *rows, o)
