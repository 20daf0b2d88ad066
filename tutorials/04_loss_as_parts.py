# %% [markdown]
"""Lesson 04 — the loss as parts: GRPO, DAPO, Dr. GRPO and CISPO from the same five pieces.

    python tutorials/04_loss_as_parts.py            # full mode (well under a minute)
    python tutorials/04_loss_as_parts.py --fast     # fast mode (a few seconds; what CI runs)

Writes `clip_mask_vs_regulariser.png` and `results.json` into `--out` (default
`runs/tutorials/04_loss_as_parts`). Uses `minirl/losses/` (read `docs/losses.md` next).
Mirrors, in miniature: RLAX §4.1 and Eq. 3 (the paper has no figure for this; the plot is ours):
in GRPO the clip is a gradient MASK, in CISPO it is a REGULARISER (a capped importance weight,
and the gradient still flows).


THE IDEA
--------
Papers name their losses as if each were a new algorithm. RLAX (Eq. 3) shows that most of them
are one formula with different parts plugged in. For sequence i and completion token t:

    J(θ) = Σ_i Σ_t  m_it · sg[ Agg_it · IS_it ] · ( sg[ Adv_it ] · G1_it(θ) + G2_it(θ) )
    loss = −J

    m     which tokens count (rejection masks, padding)
    Agg   how tokens are averaged: per sequence, per token, per fixed length
    IS    an importance weight: 1, the ratio r = πθ/π_old, a clipped ratio, ...
    Adv   the advantage: rewards normalised within the group of G samples of one prompt
    G1    the term that carries the policy gradient: r (PPO-style) or log πθ (REINFORCE-style)
    G2    regularisers such as a KL penalty to a reference policy

`sg` is stop-gradient: Agg, IS and Adv are constants. Gradients come only from G1 and G2. In
minirl each part is a small frozen dataclass and an `Objective` is a combination of them
(minirl/losses/). Step 1 below builds four well-known losses in a few lines each and checks that
they equal the library's presets.

Why the parts matter: two losses with the same clip constant can do very different things.
Look at the gradient of J with respect to one token's log-prob, g = dJ/d log πθ, as a function of
the ratio r = πθ/π_old of that token (the policy has already moved r away from 1 during this step):

  GRPO   G1 = min(r·A, clip(r, 1−ε, 1+ε)·A)/A, written in Eq. 3 as M·r with a 0/1 mask M.
         Since d r / d log π = r:   g = Agg · A · r · M.   For A > 0 and r > 1+ε, M = 0: the
         token's gradient is EXACTLY ZERO. The clip is a MASK: this token drops out of the update.
  CISPO  IS = sg[min(r, 1+ε_hi)], G1 = log πθ:   g = Agg · A · min(r, 1+ε_hi).
         For A > 0 and r > 1+ε_hi the weight is capped at 1+ε_hi, but the gradient still FLOWS.
         The clip is a REGULARISER: it bounds the step and discards nothing.

Inside the trust region the two agree (g = Agg·A·r in both). MiniMax-M1 introduced CISPO
because the masked tokens are often the rare "fork" tokens that matter for reasoning. The price
is that CISPO has no trust region. Step 4 shows this: with several updates on one batch (the
usual PPO "epochs"), GRPO stops moving a token once its ratio leaves [1−ε, 1+ε], while CISPO keeps
pushing it.

WHAT THE SCRIPT DOES
--------------------
1. Builds GRPO, DAPO, Dr. GRPO and CISPO from parts, and checks each equals `get_preset(name)`.
2. Takes one group of two one-token sequences with rewards (1, 0), so A = (+0.707, −0.707) with
   group normalisation. Sets each token's ratio to r and takes g = dJ/d log πθ with `jax.grad`
   of the library's loss, for r from 0.5 to 1.6.
3. Prints g at a few ratios, plots g(r) for A > 0 and A < 0, and checks the mask and regulariser
   claims with numbers.
4. Trains a one-context policy (a softmax over 8 tokens) on ONE fixed batch for many updates
   with each loss, and tracks the ratio of the rewarded token: a trust region, or not.

Expected output (full mode, measured)
-------------------------------------
Measured on 2026-11-22 with `python tutorials/04_loss_as_parts.py` on a shared virtual machine
with 2 cores (nproc = 2), under heavy load from other jobs (load average 12-14). It took 87 s of
wall time and 9.0 s of CPU time (user + sys); the numbers below do not depend on the machine.
The figure is figures/04_loss_as_parts.png.

Both claims reproduce exactly. GRPO's gradient for an A > 0 token is 0 beyond r = 1.2, and for
an A < 0 token below r = 0.8. CISPO's gradient is capped at 1.28·A·Agg = 0.4525 but never 0.
Under repeated updates on one batch, GRPO's rewarded token stops at r = 1.33. It ends a little
above 1.2 because, after its own gradient is masked, the three unrewarded tokens keep falling
until they reach r = 0.8, and the softmax hands their probability to token 0. CISPO's keeps
climbing towards the largest possible ratio, 8 (π_old = 1/8).

    mode: full   jax 0.10.2

    Step 1. four losses from parts, each equal to the library's preset:
      GRPO      Agg=SequenceMean IS=1                       Adv=GroupNorm G1=ClippedRatio G2=['K3KL']  == get_preset('grpo'): True
      DAPO      Agg=TokenMean    IS=1                       Adv=GroupNorm G1=ClippedRatio G2=-         == get_preset('dapo'): True
      Dr. GRPO  Agg=MaxLength    IS=1                       Adv=GroupMean G1=ClippedRatio G2=-         == get_preset('dr_grpo'): True
      CISPO     Agg=TokenMean    IS=['ClippedTokenRatio']   Adv=GroupNorm G1=LogProb      G2=-         == get_preset('cispo'): True

    Step 2. g = dJ/d log πθ per token (KL off in GRPO so the clip is seen alone)
                           r     0.70     0.90     1.00     1.10     1.25     1.50
      A > 0 GRPO              0.2475   0.3182   0.3536   0.3889   0.0000   0.0000
      A > 0 DAPO              0.2475   0.3182   0.3536   0.3889   0.4419   0.0000
      A > 0 Dr. GRPO          0.1750   0.2250   0.2500   0.2750   0.0000   0.0000
      A > 0 CISPO             0.2475   0.3182   0.3536   0.3889   0.4419   0.4525
      A < 0 GRPO              0.0000  -0.3182  -0.3536  -0.3889  -0.4419  -0.5303
      A < 0 DAPO              0.0000  -0.3182  -0.3536  -0.3889  -0.4419  -0.5303
      A < 0 Dr. GRPO          0.0000  -0.2250  -0.2500  -0.2750  -0.3125  -0.3750
      A < 0 CISPO            -0.2475  -0.3182  -0.3536  -0.3889  -0.4419  -0.4525

    Step 3. the claims, checked on the curves:
      grpo_A_pos_masked_beyond_1.2     True
      grpo_A_neg_masked_below_0.8      True
      cispo_A_pos_capped_not_zero      True
      cispo_A_neg_never_zero           True
      equal_inside_trust_region        True
      GRPO (with its KL, β = 0.04) at r = 1.5: clip_fraction = 0.50; the k3 KL adds β(π_ref/πθ − 1) = -0.0133 per token before Agg

    Step 4. 60 updates on ONE batch (4 samples, only token 0 rewarded): ratio of the rewarded token
      after update        1       5      10      60
      GRPO            1.097   1.256   1.327   1.327
      DAPO            1.097   1.380   1.464   1.464
      Dr. GRPO        1.048   1.224   1.261   1.332
      CISPO           1.097   1.659   2.598   7.091
      -> GRPO stops at r = 1.33 (no gradient left); CISPO reaches r = 7.09 (capped weight, the gradient still flows)

    wrote runs/tutorials/04_loss_as_parts/clip_mask_vs_regulariser.png and runs/tutorials/04_loss_as_parts/results.json
"""

