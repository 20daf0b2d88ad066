"""Every part on a hand-computed 2-group, 3-token example (the arithmetic is in the comments).

    row  group  R   mask     r = pi_theta/pi_prox   c = pi_prox/mu      log rho = log pi_ref/pi_theta
    0    0      1   1 1 1    1.5  0.5  1.1          1.0  2.5  0.8       0.1  -0.2  0.0
    1    0     -1   1 1 0    0.7  1.3   .           1.2  0.4   .        0.3   0.05  .
    2    1      3   0 1 1     .   1.25 0.9           .   1.0  6.0        .   -0.1  0.2
    3    1      1   1 0 0    3.5   .    .           0.9   .    .        0.5    .    .

n = (3, 2, 2, 1), sum n = 8, N = 4, L_max = 3. Masked positions hold -inf log-probs.
Group 0: mean 0, Bessel std sqrt(((1-0)^2 + (-1-0)^2) / 1) = sqrt(2)
Group 1: mean 2, Bessel std sqrt((1 + 1) / 1) = sqrt(2)
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from minirl.losses import (
    GAE,
    K1KL,
    K2KL,
    K3KL,
    ClippedRatio,
    ClippedTokenRatio,
    Context,
    Correction,
    Entropy,
    GeometricSequenceRatio,
    GroupMean,
    GroupNorm,
    GSPOClipped,
    LastToken,
    LeaveOneOut,
    LogProb,
    LossInputs,
    MaxLength,
    SequenceLogProb,
    SequenceMean,
    SequenceRatio,
    SequenceReject,
    TokenMean,
    TokenRatio,
    TokenReject,
    TruncatedCorrection,
    apply_rejection,
    batch_whiten,
    gae,
    get_preset,
    group_statistics,
    validate_inputs,
)

X = np.nan  # placeholder off the mask
MASK = np.array([[1, 1, 1], [1, 1, 0], [0, 1, 1], [1, 0, 0]], np.float32)
R_TOK = np.array([[1.5, 0.5, 1.1], [0.7, 1.3, X], [X, 1.25, 0.9], [3.5, X, X]])
C_TOK = np.array([[1.0, 2.5, 0.8], [1.2, 0.4, X], [X, 1.0, 6.0], [0.9, X, X]])
LOG_RHO = np.array([[0.1, -0.2, 0.0], [0.3, 0.05, X], [X, -0.1, 0.2], [0.5, X, X]])
REWARDS = np.array([1.0, -1.0, 3.0, 1.0], np.float32)
GIDS = np.array([0, 0, 1, 1], np.int32)
SQ2 = np.sqrt(2.0)
A_NORM = np.array([1 / (SQ2 + 1e-6), -1 / (SQ2 + 1e-6), 1 / (SQ2 + 1e-6), -1 / (SQ2 + 1e-6)])


def _fill(x):
    return jnp.asarray(np.where(MASK > 0, x, -np.inf), jnp.float32)


PROX = np.full((4, 3), np.log(0.5))
INPUTS = LossInputs(
    mask=jnp.asarray(MASK),
    prox_logp=_fill(PROX),
    behav_logp=_fill(PROX - np.log(np.where(MASK > 0, C_TOK, 1.0))),
    rewards=jnp.asarray(REWARDS),
    group_ids=jnp.asarray(GIDS),
    ref_logp=_fill(PROX + np.log(np.where(MASK > 0, R_TOK, 1.0)) + np.where(MASK > 0, LOG_RHO, 0)),
)
LOGP = _fill(PROX + np.log(np.where(MASK > 0, R_TOK, 1.0)))


def tok(rows):
    """Per-row values broadcast to [4, 3] on the mask, 0 elsewhere."""
    return np.where(MASK > 0, np.asarray(rows, np.float64)[:, None], 0.0)


def on_mask(x):
    return np.where(MASK > 0, x, 0.0)


def context(adv=A_NORM, entropy=None):
    """The phase-2 context of the example, as Objective.loss builds it."""
    prepared = get_preset("grpo").prepare(INPUTS)
    log_ratio = jnp.asarray(on_mask(np.log(np.where(MASK > 0, R_TOK, 1.0))), jnp.float32)
    return Context(
        logp=jnp.where(MASK > 0, LOGP, 0.0),
        log_ratio=log_ratio,
        ratio=jnp.exp(log_ratio),
        mask=jnp.asarray(MASK),
        adv=jnp.asarray(tok(adv), jnp.float32),
        log_c=prepared.log_c,
        clamp=20.0,
        ref_logp=prepared.ref_logp,
        entropy=entropy,
    )


def close(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol)


# ------------------------------------------------------------------------------ advantages


def test_group_statistics_bessel_eps_singleton_and_zero_spread():
    # groups: (1, 2, 3) -> mean 2, Bessel var ((1)^2 + 0 + 1^2) / 2 = 1; (5) singleton;
    # (4, 4) zero spread; (0, 10) -> mean 5, var (25 + 25) / 1 = 50
    r = jnp.array([1.0, 2.0, 3.0, 5.0, 4.0, 4.0, 0.0, 10.0])
    ids = jnp.array([2, 2, 2, 8, 1, 1, 6, 6], jnp.int32)
    g = group_statistics(r, ids)
    close(g.size, [3, 3, 3, 1, 2, 2, 2, 2])
    close(g.mean, [2, 2, 2, 5, 4, 4, 5, 5])
    close(g.std, [1, 1, 1, 0, 0, 0, np.sqrt(50), np.sqrt(50)])
    assert g.informative.tolist() == [True] * 3 + [False] * 3 + [True] * 2
    inputs = INPUTS.replace(rewards=r, group_ids=ids, mask=jnp.ones((8, 1)))
    adv = GroupNorm(eps=1e-6)(inputs, jnp.ones((8, 1)))
    # (R - mean) / (std + eps): -1/(1 + 1e-6), 0, +1/(1 + 1e-6); singleton 0; equal 0; +-5/(sqrt 50 + eps)
    s50 = np.sqrt(50) + 1e-6
    close(adv[:, 0], [-1 / 1.000001, 0, 1 / 1.000001, 0, 0, 0, -5 / s50, 5 / s50], rtol=1e-6)
    # exactly zero (not a rounding residue / eps) for equal rewards that do not sum exactly
    equal = INPUTS.replace(rewards=jnp.full((3,), 0.1), group_ids=jnp.zeros(3, jnp.int32))
    adv = GroupNorm()(equal, jnp.ones((3, 1)))
    assert np.all(np.asarray(adv) == 0.0)
    # a nan reward is an upstream bug: it is not zeroed away but reaches the loss, where the
    # trainer's non-finite guard skips the step; the other groups are untouched. (The traced
    # path: an eager `prepare` refuses it outright, see test_prepare_refuses_a_non_finite_reward.)
    poisoned = INPUTS.replace(rewards=INPUTS.rewards.at[1].set(jnp.nan))
    adv = GroupNorm()(poisoned, jnp.asarray(MASK))
    assert np.isnan(np.asarray(adv)[:2][MASK[:2] > 0]).all()
    close(adv[2:], tok(A_NORM)[2:])
    assert not np.isfinite(float(jax.jit(get_preset("grpo").__call__)(poisoned, LOGP)[0]))


def test_group_advantages_on_the_example():
    valid = jnp.asarray(MASK)
    close(GroupNorm()(INPUTS, valid), tok(A_NORM))  # (R - mean) / (sqrt 2 + 1e-6) = +-0.7071064
    # group mean: (1 - 0, -1 - 0, 3 - 2, 1 - 2)
    close(GroupMean()(INPUTS, valid), tok([1, -1, 1, -1]))
    # leave one out, G = 2: R_i - R_other = (1 - (-1), -1 - 1, 3 - 1, 1 - 3)
    close(LeaveOneOut()(INPUTS, valid), tok([2, -2, 2, -2]))


def test_batch_whiten_on_the_example():
    # group-mean advantages per token: 1,1,1 | -1,-1 | 1,1 | -1   (8 tokens)
    # token mean = (3 - 2 + 2 - 1) / 8 = 0.25
    # deviations 0.75 (x5 tokens with A=1), -1.25 (x3 tokens with A=-1)
    # population var = (5 * 0.5625 + 3 * 1.5625) / 8 = (2.8125 + 4.6875) / 8 = 0.9375
    sigma = np.sqrt(0.9375) + 1e-6  # 0.968246
    adv = batch_whiten()(INPUTS, jnp.asarray(MASK))
    close(adv, tok([0.75 / sigma, -1.25 / sigma, 0.75 / sigma, -1.25 / sigma]))
    close(np.asarray(adv)[MASK > 0].mean(), 0.0, atol=1e-6)


def numpy_whiten(adv_tok, counted):
    """Whitening by hand: mean and population std over the counted tokens only."""
    vals = adv_tok[counted > 0]
    return (adv_tok - vals.mean()) / (vals.std() + 1e-6)


@pytest.mark.parametrize("preset", ["reinforce_pp", "decoupled_ppo"])
def test_batch_whitening_is_over_the_tokens_counted_after_rejection(preset):
    """docs/losses.md: whitening is "over all counted tokens", and m counts tokens "after any
    rejection". Rejected tokens must move neither the mean nor the std."""
    rules = {
        # token rule 0.5 <= c <= 2 drops c = 2.5 (row 0), 0.4 (row 1), 6.0 (row 2): 5 tokens left
        "token": dict(token_reject=TokenReject(0.5, 2.0)),
        # then mean_k1 <= 0.15 drops row 1 (test_rejection_on_the_example): 4 tokens left
        "token+sequence": dict(
            token_reject=TokenReject(0.5, 2.0), sequence_reject=SequenceReject("mean_k1", 0.15)
        ),
    }
    # group-mean advantages: rows (+1, -1, +1, -1). Counted tokens, by hand:
    #   token:          +1 +1 | -1 | +1 | -1   mean 0.2, var (3 .8^2 + 2 1.2^2)/5 = 0.96
    #   token+sequence: +1 +1 |    | +1 | -1   mean 0.5, var (3 .5^2 + 1.5^2)/4 = 0.75
    # (before rejection all 8 tokens: mean 0.25, var 0.9375, test_batch_whiten_on_the_example)
    by_hand = {"token": (0.2, 0.96), "token+sequence": (0.5, 0.75)}
    for rule, parts in rules.items():
        objective = get_preset(preset, **parts)
        prepared = objective.prepare(INPUTS)
        counted = np.asarray(prepared.mask)
        raw = {"reinforce_pp": [1, -1, 1, -1], "decoupled_ppo": A_NORM}[preset]
        want = numpy_whiten(tok(raw), counted)
        got = np.asarray(prepared.adv)
        close(got[counted > 0], want[counted > 0])
        if preset == "reinforce_pp":
            mean, var = by_hand[rule]
            sigma = np.sqrt(var) + 1e-6
            close(got[counted > 0], ((tok(raw) - mean) / sigma)[counted > 0])
        close(got[counted > 0].mean(), 0.0, atol=1e-6)  # whitened over exactly these tokens
        close(got[counted > 0].std(), 1.0, rtol=1e-5)


