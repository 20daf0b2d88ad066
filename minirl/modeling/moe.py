"""A mixture-of-experts MLP (Qwen2-MoE / Qwen3-MoE), its routing record and its balancing loss.

What one MoE layer computes for a token x [D] (E experts, k per token, each a SwiGLU F wide):

    p       = softmax(x @ router)                     [E]  router [D, E], softmax in float32
    chosen  = top-k of p                              [k]  ties: the lower expert index first
              (or, replayed, the k experts `routes` names)
    g       = p[chosen], / sum(g) if norm_topk_prob   [k]  the gate values
    y       = sum_j g_j * down_e(silu(x gate_e) * (x up_e))   e = chosen_j
            + sigmoid(x @ shared_gate) * shared(x)    (Qwen2-MoE's shared expert, if any)

The experts are one batched weight per projection: gate_proj and up_proj [E, D, F], down_proj
[E, F, D]. With replay the SET of experts comes from `routes`, but g is still gathered from this
forward's router probabilities, so gradients reach the router (R3, arXiv 2510.11370).

How it is computed, in both modes: every expert runs on every token and the k chosen ones are
kept by a combine weight that is zero for the others — x times [D, E*F] for gate and up, then
(h * combine) times [E*F, D] for down, which also sums the k outputs. Three dense products, so
exact mode is the ordinary fixed-order `minirl.modeling.exact.dense` and a token's result cannot
depend on which other tokens share its batch (unchosen experts add exact zeros). The price is
E/k times the active FLOPs: right for the tiny shapes minirl runs on a CPU; a production kernel
groups tokens by expert instead (docs/moe.md).

The record: every call stores, as `nnx.Intermediate` variables on the layer, the chosen experts
int32 [B, T, k] (the router's order: largest probability first) and the router probabilities
float32 [B, T, E]. `collect(model)` pops them for all MoE layers (inside jit too).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from flax.errors import TraceContextError

from minirl.modeling import exact as exact_ops


def check(cfg) -> None:
    """ValueError unless cfg's MoE fields fit together (cfg.num_experts > 0)."""
    e, k = cfg.num_experts, cfg.experts_per_token
    if not 1 <= k <= e:
        raise ValueError(f"experts_per_token must be in 1..num_experts={e}, got {k}")
    if cfg.expert_dim < 1 or cfg.shared_expert_dim < 0 or cfg.moe_every < 1:
        raise ValueError(
            "expert_dim and moe_every must be >= 1 and shared_expert_dim >= 0, got "
            f"{cfg.expert_dim}, {cfg.moe_every}, {cfg.shared_expert_dim}"
        )
    if any(not 0 <= i < cfg.num_layers for i in cfg.dense_layers):
        raise ValueError(f"dense_layers must be layer indices < {cfg.num_layers}")
    if cfg.lora_rank and set(cfg.lora_targets) - {"q", "k", "v", "o"}:
        raise ValueError(
            "LoRA on a mixture-of-experts model adapts attention only: set lora_targets to a "
            f"subset of (q, k, v, o), got {tuple(cfg.lora_targets)}"
        )


def softmax(z: jax.Array, exact: bool = False) -> jax.Array:
    """softmax over the last axis, float32; exact: max-shifted, summed with the fixed tree."""
    z = z.astype(jnp.float32)
    if not exact:
        return jax.nn.softmax(z, axis=-1)
    z = exact_ops.fusion_barrier(z)
    e = jnp.exp(exact_ops.fusion_barrier(z - jnp.max(z, axis=-1, keepdims=True)))
    return e / exact_ops.tree_sum(e, -1)[..., None]


def route(probs: jax.Array, k: int, norm_topk_prob: bool, routes=None, exact: bool = False):
    """(chosen experts int32 [..., k], gate values float32 [..., k]) from router probabilities
    [..., E]: the top k (equal probabilities: the lower index first), or the given `routes`
    [..., k]; the gate values are probs at those experts, renormalised to sum 1 if asked."""
    chosen = jax.lax.top_k(probs, k)[1] if routes is None else routes.astype(jnp.int32)
    gates = jnp.take_along_axis(probs, chosen, axis=-1)
    if norm_topk_prob:
        total = exact_ops.tree_sum(gates, -1) if exact else jnp.sum(gates, -1)
        gates = gates / total[..., None]
    return chosen, gates


