"""On-policy distillation as an advantage part of RLAX Eq. 3: a teacher's per-token opinion.

The student samples (the rollout engine, behaviour log-probs log mu); a frozen teacher scores the
student's OWN tokens (log pi_T, one forward over the batch, minirl/training/teacher.py). The
per-token reverse-KL sample

    k_it = log mu_it - log pi_T,it          (> 0 where the student likes a token more than the teacher)

is a dense, per-token (negative) reward, where a verifier gives one number per sequence:

    Adv_it = coef * sum_{t' >= t} discount^(t' - t) m_it' (-k_it')   [+ the reward's Adv_it]

so the rest of Eq. 3 (importance weights, clipping, aggregation, rejection, every metric) applies
unchanged. The `distill` preset (presets.py) is this advantage alone, token mean, decoupled PPO's
surrogate; `with_teacher` adds it, times `coef`, to any other preset's reward advantage.

WHAT IT OPTIMISES. The student's reverse KL to the teacher over its own sequences,
KL(pi_theta || pi_T) = E_{y ~ pi_theta} sum_t (log pi_theta - log pi_T)(y_t | y_<t). Its gradient is
the score function with the cost-to-go (the term E[sum_t grad log pi_theta] is 0, and a token does
not change the cost of the tokens before it):

    grad KL = E_y[ sum_t grad log pi_theta(y_t) * sum_{t' >= t} k_t' ]      (on-policy: mu = pi_theta)

so discount = 1 makes -grad J an unbiased estimate of grad KL (tests/losses/test_distill.py checks
this exactly, by enumerating every sequence of a small policy). discount = 0, the default, keeps
only each token's own term: lower variance, biased (it ignores how a token changes the teacher's
opinion of the tokens after it); it is what Thinking Machines' on-policy distillation (Lu et al.
2025, the Tinker cookbook) uses. GKD (Agarwal et al. 2024) and MiniLLM (Gu et al. 2024) are the
papers; Qwen3's small models were post-trained this way (the Qwen3 report's strong-to-weak
distillation).

Choices made here, on purpose:
- The student's side is log mu, what the engine recorded when it sampled (no extra forward, as the
  Tinker cookbook does). On fresh data in exact mode log mu IS log pi_prox, bit for bit; on stale
  data the advantage measures the behaviour policy's distance to the teacher, and the importance
  weights correct only which tokens were sampled.
- k is clamped to [-C, C] (C = the objective's `log_ratio_clamp`): under top-k/top-p a token
  outside the teacher's truncated set has log pi_T of about -1e30 (minirl/modeling/sampling.py).
- The discounted sum is `advantages.gae` with lambda = 1 and V = 0 (token rewards -k).
- A reward advantage that whitens (`whiten=True`) whitens the reward part only; the teacher's part
  is added after, in its own units (nats per token).
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
