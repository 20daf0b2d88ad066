"""Tests for minirl/optimizer.py: one AdamW update by hand, and the non-finite guard.

On the first update Adam's bias-corrected moments are g and g^2, so the step direction is
g / (|g| + eps) = sign(g) (plus weight decay on matrices): easy to write down exactly.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from minirl.optimizer import AdamW, compiled

SETTINGS = AdamW(b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, max_grad_norm=1.0)


def _params():
    return {"w": jnp.array([[1.0, 2.0], [3.0, 4.0]]), "b": jnp.array([0.5])}


def _grads(scale=1.0):
    return {"w": jnp.array([[3.0, 0.0], [0.0, -4.0]]) * scale, "b": jnp.array([0.0])}


def test_first_update_by_hand():
    init, update = compiled(SETTINGS)
    params = _params()
    new, state, ok, norm = update(params, init(params), (_grads(), jnp.float32(2.0)), 1.0, 0.1)
    assert bool(ok) and float(norm) == pytest.approx(5.0)  # ||(3, -4)||, before clipping
    # clipped g = (0.6, -0.8); direction sign(g) + 0.1 * w on the matrix, 0 where g = 0 and b
    # (no decay on vectors)
    want_w = np.array([[1.0, 2.0], [3.0, 4.0]]) - 0.1 * (
        np.array([[1.0, 0.0], [0.0, -1.0]]) + 0.1 * np.array([[1.0, 2.0], [3.0, 4.0]])
    )
    np.testing.assert_allclose(new["w"], want_w, rtol=1e-6)
    np.testing.assert_array_equal(new["b"], params["b"])
    # `scale` multiplies the summed gradients before anything else (a mini-batch's share)
    _, _, _, half = update(params, init(params), (_grads(), jnp.float32(2.0)), 0.5, 0.1)
    assert float(half) == pytest.approx(2.5)


@pytest.mark.parametrize("bad", ["loss", "grad"])
def test_nonfinite_input_keeps_everything_bitwise(bad):
    init, update = compiled(SETTINGS)
    params = _params()
    state = update(params, init(params), (_grads(), jnp.float32(1.0)), 1.0, 0.1)[1]  # not fresh
    loss = jnp.float32(np.nan if bad == "loss" else 1.0)
    grads = _grads(np.inf) if bad == "grad" else _grads()
    new, new_state, ok, _ = update(params, state, (grads, loss), 1.0, 0.1)
    assert not bool(ok)
    got, want = jax.tree.leaves((new, new_state)), jax.tree.leaves((params, state))
    assert len(got) == len(want) == 2 + 5  # params w, b; state: count, mu (w, b), nu (w, b)
    for g, w in zip(got, want, strict=True):
        assert np.asarray(g).tobytes() == np.asarray(w).tobytes()
