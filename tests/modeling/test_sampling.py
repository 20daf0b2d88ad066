"""minirl/modeling/sampling.py: truncation by hand-computed values, sampling frequencies, key determinism,
and the shared log-prob function with the engine's truncation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from minirl.modeling.model import token_logprobs
from minirl.modeling.sampling import (
    NEG,
    Sampling,
    first_argmax,
    prefix_sum,
    request_ids,
    sample_tokens,
    token_keys,
    truncate_logits,
)


def kept(z):
    return np.asarray(z) > NEG / 2


@pytest.mark.parametrize("exact", [False, True])
def test_top_k_keeps_the_k_largest_and_ties(exact):
    z = jnp.array([[1.0, 5.0, 3.0, 4.0, 2.0]])
    assert kept(truncate_logits(z, top_k=2, exact=exact)).tolist() == [
        [False, True, False, True, False]
    ]
    ties = jnp.array([[1.0, 3.0, 3.0, 2.0]])  # k=1 with a tie at the top keeps both
    assert kept(truncate_logits(ties, top_k=1, exact=exact)).tolist() == [
        [False, True, True, False]
    ]
    out = truncate_logits(z, top_k=2, exact=exact)
    assert float(out[0, 1]) == 5.0 and float(out[0, 3]) == 4.0  # kept logits are untouched


@pytest.mark.parametrize("exact", [False, True])
def test_top_p_keeps_the_smallest_set_reaching_p(exact):
    probs = np.array([0.15, 0.5, 0.05, 0.3])
    z = jnp.log(jnp.array([probs], jnp.float32))
    # sorted: 0.5, 0.3, 0.15, 0.05; mass strictly before each: 0, 0.5, 0.8, 0.95
    assert kept(truncate_logits(z, top_p=0.4, exact=exact)).tolist() == [
        [False, True, False, False]
    ]
    assert kept(truncate_logits(z, top_p=0.7, exact=exact)).tolist() == [[False, True, False, True]]
    assert kept(truncate_logits(z, top_p=0.9, exact=exact)).tolist() == [[True, True, False, True]]
    assert kept(truncate_logits(z, top_p=0.99, exact=exact)).all()
    # top-k first, then top-p over the renormalised survivors: top-2 = {0.5, 0.3} -> 0.625, 0.375
    both = truncate_logits(z, top_k=2, top_p=0.6, exact=exact)
    assert kept(both).tolist() == [[False, True, False, False]]


def test_logprobs_are_under_the_truncated_renormalised_distribution():
    probs = np.array([0.15, 0.5, 0.05, 0.3])
    logits = jnp.log(jnp.array([[probs, probs]], jnp.float32))  # [1, 2, V]
    targets = jnp.array([[1, 3]])
    for exact in (False, True):
        lp = np.asarray(token_logprobs(logits, targets, Sampling(1.0, 0, 0.7, exact)))
        np.testing.assert_allclose(lp, np.log([[0.5 / 0.8, 0.3 / 0.8]]), rtol=1e-6)
        lp = np.asarray(token_logprobs(logits, targets, Sampling(2.0, 2, exact=exact)))
        tempered = probs**0.5  # temperature 2 on log-probs
        np.testing.assert_allclose(
            lp, np.log([[tempered[1], tempered[3]]] / (tempered[1] + tempered[3])), rtol=1e-6
        )
    # a token outside the kept set gets a finite, hugely negative log-prob (no nan)
    lp = token_logprobs(logits, jnp.array([[2, 2]]), Sampling(1.0, top_k=2))
    assert np.all(np.isfinite(lp)) and np.all(np.asarray(lp) < -1e29)


def test_token_logprobs_without_truncation_is_unchanged():
    logits = jax.random.normal(jax.random.key(0), (2, 3, 11))
    targets = jax.random.randint(jax.random.key(1), (2, 3), 0, 11)
    ref = jnp.take_along_axis(jax.nn.log_softmax(logits / 0.7), targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(
        token_logprobs(logits, targets, Sampling(0.7)), ref, rtol=1e-6, atol=1e-6
    )


@pytest.mark.gpu
def test_exact_prefix_sum_is_a_cumsum_and_batch_invariant():
    x = jax.random.uniform(jax.random.key(0), (37, 100))
    out = jax.jit(lambda x: prefix_sum(x, True))(x)
    np.testing.assert_allclose(out, np.cumsum(np.asarray(x, np.float64), -1), rtol=1e-5)
    row = jax.jit(lambda x: prefix_sum(x, True))(x[5:6])
    assert (np.asarray(row) == np.asarray(out[5:6])).all()


def test_sampling_frequencies_match_the_truncated_distribution():
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    n = 20000
    logits = jnp.broadcast_to(jnp.log(jnp.array(probs, jnp.float32)), (n, 4))
    ids = jnp.asarray(np.stack([request_ids(u, 0) for u in range(n)]))
    keys = token_keys(jnp.uint32(7), ids, jnp.zeros(n, jnp.int32))
    toks = np.asarray(
        jax.jit(lambda k, z: sample_tokens(k, z, Sampling(1.0, top_k=3)))(keys, logits)
    )
    freq = np.bincount(toks, minlength=4) / n
    expect = np.array([0.4, 0.3, 0.2, 0.0]) / 0.9
    sigma = np.sqrt(expect * (1 - expect) / n)
    assert freq[3] == 0.0
    assert np.all(np.abs(freq - expect) <= 4 * sigma + 1e-12), (freq, expect)


def test_greedy_is_argmax():
    logits = jnp.array([[0.1, 2.0, -1.0], [3.0, 3.5, 0.0]])
    keys = token_keys(jnp.uint32(0), jnp.zeros((2, 3), jnp.uint32), jnp.zeros(2, jnp.int32))
    assert sample_tokens(keys, logits, Sampling(0.0)).tolist() == [1, 1]


@pytest.mark.parametrize("vocab", [3, 64, 65, 1000])
def test_first_argmax_is_argmax_ties_and_extremes_included(vocab):
    rng = np.random.default_rng(vocab)
    x = rng.integers(0, 3, (6, vocab)).astype(np.float32)  # many ties: the first index wins
    x[1] = -np.inf  # every logit -inf: index 0, as jnp.argmax
    x[2] = NEG  # every logit truncated
    x[3, -1] = 9.0  # the maximum in the last (padded) block
    x[4, 0] = 9.0
    x[5] = rng.standard_normal(vocab)
    want = np.asarray(jnp.argmax(jnp.asarray(x), axis=-1))
    assert np.asarray(jax.jit(first_argmax)(jnp.asarray(x))).tolist() == want.tolist()


@pytest.mark.parametrize("rows", [1, 3, 6, 16])  # 1 row; 1 block of 3; 2 of 3; 4 of 4
def test_sample_tokens_draws_what_jax_random_categorical_draws(rows):
    """Gumbel-max written out (blocks of rows, a fast argmax) keeps every token of the
    library's own `jax.random.categorical`."""
    logits = jnp.asarray(np.random.default_rng(rows).standard_normal((rows, 5000)) * 3)
    ids = jnp.asarray(np.stack([request_ids(u, 1) for u in range(rows)]))
    keys = token_keys(jnp.uint32(3), ids, jnp.arange(rows, dtype=jnp.int32))
    ours = jax.jit(lambda k, z: sample_tokens(k, z, Sampling(0.7, top_p=0.9)))(keys, logits)
    z = truncate_logits(logits / 0.7, top_p=0.9)
    assert ours.tolist() == jax.vmap(jax.random.categorical)(keys, z).tolist()


def test_keys_depend_on_ids_only_not_on_batch_position():
    ids = jnp.asarray(np.stack([request_ids(u, s) for u, s in [(3, 0), (3, 1), (2**40 + 5, 0)]]))
    pos = jnp.array([0, 4, 9])
    keys = jax.random.key_data(token_keys(jnp.uint32(1), ids, pos))
    perm = jnp.array([2, 0, 1])
    permuted = jax.random.key_data(token_keys(jnp.uint32(1), ids[perm], pos[perm]))
    assert (np.asarray(permuted) == np.asarray(keys)[np.asarray(perm)]).all()
    alone = jax.random.key_data(token_keys(jnp.uint32(1), ids[1:2], pos[1:2]))
    assert (np.asarray(alone) == np.asarray(keys[1:2])).all()
    assert len({tuple(np.asarray(k).tolist()) for k in keys}) == 3
    other_seed = jax.random.key_data(token_keys(jnp.uint32(2), ids, pos))
    assert not (np.asarray(other_seed) == np.asarray(keys)).all()


def test_request_ids_split_64_bit_uids():
    assert request_ids(2**40 + 5, 7).tolist() == [256, 5, 7]
    assert request_ids(-1, 0).tolist() == [2**32 - 1, 2**32 - 1, 0]
