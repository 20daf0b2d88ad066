"""The data a loss consumes, and the few numerical guards every part shares.

Three containers, one per stage of the two-phase loss (see `objective.py`):

- `LossInputs` — what the trainer hands to phase 1 (`Objective.prepare`) for the WHOLE train
  batch: masks, the three kinds of log-probs, rewards, group ids.
- `Prepared`   — what phase 1 returns and phase 2 (`Objective.loss`) consumes. Every leaf has
  leading axis B, so any subset of rows is a valid micro-batch:
  `take_rows(prepared, rows)`.
- `Context`    — the per-token quantities of one micro-batch inside phase 2 (log-ratio, ratio,
  advantage, ...): the single argument every importance weight and gradient term receives.

Numerical rules (PipelineRL limits study, docs/losses.md): masked positions may hold `-inf` or
garbage log-probs, so every log-prob is replaced by 0 off the mask with `jnp.where` (never
`mask * x`, which turns `0 * inf` into nan), and every log-ratio is clamped to [-C, C] *before*
`exp` (`clamped_difference`). Non-finite differences at counted tokens become +-C (inf) or 0 (nan),
and a non-finite log pi_theta there is read as log pi_prox + that clamped difference, without
gradient (`Objective.loss`), so every preset sees the same finite value.

Axis letters as in minirl/types.py: B rows (b for a micro-batch), T positions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass
class LossInputs:
    """The whole train batch, as phase 1 sees it. Groups (same prompt) are contiguous and whole."""

    mask: jax.Array  # [B, T] 1.0 on completion tokens (the targets that count), else 0
    prox_logp: jax.Array  # [B, T] log pi_prox: trainer's recompute under the step's start weights
    behav_logp: jax.Array  # [B, T] log mu: what the rollout engine reported when it sampled
    rewards: jax.Array  # [B] scalar reward of each sequence
    group_ids: jax.Array  # [B] int32, equal ids = same prompt; contiguous runs
    ref_logp: jax.Array | None = None  # [B, T] log pi_ref, for KL terms
    token_rewards: jax.Array | None = None  # [B, T] per-token rewards (GAE); default: R_i at last
    teacher_logp: jax.Array | None = None  # [B, T] log pi_T: a teacher's score (distillation)

    @classmethod
    def from_batch(cls, batch: Any, prox_logp, ref_logp=None) -> LossInputs:
        """Build from a `minirl.types.Batch` plus the trainer's recomputed log-probs (and the
        teacher's log-probs the batch carries, if any)."""
        teacher = getattr(batch, "teacher_logprobs", None)
        return cls(
            mask=jnp.asarray(batch.mask, jnp.float32),
            prox_logp=jnp.asarray(prox_logp, jnp.float32),
            behav_logp=jnp.asarray(batch.behaviour_logprobs, jnp.float32),
            rewards=jnp.asarray(batch.rewards, jnp.float32),
            group_ids=jnp.asarray(batch.group_ids, jnp.int32),
            ref_logp=None if ref_logp is None else jnp.asarray(ref_logp, jnp.float32),
            teacher_logp=None if teacher is None else jnp.asarray(teacher, jnp.float32),
        )

    def as_float32(self) -> LossInputs:
        """Floats as float32, group ids as int32 (what phase 1 computes in)."""
        f32 = lambda x: None if x is None else jnp.asarray(x, jnp.float32)
        return LossInputs(
            mask=f32(self.mask),
            prox_logp=f32(self.prox_logp),
            behav_logp=f32(self.behav_logp),
            rewards=f32(self.rewards),
            group_ids=jnp.asarray(self.group_ids, jnp.int32),
            ref_logp=f32(self.ref_logp),
            token_rewards=f32(self.token_rewards),
            teacher_logp=f32(self.teacher_logp),
        )


def check_shapes(inputs: LossInputs) -> None:
    """Shapes with clear messages: mask [B, T], the log-prob-like fields [B, T], rewards and
    group ids [B]. Shapes are static, so this also runs while `jit` traces (`prepare` calls it):
    a [1, T] array must not broadcast silently against [B, T]."""
    mask = np.shape(inputs.mask)
    if len(mask) != 2:
        raise ValueError(f"LossInputs.mask must be [B, T], got shape {mask}")
    for name in ("prox_logp", "behav_logp", "ref_logp", "token_rewards", "teacher_logp"):
        x = getattr(inputs, name)
        if x is not None and np.shape(x) != mask:
            raise ValueError(
                f"LossInputs.{name} must have the mask's shape {mask}, got {np.shape(x)}"
            )
    for name in ("rewards", "group_ids"):
        if np.shape(getattr(inputs, name)) != mask[:1]:
            raise ValueError(
                f"LossInputs.{name} must be [B] = {mask[:1]}, got {np.shape(getattr(inputs, name))}"
            )


def check_finite_rewards(inputs: LossInputs) -> None:
    """Refuse a non-finite reward (`rewards`, and `token_rewards` on the mask) when the values are
    concrete, i.e. on an eager call. Under `jit` they are tracers and cannot be looked at: a
    non-finite reward then reaches the loss, whose non-finite value the trainer's guard skips and
    counts (and the trainer's batches never hold one: `make_batch` refuses them upstream)."""
    traced = lambda *xs: any(isinstance(x, jax.core.Tracer) for x in xs)
    if not traced(inputs.rewards):
        _refuse_non_finite("rewards", np.asarray(inputs.rewards))
    if inputs.token_rewards is not None and not traced(inputs.token_rewards, inputs.mask):
        on = np.asarray(inputs.mask) > 0
        _refuse_non_finite("token_rewards", np.where(on, np.asarray(inputs.token_rewards), 0.0))


