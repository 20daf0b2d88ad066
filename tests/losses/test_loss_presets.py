"""Every preset's gradient equals the gradient of its paper's objective, written out directly.

Each reference below is the paper's formula in plain jnp (no minirl part is used), with the
advantages recomputed in numpy by explicit loops over groups. The preset's Eq. 3 loss is a
surrogate whose VALUE differs (stop-gradients, masks instead of min/clip), so gradients are what
is compared — eagerly and under jit, to float32 precision. Each case also checks that the batch
actually exercises the clipping/rejection it is about, so the comparison cannot pass vacuously.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from minirl.losses import (
    GAE,
    ClippedRatio,
    GroupMean,
    Objective,
    get_preset,
    list_presets,
    with_rejection,
    with_tis,
)
from minirl.losses.presets import (
    decoupled_ppo,
    grpo,
    reinforce_pp,
    with_behaviour_cap,
    with_teacher,
)

# ---------------------------------------------------------------- numpy advantages (by loops)


def groups(gids):
    """Index arrays of the contiguous groups."""
    out, start = [], 0
    for i in range(1, len(gids) + 1):
        if i == len(gids) or gids[i] != gids[start]:
            out.append(np.arange(start, i))
            start = i
    return out


def adv_group_norm(R, gids, eps=1e-6):
    A = np.zeros_like(R)
    for g in groups(gids):
        if len(g) > 1 and np.ptp(R[g]) > 0:
            A[g] = (R[g] - R[g].mean()) / (R[g].std(ddof=1) + eps)
    return A


def adv_group_mean(R, gids):
    A = np.zeros_like(R)
    for g in groups(gids):
        if len(g) > 1 and np.ptp(R[g]) > 0:
            A[g] = R[g] - R[g].mean()
    return A


def adv_loo(R, gids):
    A = np.zeros_like(R)
    for g in groups(gids):
        if len(g) > 1 and np.ptp(R[g]) > 0:
            for i in g:
                A[i] = R[i] - np.mean([R[j] for j in g if j != i])
    return A


def whiten_tokens(A_tok, m, eps=1e-6):
    vals = A_tok[m > 0]
    return np.where(m > 0, (A_tok - vals.mean()) / (vals.std() + eps), 0.0)


def numpy_data(inputs):
    keys = ("mask", "prox_logp", "behav_logp", "ref_logp", "teacher_logp")
    d = {k: np.asarray(getattr(inputs, k)) for k in keys}
    d["R"] = np.asarray(inputs.rewards, np.float64)
    d["gids"] = np.asarray(inputs.group_ids)
    d["n"] = d["mask"].sum(-1)
    d["N"] = float((d["n"] > 0).sum())
    d["L"] = d["n"].max()
    return d


# ---------------------------------------------------------------- the papers' objectives (J)


def _safe(d, x):
    return jnp.where(d["mask"] > 0, x, 0.0)


def _r(logp, d):
    return jnp.exp(_safe(d, logp) - _safe(d, d["prox_logp"]))


def _c(d):
    return jnp.exp(_safe(d, d["prox_logp"]) - _safe(d, d["behav_logp"]))


def _ppo_min(r, A, lo, hi):
    return jnp.minimum(r * A, jnp.clip(r, 1 - lo, 1 + hi) * A)


def _tok(A_seq, d):
    return jnp.asarray(A_seq, jnp.float32)[:, None] * jnp.ones_like(d["mask"])


def J_grpo(logp, d, mask=None, teacher=None):
    """DeepSeekMath Eq. 3: 1/G sum_i 1/|o_i| sum_t [min(rA, clip(r)A) - beta k3], k3 of Eq. 4.
    `teacher` (coef, discount): A plus that much of the teacher's advantage (`A_teacher`)."""
    m = d["mask"] if mask is None else mask
    A = _tok(adv_group_norm(d["R"], d["gids"]), d)
    if teacher is not None:
        A = A + jnp.asarray(A_teacher(d, *teacher), jnp.float32)
    lp = _safe(d, logp)
    rho = jnp.exp(_safe(d, d["ref_logp"]) - lp)
    k3 = rho - jnp.log(rho) - 1
    per_tok = jnp.where(m > 0, _ppo_min(_r(logp, d), A, 0.2, 0.2) - 0.04 * k3, 0.0)
    n = m.sum(-1)
    N = (n > 0).sum()
    return (per_tok.sum(-1) / np.maximum(n, 1)).sum() / N


