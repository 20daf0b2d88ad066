"""The LM head in chunks (minirl/modeling/chunked_logprobs.py): the same log-probs, entropies and
gradients as the whole [B, T, V] logits at once — bitwise in exact mode (chunks of positions),
within stated bounds on the fast path (slices of the vocabulary under a custom VJP) — and no
logits-sized buffer in the compiled forward or backward.

One small shape ([3, 11] positions, D 16, V 64) for the numbers; budgets of 5 positions' logits
(exact: three chunks of positions, the last one padded; fast: four slices of 16 ids, the
narrowest), 24 (fast: two slices of 31 ids and one of 2) and 32 (one of 41, one of 23); the
untied head [D, V] and the tied embedding [V, D].
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from minirl.modeling.chunked_logprobs import chunk_positions, head_logprobs
from minirl.modeling.sampling import Sampling

B, T, D, V = 3, 11, 16, 64
SAMPLINGS = {
    "fast": Sampling(0.7),
    "fast top-k top-p": Sampling(0.7, top_k=8, top_p=0.9),
    "exact": Sampling(0.7, exact=True),
}
FAST_TOL = 1e-6  # |log-prob or entropy difference| allowed on the fast path, plus FAST_TOL x
# its size (an online log-sum-exp over slices rounds differently: measured <= 1.4e-6 at -2.2)
GRAD_RTOL = 1e-6  # max |gradient difference| / max |gradient|, per argument (measured: <= 3e-7)


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(D, V)) * 0.5, jnp.float32)
    targets = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    return hidden, head, targets


def _run(sampling, tied, chunk, hidden, head, targets):
    fn = jax.jit(lambda x, h: head_logprobs(x, h, targets, sampling, chunk, True, tied))
    return fn(hidden, head.T if tied else head)


@pytest.mark.parametrize("name", list(SAMPLINGS))
@pytest.mark.parametrize("tied", [False, True])
def test_chunks_give_the_unchunked_logprobs_and_entropies(inputs, name, tied):
    sampling = SAMPLINGS[name]
    want_logp, want_ent = _run(sampling, False, 0, *inputs)  # the untied head, all at once
    assert want_logp.shape == want_ent.shape == (B, T) and (want_logp < 0).all()
    for chunk in (5, 24, 32):
        logp, ent = _run(sampling, tied, chunk, *inputs)
        if sampling.exact:
            np.testing.assert_array_equal(
                np.asarray(logp).view(np.uint32), np.asarray(want_logp).view(np.uint32)
            )
        else:
            np.testing.assert_allclose(logp, want_logp, rtol=FAST_TOL, atol=FAST_TOL)
        np.testing.assert_allclose(ent, want_ent, rtol=FAST_TOL, atol=FAST_TOL)


@pytest.mark.parametrize("name", ["fast", "exact"])
def test_chunks_give_the_unchunked_gradients(inputs, name):
    """d/d(hidden, head) of a weighted sum of log-probs plus an entropy bonus: fp32 within
    GRAD_RTOL of the whole-logits gradient, both arguments."""
    sampling, (hidden, head, targets) = SAMPLINGS[name], inputs
    weights = jnp.linspace(-1.0, 2.0, B * T).reshape(B, T)

    def loss(x, h, chunk):
        logp, ent = head_logprobs(x, h, targets, sampling, chunk, entropy=True)
        return jnp.sum(weights * logp) + 0.3 * jnp.sum(ent)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
    want = grad(hidden, head, 0)
    for chunk in (5, 24):  # whole slices only; a last, narrower one
        for got, ref in zip(grad(hidden, head, chunk), want, strict=True):
            assert float(jnp.abs(ref).max()) > 0.1  # a real gradient
            assert float(jnp.abs(got - ref).max() / jnp.abs(ref).max()) <= GRAD_RTOL


@pytest.mark.parametrize("name", ["fast", "fast top-k top-p"])
def test_no_logits_sized_buffer_forward_or_backward(name):
    """The compiled value-and-gradient holds less scratch memory than ONE [N, V] logits array
    with a budget of 16 positions' logits (fast: slices of 455 ids, their logits and head rows
    within it; truncated sampling: chunks of 16 positions); all at once it holds at least two (so this test can fail)."""
    n, d, v = 256, 32, 8192
    logits_bytes = n * v * 4  # 8 MiB
    x = jax.ShapeDtypeStruct((4, n // 4, d), jnp.float32)
    w = jax.ShapeDtypeStruct((v, d), jnp.float32)  # tied: the embedding
    t = jax.ShapeDtypeStruct((4, n // 4), jnp.int32)

    def temp_bytes(chunk):
        def loss(x, w, t):
            logp, ent = head_logprobs(x, w, t, SAMPLINGS[name], chunk, entropy=True, tied=True)
            return jnp.sum(logp) + jnp.sum(ent)

        fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
        return fn.lower(x, w, t).compile().memory_analysis().temp_size_in_bytes

    assert temp_bytes(16) < logits_bytes
    assert temp_bytes(0) >= 2 * logits_bytes


def test_chunk_positions_follow_the_budget():
    assert chunk_positions(151_936, 64) == 110  # 64 MiB / (4 B x 151,936) = 110.4
    assert chunk_positions(300, 64) == 55_924  # a small vocabulary: any micro-batch at once
    assert chunk_positions(151_936, 0.001) == 1  # at least one position
    assert chunk_positions(151_936, 0) == 0  # 0: no chunks


def test_a_prefill_computes_the_last_positions_logits_only():
    """The rollout engine's prefill (`model(..., last_only=True)`, minirl/inference/decoding.py)
    never holds the [R, T, V] logits either: its scratch and output memory together stay under
    one such array, which the same call for every position returns."""
    from flax import nnx

    from minirl.modeling.model import KVCache, ModelConfig, abstract_model

    cfg = ModelConfig(vocab_size=8192, dim=32, num_layers=1, num_heads=2, head_dim=16, mlp_dim=64)
    rows, t = 4, 64
    graphdef, params = abstract_model(cfg)
    tokens = jax.ShapeDtypeStruct((rows, t), jnp.int32)

    def held_bytes(last_only):
        def prefill(params, tokens):
            model = nnx.merge(graphdef, params)
            cache = KVCache.zeros(cfg, rows, t)
            return model(tokens, cache=cache, num_new=jnp.full((rows,), t - 3), last_only=last_only)

        memory = jax.jit(prefill).lower(params, tokens).compile().memory_analysis()
        return memory.temp_size_in_bytes + memory.output_size_in_bytes  # logits and KV cache

    logits_bytes = rows * t * cfg.vocab_size * 4  # 8 MiB
    assert held_bytes(True) < logits_bytes / 10 and held_bytes(False) > logits_bytes


def test_bf16_hidden_states_keep_their_dtypes_and_the_unchunked_gradient(inputs):
    """A bf16 model (float32 master head, bf16 hidden states: `model.dtype=bfloat16`): the
    vocabulary slices' custom VJP returns each gradient in its argument's dtype, equal to the
    whole-logits gradient within GRAD_RTOL (measured: 0 for the hidden states, 9e-8 the head)."""
    hidden, head, targets = inputs
    hidden = hidden.astype(jnp.bfloat16)

    def loss(x, w, chunk):
        logp, ent = head_logprobs(x, w, targets, SAMPLINGS["fast"], chunk, True, tied=True)
        return jnp.sum(logp) + 0.3 * jnp.sum(ent)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
    for got, ref in zip(grad(hidden, head.T, 5), grad(hidden, head.T, 0), strict=True):
        assert got.dtype == ref.dtype
        got, ref = got.astype(jnp.float32), ref.astype(jnp.float32)
        assert float(jnp.abs(got - ref).max() / jnp.abs(ref).max()) <= GRAD_RTOL
