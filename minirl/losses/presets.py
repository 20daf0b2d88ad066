"""Named losses: each preset is a few lines naming its parts, with its paper's defaults.

    preset           Agg            IS                    Adv                 G1                      G2
    grpo             sequence_mean  1                     group_norm          clipped_ratio(.2,.2)    k3_kl(0.04)
    dapo             token_mean     1                     group_norm          clipped_ratio(.2,.28)   -
    dr_grpo          max_length     1                     group_mean          clipped_ratio(.2,.2)    -
    reinforce        last_token     sequence_ratio        group_mean          sequence_logprob        -
    token_reinforce  max_length     token_ratio           group_mean          logprob                 -
    rloo             max_length     token_ratio           leave_one_out       logprob                 -
    reinforce_pp     token_mean     1                     batch_whiten        clipped_ratio(.2,.2)    k2_kl(1e-3)
    cispo            token_mean     clip(r, 0, 1.28)      group_norm          logprob                 -
    gspo             sequence_mean  s_i                   group_norm          gspo_clipped(3e-4,4e-4) -
    ppo              token_mean     1                     gae(1, 1)           clipped_ratio(.2,.2,dual 3)  -
    decoupled_ppo    token_mean     c 1[c <= 5]           group_norm+whiten   clipped_ratio(.2,.2)    -
    naive_ppo        token_mean     c = pi_prox/mu        group_norm+whiten   clipped_ratio on pi/mu  -
    distill          token_mean     c = pi_prox/mu        teacher: -(log mu - log pi_T)  clipped_ratio(.2,.2)  -

Variants, for any preset, by function or by name suffix (applied left to right): `with_tis`
(`<name>_tis`), `with_rejection` (`<name>_mis`), `with_behaviour_cap`, `with_kl_coef` and
`with_teacher`, e.g. `get_preset("decoupled_ppo_tis_mis", log_ratio_clamp=5.0)`. What each does,
the run settings behind them, and every preset's defaults and paper: docs/losses.md, "Presets".
Our own choices, not a paper's: REINFORCE++'s k2 coefficient 1e-3 and the `_mis` thresholds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from minirl.losses.advantages import GAE, GroupMean, GroupNorm, LeaveOneOut, batch_whiten
from minirl.losses.aggregation import LastToken, MaxLength, SequenceMean, TokenMean
from minirl.losses.distill import Distill
from minirl.losses.importance import (
    ClippedTokenRatio,
    Correction,
    GeometricSequenceRatio,
    SequenceRatio,
    TokenRatio,
    TruncatedCorrection,
)
from minirl.losses.objective import Objective
from minirl.losses.regularizers import K2KL, K3KL, KL
from minirl.losses.rejection import SequenceReject, TokenReject
from minirl.losses.terms import ClippedRatio, GSPOClipped, LogProb, SequenceLogProb


def grpo() -> Objective:
    """DeepSeekMath GRPO, as RLAX Listing 1: per-sequence mean of min(rA, clip(r)A) - beta k3."""
    return Objective(
        name="grpo",
        aggregation=SequenceMean(),
        advantage=GroupNorm(eps=1e-6),
        gradient_term=ClippedRatio(eps_lo=0.2, eps_hi=0.2),
        regularizers=(K3KL(beta=0.04),),
    )


def dapo() -> Objective:
    """DAPO: token-level mean, clip-higher (0.2, 0.28), no KL, dynamic sampling on."""
    return Objective(
        name="dapo",
        aggregation=TokenMean(),
        advantage=GroupNorm(eps=1e-6),
        gradient_term=ClippedRatio(eps_lo=0.2, eps_hi=0.28),
        dynamic_filtering=True,
    )


def dr_grpo() -> Objective:
    """Dr. GRPO: constant 1/(N L_max) weights and no std division: no length or difficulty bias."""
    return Objective(
        name="dr_grpo",
        aggregation=MaxLength(),
        advantage=GroupMean(),
        gradient_term=ClippedRatio(eps_lo=0.2, eps_hi=0.2),
    )


def reinforce() -> Objective:
    """Sequence-level REINFORCE (RLAX App. A, Eq. 6): (1/N) sum_i sg[r_i] A_i log pi(o_i)."""
    return Objective(
        name="reinforce",
        aggregation=LastToken(),
        importance=(SequenceRatio(),),
        advantage=GroupMean(),
        gradient_term=SequenceLogProb(),
    )


def token_reinforce() -> Objective:
    """Token-level REINFORCE (RLAX App. A): 1/(N L_max) sum sg[r_it] A_i log pi_it."""
    return Objective(
        name="token_reinforce",
        aggregation=MaxLength(),
        importance=(TokenRatio(),),
        advantage=GroupMean(),
        gradient_term=LogProb(),
    )


def rloo() -> Objective:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024), token-level form."""
    return Objective(
        name="rloo",
        aggregation=MaxLength(),
        importance=(TokenRatio(),),
        advantage=LeaveOneOut(),
        gradient_term=LogProb(),
    )