def J_dapo(logp, d, tis=None):
    """DAPO: 1/sum|o_i| sum_i sum_t min(rA, clip(r, 1-0.2, 1+0.28)A) [x sg(min(c, C)) for TIS]."""
    A = _tok(adv_group_norm(d["R"], d["gids"]), d)
    surr = _ppo_min(_r(logp, d), A, 0.2, 0.28)
    if tis is not None:
        surr = jax.lax.stop_gradient(jnp.minimum(_c(d), tis)) * surr
    return jnp.where(d["mask"] > 0, surr, 0.0).sum() / d["mask"].sum()


def J_dr_grpo(logp, d):
    """Dr. GRPO: 1/G sum_i 1/L_max sum_t min(rA, clip(r)A), A = R - mean."""
    A = _tok(adv_group_mean(d["R"], d["gids"]), d)
    surr = jnp.where(d["mask"] > 0, _ppo_min(_r(logp, d), A, 0.2, 0.2), 0.0)
    return surr.sum() / (d["N"] * d["L"])


def J_reinforce(logp, d):
    """RLAX Eq. 6: 1/G sum_i sg[prod_t r_it] A_i log pi(o_i)."""
    A = jnp.asarray(adv_group_mean(d["R"], d["gids"]), jnp.float32)
    seq_lp = _safe(d, logp).sum(-1)
    seq_r = jax.lax.stop_gradient(_r(logp, d).prod(-1))  # r = 1 off the mask
    return (seq_r * A * seq_lp).sum() / d["N"]


def _token_reinforce(logp, d, A_seq):
    A = _tok(A_seq, d)
    per_tok = jax.lax.stop_gradient(_r(logp, d)) * A * _safe(d, logp)
    return jnp.where(d["mask"] > 0, per_tok, 0.0).sum() / (d["N"] * d["L"])


def J_token_reinforce(logp, d):
    """RLAX App. A: 1/(G L_max) sum_i sum_t sg[r_it] A_i log pi_it."""
    return _token_reinforce(logp, d, adv_group_mean(d["R"], d["gids"]))


def J_rloo(logp, d):
    """Token-level REINFORCE with the leave-one-out baseline R_i - mean_{j != i} R_j."""
    return _token_reinforce(logp, d, adv_loo(d["R"], d["gids"]))


def J_reinforce_pp(logp, d, mask=None):
    """REINFORCE++-baseline: whitened (R - mean_g), token-mean PPO clip, minus beta k2. `mask`:
    the counted tokens (after rejection), over which both the whitening and the mean run."""
    m = d["mask"] if mask is None else mask
    A = whiten_tokens(np.asarray(_tok(adv_group_mean(d["R"], d["gids"]), d)), m)
    k2 = 0.5 * (_safe(d, logp) - _safe(d, d["ref_logp"])) ** 2
    per_tok = _ppo_min(_r(logp, d), jnp.asarray(A, jnp.float32), 0.2, 0.2) - 1e-3 * k2
    return jnp.where(m > 0, per_tok, 0.0).sum() / m.sum()


def J_cispo(logp, d):
    """MiniMax-M1 Eq. 4: 1/sum|o_i| sum sg[clip(r, 1 - 1.0, 1 + 0.28)] A log pi."""
    A = _tok(adv_group_norm(d["R"], d["gids"]), d)
    w = jax.lax.stop_gradient(jnp.clip(_r(logp, d), 0.0, 1.28))
    return jnp.where(d["mask"] > 0, w * A * _safe(d, logp), 0.0).sum() / d["mask"].sum()


