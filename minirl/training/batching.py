"""Scored rollouts -> one padded `Batch` for the trainer (the last step of the data flow).

Each row is one rollout: its prompt followed by its completion, shifted by one position so that
position t predicts the next token (teacher forcing):

    sequence   s = prompt (P tokens) + completion (C tokens)
    tokens     s[0 : P+C-1]                  what the model reads
    targets    s[1 : P+C]                    what position t should predict
    mask       1.0 at t = P-1 .. P+C-2       the targets that are completion tokens (times
                                             rollout.mask: a multi-turn episode's observation
                                             tokens are read, never trained on)

so completion token c sits at target position P-1+c, and its behaviour log-prob and weight version
go to that same position. A mixture-of-experts rollout's `routes` ([P+C-1, M, k], one per position
the engine ran) fill `routes[:, :P+C-1]` of the batch: position t's experts, as the engine ran
`tokens[t]` (what `trainer.routing=replay` replays; padding 0). This is exactly how the rollout engine scored it: the logits it sampled
completion token c from are the logits of position P-1+c of the full sequence.

Rows are right-padded with `pad_id` (mask 0, behaviour log-prob 0, version -1) to a common length
T, rounded up to a small set of bucket lengths (`bucket_length`) so the trainer's jitted functions
compile a bounded number of times. Rows are sorted by (prompt uid, sample index): groups (the G
samples of one prompt) are contiguous and whole, and the order never depends on the order in which
rollouts finished (determinism by construction, docs/design.md).

Simplified on purpose: no truncation (a too-long rollout is the engine's job to prevent), and no
packing of several sequences into one row (the model has no segment mask).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from minirl.types import Batch, Rollout


def bucket_length(n: int, minimum: int = 32) -> int:
    """The smallest bucket >= n: multiples of `minimum` up to 8 * minimum, then four buckets per
    doubling (multiples of 1/8 of the next power of two), so padding wastes at most 25% while a
    run sees only a handful of distinct lengths."""
    if minimum < 1:
        raise ValueError(f"bucket minimum must be >= 1, got {minimum}")
    n = max(int(n), 1)
    step = max(minimum, (1 << (n - 1).bit_length()) // 8)
    return -(-n // step) * step


def _check_rollouts(rollouts: Sequence[Rollout]) -> None:
    """ValueError unless every rollout is scored (finitely) and self-consistent."""
    if not rollouts:
        raise ValueError("make_batch needs at least one rollout")
    for i, r in enumerate(rollouts):
        if r.score is None:
            raise ValueError(
                f"rollout {i} (prompt uid {r.prompt.uid}) has no score: verify before batching"
            )
        if not math.isfinite(r.score.reward):
            raise ValueError(
                f"rollout {i} (prompt uid {r.prompt.uid}) has a non-finite reward {r.score.reward}"
            )
        c = len(r.tokens)
        m = c if r.mask is None else len(r.mask)
        if len(r.logprobs) != c or len(r.versions) != c or m != c:
            raise ValueError(
                f"rollout {i}: tokens, logprobs, versions and mask must have equal lengths, got "
                f"{c}, {len(r.logprobs)}, {len(r.versions)}, {m}"
            )
        if len(r.prompt.tokens) == 0:
            raise ValueError(f"rollout {i}: the prompt has no tokens (it should at least hold BOS)")
        n = len(r.prompt.tokens) + c - 1
        if r.routes is not None and len(r.routes) != n:
            raise ValueError(f"rollout {i}: routes cover {len(r.routes)} positions, not P+C-1={n}")
        if (r.routes is None) != (rollouts[0].routes is None):
            raise ValueError("rollouts mix routed (MoE) and unrouted ones")


def make_batch(rollouts: Sequence[Rollout], pad_id: int, bucket_minimum: int = 32) -> Batch:
    """Pack scored rollouts into a right-padded `Batch` (see the module docstring for the layout).

    Every rollout must carry a finite `score.reward`; group ids are 0, 1, ... in order of prompt
    uid. Raises ValueError on inconsistent input (it is the controller's data, not model output).
    """
    _check_rollouts(rollouts)
    order = sorted(
        range(len(rollouts)), key=lambda i: (rollouts[i].prompt.uid, rollouts[i].sample_index)
    )
    rows = [rollouts[i] for i in order]
    for a, b in zip(rows, rows[1:], strict=False):
        if (a.prompt.uid, a.sample_index) == (b.prompt.uid, b.sample_index):
            raise ValueError(
                f"two rollouts share prompt uid {a.prompt.uid} and sample index {a.sample_index}"
            )
    b_rows = len(rows)
    lengths = [len(r.prompt.tokens) + len(r.tokens) - 1 for r in rows]
    t = bucket_length(max(lengths), bucket_minimum)

    tokens = np.full((b_rows, t), pad_id, np.int32)  # [B, T]
    targets = np.full((b_rows, t), pad_id, np.int32)  # [B, T]
    mask = np.zeros((b_rows, t), np.float32)  # [B, T]
    behaviour = np.zeros((b_rows, t), np.float32)  # [B, T]
    versions = np.full((b_rows, t), -1, np.int32)  # [B, T]
    rewards = np.zeros((b_rows,), np.float32)  # [B]
    group_ids = np.zeros((b_rows,), np.int32)  # [B]
    prompt_uids = np.zeros((b_rows,), np.int64)  # [B]
    routes = None
    if rows[0].routes is not None:  # [B, T, M, k] in the rollouts' compact dtype
        routes = np.zeros((b_rows, t, *rows[0].routes.shape[1:]), rows[0].routes.dtype)

    group, seen = -1, set()
    for i, r in enumerate(rows):
        seq = np.concatenate(
            [np.asarray(r.prompt.tokens, np.int32), np.asarray(r.tokens, np.int32)]
        )
        n, p, c = lengths[i], len(r.prompt.tokens), len(r.tokens)
        tokens[i, :n] = seq[:-1]
        targets[i, :n] = seq[1:]
        mask[i, p - 1 : p - 1 + c] = 1.0 if r.mask is None else r.mask
        behaviour[i, p - 1 : p - 1 + c] = r.logprobs
        versions[i, p - 1 : p - 1 + c] = r.versions
        if routes is not None:
            routes[i, :n] = r.routes
        if r.prompt.uid not in seen:
            seen.add(r.prompt.uid)
            group += 1
        group_ids[i] = group
        rewards[i] = r.score.reward
        prompt_uids[i] = r.prompt.uid
    return Batch(
        tokens, targets, mask, behaviour, versions, rewards, group_ids, prompt_uids, routes
    )
