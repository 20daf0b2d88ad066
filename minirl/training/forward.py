"""The trainer's forward pass: log-probs of the targets, computed the way the rollout engine
computes them, and the per-micro-batch gradient of a loss on them.

    spec = ForwardSpec(model_cfg, sampling, "none")    # what the compiled code is specialised on
    logp = forward_fn(spec)(params, tokens, targets)     # [R, Tb] log pi(targets)
    acc, metrics, logp, choice = accumulate_fn(spec, loss)(params, acc, tokens, targets, part)

Mixture-of-experts models (`ForwardSpec.routing`): "free" lets each MoE layer's router choose;
"replay" sends each position to the experts the engine recorded (`routes` [R, Tb, M, k], the
batch's `routes`), the gate values still from this forward's router so the router gets its
gradient (R3, arXiv 2510.11370). `choice` [R, Tb, M, k] is what the routers themselves would pick
in this forward (top-k of their probabilities: under replay, each layer's pick given the replayed
layers before it), for the routing-disagreement metrics; None on a dense model.

Numerics match the engine (RLAX §5.1): the same model call (`exact` flag) and the same
`minirl.modeling.model.token_logprobs` under the engine's `Sampling` spec (scoring form), so the trainer's recomputed log pi_prox
and the engine's behaviour log-probs differ only where the computation itself does (exact mode:
not at all; docs/trainer.md). The LM head runs `ForwardSpec.logit_chunk` positions at a time (0:
all): no [R, Tb, V] logits at once, forward or backward (minirl/modeling/chunked_logprobs.py).

Remat (`ForwardSpec.remat`, only under the gradient): each decoder block in `jax.checkpoint`,
"dots" (`dots_saveable`), "nothing" (RLAX's nothing-saveable: closest to the inference graph)
or "none"; docs/trainer.md has their costs (on a CPU: `_compiler_options`). Packed rows
(`packing`): `_forward`.

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

from minirl.modeling import lora, moe
from minirl.modeling.chunked_logprobs import head_logprobs
from minirl.modeling.model import KVCache, ModelConfig, abstract_model
from minirl.modeling.sampling import Sampling

__all__ = [
    "REMAT_POLICIES",
    "ForwardSpec",
    "abstract_model",
    "accumulate",
    "accumulate_fn",
    "forward_fn",
    "logprobs",
    "narrow",
    "reference_fn",
    "routing_fn",
]

ROUTINGS = ("free", "replay")

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
    routing: str = "free"  # MoE: "free" (the router chooses) | "replay" (the engine's experts)
    logit_chunk: int = 0  # positions per LM-head chunk (chunked_logprobs.py); 0 = all at once

    @property
    def exact(self) -> bool:
        return self.sampling.exact


class _Checkpointed(nnx.Module):
    """A decoder block whose activations the backward pass recomputes (`jax.checkpoint`)."""

    def __init__(self, block, policy):
        self.block = block
        self.policy = policy

    def __call__(
        self, x, positions, inv_freq, layer_cache, starts, exact=False, routes=None, segments=None
    ):
        graphdef, state = nnx.split(self.block)

        def run(state, x, positions, inv_freq, layer_cache, starts, routes, segments):
            block = nnx.merge(graphdef, state)
            args = (x, positions, inv_freq, layer_cache, starts, exact, routes)
            y, kv = block(*args, segments=segments)
            return y, kv, nnx.pop(block, nnx.Intermediate)  # an MoE layer's record, brought out

        args = (state, x, positions, inv_freq, layer_cache, starts, routes, segments)
        y, kv, sown = jax.checkpoint(run, policy=self.policy)(*args)
        nnx.update(self.block, sown)
        return y, kv


def _compiler_options(s: ForwardSpec) -> dict | None:
    """XLA's CPU compiler drops `jax.checkpoint`'s barriers before its CSE pass, which then merges
    each recomputed block into the forward (docs/trainer.md, "Remat and exact mode")."""
    if s.remat == "none" or jax.default_backend() != "cpu":
        return None
    return {"xla_disable_hlo_passes": "cse_barrier_expander"}


def unpack(x, packing):  # packed rows' values [P, Tb] -> rows [R, Tb] (0 elsewhere)
    if packing is None or x is None:
        return x
    source = packing["source"]  # [R, Tb] flat index into [P * L], -1: none
    got = x.reshape(-1)[jnp.maximum(source, 0)]
    return jnp.where(source >= 0, got, jnp.zeros((), x.dtype))


def _shared_hidden(s, model, tokens, shared):
    """Hidden states [R, 1 + Tc, D] of rows whose prompts run once (`microbatch.shared`): each
    distinct prompt with a fresh cache, then each row's tokens after its prompt's keys and
    values (gathered: their gradient sums over the rows), and the prompt's last position first."""
    prompts, plen, src = shared["prompts"], shared["prompt_lengths"], shared["src"]
    fresh = KVCache.zeros(s.model, *prompts.shape)
    h, cache = model.hidden(prompts, cache=fresh, num_new=plen, exact=s.exact)  # [U, Tp, D]
    pad = ((0, 0), (0, tokens.shape[1]), (0, 0), (0, 0))  # room for the row's own positions
    row = lambda x: jnp.pad(x[src], pad)  # noqa: E731
    rows = KVCache(tuple(map(row, cache.k)), tuple(map(row, cache.v)), plen[src])
    after = model.hidden(tokens, cache=rows, exact=s.exact)[0]  # [R, Tc, D]
    last = h[src, plen[src] - 1][:, None]  # [R, 1, D]: predicts the first completion token
    return jnp.concatenate([last, after], axis=1)


