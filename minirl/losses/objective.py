"""The objective: RLAX Eq. 3 assembled from parts, evaluated in two phases.

    J(theta) = sum_i sum_t m_it sg[Agg_it IS_it] (sg[Adv_it] G1_it(theta) + G2_it(theta)),  loss = -J

`sg` = `jax.lax.stop_gradient`; gradients come only from G1 (`gradient_term`) and G2
(`regularizers`). The parts live in aggregation.py, importance.py, advantages.py, terms.py,
regularizers.py and rejection.py; presets.py names the combinations of the papers.

The two phases (what the trainer calls): `prepare(inputs)` runs once on the WHOLE train batch and
does everything that depends on the batch and not on theta (advantages, rejection masks, the
aggregation weights with N, sum n and L_max folded in); `loss(logp, take_rows(prepared, rows),
entropy=None)` runs per micro-batch of whole rows and returns `(loss_sum, metrics)`: this slice's
share of -J with NO further division, and its metric sums (metrics.py). Summed over any partition
of the rows, the loss and its gradient are exactly the full-batch ones. `objective(inputs, logp)`
does both phases on the full batch. `needs_ref`, `needs_teacher` and `needs_entropy` tell the
trainer what to supply: `ref_logp` or `teacher_logp` (on-policy distillation, distill.py) in the
inputs, per-token `entropy` [b, T] to `loss`. There is no value loss: minirl trains no critic.

The code sketch, PPO-style mini-batches (`prepare` each update's rows) and the inputs both phases
refuse (shapes; non-finite rewards): docs/losses.md, "The two-phase API (what the trainer calls)".
How a non-finite log pi_theta at a counted token is read, the same for every preset, so the loss
and its gradient stay finite: docs/losses.md, "Where the code deliberately differs from the
papers".

Garbage (-inf, nan) at masked positions never reaches the loss or its gradient (`jnp.where`, never
`mask * x`), and every log-ratio is clamped to [-C, C] before exp (C = `log_ratio_clamp`, 20).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from minirl.losses.advantages import Advantage
from minirl.losses.aggregation import Aggregation
from minirl.losses.distill import Distill, teacher_log_ratio
from minirl.losses.importance import ImportanceWeight
from minirl.losses.inputs import (
    Context,
    LossInputs,
    Prepared,
    check_finite_rewards,
    check_rows,
    check_shapes,
    clamped_difference,
    masked,
)
from minirl.losses.metrics import batch_statistics, finalize_metrics, slice_metrics
from minirl.losses.regularizers import Regularizer
from minirl.losses.rejection import SequenceReject, TokenReject, apply_rejection
from minirl.losses.terms import GradientTerm


@dataclasses.dataclass(frozen=True)
class Objective:
    """One loss = one combination of parts. Frozen and hashable: safe to close over in `jit`."""

    name: str
    aggregation: Aggregation  # Agg: how tokens are averaged (batch normalisers)
    advantage: Advantage  # Adv: from rewards, once per batch
    gradient_term: GradientTerm  # G1: where the policy gradient comes from
    importance: tuple[ImportanceWeight, ...] = ()  # IS = product of these (() = 1)
    regularizers: tuple[Regularizer, ...] = ()  # G2 = sum of these (() = 0)
    token_reject: TokenReject | None = None  # rejection of tokens by c (phase 1)
    sequence_reject: SequenceReject | None = None  # rejection of sequences by c (phase 1)
    log_ratio_clamp: float = 20.0  # C: log-ratios clamped to [-C, C] before exp
    dynamic_filtering: bool = False  # read by the data layer (DAPO): drop groups with no spread
    router_aux_coef: float = 0.0  # MoE: weight of the routers' load-balancing loss (below)

    def __post_init__(self):
        for field in ("importance", "regularizers"):
            if not isinstance(getattr(self, field), tuple):
                raise TypeError(
                    f"Objective.{field} must be a tuple of parts, got {getattr(self, field)!r}"
                )
        if not (self.log_ratio_clamp > 0 and math.isfinite(self.log_ratio_clamp)):
            raise ValueError(f"log_ratio_clamp must be finite and > 0, got {self.log_ratio_clamp}")
        if not (self.router_aux_coef >= 0 and math.isfinite(self.router_aux_coef)):
            raise ValueError(f"router_aux_coef must be finite and >= 0, got {self.router_aux_coef}")
        if isinstance(self.advantage, Distill):  # the teacher's log-ratio is clamped with our C
            synced = dataclasses.replace(self.advantage, clamp=self.log_ratio_clamp)
            object.__setattr__(self, "advantage", synced)

    # -- what the trainer must supply ------------------------------------------------------------
    @property
    def needs_ref(self) -> bool:
        """A KL term is present: `LossInputs.ref_logp` is required."""
        return any(getattr(r, "needs_ref", False) for r in self.regularizers)

    @property
    def needs_teacher(self) -> bool:
        """A teacher term is present (on-policy distillation): `LossInputs.teacher_logp` is
        required."""
        return getattr(self.advantage, "needs_teacher", False)

    @property
    def needs_entropy(self) -> bool:
        """An entropy bonus is present: pass `entropy` [b, T] to `loss`."""
        return any(getattr(r, "needs_entropy", False) for r in self.regularizers)

    # -- phase 1 ---------------------------------------------------------------------------------
    def prepare(self, inputs: LossInputs) -> Prepared:
        """Batch-level, theta-independent quantities for the WHOLE train batch (jittable)."""
        if self.needs_ref and inputs.ref_logp is None:
            raise ValueError(
                f"objective {self.name!r} has a KL term: LossInputs.ref_logp is required"
            )
        check_shapes(inputs)
        check_finite_rewards(inputs)  # eager calls only (see the module docstring)
        inputs = inputs.as_float32()
        valid = (inputs.mask > 0).astype(jnp.float32)  # [B, T]
        prox = masked(inputs.prox_logp, valid)
        log_c = clamped_difference(prox, masked(inputs.behav_logp, valid), self.log_ratio_clamp)
        mask, seq_rejected = apply_rejection(self.token_reject, self.sequence_reject, log_c, valid)
        # rejection first: whitening's mean and std are over the counted tokens (docs/losses.md)
        adv = self.advantage(inputs, valid, mask)
        teacher_kl = teacher_logp = None
        if self.needs_teacher:  # for the distill/* metrics
            teacher_kl = teacher_log_ratio(inputs, valid, self.log_ratio_clamp)
            teacher_logp = masked(inputs.behav_logp, valid) - teacher_kl
        return Prepared(
            mask=mask,
            valid=valid,
            weight=self.aggregation(mask, valid),
            adv=adv,
            prox_logp=prox,
            log_c=log_c,
            seq_rejected=seq_rejected,
            ref_logp=masked(inputs.ref_logp, valid) if self.needs_ref else None,
            teacher_kl=teacher_kl,
            teacher_logp=teacher_logp,
        )

    # -- phase 2 ---------------------------------------------------------------------------------
    def loss(self, logp, prepared: Prepared, entropy=None):
        """(loss_sum, metrics) of these rows: their share of -J (jittable, differentiable in logp
        [b, T] and entropy [b, T]). `metrics` holds summable sums/counts/maxes."""
        if self.needs_entropy and entropy is None:
            raise ValueError(
                f"objective {self.name!r} has an entropy bonus: pass entropy=[b, T] to loss"
            )
        p = prepared
        check_rows("logp", logp, p.mask.shape)
        if entropy is not None:
            check_rows("entropy", entropy, p.mask.shape)
        sg = jax.lax.stop_gradient
        logp = masked(jnp.asarray(logp, jnp.float32), p.valid)
        log_ratio = clamped_difference(logp, p.prox_logp, self.log_ratio_clamp)
        # a non-finite log-prob is read as log pi_prox + l, without gradient (module docstring)
        logp = jnp.where(jnp.isfinite(logp), logp, p.prox_logp + log_ratio)
        ctx = Context(
            logp=logp,
            log_ratio=log_ratio,
            ratio=jnp.exp(log_ratio),
            mask=p.mask,
            adv=p.adv,
            log_c=p.log_c,
            clamp=self.log_ratio_clamp,
            ref_logp=p.ref_logp,
            entropy=None if entropy is None else masked(entropy, p.valid),
        )
        is_weight = jnp.ones_like(logp)
        for part in self.importance:
            is_weight = is_weight * part(ctx)
        g2 = sum((reg(ctx) for reg in self.regularizers), jnp.zeros_like(logp))
        per_token = sg(p.weight * is_weight) * (sg(p.adv) * self.gradient_term(ctx) + g2)  # Eq. 3
        policy_loss = -masked(per_token, p.mask).sum()

        clipped = jnp.zeros(logp.shape, bool)
        for part in (*self.importance, self.gradient_term):
            if hasattr(part, "clipped"):
                clipped = clipped | part.clipped(ctx)
        metrics = slice_metrics(ctx, p, is_weight, clipped, policy_loss, ctx.entropy)
        return policy_loss, metrics

    def batch_statistics(self, logp, prepared: Prepared) -> dict:
        """Exact p95 of r and c (not summable: give it the whole batch)."""
        check_rows("logp", logp, prepared.mask.shape)
        return batch_statistics(logp, prepared, self.log_ratio_clamp)

    # -- convenience: the whole batch at once ----------------------------------------------------
    def __call__(self, inputs: LossInputs, logp, entropy=None):
        """(loss, finalized metrics incl. p95) for the full batch: prepare + loss + finalize."""
        prepared = self.prepare(inputs)
        loss, metrics = self.loss(logp, prepared, entropy=entropy)
        return loss, {**finalize_metrics(metrics), **self.batch_statistics(logp, prepared)}
