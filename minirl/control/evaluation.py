"""Held-out evaluation: pass@1 and pass@k of a policy on a task's test split.

For each of `n` test prompts the engine draws `k` samples (counter-based keys, so the same
prompts and the same random numbers are used before and after training: a paired comparison).
pass@1 is the mean success over all samples; pass@k is the share of prompts with at least one
success among their k samples (the unbiased estimator of Chen et al. 2021 with n = k).
"""

from __future__ import annotations

import numpy as np

from minirl.inference.scheduler import Request
from minirl.types import Prompt, Rollout


def heldout_prompts(task, n: int) -> list[Prompt]:
    """The first `n` test prompts (all of them, if a dataset file's test split is smaller)."""
    test = getattr(task, "test", None)  # a file task's held-out rows; built-in tasks are endless
    n = n if test is None else min(n, len(test))
    return [task.prompt(i, "test") for i in range(n)]


def decode_rollouts(rollouts: list[Rollout], tokenizer) -> None:
    """Fill `rollout.text` (special tokens dropped) in place."""
    for r in rollouts:
        r.text = tokenizer.decode(r.tokens)


def evaluate(
    engine, task, tokenizer, prompts: list[Prompt], samples: int, verifier=None, progress=None
) -> dict[str, float]:
    """pass@1, pass@`samples`, mean reward and completion length of the engine's current
    weights, scored by `verifier` (default: the task's). Multi-turn episodes (an EpisodeRunner
    as the engine, its EpisodeScores as the verifier) also report the mean assistant turns.
    `progress(n)` is told of every n completions finished (a progress bar)."""
    requests = [Request(p, i, task.max_new_tokens) for p in prompts for i in range(samples)]
    if progress is None:
        rollouts = engine.generate(requests)
    else:
        rollouts = engine.generate(requests, progress=progress)
    decode_rollouts(rollouts, tokenizer)
    scores = (task.verifier if verifier is None else verifier).score(rollouts)
    rewards = np.array([s.reward for s in scores], np.float64)
    success = (rewards >= 1.0).reshape(len(prompts), samples)
    out = {
        "pass@1": float(success.mean()),
        f"pass@{samples}": float(success.any(axis=1).mean()),
        "reward": float(rewards.mean()),
        "length": float(np.mean([len(r.tokens) for r in rollouts])),
    }
    if any(r.mask is not None for r in rollouts):
        out["turns"] = float(np.mean([assistant_turns(r) for r in rollouts]))
    return out


def assistant_turns(rollout: Rollout) -> int:
    """How many turns the policy wrote: runs of mask-1 tokens (1 for a single-turn rollout)."""
    if rollout.mask is None:
        return 1
    policy = np.asarray(rollout.mask) > 0
    return int(np.sum(policy & ~np.concatenate([[False], policy[:-1]])))