def _forward(s, params, tokens, targets, remat, routes=None, dropout=None, packing=None, ent=False):
    """`logprobs`, the entropies [R, Tb] (`ent`, else None) and what the MoE layers did: (routes
    run [R, Tb, M, k] int32, router probabilities [R, Tb, M, E] float32) or (None, None).
    `packing`: packed rows [P, Tb] in (tokens, targets), rows [R, Tb] out; or, with "src",
    rows sharing their prompts (`_shared_hidden`)."""
    model = nnx.merge(abstract_model(s.model)[0], params)
    if dropout is not None:
        lora.set_dropout(model, s.model.lora_dropout, dropout)
    blocks, policy = model.layers, REMAT_POLICIES[s.remat] if remat else None
    if policy is not None:
        model.layers = nnx.List([_Checkpointed(b, policy) for b in blocks])
    replay = routes.astype(jnp.int32) if s.routing == "replay" and routes is not None else None
    if packing is not None and "src" in packing:
        hidden = _shared_hidden(s, model, tokens, packing)
    else:
        hidden = model.hidden(tokens, exact=s.exact, routes=replay, packed=packing)[0]
    model.layers = blocks  # each holds its MoE record (a _Checkpointed put it back)
    tied = s.model.tie_embeddings
    head = model.embed[...] if tied else model.lm_head[...]  # [D, V], or tied: [V, D]
    logp, entropy = head_logprobs(hidden, head, targets, s.sampling, s.logit_chunk, ent, tied)
    return unpack(logp, packing), unpack(entropy, packing), moe.collect(model)


def logprobs(s: ForwardSpec, params, tokens, targets, remat: bool, routes=None, dropout=None):
    """tokens, targets [R, Tb] -> log-probs [R, Tb] as the engine scores them; `remat` applies
    s.remat; `routes` [R, Tb, M, k]: the engine's experts, replayed under s.routing "replay";
    `dropout`: the LoRA dropout key of a training forward (model.lora_dropout)."""
    return _forward(s, params, tokens, targets, remat, routes, dropout)[0]


def _choice(s: ForwardSpec, probs):
    """The experts each router would pick [R, Tb, M, k] (ties to the lower index), or None."""
    return None if probs is None else jax.lax.top_k(probs, s.model.experts_per_token)[1]