# %%
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure

from minirl.losses import (
    K3KL,
    ClippedRatio,
    ClippedTokenRatio,
    GroupMean,
    GroupNorm,
    LogProb,
    LossInputs,
    MaxLength,
    Objective,
    SequenceMean,
    TokenMean,
    get_preset,
)

# %% [markdown]
# Step 1: four losses from parts. Each is a few lines. Compare with minirl/losses/presets.py.


# %%
GRPO = Objective(  # DeepSeekMath: per-sequence mean, group-normalised advantage, PPO clip, k3 KL
    name="grpo",
    aggregation=SequenceMean(),
    advantage=GroupNorm(eps=1e-6),
    gradient_term=ClippedRatio(eps_lo=0.2, eps_hi=0.2),
    regularizers=(K3KL(beta=0.04),),
)
DAPO = Objective(  # token-level mean, "clip-higher" (0.2, 0.28), no KL, dynamic sampling
    name="dapo",
    aggregation=TokenMean(),
    advantage=GroupNorm(eps=1e-6),
    gradient_term=ClippedRatio(eps_lo=0.2, eps_hi=0.28),
    dynamic_filtering=True,
)
DR_GRPO = Objective(  # no length bias (1 / (N L_max)) and no std division
    name="dr_grpo",
    aggregation=MaxLength(),
    advantage=GroupMean(),
    gradient_term=ClippedRatio(eps_lo=0.2, eps_hi=0.2),
)
CISPO = Objective(  # the clip moves from the gradient term into a stop-gradient IS weight
    name="cispo",
    aggregation=TokenMean(),
    importance=(ClippedTokenRatio(eps_lo=1.0, eps_hi=0.28),),
    advantage=GroupNorm(eps=1e-6),
    gradient_term=LogProb(),
)
LOSSES = {"GRPO": GRPO, "DAPO": DAPO, "Dr. GRPO": DR_GRPO, "CISPO": CISPO}
COLORS = {"GRPO": "tab:blue", "DAPO": "tab:green", "Dr. GRPO": "tab:purple", "CISPO": "tab:red"}