def test_whitening_of_counted_advantages_with_no_spread_is_exactly_zero():
    """All counted tokens share one advantage: whitening gives 0, not a residue divided by eps.
    Token rejection [0.95, 1.05] keeps c = 1.0 at rows 0 and 2 (both A = +1) only."""
    objective = get_preset("reinforce_pp", token_reject=TokenReject(0.95, 1.05))
    prepared = objective.prepare(INPUTS)
    counted = np.asarray(prepared.mask)
    assert counted.sum() == 2 and np.all(np.asarray(prepared.adv) == 0.0)


def test_gae_by_hand():
    # V = 0 (no critic): delta_t = r_t, A_t = r_t + gamma lam A_next. One row: prompt at t=0,
    # completion t=1..4 with a masked gap at t=3 (skipped), rewards 0.5 at t=1 and 1 at the end;
    # gamma 0.9, lambda 0.8 -> gamma lam = 0.72:
    # t=4: A4 = 1;  t=2: A2 = 0 + 0.72 * 1 = 0.72;  t=1: A1 = 0.5 + 0.72 * 0.72 = 1.0184
    # t=0 (prompt, reward 9 is garbage) and t=3 (gap) -> 0
    m = jnp.array([[0.0, 1, 1, 0, 1]])
    adv = gae(jnp.array([[9.0, 0.5, 0, 7.0, 1]]), m, 0.9, 0.8)
    close(adv, [[0, 1.0184, 0.72, 0, 1.0]])
    # GAE part, gamma = lambda = 1: every token gets R_i (reward on the last token)
    close(GAE(1.0, 1.0)(INPUTS, jnp.asarray(MASK)), tok(REWARDS))