def J_gspo(logp, d):
    """GSPO: 1/G sum_i min(s_i A_i, clip(s_i, 1 - 3e-4, 1 + 4e-4) A_i), s_i = (prod r)^(1/n_i)."""
    A = jnp.asarray(adv_group_norm(d["R"], d["gids"]), jnp.float32)
    s = jnp.exp((_safe(d, logp) - _safe(d, d["prox_logp"])).sum(-1) / d["n"])
    return _ppo_min(s, A, 3e-4, 4e-4).sum() / d["N"]


def np_gae(rew, m, gamma, lam):
    """GAE along each row's completion tokens with V = 0, by a plain loop."""
    adv = np.zeros_like(rew)
    for i in range(rew.shape[0]):
        next_a = 0.0
        for t in np.flatnonzero(m[i])[::-1]:
            next_a = rew[i, t] + gamma * lam * next_a
            adv[i, t] = next_a
    return adv


def J_ppo(logp, d, gamma=1.0, lam=1.0):
    """PPO, token mean, dual clip 3 (Ye et al.): A<0: max(min(rA, clip(r)A), 3A); GAE, V = 0."""
    m = d["mask"]
    rew = np.zeros_like(m)
    for i in range(m.shape[0]):
        rew[i, np.flatnonzero(m[i])[-1]] = d["R"][i]
    A = jnp.asarray(np_gae(rew, m, gamma, lam), jnp.float32)
    surr = _ppo_min(_r(logp, d), A, 0.2, 0.2)
    surr = jnp.where(A < 0, jnp.maximum(surr, 3.0 * A), surr)
    return jnp.where(m > 0, surr, 0.0).sum() / m.sum()


def J_decoupled_ppo(logp, d, cap=None, mask=None, drop=None):
    """AReaL Eq. 5: 1/sum|o| sum_t (pi_prox/mu) min(u A, clip(u, 0.8, 1.2) A), u = pi_theta/pi_prox,
    A group-normalised then normalised over the batch's (counted) tokens. TIS: pi_prox/mu capped.
    `drop`: AReaL's released bound, tokens with pi_prox/mu > drop weigh 0 but stay in 1/sum|o|."""
    m = d["mask"] if mask is None else mask
    A = whiten_tokens(np.asarray(_tok(adv_group_norm(d["R"], d["gids"]), d)), m)
    c = _c(d) if cap is None else jnp.minimum(_c(d), cap)
    c = c if drop is None else jnp.where(c <= drop, c, 0.0)
    surr = c * _ppo_min(_r(logp, d), jnp.asarray(A, jnp.float32), 0.2, 0.2)
    return jnp.where(m > 0, surr, 0.0).sum() / m.sum()


def J_naive_ppo(logp, d):
    """AReaL Eq. 2 with pi_old = mu: 1/sum|o| sum_t min(u A, clip(u, 0.8, 1.2) A), u = pi_theta/mu,
    with decoupled PPO's advantages (the only difference between AReaL Table 2's columns)."""
    A = whiten_tokens(np.asarray(_tok(adv_group_norm(d["R"], d["gids"]), d)), d["mask"])
    u = jnp.exp(_safe(d, logp) - _safe(d, d["behav_logp"]))
    surr = _ppo_min(u, jnp.asarray(A, jnp.float32), 0.2, 0.2)
    return jnp.where(d["mask"] > 0, surr, 0.0).sum() / d["mask"].sum()


def A_teacher(d, coef=1.0, discount=0.0):
    """On-policy distillation's advantage (GKD's reverse KL, Lu et al. 2025's per-token reward):
    coef x the discounted sum over the rest of the row of -(log mu - log pi_T), by loops."""
    m = d["mask"]
    k = np.where(m > 0, d["behav_logp"], 0.0) - np.where(m > 0, d["teacher_logp"], 0.0)
    return coef * np_gae(-k, m, discount, 1.0)


