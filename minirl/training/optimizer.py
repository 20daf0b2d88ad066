"""The trainer's optimizer update: global-norm clipping, AdamW, a warm-up/cosine learning-rate
schedule, and the non-finite guard that turns a bad update into no update at all.

    settings = AdamW(b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, max_grad_norm=1.0)
    init, update = compiled(settings)
    opt_state = init(params)
    params, opt_state, ok, grad_norm = update((grads, loss), opt_state, params, scale, lr)

One update, from gradients summed over micro-batches (minirl/training/trainer.py):

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
    min_lr_ratio * lr at total_steps (which a run sets from rl.steps when it is 0:
    minirl.config.RunConfig.trainer_config)."""
    warm = min(1.0, (step + 1) / (cfg.warmup_steps + 1))
    if cfg.schedule == "constant":
        return cfg.learning_rate * warm
    if not cfg.total_steps:
        raise ValueError("a cosine schedule needs its length: TrainerConfig.total_steps >= 1")
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


def guarded_update(o: AdamW, acc, opt_state, params, scale, lr):
    """One update from `acc` = (summed gradients, summed loss), or none at all (the old params
    and optimizer state, bit for bit) if the loss or the gradient norm is non-finite.
    Returns (params, opt_state, ok, gradient norm before clipping).

    The arithmetic of `transform(o)` (optax's, on the state layout its `init` makes), written as
    one pass over each leaf's moments and one over its parameters: optax's chain materialised
    the scaled and the clipped gradient of every leaf and read the old moments after writing the
    new ones, so XLA CPU wrote ~5 fresh leaf-sized arrays per leaf and copied the moments.
    Equal to optax's chain to float rounding (tests/training/test_optimizer.py): clipping multiplies by
    one scalar factor where optax divides each element by the norm."""
    grads, loss = acc
    squares = sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(grads))
    grad_norm = jnp.sqrt(squares) * jnp.abs(scale)  # the norm of scale * grads
    ok = jnp.isfinite(loss * scale) & jnp.isfinite(grad_norm)
    factor = scale  # the mini-batch share, times min(1, c / ||g||) when clipping
    if o.max_grad_norm > 0:
        factor = scale * jnp.where(grad_norm < o.max_grad_norm, 1.0, o.max_grad_norm / grad_norm)
    clip_state, adam, decay_state = opt_state
    count = optax.safe_increment(adam.count)

    def scaled(g):  # keep bf16 as bf16
        return (g * factor).astype(g.dtype)

    # A select per leaf, not lax.cond: it fuses into the leaf's single pass.
    mu = jax.tree.map(
        lambda g, m: jnp.where(ok, (1 - o.b1) * scaled(g) + o.b1 * m, m), grads, adam.mu
    )
    nu = jax.tree.map(
        lambda g, v: jnp.where(ok, (1 - o.b2) * scaled(g) ** 2 + o.b2 * v, v), grads, adam.nu
    )

    def step(p, mu, nu):  # reads the new moments, so XLA never needs the old ones again
        mu_hat = mu / (1 - o.b1**count).astype(mu.dtype)
        nu_hat = nu / (1 - o.b2**count).astype(nu.dtype)
        direction = mu_hat / (jnp.sqrt(nu_hat) + o.eps)
        if p.ndim >= 2:  # decoupled weight decay, on matrices only
            direction = direction + o.weight_decay * p
        return jnp.where(ok, (p - lr * direction).astype(p.dtype), p)

    adam = adam._replace(count=jnp.where(ok, count, adam.count), mu=mu, nu=nu)
    new_params = jax.tree.map(step, params, mu, nu)
    return new_params, (clip_state, adam, decay_state), ok, grad_norm


@functools.lru_cache(maxsize=8)
def compiled(o: AdamW):
    """(init, update): `transform(o).init` jitted, and `update(acc, opt_state, params, scale, lr)`
    = `guarded_update` jitted with `acc` and `opt_state` donated: the caller must not use them
    afterwards. Parameters are never donated: the engine and the weight store may still hold
    them. The argument order matters: JAX gives each output the first donated input of its
    shape and dtype, in argument order, so the new parameters are written into the gradient
    buffers (dead by then) and the new moments over the old ones: the update allocates no
    leaf-sized memory (fresh pages cost ~5x a pass over warm ones on CPU) and copies nothing
    (tests/training/test_optimizer.py reads the compiled update for copies)."""
    update = jax.jit(functools.partial(guarded_update, o), donate_argnums=(0, 1))
    return jax.jit(transform(o).init), update
