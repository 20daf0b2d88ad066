"""Held-out evaluation: pass@1 and pass@k of a policy on a task's test split.

For each of `n` test prompts the engine draws `k` samples (counter-based keys, so the same
prompts and the same random numbers are used before and after training: a paired comparison).
pass@1 is the mean success over all samples; pass@k is the share of prompts with at least one
success among their k samples (the unbiased estimator of Chen et al. 2021 with n = k).
"""

from __future__ import annotations

import numpy as np

from minirl.scheduler import Request
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


def evaluate(engine, task, tokenizer, prompts: list[Prompt], samples: int) -> dict[str, float]:
    """pass@1, pass@`samples` and mean completion length of the engine's current weights."""
    requests = [Request(p, i, task.max_new_tokens) for p in prompts for i in range(samples)]
    rollouts = engine.generate(requests)
    decode_rollouts(rollouts, tokenizer)
    rewards = np.array([s.reward for s in task.verifier.score(rollouts)], np.float64)
    success = (rewards >= 1.0).reshape(len(prompts), samples)
    return {
        "pass@1": float(success.mean()),
        f"pass@{samples}": float(success.any(axis=1).mean()),
        "reward": float(rewards.mean()),
        "length": float(np.mean([len(r.tokens) for r in rollouts])),
    }