# ----------------------------------------------------------------------------- aggregation


def test_aggregation_weights_on_the_example():
    m = jnp.asarray(MASK)
    # 1/(N n_i) = 1/(4*3), 1/(4*2), 1/(4*2), 1/(4*1)
    close(SequenceMean()(m, m), tok([1 / 12, 1 / 8, 1 / 8, 1 / 4]))
    close(TokenMean()(m, m), on_mask(np.full((4, 3), 1 / 8)))  # 1 / sum n = 1/8
    close(MaxLength()(m, m), on_mask(np.full((4, 3), 1 / 12)))  # 1/(N L_max) = 1/(4*3)
    close(MaxLength(max_length=10)(m, m), on_mask(np.full((4, 3), 1 / 40)))
    # last counted token of each row: t = 2, 1, 2, 0, each 1/N = 1/4
    want = np.zeros((4, 3))
    want[[0, 1, 2, 3], [2, 1, 2, 0]] = 0.25
    close(LastToken()(m, m), want)
    # rejection shrinks the denominators: rows 1 and 2 rejected -> N = 2: 1/(2*3), 1/(2*1)
    kept = m * jnp.array([1.0, 0, 0, 1])[:, None]
    close(SequenceMean()(kept, m), tok([1 / 6, 0, 0, 1 / 2]))
    close(TokenMean()(kept, m), on_mask(np.full((4, 3), 1 / 4)) * tok([1, 0, 0, 1]))