FULL = dict(ratios=np.linspace(0.5, 1.6, 1101), updates=60)
FAST = dict(ratios=np.linspace(0.5, 1.6, 111), updates=30)


# %%
def without_kl(objective: Objective) -> Objective:
    """The same loss without its KL term, so the plot shows the clip alone."""
    return dataclasses.replace(objective, regularizers=())


# %% [markdown]
# Step 2: g = dJ/d log π for one group of two one-token sequences, as a function of the ratio.


# %%
def two_token_group(ratio):
    """Rows (A > 0, A < 0), one token each, both with ratio `ratio` to π_old = 0.5."""
    old = jnp.log(jnp.full((2, 1), 0.5))  # [B, T] log π_old (= log μ: no staleness here)
    inputs = LossInputs(
        mask=jnp.ones((2, 1)),
        prox_logp=old,
        behav_logp=old,
        rewards=jnp.array([1.0, 0.0]),
        group_ids=jnp.array([0, 0], jnp.int32),
        ref_logp=old,
    )
    return inputs, old + jnp.log(ratio)  # log πθ = log π_old + log r


# %%
def gradient_weight(objective: Objective, ratios: np.ndarray) -> np.ndarray:
    """g(r) = dJ/d log πθ of the A > 0 token and the A < 0 token: [len(ratios), 2]."""

    def g(ratio):
        inputs, logp = two_token_group(ratio)
        prepared = objective.prepare(inputs)  # phase 1: advantages, Agg weights (θ-free)
        minus_loss = lambda lp: -objective.loss(lp, prepared)[0]  # phase 2: J = −loss
        return jax.grad(minus_loss)(logp)[:, 0]  # [2]

    return np.asarray(jax.jit(jax.vmap(g))(jnp.asarray(ratios, jnp.float32)))


# %% [markdown]
# Step 4: many updates on one fixed batch. Policy: softmax over 8 logits θ (one context).
# Batch: a group of 4 samples, tokens 0..3, only token 0 rewarded. π_old = uniform (1/8 each).