def _refuse_non_finite(name: str, x: np.ndarray) -> None:
    bad = ~np.isfinite(x)
    if bad.any():
        raise ValueError(
            f"LossInputs.{name} has {int(bad.sum())} non-finite value(s), the first "
            f"{x[bad][0]} at index {np.argwhere(bad)[0].tolist()}: rewards must be finite"
        )


def validate_inputs(inputs: LossInputs) -> None:
    """Host-side checks with clear messages (shapes, contiguous groups). Not jittable: call it on
    concrete arrays, e.g. once per batch in the trainer, before `prepare`. Rewards are not checked
    for finiteness here: the trainer relies on its non-finite guard for those (see
    `check_finite_rewards`)."""
    check_shapes(inputs)
    ids = np.asarray(inputs.group_ids)
    starts = ids[np.r_[True, ids[1:] != ids[:-1]]]
    if len(np.unique(starts)) != len(starts):
        raise ValueError(f"rows of a group must be contiguous; group_ids = {ids.tolist()}")


def check_rows(name: str, x, shape: tuple[int, ...]) -> None:
    """`x` (logp or entropy given to phase 2) must have the prepared rows' shape [b, T]
    exactly: jnp would broadcast a [1, T] array against [b, T] into a wrong loss without error."""
    if np.shape(x) != tuple(shape):
        raise ValueError(
            f"{name} must have the shape of the prepared rows {tuple(shape)} ([b, T]), got "
            f"{np.shape(x)}: slice it with the rows given to take_rows(prepared, rows)"
        )


@flax.struct.dataclass
class Prepared:
    """Phase-1 output: per-row, batch-normalised quantities. Every leaf has leading axis B.

    Everything here is constant during the update (no gradient flows through it): advantages,
    aggregation weights with their batch-level normalisers, rejection masks, log c.
    """

    mask: jax.Array  # [B, T] tokens that count: completion mask after rejection
    valid: jax.Array  # [B, T] the completion mask as given (diagnostics run over it)
    weight: jax.Array  # [B, T] aggregation weight Agg_it, normalisers of the whole batch folded in
    adv: jax.Array  # [B, T] advantage, broadcast over tokens (0 off `valid`)
    prox_logp: jax.Array  # [B, T] log pi_prox, 0 off `valid`
    log_c: jax.Array  # [B, T] clamp(log pi_prox - log mu, -C, C), 0 off `valid`
    seq_rejected: jax.Array  # [B] 1.0 if sequence rejection dropped the row
    ref_logp: jax.Array | None = None  # [B, T] log pi_ref, 0 off `valid` (only if a KL term)
    teacher_kl: jax.Array | None = None  # [B, T] clamp(log mu - log pi_T), 0 off `valid` (teacher)
    teacher_logp: jax.Array | None = None  # [B, T] log mu - teacher_kl (log pi_T >= log mu - C)


def take_rows(prepared: Prepared, rows) -> Prepared:
    """A micro-batch: the given rows (indices, slice or boolean mask) of every leaf."""
    return jax.tree.map(lambda x: x[rows], prepared)


@dataclasses.dataclass(frozen=True)
class Context:
    """Per-token quantities of one micro-batch in phase 2. `logp`, `log_ratio` and `ratio` carry
    the gradient; the rest are constants from `Prepared`. All are 0 off the completion mask."""

    logp: jax.Array  # [b, T] log pi_theta (differentiable)
    log_ratio: jax.Array  # [b, T] l = clamp(log pi_theta - log pi_prox, -C, C)
    ratio: jax.Array  # [b, T] r = exp(l)
    mask: jax.Array  # [b, T] tokens that count
    adv: jax.Array  # [b, T]
    log_c: jax.Array  # [b, T] clamped log(pi_prox / mu)
    clamp: float  # C
    ref_logp: jax.Array | None = None  # [b, T]
    entropy: jax.Array | None = None  # [b, T] per-token entropy H_it (differentiable)

    @property
    def lengths(self) -> jax.Array:
        """n_i: counted tokens of each row.  # [b]"""
        return self.mask.sum(axis=-1)

    def row_sum(self, x: jax.Array) -> jax.Array:
        """sum_t m_it x_it.  # [b]"""
        return jnp.where(self.mask > 0, x, 0.0).sum(axis=-1)

    def row_mean(self, x: jax.Array) -> jax.Array:
        """sum_t m_it x_it / n_i, 0 for an empty row.  # [b]"""
        return self.row_sum(x) / jnp.maximum(self.lengths, 1.0)


def clamped_difference(a: jax.Array, b: jax.Array, clamp: float) -> jax.Array:
    """clamp(a - b, -C, C) with non-finite differences mapped to +-C (inf) or 0 (nan).

    Inputs are expected to be already zeroed off the mask (see `masked`)."""
    d = jnp.nan_to_num(a - b, nan=0.0, posinf=clamp, neginf=-clamp)
    return jnp.clip(d, -clamp, clamp)


def masked(x: jax.Array, mask: jax.Array) -> jax.Array:
    """x where mask > 0, else 0 — safe for -inf/nan garbage (and for its gradient)."""
    return jnp.where(mask > 0, x, 0.0)


def last_token_mask(mask: jax.Array) -> jax.Array:
    """1.0 at the last counted token of each row, 0 elsewhere (all 0 for an empty row).  # [B, T]"""
    t = mask.shape[-1]
    last = t - 1 - jnp.argmax(mask[..., ::-1] > 0, axis=-1)  # [B]
    hit = (jnp.arange(t) == last[..., None]) & (mask.sum(axis=-1, keepdims=True) > 0)
    return hit.astype(mask.dtype)