def reinforce_pp() -> Objective:
    """REINFORCE++-baseline: group mean, batch whitening, PPO clip, k2 KL in the loss."""
    return Objective(
        name="reinforce_pp",
        aggregation=TokenMean(),
        advantage=batch_whiten(),
        gradient_term=ClippedRatio(eps_lo=0.2, eps_hi=0.2),
        regularizers=(K2KL(beta=1e-3),),
    )


def cispo() -> Objective:
    """CISPO (MiniMax-M1 Eq. 4): sg[clip(r, 1 - eps_lo, 1 + eps_hi)] A log pi, token mean."""
    return Objective(
        name="cispo",
        aggregation=TokenMean(),
        importance=(ClippedTokenRatio(eps_lo=1.0, eps_hi=0.28),),
        advantage=GroupNorm(eps=1e-6),
        gradient_term=LogProb(),
    )


def gspo() -> Objective:
    """GSPO: sequence ratio s_i = (pi_theta/pi_old)^(1/n_i), clipped at the sequence level."""
    return Objective(
        name="gspo",
        aggregation=SequenceMean(),
        importance=(GeometricSequenceRatio(),),
        advantage=GroupNorm(eps=1e-6),
        gradient_term=GSPOClipped(eps_lo=3e-4, eps_hi=4e-4),
    )


def ppo() -> Objective:
    """PPO with the dual clip (Ye et al. 2020), GAE advantages with V = 0 (no critic)."""
    return Objective(
        name="ppo",
        aggregation=TokenMean(),
        advantage=GAE(gamma=1.0, lam=1.0),
        gradient_term=ClippedRatio(eps_lo=0.2, eps_hi=0.2, dual_clip=3.0),
    )


BEHAVIOUR_CAP = 5.0  # AReaL's bound on c = pi_prox/mu (its example configs' `upper: 5.0`)


def decoupled_ppo() -> Objective:
    """AReaL Eq. 5: sum_t sg[c] min(u A, clip(u) A), c = pi_prox/mu, u = pi_theta/pi_prox, with
    advantages normalised over the global batch; as AReaL's released trainer runs it, tokens
    with c > 5 are dropped from the sum (still counted in the mean). `with_behaviour_cap(p,
    None)` gives the paper's uncapped Eq. 5."""
    return Objective(
        name="decoupled_ppo",
        aggregation=TokenMean(),
        importance=(Correction(cap=BEHAVIOUR_CAP),),
        advantage=GroupNorm(eps=1e-6, whiten=True),
        gradient_term=ClippedRatio(eps_lo=0.2, eps_hi=0.2),
    )