# ---------------------------------------------------------------------- importance weights


def test_importance_weights_on_the_example():
    ctx = context()
    close(TokenRatio()(ctx) * MASK, on_mask(R_TOK))
    # prod r: 1.5*0.5*1.1 = 0.825, 0.7*1.3 = 0.91, 1.25*0.9 = 1.125, 3.5
    close(SequenceRatio()(ctx) * MASK, tok([0.825, 0.91, 1.125, 3.5]))
    # geometric: 0.825^(1/3) = 0.93795, 0.91^(1/2) = 0.95394, 1.125^(1/2) = 1.06066, 3.5
    close(GeometricSequenceRatio()(ctx) * MASK, tok([0.825 ** (1 / 3), 0.91**0.5, 1.125**0.5, 3.5]))
    # CISPO: clip(r, 0, 1.28): 1.5 -> 1.28, 1.3 -> 1.28, 3.5 -> 1.28; the rest unchanged
    want = np.array([[1.28, 0.5, 1.1], [0.7, 1.28, 0], [0, 1.25, 0.9], [1.28, 0, 0]])
    close(ClippedTokenRatio(1.0, 0.28)(ctx) * MASK, want)
    assert ClippedTokenRatio(1.0, 0.28).clipped(ctx).sum() == 3
    close(Correction()(ctx) * MASK, on_mask(C_TOK))
    # TIS: min(c, 2): 2.5 -> 2, 6 -> 2
    close(TruncatedCorrection(2.0)(ctx) * MASK, on_mask(np.minimum(C_TOK, 2.0)))
    assert TruncatedCorrection(2.0).clipped(ctx).sum() == 2


# ------------------------------------------------------------------ gradient terms, G2


def test_clipped_ratio_mask_on_the_example():
    ctx = context()  # A = +a, -a, +b, -b
    # row 0, A > 0: r = 1.5 > 1.2 -> M = 0; 0.5 and 1.1 -> M = 1 (A > 0 never clips below)
    # row 1, A < 0: r = 0.7 < 0.8 -> M = 0; 1.3 -> M = 1 (A < 0 never clips above, w/o dual)
    # row 2, A > 0: 1.25 > 1.2 -> 0; 0.9 -> 1
    # row 3, A < 0: 3.5 -> 1; with the dual clip c = 3: 3.5 > 3 -> 0
    M = np.array([[0, 1, 1], [0, 1, 0], [0, 0, 1], [1, 0, 0]])
    close(ClippedRatio(0.2, 0.2)(ctx) * MASK, M * on_mask(R_TOK))
    M[3, 0] = 0
    close(ClippedRatio(0.2, 0.2, dual_clip=3.0)(ctx) * MASK, M * on_mask(R_TOK))
    # its gradient is M r (d r / d logp = r): masked tokens get none
    g = jax.grad(lambda lp: (ClippedRatio()(context_with(lp)) * MASK).sum())(ctx.logp)
    close(g, np.array([[0, 0.5, 1.1], [0, 1.3, 0], [0, 0, 0.9], [3.5, 0, 0]]))


