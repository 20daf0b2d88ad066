"""The trainer's optimizer update: global-norm clipping, AdamW, a warm-up/cosine learning-rate
schedule, and the non-finite guard that turns a bad update into no update at all.

    settings = AdamW(b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, max_grad_norm=1.0)
    init, update = compiled(settings)
    opt_state = init(params)
    params, opt_state, ok, grad_norm = update(params, opt_state, (grads, loss), scale, lr)

One update, from gradients summed over micro-batches (minirl/trainer.py):

  g <- scale * g                     (a PPO mini-batch's share of the batch; 1 otherwise)
  g <- g * min(1, c / ||g||)         global-norm clipping at c = max_grad_norm (0 = off)
  m, v <- Adam moments of g          bias-corrected (optax.scale_by_adam)
  d <- m / (sqrt(v) + eps) + wd * p  decoupled weight decay, on matrices only (never on norms)
  p <- p - lr * d

Non-finite guard (the PipelineRL limits study names inf/nan updates as a failure mode of long
asynchronous runs): if the loss or the gradient norm is nan or inf, every leaf of the params and
of the optimizer state keeps its old value, bit for bit, and `ok` comes back False; the caller
counts the skip and does not publish the weights.

Simplified on purpose: the learning rate is a Python float passed per call (the schedule counts
train steps, not optimizer updates), not an optax schedule inside the state.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

__all__ = ["SCHEDULES", "AdamW", "compiled", "guarded_update", "learning_rate", "transform"]

SCHEDULES = ("constant", "cosine")


def learning_rate(cfg, step: int) -> float:
    """The learning rate of train step `step` (0-based) under a `TrainerConfig` `cfg`: linear
    warm-up from lr/(W+1) to lr over W = warmup_steps steps, then constant, or cosine down to
    min_lr_ratio * lr at total_steps."""
    warm = min(1.0, (step + 1) / (cfg.warmup_steps + 1))
    if cfg.schedule == "constant":
        return cfg.learning_rate * warm
    progress = min(1.0, max(0.0, (step - cfg.warmup_steps) / (cfg.total_steps - cfg.warmup_steps)))
    cosine = cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.learning_rate * warm * cosine


class AdamW(NamedTuple):
    """The update's settings (hashable: compiled functions are cached per value)."""

    b1: float
    b2: float
    eps: float
    weight_decay: float
    max_grad_norm: float  # 0 = no clipping


def transform(o: AdamW) -> optax.GradientTransformation:
    """clip -> Adam moments -> decoupled weight decay (matrices only); the caller scales by -lr."""
    return optax.chain(
        optax.clip_by_global_norm(o.max_grad_norm) if o.max_grad_norm > 0 else optax.identity(),
        optax.scale_by_adam(o.b1, o.b2, o.eps),
        optax.add_decayed_weights(
            o.weight_decay, mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)
        ),
    )


def guarded_update(o: AdamW, params, opt_state, acc, scale, lr):
    """One update from `acc` = (summed gradients, summed loss), or none at all (the old params
    and optimizer state, bit for bit) if the loss or the gradient norm is non-finite.
    Returns (params, opt_state, ok, gradient norm before clipping)."""
    grads, loss = jax.tree.map(lambda g: (g * scale).astype(g.dtype), acc)  # keep bf16 as bf16
    grad_norm = optax.tree.norm(grads)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    direction, new_state = transform(o).update(grads, opt_state, params)
    new_params = jax.tree.map(lambda p, d: (p - lr * d).astype(p.dtype), params, direction)
    # A select per leaf, not lax.cond: XLA CPU copied every parameter into the cond's buffers on
    # every call; a select fuses into the update's single pass over each leaf.
    keep = functools.partial(jax.tree.map, lambda new, old: jnp.where(ok, new, old))
    return keep(new_params, params), keep(new_state, opt_state), ok, grad_norm


@functools.lru_cache(maxsize=8)
def compiled(o: AdamW):
    """(init, update): `transform(o).init` and `guarded_update` jitted. Nothing is donated:
    parameters because the engine and the weight store may still hold the arrays, the optimizer
    state and the gradients because XLA CPU then copied most donated leaves before the update
    (its several fusions per leaf read the old values); the update ran 2-3x slower that way."""
    return jax.jit(transform(o).init), jax.jit(functools.partial(guarded_update, o))
