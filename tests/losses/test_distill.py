"""On-policy distillation's advantage part (minirl/losses/distill.py), by hand and by enumeration.

- Hand-computed advantages on a 2-row example: discount 0, 0.5 and 1, a coefficient, mixed with a
  group-normalised reward; the advantage reads log mu (what the engine sampled with), not
  log pi_prox; the clamp C (the objective's) on a teacher log-prob of -1e30; the distill/*
  metrics.
- What the objective optimises: on-policy with discount 1, the expected gradient of the `distill`
  preset's loss, over EVERY sequence of a small autoregressive policy weighted by its
  probability, equals the gradient of the reverse KL(pi_theta || pi_T) computed exactly; with
  discount 0 it does not (the per-token form is biased), so the test can tell them apart.
- The refusals: no teacher log-probs, a sequence-level loss, a coefficient of 0.
(The preset's gradient against the paper form on random off-policy batches, with clipping
active, is in test_loss_presets.py; micro-batch invariance in test_loss_objective.py.)
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from minirl.losses import (
    GroupNorm,
    LossInputs,
    finalize_metrics,
    get_preset,
    make_objective,
    take_rows,
    with_kl_coef,
    with_teacher,
)
from minirl.losses.distill import Distill
from minirl.losses.presets import grpo

L2, L3 = np.log(2.0), np.log(3.0)
A = 0.5 / (np.sqrt(0.5) + 1e-6)  # group_norm of R = (1, 0)


def _example():
    """Row 0: mu = (.5, .25, .8), pi_T = (.25, .5, .8) -> k = (log 2, -log 2, 0); row 1 (two
    tokens): mu = (.1, .2), pi_T = (.3, .2) -> k = (-log 3, 0). pi_prox differs from mu
    everywhere (stale data)."""
    log = lambda *p: np.log(np.array(p, np.float32))
    mask = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
    behav = np.stack([log(0.5, 0.25, 0.8), np.r_[log(0.1, 0.2), -np.inf]])
    teacher = np.stack([log(0.25, 0.5, 0.8), np.r_[log(0.3, 0.2), -np.inf]])
    return LossInputs(
        mask=jnp.asarray(mask),
        prox_logp=jnp.full((2, 3), np.log(0.4), jnp.float32),
        behav_logp=jnp.asarray(behav, jnp.float32),
        rewards=jnp.array([1.0, 0.0]),
        group_ids=jnp.array([0, 0], jnp.int32),
        teacher_logp=jnp.asarray(teacher, jnp.float32),
    )


def _adv(objective, inputs):
    return np.asarray(jax.jit(objective.prepare)(inputs).adv)


def test_hand_computed_advantages():
    inputs = _example()
    close = lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # discount 0: each token's own -(log mu - log pi_T); 0 off the mask
    close(_adv(get_preset("distill"), inputs), [[-L2, L2, 0.0], [L3, 0.0, 0.0]])
    # discount 0.5: t1 = log 2, t0 = -log 2 + 0.5 log 2
    half = with_teacher(get_preset("distill"), 1.0, 0.5)
    close(_adv(half, inputs), [[-0.5 * L2, L2, 0.0], [L3, 0.0, 0.0]])
    # discount 1 and coefficient 2: the whole cost-to-go, doubled
    close(
        _adv(with_teacher(get_preset("distill"), 2.0, 1.0), inputs),
        [[0.0, 2 * L2, 0.0], [2 * L3, 0, 0]],
    )
    # mixed with GRPO's reward advantage (+-0.70711 on every token of the row); no KL term here
    mixed = with_teacher(with_kl_coef(grpo(), 0.0), 1.0, 0.0)
    assert mixed.advantage == Distill(1.0, 0.0, reward=GroupNorm(eps=1e-6))
    close(_adv(mixed, inputs), [[A - L2, A + L2, A], [L3 - A, -A, 0.0]])
    # the same through the run's `make_objective` (rl.loss=grpo, rl.kl_coef=0, rl.distill_coef=1)
    assert make_objective("grpo", 5.0, 0.0, 0.0, 1.0, 0.0) == mixed


def test_the_advantage_reads_behaviour_logprobs_not_the_recompute():
    """log mu is what sampled the tokens; the recompute log pi_prox does not enter the teacher's
    advantage (it enters through the importance weight c only)."""
    inputs = _example()
    moved = inputs.replace(prox_logp=inputs.prox_logp + 0.3)
    objective = get_preset("distill")
    np.testing.assert_array_equal(_adv(objective, inputs), _adv(objective, moved))
    moved_mu = inputs.replace(behav_logp=inputs.behav_logp + 0.3)
    np.testing.assert_allclose(
        _adv(objective, moved_mu) - _adv(objective, inputs), -0.3 * inputs.mask, atol=1e-6
    )


def test_a_teacher_logprob_of_minus_1e30_is_clamped_with_the_objectives_c():
    """Under top-k / top-p a token outside the teacher's set has log pi_T ~ -1e30."""
    inputs = _example()
    inputs = inputs.replace(teacher_logp=inputs.teacher_logp.at[1, 0].set(-1e30))
    assert _adv(get_preset("distill"), inputs)[1, 0] == pytest.approx(-20.0)
    clamped = get_preset("distill", log_ratio_clamp=5.0)
    assert clamped.advantage.clamp == 5.0  # synced with the objective's C
    assert _adv(clamped, inputs)[1, 0] == pytest.approx(-5.0)


