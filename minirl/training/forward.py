"""The trainer's forward pass: log-probs of the targets, computed the way the rollout engine
computes them, and the per-micro-batch gradient of a loss on them.

    spec = ForwardSpec(model_cfg, sampling, "none")    # what the compiled code is specialised on
    logp = forward_fn(spec)(params, tokens, targets)     # [R, Tb] log pi(targets)
    acc, metrics, logp = accumulate_fn(spec, loss)(params, acc, tokens, targets, part)
    # LoRA: the gradient of the adapters alone, the frozen base joined in the forward
    acc, metrics, logp = accumulate_fn(spec, loss)(adapters, acc, tokens, targets, part, base)

Numerics match the engine (RLAX §5.1): the same model call (`exact` flag) and the same
`minirl.modeling.model.token_logprobs` under the engine's `Sampling` spec (scoring form), so the trainer's recomputed log pi_prox
and the engine's behaviour log-probs differ only where the computation itself does (exact mode:
not at all; docs/trainer.md).

Remat (`ForwardSpec.remat`, only under the gradient): each decoder block is wrapped in
`jax.checkpoint` with XLA's `dots_saveable` ("dots": keep matmul outputs, recompute the cheap
elementwise work) or `nothing_saveable` ("nothing": recompute the whole block in the backward
pass — RLAX's "nothing-saveable" setting, which keeps the training forward closest to the
inference graph), or not at all ("none"). docs/trainer.md reports what each costs here.

The functions are pure and jitted once per (spec, loss), shared between trainers with equal
settings, so tests and benchmarks reuse compiles. The gradient accumulator is donated.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from minirl.modeling import lora
from minirl.modeling.model import ModelConfig, abstract_model, token_entropy, token_logprobs
from minirl.modeling.sampling import Sampling

__all__ = [
    "REMAT_POLICIES",
    "ForwardSpec",
    "abstract_model",
    "accumulate",
    "accumulate_fn",
    "forward_fn",
    "logprobs_and_logits",
]

REMAT_POLICIES = {
    "none": None,
    "dots": jax.checkpoint_policies.dots_saveable,
    "nothing": jax.checkpoint_policies.nothing_saveable,
}


class ForwardSpec(NamedTuple):
    """What the forward is specialised on (hashable)."""

    model: ModelConfig
    sampling: Sampling  # the engine's, in scoring form (temperature > 0)
    remat: str  # a key of REMAT_POLICIES

    @property
    def exact(self) -> bool:
        return self.sampling.exact


class _Checkpointed(nnx.Module):
    """A decoder block whose activations the backward pass recomputes (`jax.checkpoint`)."""

    def __init__(self, block, policy):
        self.block = block
        self.policy = policy

    def __call__(self, x, positions, inv_freq, layer_cache, starts, exact=False):
        assert layer_cache is None, "remat is for the training forward (no KV cache)"
        graphdef, state = nnx.split(self.block)

        def run(state, x, positions, inv_freq, starts):
            return nnx.merge(graphdef, state)(x, positions, inv_freq, None, starts, exact)[0]

        return jax.checkpoint(run, policy=self.policy)(state, x, positions, inv_freq, starts), None


def logprobs_and_logits(s: ForwardSpec, params, tokens, targets, remat: bool, dropout=None):
    """tokens, targets [R, Tb] -> (log-probs [R, Tb], logits [R, Tb, V]): the model's forward
    and the engine's `token_logprobs` with the engine's settings; `remat` applies s.remat;
    `dropout` (a key: the training forward of a run with model.lora_dropout) drops adapter inputs."""
    model = nnx.merge(abstract_model(s.model)[0], params)
    if dropout is not None:
        lora.set_dropout(model, s.model.lora_dropout, dropout)
    if remat and REMAT_POLICIES[s.remat] is not None:
        model.layers = nnx.List([_Checkpointed(b, REMAT_POLICIES[s.remat]) for b in model.layers])
    logits = model(tokens, exact=s.exact)  # [R, Tb, V]
    return token_logprobs(logits, targets, s.sampling), logits


def accumulate(s: ForwardSpec, loss, params, acc, tokens, targets, part, frozen=None, dropout=None):
    """Phase 2 of `loss` on one micro-batch: add its gradient and loss value to the accumulator
    `acc` = (gradients, loss), or start one if `acc` is None (no zeros to write and add on the
    first micro-batch). The gradient is with respect to `params` only; `frozen` (a LoRA run's
    base weights: minirl/modeling/lora.py `trainable`) joins them in the forward without a gradient;
    `dropout`, the micro-batch's LoRA dropout key (None: no dropout).
    Returns (accumulator, the micro-batch's metrics, the training forward's log-probs [R, Tb],
    for the RLAX Fig. 5 metrics)."""

    def micro_loss(p):
        joined = lora.join(p, frozen)
        logp, logits = logprobs_and_logits(s, joined, tokens, targets, True, dropout)
        entropy = token_entropy(logits, s.sampling.temperature) if loss.needs_entropy else None
        value, metrics = loss.loss(logp, part, entropy=entropy)
        return value, (metrics, jax.lax.stop_gradient(logp))

    (value, (metrics, logp)), grads = jax.value_and_grad(micro_loss, has_aux=True)(params)
    if acc is None:
        return (grads, value), metrics, logp
    return jax.tree.map(jnp.add, acc, (grads, value)), metrics, logp


@functools.lru_cache(maxsize=32)
def forward_fn(s: ForwardSpec):
    """jit of (params, tokens [R, Tb], targets [R, Tb]) -> log-probs [R, Tb], no remat."""
    return jax.jit(
        lambda params, tokens, targets: logprobs_and_logits(
            s, params, tokens, targets, remat=False
        )[0]
    )


@functools.lru_cache(maxsize=32)
def training_forward_fn(s: ForwardSpec):
    """jit of (params, tokens, targets) -> log-probs [R, Tb] as the training step computes them:
    inside `jax.value_and_grad`, with the spec's remat policy (the gradient's norm is returned
    too, or XLA would drop the backward pass and the remat with it). For diagnosing what the
    training forward itself changes (minirl diagnose's "training forward" rows)."""

    def run(params, tokens, targets):
        def total(p):
            logp = logprobs_and_logits(s, p, tokens, targets, remat=True)[0]
            return jnp.sum(logp), logp

        (_, logp), grads = jax.value_and_grad(total, has_aux=True)(params)
        return logp, optax.tree.norm(grads)

    return jax.jit(run)


@functools.lru_cache(maxsize=32)
def accumulate_fn(s: ForwardSpec, loss):
    """jit of `accumulate` for one spec and loss, the accumulator donated."""
    return jax.jit(functools.partial(accumulate, s, loss), donate_argnums=(1,))