def J_distill(logp, d, coef=1.0, discount=0.0):
    """On-policy distillation through decoupled PPO's surrogate (AReaL Eq. 5): 1/sum|o| sum_t
    (pi_prox/mu) min(u A, clip(u, 0.8, 1.2) A), u = pi_theta/pi_prox, A = `A_teacher`."""
    A = jnp.asarray(A_teacher(d, coef, discount), jnp.float32)
    surr = _c(d) * _ppo_min(_r(logp, d), A, 0.2, 0.2)
    return jnp.where(d["mask"] > 0, surr, 0.0).sum() / d["mask"].sum()


MIS = dict(token=(0.6, 1.8), sequence=("mean_k1", 0.12))


def mis_mask(d):
    """The tokens kept by token rejection (0.6 <= c <= 1.8) and then sequence rejection
    (|mean log c| <= 0.12 over the kept tokens), by numpy."""
    c = np.asarray(_c(d))
    keep = (d["mask"] > 0) & (c >= 0.6) & (c <= 1.8)
    stat = np.abs(np.where(keep, np.log(c), 0).sum(-1)) / np.maximum(keep.sum(-1), 1)
    return (keep & (stat <= 0.12)[:, None]).astype(np.float32)


def J_grpo_mis(logp, d):
    """GRPO on the tokens kept by `mis_mask`; denominators count kept tokens only."""
    return J_grpo(logp, d, mask=mis_mask(d))


def J_reinforce_pp_mis(logp, d):
    """REINFORCE++ on the tokens kept by `mis_mask`: whitened over the kept tokens (docs/losses.md:
    "over all counted tokens"), token mean over them."""
    return J_reinforce_pp(logp, d, mask=mis_mask(d))


def J_decoupled_ppo_mis(logp, d):
    """AReaL Eq. 5 on the tokens kept by `mis_mask`, advantages normalised over those tokens."""
    return J_decoupled_ppo(logp, d, mask=mis_mask(d))


# name -> (objective factory, reference J, batch kwargs, what must be active in the batch)
CASES = {
    "grpo": (lambda: get_preset("grpo"), J_grpo, {}, "clip"),
    "dapo": (lambda: get_preset("dapo"), J_dapo, {}, "clip"),
    "dr_grpo": (lambda: get_preset("dr_grpo"), J_dr_grpo, {}, "clip"),
    "reinforce": (lambda: get_preset("reinforce"), J_reinforce, {}, None),
    "token_reinforce": (lambda: get_preset("token_reinforce"), J_token_reinforce, {}, None),
    "rloo": (lambda: get_preset("rloo"), J_rloo, {}, None),
    "reinforce_pp": (lambda: get_preset("reinforce_pp"), J_reinforce_pp, {}, "clip"),
    "cispo": (lambda: get_preset("cispo"), J_cispo, {}, "clip"),
    "gspo": (lambda: get_preset("gspo"), J_gspo, {"log_ratio_scale": 1e-3}, "clip"),
    "ppo": (lambda: get_preset("ppo"), J_ppo, {"log_ratio_scale": 0.8}, "dual"),
    # the paper's uncapped Eq. 5, and the bound AReaL's trainer adds (tokens with c > cap dropped)
    "decoupled_ppo": (
        lambda: with_behaviour_cap(decoupled_ppo(), None),
        J_decoupled_ppo,
        {},
        "clip",
    ),
    "decoupled_ppo_capped": (
        lambda: with_behaviour_cap(decoupled_ppo(), 1.5),
        lambda lp, d: J_decoupled_ppo(lp, d, drop=1.5),
        {},
        "drop",
    ),
    "naive_ppo": (lambda: get_preset("naive_ppo"), J_naive_ppo, {}, "clip"),
    "dapo_tis": (
        lambda: get_preset("dapo_tis"),
        lambda lp, d: J_dapo(lp, d, tis=2.0),
        {"correction_scale": 0.6},
        "tis",
    ),
    "decoupled_ppo_tis": (
        lambda: with_tis(decoupled_ppo(), cap=1.5),
        lambda lp, d: J_decoupled_ppo(lp, d, cap=1.5),
        {},
        "tis",
    ),
    "grpo_mis": (
        lambda: with_rejection(grpo(), **MIS),
        J_grpo_mis,
        {"correction_scale": 0.3},
        "reject",
    ),
    # about half the tokens rejected: whitening over all tokens would be off by ~15 %
    "reinforce_pp_mis": (
        lambda: with_rejection(reinforce_pp(), **MIS),
        J_reinforce_pp_mis,
        {"correction_scale": 0.6},
        "reject",
    ),
    "decoupled_ppo_mis": (
        lambda: with_rejection(decoupled_ppo(), **MIS),
        J_decoupled_ppo_mis,
        {"correction_scale": 0.6},
        "reject",
    ),
    # on-policy distillation: the teacher's per-token advantage, alone and mixed with a reward
    "distill": (lambda: get_preset("distill"), J_distill, {}, "clip"),
    "distill_discounted": (
        lambda: with_teacher(get_preset("distill"), 0.7, 0.9),
        lambda lp, d: J_distill(lp, d, 0.7, 0.9),
        {},
        "clip",
    ),
    "grpo_with_teacher": (
        lambda: with_teacher(grpo(), 0.5, 1.0),
        lambda lp, d: J_grpo(lp, d, teacher=(0.5, 1.0)),
        {},
        "clip",
    ),
}