# %%
def ratio_trajectory(objective: Objective, updates: int, lr: float = 0.25) -> np.ndarray:
    """Plain gradient ascent on J for `updates` steps on the same batch (π_old fixed, as in PPO
    epochs). Returns the ratio πθ(token 0) / π_old(token 0) after each update: [updates + 1]."""
    tokens = jnp.array([[0], [1], [2], [3]])  # [B, T]
    old = jnp.full((4, 1), jnp.log(1 / 8))
    inputs = LossInputs(
        mask=jnp.ones((4, 1)),
        prox_logp=old,
        behav_logp=old,
        rewards=jnp.array([1.0, 0.0, 0.0, 0.0]),
        group_ids=jnp.zeros(4, jnp.int32),
        ref_logp=old,
    )
    prepared = objective.prepare(inputs)

    def minus_loss(theta):
        logp = jnp.take(jax.nn.log_softmax(theta), tokens)  # [B, T] log πθ of each sample
        return -objective.loss(logp, prepared)[0]

    @jax.jit
    def update(theta):
        return theta + lr * jax.grad(minus_loss)(theta)

    theta = jnp.zeros(8)
    ratios = [1.0]
    for _ in range(updates):
        theta = update(theta)
        ratios.append(float(jax.nn.softmax(theta)[0] * 8))
    return np.array(ratios)


# %%
def plot(ratios, weights, trajectories, path: Path) -> None:
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    axes = fig.subplots(1, 3)
    for col, (ax, title) in enumerate(
        zip(
            axes[:2],
            ("A > 0  (A = +0.707; Dr. GRPO +0.5)", "A < 0  (A = −0.707; Dr. GRPO −0.5)"),
            strict=True,
        )
    ):
        for name, w in weights.items():
            ax.plot(
                ratios,
                w[:, col],
                color=COLORS[name],
                lw=2.5 if name in ("GRPO", "CISPO") else 1.2,
                linestyle="-" if name in ("GRPO", "CISPO") else "--",
                label=name,
            )
        ax.axhline(0, color="gray", lw=0.5)
        ax.axvline(1, color="gray", lw=0.5, linestyle=":")
        ax.set_xlabel("ratio r = πθ / π_old of this token")
        ax.set_ylabel("gradient weight dJ / d log πθ")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    axes[0].annotate(
        "GRPO: masked (0)\nbeyond 1 + ε",
        xy=(1.4, 0.0),
        xytext=(1.25, 0.12),
        arrowprops=dict(arrowstyle="->"),
        fontsize=8,
    )
    axes[0].annotate(
        "CISPO: capped at\n(1 + 0.28)·A·Agg",
        xy=(1.45, 0.4525),
        xytext=(0.6, 0.42),
        arrowprops=dict(arrowstyle="->"),
        fontsize=8,
    )
    ax = axes[2]
    for name, r in trajectories.items():
        ax.plot(r, color=COLORS[name], label=name)
    ax.axhline(1.2, color="gray", lw=0.5, linestyle=":")
    ax.annotate("1 + ε = 1.2", xy=(0, 1.2), xytext=(0.5, 1.3), fontsize=8)
    ax.set_xlabel("updates on the same batch")
    ax.set_ylabel("ratio of the rewarded token")
    ax.set_title("many updates on one batch: a trust region, or not", fontsize=10)
    ax.legend(fontsize=8)
    fig.suptitle("RLAX Eq. 3: the clip is a MASK in GRPO (KL off) and a REGULARISER in CISPO")
    fig.savefig(path, dpi=110)


