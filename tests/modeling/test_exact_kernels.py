"""minirl/modeling/exact_kernels.py: the Pallas kernel of exact mode's dense product.

On the CPU it runs in Pallas's interpret mode and must give exactly the bits of exact.py's XLA
path (== on every shape class: one chunk per group, chains of chunks, an odd contraction, the
experts' 3-D product; float32 and bfloat16), and its hand-written backward the plain product's
gradient. The `gpu` tests run the compiled kernel where JAX sees a GPU (`pytest -m gpu`): rows
alone equal rows in a batch, and the model's exact decode equals its exact forward
(tests/modeling/test_model.py's `test_exact_mode_is_bitwise`, which selects the kernel there)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from minirl.modeling import exact

# (rows, I, O): groups of 8 in one 16-chunk; of 25 in one 32-chunk; of 80 in a chain of three
# 32-chunks; an odd I (one group and a zero chunk); O not a multiple of the column tile.
SHAPES = [((3, 7), 64, 40), ((2, 5), 200, 32), ((9,), 640, 16), ((4,), 37, 20)]


def _both(x, w):
    """(the XLA path's exact dense, the interpreted kernel's float32 sums in x's dtype, as
    `dense` returns them), one compile for both."""
    both = lambda x, w: (exact.dense(x, w, True), exact.kernel_dense(x, w, True).astype(x.dtype))
    return jax.jit(both)(x, w)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_interpreted_kernel_gives_the_xla_paths_bits(dtype):
    rng = np.random.default_rng(0)
    for rows, i, o in SHAPES:
        x = jnp.asarray(rng.standard_normal((*rows, i)), dtype)
        w = jnp.asarray(rng.standard_normal((i, o)) / np.sqrt(i), dtype)
        xla, kernel = _both(x, w)
        assert kernel.dtype == x.dtype and kernel.shape == (*rows, o)
        np.testing.assert_array_equal(np.asarray(kernel, np.float32), np.asarray(xla, np.float32))
    h = jnp.asarray(rng.standard_normal((2, 3, 4, 24)), dtype)  # [B, T, E, F]: 4 experts
    w = jnp.asarray(rng.standard_normal((4, 24, 16)), dtype)
    xla, kernel = _both(h, w)
    np.testing.assert_array_equal(np.asarray(kernel, np.float32), np.asarray(xla, np.float32))


def test_kernel_gradient_is_the_products():
    rng = np.random.default_rng(1)
    x, w = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((5, 64), (64, 8)))
    c = jnp.asarray(rng.standard_normal((5, 8)), jnp.float32)
    ours = jax.jit(jax.grad(lambda x, w: (exact.kernel_dense(x, w, True) * c).sum(), (0, 1)))(x, w)
    plain = jax.grad(lambda x, w: ((x @ w) * c).sum(), (0, 1))(x, w)
    for a, b in zip(ours, plain, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_compiled_kernel_rows_alone_equal_rows_in_a_batch():
    """The batch invariance the kernel exists for, on the accelerator (the CPU's XLA path in the
    default lane): one row, 8 rows, 37 rows and 256 rows give each row the same bits."""
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((256, 896)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((896, 1024)) / 30, jnp.bfloat16)
    f = jax.jit(lambda x, w: exact.dense(x, w, True))
    full = np.asarray(f(x, w), np.float32)
    for rows in (1, 8, 37):
        np.testing.assert_array_equal(np.asarray(f(x[:rows], w), np.float32), full[:rows])