def test_distill_metrics_by_hand():
    inputs = _example()
    objective = get_preset("distill")
    prepared = jax.jit(objective.prepare)(inputs)
    logp = jnp.where(inputs.mask > 0, inputs.prox_logp, 0.0)
    rows = (np.array([0]), np.array([1]))
    loss = jax.jit(objective.loss)
    parts = [loss(logp[r], take_rows(prepared, r))[1] for r in rows]
    m = finalize_metrics(parts)
    # k1 of KL(mu || pi_T) over the 5 completion tokens: (log 2 - log 2 + 0 - log 3 + 0) / 5
    assert float(m["distill/reverse_kl"]) == pytest.approx(-L3 / 5, rel=1e-5)
    want = np.log([0.25, 0.5, 0.8, 0.3, 0.2]).mean()
    assert float(m["distill/teacher_logp"]) == pytest.approx(want, rel=1e-5)
    assert "teacher_kl_sum" not in jax.jit(get_preset("dapo").__call__)(inputs, logp)[1]


def test_refusals():
    with pytest.raises(ValueError, match="teacher_logp .* is required"):
        get_preset("distill").prepare(_example().replace(teacher_logp=None))
    with pytest.raises(ValueError, match="sequence-level"):
        with_teacher(get_preset("reinforce"), 1.0)
    with pytest.raises(ValueError, match="coefficient must be finite and > 0"):
        make_objective("distill", 5.0, None, 0.0, 0.0)
    with pytest.raises(ValueError, match="discount must be in"):
        with_teacher(grpo(), 1.0, 1.5)


# ---------------------------------------------------------------- the reverse KL, by enumeration

V, L = 3, 3  # every sequence of 3 tokens from 3 symbols: 27 rows


def _table_logp(table, seqs):
    """log pi(y_t | y_{t-1}) of an autoregressive table policy [L, V + 1, V] (prev V = start)."""
    prev = np.concatenate([np.full((len(seqs), 1), V), seqs[:, :-1]], axis=1)  # [N, L]
    logits = table[jnp.arange(L)[None, :], prev]  # [N, L, V]
    return jnp.take_along_axis(jax.nn.log_softmax(logits), seqs[..., None], -1)[..., 0]


@pytest.mark.parametrize("discount", [1.0, 0.0])
def test_expected_gradient_is_the_reverse_kl_gradient_at_discount_1(discount):
    """KL(pi_theta || pi_T) = sum_y p(y) sum_t (log pi_theta - log pi_T)(y_t): its exact gradient
    against the `distill` preset's gradient, on-policy (mu = pi_prox = pi_theta), averaged over
    every sequence with weight p(y) and scaled by the token mean's normaliser."""
    rng = np.random.default_rng(0)
    theta = jnp.asarray(rng.normal(size=(L, V + 1, V)), jnp.float32)
    teacher = jnp.asarray(rng.normal(size=(L, V + 1, V)), jnp.float32)
    seqs = np.array(list(itertools.product(range(V), repeat=L)), np.int32)  # [27, 3]
    log_t = _table_logp(teacher, seqs)

    def reverse_kl(th):
        lp = _table_logp(th, seqs)
        return (jnp.exp(lp.sum(-1)) * (lp - log_t).sum(-1)).sum()

    mu = _table_logp(theta, seqs)
    inputs = LossInputs(
        mask=jnp.ones((len(seqs), L)),
        prox_logp=mu,
        behav_logp=mu,
        rewards=jnp.zeros(len(seqs)),
        group_ids=jnp.arange(len(seqs), dtype=jnp.int32),
        teacher_logp=log_t,
    )
    objective = with_teacher(get_preset("distill"), 1.0, discount)
    prepared = jax.jit(objective.prepare)(inputs)
    p = jax.lax.stop_gradient(jnp.exp(mu.sum(-1)))  # [27] probability of each sequence

    # sum_y p(y) loss_y(theta): every row's aggregation weight times p(y), times the token mean's
    # normaliser sum n (Agg is a constant of phase 1, so this weights each row's share of the loss)
    weighted = prepared.replace(weight=prepared.weight * p[:, None] * seqs.size)
    expected_loss = lambda th: objective.loss(_table_logp(th, seqs), weighted)[0]

    want = jax.jit(jax.grad(reverse_kl))(theta)
    got = jax.jit(jax.grad(expected_loss))(theta)
    assert float(jnp.abs(want).max()) > 0.05
    if discount == 1.0:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    else:  # the per-token form drops the cost of later tokens: a different direction
        assert float(jnp.abs(got - want).max()) > 0.05