# %%
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="fewer points and updates (CI)")
    parser.add_argument("--out", default="runs/tutorials/04_loss_as_parts")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    s = FAST if args.fast else FULL
    print(f"mode: {'fast' if args.fast else 'full'}   jax {jax.__version__}")

    print("\nStep 1. four losses from parts, each equal to the library's preset:")
    for name, objective in LOSSES.items():
        same = objective == get_preset(objective.name)
        print(
            f"  {name:9s} Agg={type(objective.aggregation).__name__:12s} "
            f"IS={[type(p).__name__ for p in objective.importance] or 1!s:23s} "
            f"Adv={type(objective.advantage).__name__:9s} "
            f"G1={type(objective.gradient_term).__name__:12s} "
            f"G2={[type(p).__name__ for p in objective.regularizers] or '-'!s:9s} "
            f"== get_preset({objective.name!r}): {same}"
        )
        if not same:
            raise SystemExit(f"{name} built from parts differs from get_preset({objective.name!r})")

    print("\nStep 2. g = dJ/d log πθ per token (KL off in GRPO so the clip is seen alone)")
    ratios = s["ratios"]
    weights = {name: gradient_weight(without_kl(o), ratios) for name, o in LOSSES.items()}
    probe = [0.7, 0.9, 1.0, 1.1, 1.25, 1.5]
    rows = [int(np.argmin(np.abs(ratios - r))) for r in probe]
    print("  " + f"{'r':>22s}" + "".join(f"{r:9.2f}" for r in probe))
    for col, sign in ((0, "A > 0"), (1, "A < 0")):
        for name, w in weights.items():
            print(f"  {sign} {name:15s}" + "".join(f"{w[i, col] + 0.0:9.4f}" for i in rows))

    # Step 3: the claims, as numbers (the worked example of docs/losses.md is r = 1.5 and 0.9).
    grpo, cispo = weights["GRPO"], weights["CISPO"]
    beyond = ratios > 1.2 + 1e-6
    inside = (ratios > 0.8 + 1e-6) & (ratios < 1.2 - 1e-6)
    claims = {
        "grpo_A_pos_masked_beyond_1.2": bool((grpo[beyond, 0] == 0).all()),
        "grpo_A_neg_masked_below_0.8": bool((grpo[ratios < 0.8 - 1e-6, 1] == 0).all()),
        "cispo_A_pos_capped_not_zero": bool(
            np.allclose(cispo[ratios > 1.28 + 1e-6, 0], 0.5 * 1.28 * 0.70711, atol=1e-4)
        ),
        "cispo_A_neg_never_zero": bool((cispo[:, 1] < 0).all()),
        "equal_inside_trust_region": bool(np.allclose(grpo[inside], cispo[inside], atol=1e-5)),
    }
    print("\nStep 3. the claims, checked on the curves:")
    for claim, ok in claims.items():
        print(f"  {claim:32s} {ok}")
    if not all(claims.values()):
        raise SystemExit("a claim of this lesson does not hold: see the table above")
    inputs, logp = two_token_group(1.5)
    _, m = get_preset("grpo")(inputs, logp)
    print(
        f"  GRPO (with its KL, β = 0.04) at r = 1.5: clip_fraction = {float(m['clip_fraction']):.2f}"
        f"; the k3 KL adds β(π_ref/πθ − 1) = {0.04 * (1 / 1.5 - 1):+.4f} per token before Agg"
    )

    print(
        f"\nStep 4. {s['updates']} updates on ONE batch (4 samples, only token 0 rewarded): "
        "ratio of the rewarded token"
    )
    trajectories = {
        name: ratio_trajectory(without_kl(o), s["updates"]) for name, o in LOSSES.items()
    }
    marks = [1, 5, 10, s["updates"]]
    print("  after update " + "".join(f"{k:8d}" for k in marks))
    for name, r in trajectories.items():
        print(f"  {name:12s} " + "".join(f"{r[k]:8.3f}" for k in marks))
    stops = {name: float(r[-1]) for name, r in trajectories.items()}
    print(
        f"  -> GRPO stops at r = {stops['GRPO']:.2f} (no gradient left); CISPO reaches "
        f"r = {stops['CISPO']:.2f} (capped weight, the gradient still flows)"
    )
    if not stops["GRPO"] < 1.5 < stops["CISPO"]:
        raise SystemExit("expected GRPO to stop near its trust region and CISPO to go past it")

    plot(ratios, weights, trajectories, out / "clip_mask_vs_regulariser.png")
    (out / "results.json").write_text(
        json.dumps(
            {
                "mode": "fast" if args.fast else "full",
                "claims": claims,
                "gradient_weight_at": {
                    name: {f"{r}": w[i].tolist() for r, i in zip(probe, rows, strict=True)}
                    for name, w in weights.items()
                },
                "final_ratio_of_rewarded_token": stops,
            },
            indent=1,
        )
    )
    print(f"\nwrote {out / 'clip_mask_vs_regulariser.png'} and {out / 'results.json'}")


# %%
if __name__ == "__main__":
    main()