def _check_active(kind, metrics, d, prepared, objective):
    """The batch must exercise the mechanism under test (else the test proves nothing)."""
    if kind == "clip":
        assert 0.0 < float(metrics["clip_fraction"]) < 1.0
    if kind == "dual":  # some A < 0 tokens beyond the dual clip c = 3
        r = np.asarray(jnp.exp(jnp.asarray(d["logp"]) - d["prox_logp"]))
        adv = np.asarray(prepared.adv)
        assert ((adv < 0) & (r > 3.0) & (d["mask"] > 0)).any()
    if kind == "tis":
        assert float(metrics["correction_max"]) > objective.importance[-1].cap
    if kind == "drop":  # some counted tokens above the cap, some below
        c = np.asarray(_c(d))[d["mask"] > 0]
        cap = objective.importance[0].cap
        assert 0 < (c > cap).sum() < c.size
        assert float(metrics["is_weight_zero_fraction"]) == pytest.approx((c > cap).mean())
    if kind == "reject":
        assert 0.0 < float(metrics["rejected_token_fraction"]) < 1.0
        assert 0.0 < float(metrics["rejected_sequence_fraction"]) < 1.0


@pytest.mark.parametrize("case", list(CASES))
def test_gradient_matches_paper_objective(case, batch_maker):
    factory, J, kwargs, kind = CASES[case]
    objective = factory()
    inputs, logp = batch_maker(seed=1, **kwargs)
    d = numpy_data(inputs)
    d["logp"] = np.where(d["mask"] > 0, np.asarray(logp), 0.0)

    def loss(lp, inp):
        return objective.loss(lp, objective.prepare(inp))[0]

    expected = jax.grad(lambda lp: -J(lp, d))(logp)
    eager = jax.grad(loss)(logp, inputs)
    jitted = jax.jit(jax.grad(loss))(logp, inputs)
    assert np.isfinite(np.asarray(expected)).all()
    assert float(jnp.abs(expected).max()) > 1e-3  # a non-trivial gradient
    np.testing.assert_allclose(eager, expected, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(jitted, expected, rtol=2e-5, atol=1e-6)
    _, metrics = objective(inputs, logp)
    _check_active(kind, metrics, d, objective.prepare(inputs), objective)


def test_ppo_with_discounted_gae_matches_paper_objective(batch_maker):
    """PPO + GAE(0.9, 0.8) (V = 0: discounted reward-to-go): the gradient of the written-out
    objective, eagerly and under jit."""
    objective = get_preset("ppo", advantage=GAE(gamma=0.9, lam=0.8))
    inputs, logp = batch_maker(seed=2, log_ratio_scale=0.8)
    d = numpy_data(inputs)
    expected = jax.grad(lambda lp: -J_ppo(lp, d, 0.9, 0.8))(logp)

    def loss(lp, inp):
        return objective.loss(lp, objective.prepare(inp))[0]

    for fn in (jax.grad(loss), jax.jit(jax.grad(loss))):
        np.testing.assert_allclose(fn(logp, inputs), expected, rtol=2e-5, atol=1e-6)
    assert float(jnp.abs(expected).max()) > 1e-3


RATIO_PRESETS = [
    "grpo",
    "dapo",
    "dr_grpo",
    "token_reinforce",
    "rloo",
    "reinforce_pp",
    "cispo",
    "gspo",
    "ppo",
    "decoupled_ppo",
    "naive_ppo",
    "distill",
]


def test_on_policy_presets_agree_with_reinforce_up_to_aggregation(batch_maker):
    """With logp = prox = behav (r = c = s = 1, no clip active) and the same advantage, every
    ratio-based preset's gradient is REINFORCE's times N Agg_it (KL terms vanish: ref = logp)."""
    inputs, _ = batch_maker(seed=3)
    logp = inputs.prox_logp
    inputs = inputs.replace(behav_logp=logp, ref_logp=logp)
    reinforce = get_preset("reinforce")
    g_reinforce = jax.grad(lambda lp: reinforce.loss(lp, reinforce.prepare(inputs))[0])(logp)
    mask = np.asarray(inputs.mask)
    n_seq = float((mask.sum(-1) > 0).sum())
    for name in RATIO_PRESETS:
        objective = get_preset(name, advantage=GroupMean())
        prepared = objective.prepare(inputs)
        grad = jax.grad(lambda lp, o=objective, p=prepared: o.loss(lp, p)[0])(logp)
        # REINFORCE's gradient is -(1/N) A_i at every token; scale it by N Agg_it
        expected = np.asarray(g_reinforce) * n_seq * np.asarray(prepared.weight)
        np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7, err_msg=name)
    assert np.abs(np.asarray(g_reinforce)).max() > 1e-2