def load_balancing_loss(router_probs, routes, num_experts: int, mask=None) -> jax.Array:
    """The Switch / Qwen auxiliary loss E * sum_e f_e * P_e (Fedus et al. 2021, eq. 4; the form
    transformers' Qwen MoE models add): f_e = the share of tokens that sent one of their k
    choices to expert e (so sum_e f_e = k), P_e = the mean router probability of e. Perfect
    balance gives k; all tokens on the same k experts with probability 1 give E.

    router_probs [..., E] float, routes [..., k] int (the same leading axes, e.g. [B, T, M]: the
    layers are pooled as transformers does); mask [...] (a prefix of the leading axes, e.g.
    [B, T]) weights the tokens, 0 for padding. Differentiable in router_probs."""
    lead = routes.shape[:-1]
    w = jnp.ones(lead, jnp.float32) if mask is None else jnp.asarray(mask, jnp.float32)
    w = jnp.broadcast_to(w.reshape(w.shape + (1,) * (len(lead) - w.ndim)), lead)[..., None]
    picks = jax.nn.one_hot(routes, num_experts, dtype=jnp.float32).sum(-2)  # [..., E]
    rows = jnp.maximum(w.sum(), 1.0)
    f = (picks * w).reshape(-1, num_experts).sum(0) / rows
    p = (router_probs.astype(jnp.float32) * w).reshape(-1, num_experts).sum(0) / rows
    return num_experts * jnp.sum(f * p)


class MoE(nnx.Module):
    """The routed experts of one layer (+ an optional shared expert, any SwiGLU module)."""

    def __init__(self, cfg, rngs: nnx.Rngs, shared: nnx.Module | None = None):
        e, d, f = cfg.num_experts, cfg.dim, cfg.expert_dim

        def param(shape, std):
            w = jax.random.normal(rngs.params(), shape, jnp.float32) * std
            return nnx.Param(w.astype(cfg.storage_dtype))

        self.router = param((d, e), 1.0 / math.sqrt(d))
        self.gate_proj = param((e, d, f), 1.0 / math.sqrt(d))
        self.up_proj = param((e, d, f), 1.0 / math.sqrt(d))
        self.down_proj = param((e, f, d), 1.0 / math.sqrt(f * 2 * cfg.num_layers))
        if shared is not None:
            self.shared_expert = shared
            self.shared_expert_gate = param((d, 1), 1.0 / math.sqrt(d))
        self.k, self.norm_topk_prob = cfg.experts_per_token, cfg.norm_topk_prob

    def __call__(self, x: jax.Array, routes=None, exact: bool = False) -> jax.Array:
        """x [B, T, D] -> [B, T, D]; routes None (the router chooses) or int32 [B, T, k]."""
        e, d, f = self.gate_proj.shape
        logits = exact_ops.dense(x, self.router[...].astype(x.dtype), exact)  # [B, T, E]
        probs = softmax(logits, exact)
        chosen, gates = route(probs, self.k, self.norm_topk_prob, routes, exact)
        self._record(chosen, probs)
        # Zero for the E - k unchosen experts; each chosen one appears once, so sums are exact.
        combine = jnp.sum(jax.nn.one_hot(chosen, e, dtype=jnp.float32) * gates[..., None], -2)
        wide = lambda w: w[...].astype(x.dtype).transpose(1, 0, 2).reshape(d, e * f)  # [D, E*F]
        gate = exact_ops.dense(x, wide(self.gate_proj), exact).reshape(*x.shape[:-1], e, f)
        up = exact_ops.dense(x, wide(self.up_proj), exact).reshape(*x.shape[:-1], e, f)
        h = jax.nn.silu(gate) * up * combine.astype(x.dtype)[..., None]  # [B, T, E, F]
        down = self.down_proj[...].astype(x.dtype).reshape(e * f, d)
        y = exact_ops.dense(h.reshape(*x.shape[:-1], e * f), down, exact)
        if not hasattr(self, "shared_expert"):
            return y
        s = exact_ops.dense(x, self.shared_expert_gate[...].astype(x.dtype), exact)
        shared = jax.nn.sigmoid(s) * self.shared_expert(x, exact)
        return y + (exact_ops.fusion_barrier(shared) if exact else shared)

    def _record(self, chosen, probs) -> None:
        """Keep this call's routing for `collect` (the last call wins). A layer merged outside a
        jax.lax loop and called inside it (the engine's decode loop) cannot be written to from
        there: it records nothing, and `collect` says so — merge inside the loop body to record."""
        try:
            self.routes = nnx.Intermediate(chosen)
            self.router_probs = nnx.Intermediate(probs)
        except TraceContextError:
            pass


def collect(model) -> tuple[jax.Array | None, jax.Array | None]:
    """Pop the routing record of `model`'s last call: (routes int32 [B, T, M, k], router_probs
    float32 [B, T, M, E]), M = the MoE layers in order; (None, None) on a dense model. Works on
    a model merged inside a jitted function (call it on that same object)."""
    records = nnx.to_pure_dict(nnx.pop(model, nnx.Intermediate))
    if not model.cfg.moe_layers:
        return None, None
    try:
        layers = [records["layers"][i]["mlp"] for i in model.cfg.moe_layers]
        routes, probs = [r["routes"] for r in layers], [r["router_probs"] for r in layers]
    except KeyError:
        raise ValueError(
            "no routing record: call the model before collect, on this same object and trace "
            "(a model merged outside a jax.lax loop records nothing inside it)"
        ) from None
    return jnp.stack(routes, axis=2), jnp.stack(probs, axis=2)