def context_with(logp):
    ctx = context()
    log_ratio = jnp.where(MASK > 0, logp - jnp.log(0.5), 0.0)
    return Context(
        **{**ctx.__dict__, "logp": logp, "log_ratio": log_ratio, "ratio": jnp.exp(log_ratio)}
    )


def test_logprob_terms_and_gspo_mask_on_the_example():
    ctx = context()
    lp = np.asarray(ctx.logp)
    close(LogProb()(ctx), lp)
    # sequence log-prob on the last token: row sums of log(0.5 r)
    sums = np.nansum(np.where(MASK > 0, np.log(0.5 * np.nan_to_num(R_TOK, nan=1.0)), 0), axis=1)
    want = np.zeros((4, 3))
    want[[0, 1, 2, 3], [2, 1, 2, 0]] = sums
    close(SequenceLogProb()(ctx), want)
    # GSPO: s = (0.938, 0.954, 1.061, 3.5) against A = (+, -, +, -), eps (3e-4, 4e-4):
    # row 0: A > 0, s < 1 -> 1; row 1: A < 0, s < 1 - 3e-4 -> 0; row 2: A > 0, s > 1 + 4e-4 -> 0;
    # row 3: A < 0, s > 1 -> 1
    close(GSPOClipped()(ctx), lp * tok([1, 0, 0, 1]))


def test_kl_and_entropy_regularizers_on_the_example():
    ctx = context(entropy=jnp.asarray(on_mask(np.full((4, 3), 0.7))))
    lr = on_mask(LOG_RHO)  # log rho = log pi_ref - log pi_theta
    # k1 = log(pi_theta / pi_ref) = -log rho;  G2 = -beta k1 = beta log rho
    close(K1KL(0.1)(ctx), 0.1 * lr)
    # k2 = (log rho)^2 / 2, e.g. 0.1 -> 0.005;  G2 = -beta k2
    close(K2KL(0.1)(ctx), -0.1 * 0.5 * lr**2)
    # k3 = rho - log rho - 1, e.g. e^0.1 - 0.1 - 1 = 0.0051709;  G2 = -beta k3
    close(K3KL(0.1)(ctx), -0.1 * (np.exp(lr) - lr - 1))
    close(K3KL(0.1)(ctx)[0, 0], -0.1 * 0.0051709, rtol=1e-4)
    close(Entropy(0.01)(ctx), on_mask(np.full((4, 3), 0.007)))
    # d(-beta k3)/dlogp = beta (rho - 1)  (d rho / d logp = -rho)
    g = jax.grad(lambda lp: K3KL(0.1)(Context(**{**ctx.__dict__, "logp": lp})).sum())(ctx.logp)
    close(g, on_mask(0.1 * (np.exp(lr) - 1)))


# ------------------------------------------------------------------------------- rejection