def test_docs_worked_example_clip_is_mask_for_grpo_regulariser_for_cispo():
    """The numbers of docs/losses.md: one group, R = (1, 0), one token each, r = (1.5, 0.9)."""
    from minirl.losses import LossInputs

    prox = jnp.log(jnp.array([[0.2], [0.5]]))
    logp = prox + jnp.log(jnp.array([[1.5], [0.9]]))
    inputs = LossInputs(
        mask=jnp.ones((2, 1)),
        prox_logp=prox,
        behav_logp=prox,
        rewards=jnp.array([1.0, 0.0]),
        group_ids=jnp.array([0, 0]),
        ref_logp=logp,  # KL term of GRPO at its minimum: no gradient from it
    )
    a = 0.5 / (np.sqrt(0.5) + 1e-6)  # group_norm: 0.5 / (Bessel std sqrt(0.5) + eps) = 0.70711
    grads = {}
    for name in ("grpo", "cispo"):
        o = get_preset(name)
        grads[name] = np.asarray(
            jax.jit(jax.grad(lambda lp, o=o: o.loss(lp, o.prepare(inputs))[0]))(logp)
        )
    # GRPO, token 0: A > 0 and r = 1.5 > 1.2 -> M = 0: no gradient at all (a mask)
    # GRPO, token 1: A < 0, r = 0.9 inside: d(-J)/dlogp = -(1/2) (-a) 0.9 = +0.45 a = 0.31820
    np.testing.assert_allclose(grads["grpo"][:, 0], [0.0, 0.45 * a], rtol=1e-5)
    # CISPO, token 0: IS = sg[min(1.5, 1.28)] = 1.28: -(1/2) 1.28 a = -0.64 a = -0.45255 (still
    # pushed, with a capped weight: a regulariser). Token 1: IS = 0.9 -> +0.45 a, as GRPO.
    np.testing.assert_allclose(grads["cispo"][:, 0], [-0.64 * a, 0.45 * a], rtol=1e-5)


