"""The two-phase contract: micro-batch invariance, summable metrics, and robustness.

- Splitting the rows of a prepared batch into 2, 3 or 5 uneven micro-batches (or an arbitrary
  shuffled partition) gives the same summed loss, the same gradient and the same finalized
  metrics as one full-batch call.
- Property tests (hypothesis, few examples): huge log-ratios, -inf/nan/1e30 garbage off the mask,
  equal rewards, singleton groups and all-masked rows never produce nan/inf in the loss, its
  gradient or the metrics — for every preset, including TIS/rejection variants and a critic.
- A non-finite current log-prob AT a counted token has the same outcome for every registered
  preset: a finite loss and gradient, the token read at its clamped log-ratio, with no gradient.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minirl.losses import (
    Entropy,
    LossInputs,
    finalize_metrics,
    get_preset,
    list_presets,
    merge_metrics,
    take_rows,
    with_rejection,
)
from minirl.losses.advantages import GAE
from minirl.losses.presets import decoupled_ppo, with_tis

# micro-batch row counts drawn from {1, 2, 3, 5} (+ the full 8): few shapes, few compiles
SPLITS = {
    "2 uneven": [np.arange(0, 3), np.arange(3, 8)],
    "3 uneven": [np.arange(0, 1), np.arange(1, 3), np.arange(3, 8)],
    "5 uneven": [np.arange(0, 2), np.array([2]), np.array([3]), np.arange(4, 7), np.array([7])],
    "shuffled": [np.array([5, 0, 7]), np.array([1, 2, 3, 4, 6])],
}

INVARIANCE_PRESETS = {
    "grpo": lambda: get_preset("grpo"),
    "dr_grpo": lambda: get_preset("dr_grpo"),
    "reinforce": lambda: get_preset("reinforce"),
    "reinforce_pp": lambda: get_preset("reinforce_pp"),
    "cispo": lambda: get_preset("cispo", regularizers=(Entropy(0.01),)),
    "gspo": lambda: get_preset("gspo"),
    "decoupled_ppo_tis_mis": lambda: with_rejection(
        with_tis(decoupled_ppo()), token=(0.6, 1.8), sequence=("mean_k1", 0.12)
    ),
    "ppo_gae": lambda: get_preset("ppo", advantage=GAE(gamma=0.9, lam=0.8)),
}


@pytest.mark.parametrize("name", list(INVARIANCE_PRESETS))
def test_micro_batches_give_the_full_batch_loss_gradient_and_metrics(name, batch_maker):
    objective = INVARIANCE_PRESETS[name]()
    inputs, logp = batch_maker(seed=4, log_ratio_scale=0.5)
    entropy = jnp.abs(logp) * 0.5 if objective.needs_entropy else None
    prepared = jax.jit(objective.prepare)(inputs)

    @jax.jit
    def loss_and_grad(lp, p, h):
        f = lambda lp: objective.loss(lp, p, entropy=h)
        (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(lp)
        return loss, metrics, grad

    rows_of = lambda x, rows: None if x is None else x[rows]
    full_loss, full_metrics, full_grad = loss_and_grad(logp, prepared, entropy)
    full = finalize_metrics(full_metrics)
    assert float(jnp.abs(full_grad).max()) > 1e-3
    for split, parts in SPLITS.items():
        total, grad, slices = 0.0, np.zeros(logp.shape, np.float32), []
        for rows in parts:
            part = take_rows(prepared, rows)
            part_loss, part_metrics, part_grad = loss_and_grad(
                logp[rows], part, rows_of(entropy, rows)
            )
            grad[rows] = np.asarray(part_grad)
            total += float(part_loss)
            slices.append(part_metrics)
        np.testing.assert_allclose(total, float(full_loss), rtol=1e-5, atol=1e-6, err_msg=split)
        np.testing.assert_allclose(grad, full_grad, rtol=1e-5, atol=1e-7, err_msg=split)
        merged = finalize_metrics(merge_metrics(slices))
        assert merged.keys() == full.keys()
        for k in full:
            np.testing.assert_allclose(
                merged[k], full[k], rtol=1e-5, atol=1e-6, err_msg=f"{split}: {k}"
            )
    if name == "decoupled_ppo_tis_mis":  # the split must cut across rejected rows too
        assert 0 < float(full["rejected_sequence_fraction"]) < 1


def test_finalize_accepts_a_list_and_merge_takes_max():
    a = {"x_sum": jnp.array(1.0), "x_max": jnp.array(2.0)}
    b = {"x_sum": jnp.array(3.0), "x_max": jnp.array(5.0)}
    merged = merge_metrics(a, b)
    assert float(merged["x_sum"]) == 4.0 and float(merged["x_max"]) == 5.0
    assert merge_metrics([a, b]).keys() == merged.keys()
    with pytest.raises(ValueError, match="differ in keys"):
        merge_metrics(a, {"x_sum": jnp.array(1.0)})


# ---------------------------------------------------------------------------- robustness

RB, RT = 6, 5
ROBUST_OBJECTIVES = {
    **{
        name: get_preset(name)
        for name in ("grpo", "dapo", "dr_grpo", "reinforce", "token_reinforce")
    },
    **{name: get_preset(name) for name in ("rloo", "reinforce_pp", "cispo", "gspo", "ppo")},
    "decoupled_ppo": get_preset("decoupled_ppo"),
    "grpo_tis_mis": get_preset("grpo_tis_mis"),
    "gspo_mis": get_preset("gspo_mis", sequence_reject=None),
    "ppo_gae": get_preset("ppo", advantage=GAE(gamma=0.9, lam=0.8)),
}


@jax.jit
def all_losses(inputs, logp):
    """Loss, gradient and finalized metrics of every robustness objective (one compile)."""
    out = {}
    for name, o in ROBUST_OBJECTIVES.items():

        def f(lp, o=o):
            return o.loss(lp, o.prepare(inputs))

        (loss, m), grad = jax.value_and_grad(f, has_aux=True)(logp)
        out[name] = (
            loss,
            grad,
            {**finalize_metrics(m), **o.batch_statistics(logp, o.prepare(inputs))},
        )
    return out


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(
    seed=st.integers(0, 2**16),
    log_ratio=st.sampled_from([0.0, 1e-3, 1.0, 30.0, 1e4]),
    correction=st.sampled_from([0.0, 1.0, 50.0, 1e4]),
    rewards=st.sampled_from(["equal", "binary", "normal"]),
    groups=st.sampled_from(["singletons", "pairs", "one"]),
    empty_rows=st.integers(0, RB),
    fill=st.sampled_from([-np.inf, np.nan, 1e30, -1e30]),
)
def test_no_nan_or_inf_anywhere(seed, log_ratio, correction, rewards, groups, empty_rows, fill):
    rng = np.random.default_rng(seed)
    mask = (rng.random((RB, RT)) < 0.7).astype(np.float32)
    mask[:empty_rows] = 0.0  # all-masked sequences
    prox = -rng.exponential(2.0, (RB, RT))
    logp = prox + log_ratio * rng.standard_normal((RB, RT))
    behav = prox - correction * rng.standard_normal((RB, RT))
    ref = prox + log_ratio * rng.standard_normal((RB, RT))
    r = {
        "equal": np.full(RB, 0.3),
        "binary": rng.integers(0, 2, RB).astype(float),
        "normal": rng.standard_normal(RB) * 1e3,
    }[rewards]
    ids = {"singletons": np.arange(RB), "pairs": np.arange(RB) // 2, "one": np.zeros(RB)}[groups]
    off = mask == 0
    for x in (prox, logp, behav, ref):
        x[off] = fill
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    inputs = LossInputs(
        mask=f32(mask),
        prox_logp=f32(prox),
        behav_logp=f32(behav),
        rewards=f32(r),
        group_ids=jnp.asarray(ids, jnp.int32),
        ref_logp=f32(ref),
    )
    for name, (loss, grad, metrics) in all_losses(inputs, f32(logp)).items():
        assert np.isfinite(float(loss)), name
        assert np.isfinite(np.asarray(grad)).all(), name
        assert not np.asarray(grad)[off].any(), name  # nothing leaks to masked positions
        for k, v in metrics.items():
            assert np.isfinite(float(v)), f"{name}: {k}"


def test_loss_inputs_from_batch(batch_maker):
    """`from_batch` reads only mask, behaviour_logprobs, rewards, group_ids of a minirl Batch."""
    from types import SimpleNamespace

    inputs, logp = batch_maker(seed=5)
    mask = np.asarray(inputs.mask)
    batch = SimpleNamespace(
        mask=mask,
        behaviour_logprobs=np.where(mask > 0, np.asarray(inputs.behav_logp), 0.0),
        rewards=np.asarray(inputs.rewards, np.float64),
        group_ids=np.asarray(inputs.group_ids, np.int64),
    )
    built = LossInputs.from_batch(batch, prox_logp=inputs.prox_logp, ref_logp=inputs.ref_logp)
    assert built.rewards.dtype == jnp.float32 and built.group_ids.dtype == jnp.int32
    objective = jax.jit(get_preset("grpo").__call__)  # the convenience call is jittable too
    np.testing.assert_allclose(objective(built, logp)[0], objective(inputs, logp)[0], rtol=1e-6)


@pytest.mark.parametrize("name", list_presets())
def test_a_non_finite_logp_at_a_counted_token_has_one_outcome_for_every_preset(name, batch_maker):
    """docs/losses.md: "no log-ratio, however large or non-finite, may put inf/nan into the loss". One contract
    for every preset: a non-finite log pi_theta at a counted token is read as log pi_prox + l, l its
    clamped log-ratio (nan -> 0, -inf -> -C, +inf -> +C), and passes no gradient. So the loss equals
    the loss at that finite log-prob, and the gradient equals its gradient with the token zeroed."""
    objective = get_preset(name)
    inputs, logp = batch_maker(seed=6)
    inputs = inputs.replace(behav_logp=inputs.prox_logp)  # c = 1: `_mis` rejects nothing
    prepared = objective.prepare(inputs)
    row, t = 0, int(np.flatnonzero(np.asarray(inputs.mask[0]))[0])  # group of 3, A != 0
    assert float(prepared.mask[row, t]) == 1.0 and float(prepared.adv[row, t]) != 0.0

    def loss_and_grad(lp):
        f = lambda lp: objective.loss(lp, prepared)
        (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(lp)
        return float(loss), np.array(grad), finalize_metrics(metrics)

    clamp, prox = objective.log_ratio_clamp, float(inputs.prox_logp[row, t])
    for bad, log_ratio in ((np.nan, 0.0), (-np.inf, -clamp), (np.inf, clamp)):
        loss, grad, metrics = loss_and_grad(logp.at[row, t].set(bad))
        assert np.isfinite(loss) and np.isfinite(grad).all(), bad
        assert all(np.isfinite(float(v)) for v in metrics.values()), bad
        assert grad[row, t] == 0.0, bad
        want_loss, want_grad, _ = loss_and_grad(logp.at[row, t].set(prox + log_ratio))
        want_grad[row, t] = 0.0
        np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-7, err_msg=str(bad))
        np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-7, err_msg=str(bad))
    if name in ("reinforce", "cispo_tis", "grpo_mis"):  # the jitted path agrees (a few compiles)
        jitted = jax.jit(jax.value_and_grad(lambda lp: objective.loss(lp, prepared)[0]))
        loss, grad = jitted(logp.at[row, t].set(np.nan))
        np.testing.assert_allclose(float(loss), loss_and_grad(logp.at[row, t].set(prox))[0], 1e-6)
        assert np.isfinite(np.asarray(grad)).all() and float(grad[row, t]) == 0.0