def test_rejection_on_the_example():
    log_c = get_preset("grpo").prepare(INPUTS).log_c
    m = jnp.asarray(MASK)
    # token rule 0.5 <= c <= 2: drops c = 2.5 (row 0), 0.4 (row 1), 6.0 (row 2)
    kept = np.array([[1, 0, 1], [1, 0, 0], [0, 1, 0], [1, 0, 0]])
    close(TokenReject(0.5, 2.0).keep(log_c, m), kept)
    # mean_k1 = |sum log c| / n: row 0 |0 + log 2.5 + log 0.8| / 3 = log 2 / 3 = 0.23105;
    # row 1 |log(1.2 * 0.4)| / 2 = 0.36698; row 2 log 6 / 2 = 0.89588; row 3 |log 0.9| = 0.10536
    stat = SequenceReject("mean_k1", 0.3).statistic(log_c, m)
    close(stat, [np.log(2) / 3, -np.log(0.48) / 2, np.log(6) / 2, -np.log(0.9)])
    mask, rejected = apply_rejection(None, SequenceReject("mean_k1", 0.3), log_c, m)
    close(mask, MASK * tok([1, 0, 0, 1]))
    close(rejected, [0, 1, 1, 0])
    # sum_k1: log 2 = 0.693, 0.734, log 6 = 1.792, 0.105
    close(
        SequenceReject("sum_k1", 0.7).statistic(log_c, m),
        [np.log(2), -np.log(0.48), np.log(6), -np.log(0.9)],
    )
    # max_k3, k3 = c - 1 - log c: row 0 k3(2.5) = 1.5 - 0.91629 = 0.58371; row 1 k3(0.4) = 0.31629;
    # row 2 k3(6) = 5 - 1.79176 = 3.20824; row 3 k3(0.9) = 0.00536
    k3 = lambda c: c - 1 - np.log(c)
    close(SequenceReject("max_k3", 0.5).statistic(log_c, m), [k3(2.5), k3(0.4), k3(6.0), k3(0.9)])
    # token rule first, then sequence rule on the kept tokens (mean_k1 <= 0.15):
    # row 0 keeps c = (1, 0.8): |log 0.8| / 2 = 0.11157 -> kept; row 1 keeps 1.2: 0.18232 -> rejected;
    # row 2 keeps 1.0: 0 -> kept; row 3: 0.10536 -> kept
    mask, rejected = apply_rejection(
        TokenReject(0.5, 2.0), SequenceReject("mean_k1", 0.15), log_c, m
    )
    close(mask, kept * tok([1, 0, 1, 1]))
    close(rejected, [0, 1, 0, 0])


# ------------------------------------------------------------- the objective on the example


def test_grpo_loss_and_metrics_on_the_example():
    a = b = 1 / (SQ2 + 1e-6)
    objective = get_preset("grpo", regularizers=())
    loss, metrics = objective(INPUTS, LOGP)
    # J = sum Agg A M r:
    #   row 0: (1/12) (+a) (0 + 0.5 + 1.1)   row 1: (1/8) (-a) (0 + 1.3)
    #   row 2: (1/8) (+b) (0 + 0.9)          row 3: (1/4) (-b) (3.5)
    # loss = -J = a (1.3/8 - 1.6/12) + b (3.5/4 - 0.9/8) = 0.0291667 a + 0.7625 b
    close(loss, 0.0291667 * a + 0.7625 * b)
    close(metrics["clip_fraction"], 3 / 8)  # 1.5, 0.7, 1.25 clipped
    close(metrics["ratio_mean"], 10.75 / 8)  # (1.5+.5+1.1+.7+1.3+1.25+.9+3.5) / 8
    close(metrics["ratio_max"], 3.5)
    close(metrics["correction_mean"], 13.8 / 8)  # (1+2.5+.8+1.2+.4+1+6+.9) / 8
    close(metrics["correction_max"], 6.0)
    # KL(mu || prox): k1 = mean(-log c) = -(log 2 + log 0.48 + log 6 + log 0.9) / 8
    close(metrics["kl_behav_k1"], -(np.log(2) + np.log(0.48) + np.log(6) + np.log(0.9)) / 8)
    close(
        metrics["kl_behav_k3"],
        np.nansum(on_mask(C_TOK - 1 - np.log(np.where(MASK > 0, C_TOK, 1)))) / 8,
    )
    close(metrics["kl_prox_k1"], -np.log(np.prod(np.nan_to_num(R_TOK, nan=1.0))) / 8)
    close(metrics["is_weight_mean"], 1.0)
    close(metrics["rejected_token_fraction"], 0.0)
    # zero-centred A (c - 1): A > 0 rows 0, 2: a (0 + 1.5 - 0.2) + b (0 + 5) = 1.3 a + 5 b
    #                         A < 0 rows 1, 3: -a (0.2 - 0.6) - b (-0.1) = 0.4 a + 0.1 b
    close(metrics["zero_centred_pos"], 1.3 * a + 5 * b)
    close(metrics["zero_centred_neg"], 0.4 * a + 0.1 * b)
    # p95 (linear): r sorted .5 .7 .9 1.1 1.25 1.3 1.5 3.5, index 0.95*7 = 6.65 ->
    #   1.5 + 0.65 (3.5 - 1.5) = 2.8;   c sorted .4 .8 .9 1 1 1.2 2.5 6 -> 2.5 + 0.65*3.5 = 4.775
    close(metrics["ratio_p95"], 2.8)
    close(metrics["correction_p95"], 4.775)