def test_registry():
    names = list_presets()
    for base in (
        "grpo",
        "dapo",
        "dr_grpo",
        "reinforce",
        "token_reinforce",
        "rloo",
        "reinforce_pp",
        "cispo",
        "gspo",
        "ppo",
        "decoupled_ppo",
        "naive_ppo",
        "distill",
    ):
        for suffix in ("", "_tis", "_mis", "_tis_mis"):
            assert base + suffix in names
            assert get_preset(base + suffix).name == base + suffix
    with pytest.raises(ValueError, match="unknown loss preset 'grpoo'.*grpo, dapo"):
        get_preset("grpoo")
    with pytest.raises(ValueError, match="unknown Objective fields \\['beta'\\]"):
        get_preset("grpo", beta=0.1)
    assert get_preset("grpo", log_ratio_clamp=5.0).log_ratio_clamp == 5.0
    assert get_preset("grpo").needs_ref and get_preset("reinforce_pp").needs_ref
    assert not get_preset("dapo").needs_ref
    assert get_preset("dapo").dynamic_filtering
    # TIS multiplies in min(c, 2), and replaces decoupled PPO's own c instead of squaring it
    assert [type(p).__name__ for p in get_preset("token_reinforce_tis").importance] == [
        "TokenRatio",
        "TruncatedCorrection",
    ]
    assert [type(p).__name__ for p in get_preset("decoupled_ppo_tis").importance] == [
        "TruncatedCorrection"
    ]
    # decoupled PPO drops tokens with c > 5 as AReaL's trainer does; naive PPO has no bound
    assert [(type(p).__name__, p.cap) for p in get_preset("decoupled_ppo").importance] == [
        ("Correction", 5.0)
    ]
    assert [p.cap for p in get_preset("naive_ppo").importance] == [None]
    mis = get_preset("grpo_mis")
    assert (mis.token_reject.lo, mis.token_reject.hi) == (0.5, 5.0)
    assert mis.sequence_reject.stat == "mean_k1"


def test_naive_and_decoupled_ppo_differ_only_off_policy(batch_maker):
    """Fresh data (mu = pi_prox, c = 1): the same gradient. Stale data: the clip centred on mu
    masks tokens whose ratio against mu starts outside [0.8, 1.2], where decoupled PPO does not."""
    naive, decoupled = get_preset("naive_ppo"), get_preset("decoupled_ppo")
    inputs, logp = batch_maker(seed=4, log_ratio_scale=0.05, correction_scale=0.5)

    def grad(o, inp):
        return np.asarray(jax.grad(lambda lp: o.loss(lp, o.prepare(inp))[0])(logp))

    fresh = inputs.replace(behav_logp=inputs.prox_logp)
    np.testing.assert_array_equal(grad(naive, fresh), grad(decoupled, fresh))
    clip = {o.name: float(o(inputs, logp)[1]["clip_fraction"]) for o in (naive, decoupled)}
    assert clip["decoupled_ppo"] == 0.0 < clip["naive_ppo"]  # r near 1, c = pi/mu far from it
    assert not np.allclose(grad(naive, inputs), grad(decoupled, inputs))


def test_bad_configs_raise_clear_errors():
    with pytest.raises(ValueError, match="dual_clip must exceed"):
        ClippedRatio(0.2, 0.2, dual_clip=1.1)
    with pytest.raises(ValueError, match="centre must be one of"):
        ClippedRatio(0.2, 0.2, centre="old")
    with pytest.raises(ValueError, match=r"unknown Objective fields \['value_coef'\]"):
        get_preset("ppo", value_coef=0.5)  # no critic: minirl's model has no value head
    with pytest.raises(TypeError, match="must be a tuple"):
        Objective("x", get_preset("grpo").aggregation, GroupMean(), ClippedRatio(), importance=[])
    with pytest.raises(ValueError, match="SequenceReject.stat"):
        with_rejection(grpo(), sequence=("median", 0.1))
