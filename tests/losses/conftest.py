"""Shared data for the loss tests: a random train batch with the shape of a real one.

Rows are prompt + completion + padding; groups are contiguous with arbitrary ids (including a
singleton); masked positions hold -inf so every test also checks that garbage off the mask never
leaks. Log-probs are built as ratios around pi_prox with chosen spreads, so each test can decide
how far off-policy (log_ratio_scale) and how mismatched (correction_scale) the batch is. Every
batch also carries a teacher's log-probs (on-policy distillation; unused by the other losses).
"""

import jax.numpy as jnp
import numpy as np
import pytest

from minirl.losses import LossInputs

B, T = 8, 7
GROUP_SIZES = (3, 2, 2, 1)
GROUP_IDS = (7, 3, 9, 5)  # arbitrary int ids, contiguous runs


def make_batch(
    seed: int = 0,
    log_ratio_scale: float = 0.3,
    correction_scale: float = 0.3,
    fill: float = -np.inf,
):
    """(inputs: LossInputs, logp [B, T]) with garbage `fill` off the mask."""
    rng = np.random.default_rng(seed)
    gids = np.repeat(GROUP_IDS, GROUP_SIZES).astype(np.int32)
    mask = np.zeros((B, T), np.float32)
    for i in range(B):
        start = rng.integers(0, 3)  # prompt positions (not completion targets)
        length = rng.integers(1, T - start + 1)  # at least one completion token
        mask[i, start : start + length] = 1.0
    prox = -rng.exponential(1.0, (B, T)).astype(np.float32)
    logp = prox + log_ratio_scale * rng.standard_normal((B, T)).astype(np.float32)
    behav = prox - correction_scale * rng.standard_normal((B, T)).astype(np.float32)
    ref = prox + 0.2 * rng.standard_normal((B, T)).astype(np.float32)
    rewards = rng.standard_normal(B).astype(np.float32)
    teacher = prox - 0.5 * rng.standard_normal((B, T)).astype(np.float32)  # drawn last: the
    # other arrays are those of the batches before the teacher was added
    off = mask == 0
    for x in (prox, logp, behav, ref, teacher):
        x[off] = fill
    inputs = LossInputs(
        mask=jnp.asarray(mask),
        prox_logp=jnp.asarray(prox),
        behav_logp=jnp.asarray(behav),
        rewards=jnp.asarray(rewards),
        group_ids=jnp.asarray(gids),
        ref_logp=jnp.asarray(ref),
        teacher_logp=jnp.asarray(teacher),
    )
    return inputs, jnp.asarray(logp)


@pytest.fixture(scope="session")
def batch_maker():
    return make_batch