def accumulate(
    s: ForwardSpec,
    loss,
    params,
    acc,
    tokens,
    targets,
    part,
    frozen=None,
    routes=None,
    share=None,
    dropout=None,
    packing=None,
):
    """Phase 2 of `loss` on one micro-batch: add its gradient and loss value to the accumulator
    `acc` = (gradients, loss), or start one if `acc` is None (no zeros to write and add on the
    first micro-batch). The gradient is with respect to `params` only; `frozen` (a LoRA run's
    base weights: minirl/modeling/lora.py `trainable`) joins them in the forward without a gradient.
    `routes`: the micro-batch's engine routes (MoE). `share` [R, Tb] (a loss with
    `router_aux_coef`): each counted token's share of the batch's counted tokens; the
    micro-batch adds coef x its load-balancing loss over those tokens x its share, so the sum
    over micro-batches is the token-weighted mean of theirs (the batch's own with one).
    `dropout`: the micro-batch's LoRA dropout key (None: no dropout). `packing`: `_forward`'s.
    Returns (accumulator, the
    micro-batch's metrics, the training forward's log-probs [R, Tb], for the RLAX Fig. 5
    metrics, and the routers' own choice [R, Tb, M, k] or None: module docstring)."""

    def micro_loss(p):
        ent = loss.needs_entropy
        logp, entropy, (run, probs) = _forward(
            s, lora.join(p, frozen), tokens, targets, True, routes, dropout, packing, ent
        )
        value, metrics = loss.loss(logp, part, entropy=entropy)
        if getattr(loss, "router_aux_coef", 0.0):  # the load-balancing part (minirl/losses)
            aux = moe.load_balancing_loss(probs, run, s.model.num_experts, share > 0)
            aux = aux * jnp.sum(share)
            value, metrics = value + loss.router_aux_coef * aux, {**metrics, "router_aux": aux}
        return value, (metrics, jax.lax.stop_gradient(logp), _choice(s, probs))

    (value, (metrics, logp, choice)), grads = jax.value_and_grad(micro_loss, has_aux=True)(params)
    if acc is None:
        return (grads, value), metrics, logp, choice
    return jax.tree.map(jnp.add, acc, (grads, value)), metrics, logp, choice


@functools.lru_cache(maxsize=32)
def forward_fn(s: ForwardSpec):
    """jit of (params, tokens [R, Tb], targets [R, Tb], routes=None, packing=None) -> log-probs
    [R, Tb], no remat (`routes`: replayed under s.routing "replay"; `packing`: `_forward`'s)."""
    return jax.jit(
        lambda params, tokens, targets, routes=None, packing=None: _forward(
            s, params, tokens, targets, False, routes, packing=packing
        )[0]
    )


def narrow(x):
    """`x` in bfloat16 where bfloat16 holds every float32 value exactly (weights loaded from a
    bf16 checkpoint), else `x`: the trainer's reference model, half the bytes, same bits."""
    if x.dtype != jnp.float32:
        return x
    y = x.astype(jnp.bfloat16)
    return y if bool(jnp.array_equal(y.astype(jnp.float32), x)) else x


@functools.lru_cache(maxsize=32)
def reference_fn(s: ForwardSpec):
    """`forward_fn` of weights that `narrow` may have stored in bf16: cast back to the
    model's parameter dtypes first (exactly)."""
    template, forward = abstract_model(s.model)[1], forward_fn(s)
    wide = lambda x, t: x.astype(t.dtype)
    return jax.jit(lambda params, *args: forward(jax.tree.map(wide, params, template), *args))


@functools.lru_cache(maxsize=32)
def routing_fn(s: ForwardSpec):
    """jit of (params, tokens, targets, routes=None) -> (log-probs [R, Tb], the experts run
    [R, Tb, M, k], the routers' own choice [R, Tb, M, k]) on an MoE model: `forward_fn` with what
    its MoE layers did."""

    def run(params, tokens, targets, routes=None):
        logp, _, (ran, probs) = _forward(s, params, tokens, targets, False, routes)
        return logp, ran, _choice(s, probs)

    return jax.jit(run)


@functools.lru_cache(maxsize=32)
def training_forward_fn(s: ForwardSpec):
    """jit of (params, tokens, targets) -> log-probs [R, Tb] as the training step computes them:
    inside `jax.value_and_grad`, with the spec's remat policy (the gradient's norm is returned
    too, or XLA would drop the backward pass and the remat with it). For diagnosing what the
    training forward itself changes (minirl diagnose's "training forward" rows)."""

    def run(params, tokens, targets, routes=None, packing=None):
        def total(p):
            logp = _forward(s, p, tokens, targets, True, routes, packing=packing)[0]
            return jnp.sum(logp), logp

        (_, logp), grads = jax.value_and_grad(total, has_aux=True)(params)
        return logp, optax.tree.norm(grads)

    return jax.jit(run, compiler_options=_compiler_options(s))


@functools.lru_cache(maxsize=32)
def accumulate_fn(s: ForwardSpec, loss):
    """jit of `accumulate` for one spec and loss, the accumulator donated."""
    run = functools.partial(accumulate, s, loss)
    return jax.jit(run, donate_argnums=(1,), compiler_options=_compiler_options(s))