def naive_ppo() -> Objective:
    """AReaL Eq. 2 with pi_old = mu, the baseline of AReaL Table 2 ("w/o" decoupled PPO):
    sum_t min(u A, clip(u) A), u = pi_theta/mu. Decoupled PPO's parts, but the clip is centred on
    the behaviour policy that sampled the tokens instead of the trainer's recompute. On fresh
    data (c = 1) the two are the same loss; on stale data they differ."""
    return Objective(
        name="naive_ppo",
        aggregation=TokenMean(),
        importance=(Correction(),),
        advantage=GroupNorm(eps=1e-6, whiten=True),
        gradient_term=ClippedRatio(eps_lo=0.2, eps_hi=0.2, centre="behaviour"),
    )


def distill() -> Objective:
    """On-policy distillation (GKD's reverse KL, Agarwal et al. 2024; Lu et al. 2025) through
    decoupled PPO's surrogate sum_t sg[c] min(u A, clip(u) A), c unbounded; A = -(log mu - log pi_T)."""
    return Objective(
        name="distill",
        aggregation=TokenMean(),
        importance=(Correction(),),
        advantage=Distill(coef=1.0, discount=0.0),
        gradient_term=ClippedRatio(eps_lo=0.2, eps_hi=0.2),
    )


PRESETS: dict[str, Callable[[], Objective]] = {
    f.__name__: f
    for f in (
        grpo,
        dapo,
        dr_grpo,
        reinforce,
        token_reinforce,
        rloo,
        reinforce_pp,
        cispo,
        gspo,
        ppo,
        decoupled_ppo,
        naive_ppo,
        distill,
    )
}


def with_tis(objective: Objective, cap: float = 2.0) -> Objective:
    """Truncated importance sampling: multiply IS by min(c, cap). A preset that already weights
    by c (decoupled PPO) has that weight truncated instead of squared."""
    parts = tuple(
        p for p in objective.importance if not isinstance(p, (Correction, TruncatedCorrection))
    )
    return dataclasses.replace(
        objective, name=f"{objective.name}_tis", importance=(*parts, TruncatedCorrection(cap))
    )


def with_behaviour_cap(objective: Objective, cap: float | None) -> Objective:
    """The objective with its behaviour correction c bounded by `cap` (None: uncapped). Only
    for objectives that weight by c with a bound (decoupled PPO); others raise ValueError."""
    if not has_behaviour_cap(objective):
        raise ValueError(
            f"loss {objective.name!r} has no bound on c = pi_prox/mu to set "
            "(decoupled_ppo and its _mis variant have one)"
        )
    parts = tuple(Correction(cap) if isinstance(p, Correction) else p for p in objective.importance)
    return dataclasses.replace(objective, importance=parts)


def with_kl_coef(objective: Objective, beta: float) -> Objective:
    """The objective with every KL regulariser's coefficient set to `beta`; `beta` = 0 removes
    them, so `needs_ref` turns False and the trainer keeps no reference model and runs no
    reference forward. Objectives without a KL term raise ValueError unless `beta` is 0."""
    if beta < 0:
        raise ValueError(f"KL coefficient must be >= 0, got {beta}")
    kl = lambda r: isinstance(r, KL)
    if beta > 0 and not any(kl(r) for r in objective.regularizers):
        raise ValueError(f"loss {objective.name!r} has no KL term to set a coefficient on")
    parts = tuple(
        dataclasses.replace(r, beta=beta) if kl(r) else r
        for r in objective.regularizers
        if beta > 0 or not kl(r)
    )
    return dataclasses.replace(objective, regularizers=parts)


def with_teacher(objective: Objective, coef: float = 1.0, discount: float = 0.0) -> Objective:
    """The objective with `coef` x the teacher's per-token advantage (distill.py) added to its
    reward advantage (or, for `distill`, its own coefficient and discount set)."""
    if isinstance(objective.gradient_term, SequenceLogProb):  # reads one advantage per sequence
        raise ValueError(f"loss {objective.name!r} is sequence-level: use a token-level loss")
    adv = objective.advantage
    reward = adv.reward if isinstance(adv, Distill) else adv
    return dataclasses.replace(objective, advantage=Distill(coef, discount, reward))


