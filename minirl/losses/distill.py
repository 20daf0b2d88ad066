"""On-policy distillation as an advantage part of RLAX Eq. 3 (docs/distillation.md).

The student samples (behaviour log-probs log mu); a frozen teacher scores the student's own
tokens (log pi_T). The per-token reverse-KL sample k_it = log mu_it - log pi_T,it is a dense
(negative) reward, where a verifier gives one number per sequence:

    Adv_it = coef * sum_{t' >= t} discount^(t' - t) m_it' (-k_it')   [+ the reward's Adv_it]

and the rest of Eq. 3 (importance weights, clip, aggregation, rejection, metrics) is unchanged.
What it optimises is the reverse KL(pi_theta || pi_T) = E_y sum_t (log pi_theta - log pi_T)(y_t),
whose gradient is E_y[sum_t grad log pi_theta(y_t) sum_{t' >= t} k_t'] on-policy: discount 1 is
that unbiased estimate (tests/losses/test_distill.py checks it exactly, enumerating every
sequence of a small policy); discount 0, the default, keeps each token's own term (lower
variance, biased), as Thinking Machines' on-policy distillation does (Lu et al. 2025). Papers:
GKD (Agarwal et al. 2024), MiniLLM (Gu et al. 2024); Qwen3's small models were trained this way.

On purpose: the student's side is log mu, what the engine recorded (no extra forward; on fresh
exact-mode data it is log pi_prox bit for bit); k is clamped to [-C, C] with the objective's C (a
token outside the teacher's top-k/top-p set has log pi_T ~ -1e30); the discounted sum is
`advantages.gae` with lambda = 1, V = 0; a whitened reward advantage whitens the reward part only.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax

from minirl.losses.advantages import Advantage, gae
from minirl.losses.inputs import LossInputs, clamped_difference, masked


def teacher_log_ratio(inputs: LossInputs, valid: jax.Array, clamp: float) -> jax.Array:
    """k = clamp(log mu - log pi_T, -C, C) on the completion tokens, 0 elsewhere.  # [B, T]"""
    if inputs.teacher_logp is None:
        raise ValueError(
            "this objective has a teacher term: LossInputs.teacher_logp (the teacher's "
            "log-probs of the batch's targets) is required"
        )
    behaviour = masked(inputs.behav_logp, valid)
    return masked(clamped_difference(behaviour, masked(inputs.teacher_logp, valid), clamp), valid)


@dataclasses.dataclass(frozen=True)
class Distill:
    """Adv_it = coef sum_{t' >= t} discount^(t'-t) (log pi_T - log mu)_it' [+ reward's Adv_it].
    `reward`: the verifier's advantage part (None: the teacher alone, the `distill` preset).
    `clamp`: C for k; the objective sets it to its own `log_ratio_clamp`."""

    coef: float = 1.0
    discount: float = 0.0
    reward: Advantage | None = None
    clamp: float = 20.0
    needs_teacher: ClassVar[bool] = True

    def __post_init__(self):
        if not (self.coef > 0 and math.isfinite(self.coef)):
            raise ValueError(f"the teacher's coefficient must be finite and > 0, got {self.coef}")
        if not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"the distillation discount must be in [0, 1], got {self.discount}")

    def __call__(self, inputs: LossInputs, valid: jax.Array, counted: jax.Array | None = None):
        k = teacher_log_ratio(inputs, valid, self.clamp)  # [B, T]
        adv = gae(-self.coef * k, valid, self.discount, 1.0)  # [B, T] discounted cost-to-go
        if self.reward is not None:
            adv = adv + self.reward(inputs, valid, counted)
        return adv
