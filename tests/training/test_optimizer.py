"""Tests for minirl/training/optimizer.py: one AdamW update by hand, the same updates as optax's chain,
the non-finite guard, and an update that copies nothing.

On the first update Adam's bias-corrected moments are g and g^2, so the step direction is
g / (|g| + eps) = sign(g) (plus weight decay on matrices): easy to write down exactly.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from minirl.training.optimizer import AdamW, compiled, transform

SETTINGS = AdamW(b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, max_grad_norm=1.0)


def _params():
    return {"w": jnp.array([[1.0, 2.0], [3.0, 4.0]]), "b": jnp.array([0.5])}


def _grads(scale=1.0):
    return {"w": jnp.array([[3.0, 0.0], [0.0, -4.0]]) * scale, "b": jnp.array([0.0])}


def _bits(tree):
    return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


def test_first_update_by_hand():
    init, update = compiled(SETTINGS)
    params = _params()
    new, state, ok, norm = update((_grads(), jnp.float32(2.0)), init(params), params, 1.0, 0.1)
    assert bool(ok) and float(norm) == pytest.approx(5.0)  # ||(3, -4)||, before clipping
    # clipped g = (0.6, -0.8); direction sign(g) + 0.1 * w on the matrix, 0 where g = 0 and b
    # (no decay on vectors)
    want_w = np.array([[1.0, 2.0], [3.0, 4.0]]) - 0.1 * (
        np.array([[1.0, 0.0], [0.0, -1.0]]) + 0.1 * np.array([[1.0, 2.0], [3.0, 4.0]])
    )
    np.testing.assert_allclose(new["w"], want_w, rtol=1e-6)
    np.testing.assert_array_equal(new["b"], params["b"])
    np.testing.assert_allclose(state[1].mu["w"], 0.1 * np.array([[0.6, 0], [0, -0.8]]), rtol=1e-6)
    # `scale` multiplies the summed gradients before anything else (a mini-batch's share)
    _, _, _, half = update((_grads(), jnp.float32(2.0)), init(params), params, 0.5, 0.1)
    assert float(half) == pytest.approx(2.5)


@pytest.mark.parametrize("clip", [0.0, 1.0])
def test_updates_equal_optax_chain(clip):
    """Three updates (gradients far below, far above and near the clipping norm, scale 0.5)
    equal optax's clip -> scale_by_adam -> add_decayed_weights, scaled by -lr, to rounding."""
    settings = SETTINGS._replace(max_grad_norm=clip)
    init, update = compiled(settings)
    rng = np.random.default_rng(0)
    shapes = {"w": (16, 8), "v": (3, 5, 2), "b": (8,)}
    ours = {k: jnp.asarray(rng.standard_normal(s), jnp.float32) for k, s in shapes.items()}
    ref, ref_state = ours, transform(settings).init(ours)
    state = init(ours)
    for size in (1e-6, 10.0, 0.4):
        grads = {
            k: jnp.asarray(rng.standard_normal(s) * size, jnp.float32) for k, s in shapes.items()
        }
        half = jax.tree.map(lambda g: g * 0.5, grads)  # before the update consumes `grads`
        ours, state, ok, norm = update((grads, jnp.float32(1.0)), state, ours, 0.5, 1e-2)
        direction, ref_state = transform(settings).update(half, ref_state, ref)
        ref = jax.tree.map(lambda p, d: p - 1e-2 * d, ref, direction)
        assert bool(ok) and float(norm) == pytest.approx(float(optax.tree.norm(half)), rel=1e-6)
        got, want = jax.tree.leaves((ours, state)), jax.tree.leaves((ref, ref_state))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("bad", ["loss", "grad"])
def test_nonfinite_input_keeps_everything_bitwise(bad):
    init, update = compiled(SETTINGS)
    params = _params()
    state = update((_grads(), jnp.float32(1.0)), init(params), params, 1.0, 0.1)[1]  # not fresh
    before = _bits((params, state))  # the update consumes (donates) the state it is given
    loss = jnp.float32(np.nan if bad == "loss" else 1.0)
    grads = _grads(np.inf) if bad == "grad" else _grads()
    new, new_state, ok, _ = update((grads, loss), state, params, 1.0, 0.1)
    assert not bool(ok)
    assert len(jax.tree.leaves((new, new_state))) == 2 + 5  # w, b; count, mu (w, b), nu (w, b)
    assert _bits((new, new_state)) == before


def test_update_writes_in_place_and_copies_nothing():
    """The compiled update aliases every output leaf to a donated input (the new parameters to
    the gradients, the moments to the old moments) and has no copy: what keeps the 0.5B update
    near one pass over its memory (docs/trainer.md)."""
    init, update = compiled(SETTINGS)
    params = {f"w{i}": jnp.ones((64, 32)) for i in range(3)} | {"b": jnp.ones(32)}
    acc = (jax.tree.map(jnp.ones_like, params), jnp.float32(1.0))
    text = update.lower(acc, init(params), params, 1.0, 0.1).compile().as_text()
    entry = text[text.index("ENTRY") :]
    assert not re.search(r"= f32\[\d[^\]]*\]\S* copy\(", entry)  # (scalars may be copied)
    assert text.count("may-alias") >= 3 * len(params)  # params <- gradients, mu, nu in place
    params_out = jax.tree.map(jnp.copy, params)
    state = init(params)
    update((jax.tree.map(jnp.ones_like, params), jnp.float32(1.0)), state, params_out, 1.0, 0.1)
    assert all(x.is_deleted() for x in jax.tree.leaves(state[1].mu))  # donated, not copied
    assert not any(x.is_deleted() for x in jax.tree.leaves(params_out))  # params never donated