def test_rejection_and_tis_metrics_on_the_example():
    objective = get_preset(
        "grpo", token_reject=TokenReject(0.5, 2.0), sequence_reject=SequenceReject("mean_k1", 0.15)
    )
    _, metrics = objective(INPUTS, LOGP)
    # kept tokens: row 0 (t 0, 2), row 2 (t 1), row 3 (t 0) = 4 of 8; 1 of 4 sequences rejected
    close(metrics["rejected_token_fraction"], 0.5)
    close(metrics["rejected_sequence_fraction"], 0.25)
    _, metrics = get_preset("dapo_tis")(INPUTS, LOGP)
    # IS = min(c, 2) on all 8 tokens: (1 + 2 + .8 + 1.2 + .4 + 1 + 2 + .9) / 8 = 9.3 / 8
    close(metrics["is_weight_mean"], 9.3 / 8)
    close(metrics["is_weight_max"], 2.0)
    # ESS = (sum w)^2 / (n sum w^2) = 9.3^2 / (8 (1 + 4 + .64 + 1.44 + .16 + 1 + 4 + .81))
    close(metrics["is_weight_ess"], 9.3**2 / (8 * 13.05))
    close(metrics["is_weight_zero_fraction"], 0.0)
    # decoupled PPO's bound at 2.2 drops c = 2.5 and c = 6 (IS 0), keeps their count:
    # w = 1, 0, .8, 1.2, .4, 1, 0, .9 -> zero share 2/8, ESS 5.3^2 / (8 * 5.05)
    _, capped = get_preset("decoupled_ppo", importance=(Correction(cap=2.2),))(INPUTS, LOGP)
    close(capped["is_weight_zero_fraction"], 2 / 8)
    close(capped["is_weight_mean"], 5.3 / 8)
    close(capped["is_weight_ess"], 5.3**2 / (8 * 5.05))
    # clipped: DAPO's mask (0.2, 0.28) drops r = 1.5 (A > 0) and r = 0.7 (A < 0), keeps
    # r = 1.25 < 1.28; the TIS cap clips c = 2.5 and c = 6.0 -> 4 distinct tokens of 8
    close(metrics["clip_fraction"], 4 / 8)


def test_entropy_term_gradient_and_metric():
    objective = get_preset("dapo", regularizers=(Entropy(0.01),))
    assert objective.needs_entropy
    h = jnp.asarray(on_mask(np.full((4, 3), 0.7)), jnp.float32)
    prepared = objective.prepare(INPUTS)
    with pytest.raises(ValueError, match="entropy"):
        objective.loss(LOGP, prepared)
    g = jax.grad(lambda e: objective.loss(LOGP, prepared, entropy=e)[0])(h)
    close(g, on_mask(np.full((4, 3), -0.01 / 8)))  # d(-J)/dH = -coef Agg = -0.01/8
    _, m = objective(INPUTS, LOGP, entropy=h)
    close(m["entropy"], 0.7)


def test_clear_errors():
    with pytest.raises(ValueError, match="ref_logp is required"):
        get_preset("grpo").prepare(INPUTS.replace(ref_logp=None))
    with pytest.raises(ValueError, match="contiguous"):
        validate_inputs(INPUTS.replace(group_ids=jnp.array([0, 1, 0, 1])))
    with pytest.raises(ValueError, match="must be \\[B\\]"):
        validate_inputs(INPUTS.replace(rewards=jnp.zeros(3)))
    validate_inputs(INPUTS)


