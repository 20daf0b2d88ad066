"""Other ways to compute log p of the same tokens: the engine's decode and the training forward.

`minirl diagnose` (minirl/diagnose/) compares the engine's behaviour log-probs with the trainer's
recompute; to isolate each source of mismatch it also needs two computations that exist in a run
only in passing:

  decode_logprobs         the rollout engine's computation, replayed with teacher forcing:
                          prefill the prompt into a KV cache of the engine's length, then one
                          token per call, rows grouped by the engine's slot count. Bitwise the
                          engine's numbers in exact mode (tests/diagnose/test_mismatch.py); in fast mode
                          only close to them (the engine batches other rows beside each one)
  train_forward_logprobs  the training step's forward: the trainer's own forward under
                          `jax.value_and_grad`, with its remat policy and micro-batches
                          (`Trainer.training_forward_logprobs`)

Simplified on purpose: the training forward differentiates a stand-in loss (the sum of the
log-probs), not the run's objective, so XLA may fuse its backward pass differently from a
real step's (minirl/training/trainer.py logs the real step's first-update log-probs against the recompute
and the engine every step: train/dlogp_recompute/*, train/dlogp_no_recompute/*).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from minirl.modeling.model import KVCache, ModelConfig, abstract_model, token_logprobs
from minirl.modeling.sampling import Sampling
from minirl.training.row_layout import HostRows
from minirl.training.trainer import Trainer, TrainerConfig
from minirl.types import Batch

# ---------------------------------------------------------------------------------------------
# Teacher-forced decode: the engine's computation on given tokens


def _prompt_lengths(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[B, T] completion mask -> (prompt length P [B], completion length C [B]). Completion token
    c of row b sits at position P - 1 + c (minirl/training/batching.py)."""
    has = mask.max(axis=1) > 0
    return np.where(has, np.argmax(mask > 0, axis=1) + 1, 1), (mask > 0).sum(axis=1)


@functools.lru_cache(maxsize=16)
def _decode_fns(cfg: ModelConfig, sampling: Sampling, cache_len: int):
    """Jitted (prefill, step) for one setting, mirroring the rollout engine's prefill and decode."""
    graphdef = abstract_model(cfg)[0]
    exact = sampling.exact

    def logp(logits, targets):  # [R, V], [R] -> [R]
        return token_logprobs(logits[:, None], targets[:, None], sampling)[:, 0]

    def prefill(params, tokens, lengths, targets):
        """tokens [R, Lb] right-padded prompts -> (cache of cache_len positions, log p [R])."""
        model = nnx.merge(graphdef, params)
        rows, width = tokens.shape
        logits, fresh = model(
            tokens, cache=KVCache.zeros(cfg, rows, width), num_new=lengths, exact=exact
        )  # [R, Lb, V]
        last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]  # [R, V]
        pad = lambda x: jnp.pad(x, ((0, 0), (0, cache_len - width), (0, 0), (0, 0)))
        cache = KVCache(tuple(map(pad, fresh.k)), tuple(map(pad, fresh.v)), lengths)
        return cache, logp(last, targets)

    def step(params, cache, tokens, targets, live):
        """One decode step: tokens [R] -> log p of targets [R]; rows with live 0 do not advance."""
        model = nnx.merge(graphdef, params)
        logits, cache = model(tokens[:, None], cache=cache, num_new=live, exact=exact)
        return cache, logp(logits[:, 0], targets)

    return jax.jit(prefill), jax.jit(step, donate_argnums=(1,))


def decode_logprobs(
    model_cfg: ModelConfig,
    params,
    batch: Batch,
    *,
    sampling: Sampling,
    dtype: str | None = None,
    rows_per_call: int = 8,
    cache_len: int = 256,
    buckets: tuple[int, ...] = (32, 64, 128),
    row_layout=None,
) -> np.ndarray:
    """log p of `batch.targets` as the rollout engine computes it: [B, T] float32, 0 off the mask.

    Rows are processed `rows_per_call` at a time (the engine's slot count): the prompt is
    prefilled (right-padded to a bucket length) into a cache of `cache_len` positions, then each
    completion token is fed back one per call, teacher-forced. `dtype` overrides the compute
    and storage dtype as `EngineConfig.dtype` does (weights cast to it once). `row_layout` (a
    Trainer row layout, e.g. scale.slots.MeshSlots; default one device) places each call's rows.
    """
    layout = row_layout or HostRows()
    dtype = dtype or model_cfg.dtype
    cfg = dataclasses.replace(model_cfg, dtype=dtype, param_dtype=dtype)
    params = jax.tree.map(lambda x: jnp.asarray(x, cfg.storage_dtype), params)
    mask = np.asarray(batch.mask)
    plen, clen = _prompt_lengths(mask)  # [B], [B]
    need = int((plen + clen - 1).max())
    if need > cache_len:
        raise ValueError(
            f"decode_logprobs: a row needs {need} cache positions, cache_len is {cache_len}"
        )
    prefill, step = _decode_fns(cfg, sampling, cache_len)
    lengths_allowed = sorted({b for b in buckets if b < cache_len} | {cache_len})
    out = np.zeros(mask.shape, np.float32)  # [B, T]
    for start in range(0, mask.shape[0], rows_per_call):
        rows = np.arange(start, min(start + rows_per_call, mask.shape[0]))
        r = rows_per_call
        p = np.ones(r, np.int32)
        c = np.zeros(r, np.int32)
        p[: len(rows)], c[: len(rows)] = plen[rows], clen[rows]
        width = next(b for b in lengths_allowed if b >= p.max())
        tokens = np.zeros((r, width), np.int32)
        first = np.zeros(r, np.int32)
        for k, b in enumerate(rows):
            tokens[k, : p[k]] = batch.tokens[b, : p[k]]
            first[k] = batch.targets[b, p[k] - 1]
        cache, lp = prefill(params, *map(layout.rows, (tokens, p, first)))
        got = [layout.host(lp)]
        for j in range(int(c.max()) - 1):  # completion token j goes in, token j + 1 is scored
            live = (j < c - 1).astype(np.int32)
            tok, tgt = np.zeros(r, np.int32), np.zeros(r, np.int32)
            for k, b in enumerate(rows):
                if live[k]:
                    tok[k], tgt[k] = batch.tokens[b, p[k] + j], batch.targets[b, p[k] + j]
            cache, lp = step(params, cache, *map(layout.rows, (tok, tgt, live)))
            got.append(layout.host(lp))
        got = np.stack(got, axis=1)  # [R, max C]
        for k, b in enumerate(rows):
            out[b, p[k] - 1 : p[k] - 1 + c[k]] = got[k, : c[k]]
    return np.where(mask > 0, out, 0.0).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# The training forward: the trainer's own forward, under value_and_grad, with its remat policy


def train_forward_logprobs(
    model_cfg: ModelConfig, params, batch: Batch, cfg: TrainerConfig, sampling: Sampling
) -> np.ndarray:
    """log pi_theta of `batch.targets` as the training step's forward computes it (its remat
    policy, its micro-batches, inside `jax.value_and_grad`) under `sampling` (scoring form):
    [B, T] float32, 0 off the mask. The trainer's own code: `Trainer.training_forward_logprobs`."""
    trainer = Trainer(model_cfg, params, None, cfg, sampling=sampling)
    return trainer.training_forward_logprobs(batch)