def with_router_aux(objective: Objective, coef: float) -> Objective:
    """The objective plus `coef` x the routers' load-balancing loss (a mixture-of-experts
    model's: E sum_e f_e P_e per MoE layer, minirl/modeling/moe.py), which the trainer's forward
    computes from the router probabilities (no other part sees them); 0 = off."""
    return dataclasses.replace(objective, router_aux_coef=float(coef))


def make_objective(
    name: str,
    behaviour_cap: float,
    kl_coef: float | None = None,
    router_aux_coef: float = 0.0,
    distill_coef: float | None = None,
    discount: float = 0.0,
) -> Objective:
    """The loss a run trains with (`rl.loss`, `rl.behaviour_cap`, `rl.kl_coef`,
    `rl.router_aux_coef`, `rl.distill_coef`, `rl.distill_discount`): the preset `name`, its KL
    coefficient set to `kl_coef` (None = the preset's), the load-balancing part added with
    `router_aux_coef`, the teacher's advantage with `distill_coef` (None = the preset's: 1 for
    `distill`, none for the others; 0 = none) and `discount`, its bound on c set to
    `behaviour_cap` (0 = uncapped) if it has one."""
    objective = get_preset(name)
    if objective.needs_teacher or distill_coef:
        coef = objective.advantage.coef if distill_coef is None else distill_coef
        objective = with_teacher(objective, coef, discount)
    if router_aux_coef:
        objective = with_router_aux(objective, router_aux_coef)
    if kl_coef is not None:
        objective = with_kl_coef(objective, kl_coef)
    if not has_behaviour_cap(objective):
        return objective
    return with_behaviour_cap(objective, behaviour_cap or None)


def has_behaviour_cap(objective: Objective) -> bool:
    """True if the objective weights by c with a bound (the bound `with_behaviour_cap` sets)."""
    return any(isinstance(p, Correction) and p.cap is not None for p in objective.importance)


def with_rejection(
    objective: Objective,
    token: tuple[float, float] | None = (0.5, 5.0),
    sequence: tuple[str, float] | None = ("mean_k1", 0.01),
) -> Objective:
    """Masked IS: reject tokens with c outside [lo, hi], then sequences with stat > U (either
    may be None). Rejected tokens leave the loss and its denominators."""
    if token is None and sequence is None:
        raise ValueError("with_rejection needs a token rule, a sequence rule, or both")
    return dataclasses.replace(
        objective,
        name=f"{objective.name}_mis",
        token_reject=None if token is None else TokenReject(*token),
        sequence_reject=None if sequence is None else SequenceReject(*sequence),
    )


VARIANTS: dict[str, Callable[[Objective], Objective]] = {"tis": with_tis, "mis": with_rejection}


def list_presets() -> list[str]:
    """The base presets, and each with the `_tis`, `_mis` and `_tis_mis` suffixes."""
    suffixes = ("", "_tis", "_mis", "_tis_mis")
    return [name + s for name in PRESETS for s in suffixes]


def get_preset(name: str, **overrides) -> Objective:
    """The named objective, with `Objective` fields replaced by `overrides`
    (e.g. `get_preset("grpo", log_ratio_clamp=5.0)`, `get_preset("dapo_tis")`)."""
    base, variants = name, []
    while base not in PRESETS and base.rpartition("_")[2] in VARIANTS:
        base, _, suffix = base.rpartition("_")
        variants.insert(0, VARIANTS[suffix])
    if base not in PRESETS:
        raise ValueError(
            f"unknown loss preset {name!r}; known presets: {', '.join(PRESETS)} "
            f"(each also with the suffixes _tis, _mis, _tis_mis)"
        )
    objective = PRESETS[base]()
    for variant in variants:
        objective = variant(objective)
    fields = {f.name for f in dataclasses.fields(Objective)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(
            f"unknown Objective fields {unknown} for preset {name!r}; fields: {sorted(fields)}"
        )
    return dataclasses.replace(objective, **overrides)