def test_loss_refuses_arrays_that_would_broadcast():
    """A [1, T] logp against [4, T] prepared rows would broadcast into a wrong loss: refused,
    eagerly and under jit (shapes are static, so the check runs while tracing)."""
    objective = get_preset("dapo", regularizers=(Entropy(0.01),))
    prepared = objective.prepare(INPUTS)
    h = jnp.zeros((4, 3))
    rows_shape = r"logp must have the shape of the prepared rows \(4, 3\)"
    for fn in (objective.loss, jax.jit(objective.loss)):
        with pytest.raises(ValueError, match=rows_shape):
            fn(LOGP[:1], prepared, entropy=h)
        with pytest.raises(ValueError, match=r"logp .* got \(3,\)"):
            fn(LOGP[0], prepared, entropy=h)
        with pytest.raises(ValueError, match="entropy must have the shape"):
            fn(LOGP, prepared, entropy=h[:1])
    with pytest.raises(ValueError, match="logp must have the shape"):
        objective.batch_statistics(LOGP[:1], objective.prepare(INPUTS))
    # phase 1 checks its inputs' shapes the same way, also while tracing
    for fn in (objective.prepare, jax.jit(objective.prepare)):
        with pytest.raises(ValueError, match=r"prox_logp must have the mask's shape \(4, 3\)"):
            fn(INPUTS.replace(prox_logp=INPUTS.prox_logp[:1]))
        with pytest.raises(ValueError, match=r"rewards must be \[B\] = \(4,\)"):
            fn(INPUTS.replace(rewards=INPUTS.rewards[:, None]))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_prepare_refuses_a_non_finite_reward(bad):
    """An eager `prepare` (and so `objective(inputs, logp)`) refuses a non-finite reward instead
    of returning nan advantages. Under jit the values are tracers: the nan reaches the loss, as
    the trainer's non-finite guard expects (see test_group_statistics_bessel_eps_...)."""
    objective = get_preset("reinforce_pp")  # batch whitening would spread it over the whole batch
    poisoned = INPUTS.replace(rewards=INPUTS.rewards.at[2].set(bad))
    with pytest.raises(ValueError, match=r"LossInputs.rewards has 1 non-finite .* index \[2\]"):
        objective.prepare(poisoned)
    with pytest.raises(ValueError, match="rewards must be finite"):
        objective(poisoned, LOGP)
    assert not np.isfinite(np.asarray(jax.jit(objective.prepare)(poisoned).adv)).all()
    # per-token rewards (GAE) are checked on the completion mask only: garbage off it is fine
    ppo = get_preset("ppo")
    token_rewards = np.where(MASK > 0, 0.5, np.nan)
    ppo.prepare(INPUTS.replace(token_rewards=jnp.asarray(token_rewards)))
    token_rewards[0, 1] = bad
    with pytest.raises(ValueError, match=r"token_rewards has 1 non-finite .* index \[0, 1\]"):
        ppo.prepare(INPUTS.replace(token_rewards=jnp.asarray(token_rewards)))


def test_log_ratio_clamp_applies_before_exp():
    # log pi_theta - log pi_prox = 50 on row 0's first token: exp(50) would be 5e21 (and exp of a
    # bigger gap overflows float32); clamped to C = 20 -> r = e^20, to C = 5 -> r = e^5
    logp = LOGP.at[0, 0].set(jnp.log(0.5) + 50.0)
    for clamp in (20.0, 5.0):
        objective = get_preset("token_reinforce", log_ratio_clamp=clamp)
        _, metrics = objective(INPUTS, logp)
        close(metrics["ratio_max"], np.exp(clamp), rtol=1e-5)
    # beyond the clamp the ratio is constant: PPO's G1 = M r gets no gradient from that token
    objective = get_preset("dr_grpo", advantage=GroupMean())
    g = jax.grad(lambda lp: objective.loss(lp, objective.prepare(INPUTS))[0])(
        logp.at[0, 0].set(1e4)
    )
    assert float(g[0, 0]) == 0.0 and np.isfinite(np.asarray(g)).all()
    # the behaviour side too: c = exp(clamp(log pi_prox - log mu)) <= e^C
    inputs = INPUTS.replace(behav_logp=INPUTS.behav_logp.at[2, 2].set(-1e4))
    _, metrics = get_preset("grpo", log_ratio_clamp=5.0)(inputs, LOGP)
    close(metrics["correction_max"], np.exp(5.0), rtol=1e-5)
