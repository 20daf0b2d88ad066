"""Routing metrics of a mixture-of-experts step: do the trainer's routers pick the experts the
engine ran, and how evenly do tokens spread over the experts?

    routing_metrics(engine, trainer, valid, num_experts) -> {
        "routing/disagreement":        share of tokens whose top-k expert SET differs between
                                       the engine's record and the trainer's routers in at
                                       least one MoE layer
        "routing/layer_disagreement":  the same over (token, MoE layer) pairs
        "routing/expert_load_min", "routing/expert_load_max":
                                       the least and most used expert's share of one layer's
                                       routed slots (tokens x k) in the engine's record, over
                                       every MoE layer (balanced: 1 / E each)
    }

Sets, not lists: the order of the k experts carries no meaning to the layer's output. Pure numpy
(the trainer calls it on host copies once per step).
"""

from __future__ import annotations

import numpy as np

from minirl.training.microbatch import row_lengths


def ran_positions(mask: np.ndarray, rows=None) -> np.ndarray:
    """[B, T] completion mask -> [B, T] bool: the positions the trainer runs in each row (of
    `rows`, default all) up to its last counted target (minirl/training/microbatch.py)."""
    lengths = row_lengths(mask)
    valid = np.arange(mask.shape[1])[None, :] < lengths[:, None]
    if rows is not None:
        valid &= np.isin(np.arange(mask.shape[0]), rows)[:, None]
    return valid


def differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[..., k] expert ids -> [...] True where the two top-k SETS differ."""
    return np.any(np.sort(a, axis=-1) != np.sort(b, axis=-1), axis=-1)


def routing_metrics(
    engine: np.ndarray, trainer: np.ndarray, valid: np.ndarray, num_experts: int
) -> dict[str, float]:
    """engine, trainer [B, T, M, k] expert ids; valid [B, T] bool: the positions to count."""
    diff = differs(engine, trainer)[valid]  # [N, M]
    ran = engine[valid].astype(np.int64)  # [N, M, k]
    n, m, k = ran.shape
    load = [np.bincount(ran[:, i].ravel(), minlength=num_experts) for i in range(m)]
    share = np.stack(load) / max(n * k, 1)  # [M, E]
    return {
        "routing/disagreement": float(diff.any(axis=-1).mean()) if n else 0.0,
        "routing/layer_disagreement": float(diff.mean()) if n else 0.0,
        "routing/expert_load_min": float(share.min()),
        "routing/expert_load_max": float(share.max()),
    }
