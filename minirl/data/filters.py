"""Prompt curation: pre-filtering and dynamic filtering (RLAX §data curation; DAPO).

A group of G rollouts of one prompt whose rewards are all equal carries no learning signal for
group-relative advantages (every advantage is 0). Two ways to avoid spending a batch on them:

  * `prefilter` (RLAX "pre-filtering"): before training, estimate each prompt's pass rate with
    the current model (the caller supplies `pass_rate_fn`, e.g. G samples per prompt) and keep
    the prompts with PARTIAL success, lo < rate < hi.
  * `dynamic_filter` (DAPO "dynamic sampling", RLAX "dynamic filtering"): after scoring, drop
    the groups whose rewards are all equal; `fill_batch` keeps sampling until the batch holds
    enough informative groups. What was dropped is counted, because it is wasted generation.

Simplification: these are plain functions; the controller owns the loop and decides what to do
with surplus groups (`fill_batch` returns them rather than losing them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from minirl.types import Prompt, Rollout

Group = Sequence[Rollout]  # the G rollouts of one prompt


def group_rewards(group: Group) -> np.ndarray:
    """The rewards of one scored group, [G] float64; an unscored rollout is a caller bug."""
    if len(group) == 0:
        raise ValueError("empty group")
    missing = [r.sample_index for r in group if r.score is None]
    if missing:
        raise ValueError(f"group of prompt {group[0].prompt.uid} has unscored samples {missing}")
    return np.array([r.score.reward for r in group], np.float64)


def is_informative(group: Group) -> bool:
    """True when the rewards are not all equal (so group-relative advantages are not all 0).
    A group of one rollout is never informative."""
    rewards = group_rewards(group)
    return bool(rewards.max() != rewards.min())


def dynamic_filter(groups: Sequence[Group]) -> tuple[list[Group], int]:
    """DAPO dynamic sampling: keep groups with unequal rewards. Returns (kept, dropped_count)."""
    kept = [g for g in groups if is_informative(g)]
    return kept, len(groups) - len(kept)


@dataclasses.dataclass
class FillStats:
    rounds: int = 0  # calls to sample_groups
    sampled: int = 0  # groups generated
    dropped: int = 0  # groups dropped as uninformative
    full: bool = False  # did the batch reach num_groups?


def fill_batch(
    sample_groups: Callable[[int], Sequence[Group]], num_groups: int, max_rounds: int = 8
) -> tuple[list[Group], list[Group], FillStats]:
    """Sample until `num_groups` informative groups are collected (DAPO).

    `sample_groups(k)` generates and scores about k new groups (it is asked for the shortfall).
    Returns (batch, surplus, stats): `batch` has at most num_groups groups, `surplus` the extra
    informative ones of the last round (for the next batch — nothing is lost). After
    `max_rounds` rounds the batch is returned short with `stats.full == False`.
    """
    if num_groups < 1 or max_rounds < 1:
        raise ValueError("num_groups and max_rounds must be >= 1")
    kept: list[Group] = []
    stats = FillStats()
    while len(kept) < num_groups and stats.rounds < max_rounds:
        new = list(sample_groups(num_groups - len(kept)))
        good, dropped = dynamic_filter(new)
        stats.rounds += 1
        stats.sampled += len(new)
        stats.dropped += dropped
        kept.extend(good)
    stats.full = len(kept) >= num_groups
    return kept[:num_groups], kept[num_groups:], stats


@dataclasses.dataclass
class PrefilterReport:
    kept: int
    too_hard: int  # estimated pass rate <= lo
    too_easy: int  # estimated pass rate >= hi


def prefilter(
    prompts: Sequence[Prompt],
    pass_rate_fn: Callable[[Sequence[Prompt]], Sequence[float]],
    lo: float = 0.0,
    hi: float = 1.0,
) -> tuple[list[Prompt], PrefilterReport]:
    """Keep prompts whose estimated pass rate is strictly inside (lo, hi) (RLAX pre-filtering).

    `pass_rate_fn(prompts)` returns one rate in [0, 1] per prompt, in order (batched so the
    caller can generate for all prompts at once).
    """
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError(f"need 0 <= lo < hi <= 1, got lo={lo}, hi={hi}")
    rates = np.asarray(pass_rate_fn(list(prompts)), np.float64)
    if rates.shape != (len(prompts),):
        raise ValueError(f"pass_rate_fn returned shape {rates.shape}, expected ({len(prompts)},)")
    if not np.all((rates >= 0.0) & (rates <= 1.0)):  # also rejects NaN
        raise ValueError("pass rates must be in [0, 1] (got NaN or out of range)")
    keep = (rates > lo) & (rates < hi)
    kept = [p for p, k in zip(prompts, keep, strict=True) if k]
    report = PrefilterReport(
        kept=len(kept), too_hard=int((rates <= lo).sum()), too_easy=int((rates >= hi).sum())
    )
    return kept, report
