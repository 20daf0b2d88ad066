"""A mixture-of-experts MLP (Qwen2-MoE / Qwen3-MoE), its routing record and its balancing loss.

One MoE layer, for a token x [D] (E experts, k per token, each a SwiGLU F wide; docs/moe.md):

    p = softmax(x @ router) [E]; chosen = top-k of p (ties: lower index first) or the replayed
    `routes`; g = p[chosen] (/ sum(g) if norm_topk_prob); y = sum_j g_j expert_{chosen_j}(x)
    (+ sigmoid(x @ shared_gate) * shared(x), Qwen2-MoE's shared expert)

Experts are one batched weight per projection: gate_proj, up_proj [E, D, F], down_proj [E, F, D].
Replay takes the SET from `routes` but g from this forward's router, so gradients reach it (R3).
Every expert runs on every token, the unchosen ones weighted by exact zeros: three dense products
([D, E*F] twice, [E*F, D]), so exact mode is `minirl.modeling.exact.dense` and a token's result
never depends on its batch; the price is E/k times the active FLOPs (tiny CPU shapes).
Each call records the chosen experts int32 [B, T, k] and the router probabilities float32
[B, T, E] as `nnx.Intermediate`s; `collect(model)` pops them for all MoE layers.
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
    e, k, n = cfg.num_experts, cfg.experts_per_token, cfg.num_layers
    if not 1 <= k <= e:
        raise ValueError(f"experts_per_token must be in 1..num_experts={e}, got {k}")
    if min(cfg.moe_every - 1, cfg.expert_dim, cfg.shared_expert_dim) < 0:
        raise ValueError("moe_every must be >= 1 and expert_dim, shared_expert_dim >= 0")
    if any(not 0 <= i < n for i in cfg.dense_layers):
        raise ValueError(f"dense_layers must be layer indices < {n}")
    if cfg.lora_rank and set(cfg.lora_targets) - set("qkvo"):
        raise ValueError(
            "LoRA on a mixture-of-experts model adapts attention only: lora_targets must be "
            f"among q, k, v, o, got {tuple(cfg.lora_targets)}"
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
    """Switch's auxiliary loss as transformers' Qwen MoE models add it (Fedus et al. 2021, eq. 4):
    E * sum_e f_e * P_e, f_e = the share of tokens sending one of their k choices to e (sum k),
    P_e = e's mean router probability; k when balanced, E when collapsed. router_probs [..., E],
    routes [..., k] (e.g. [B, T, M]: layers pooled); mask (a prefix of those axes) weights tokens."""
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
        probs = softmax(exact_ops.dense(x, self.router[...].astype(x.dtype), exact), exact)
        chosen, gates = route(probs, self.k, self.norm_topk_prob, routes, exact)
        try:  # the record `collect` pops; impossible (and skipped) inside a jax.lax loop
            self.routes, self.router_probs = nnx.Intermediate(chosen), nnx.Intermediate(probs)
        except TraceContextError:  # that the layer was merged outside of
            pass
        # Zero for the E - k unchosen experts; each chosen one appears once, so sums are exact.
        combine = jnp.sum(jax.nn.one_hot(chosen, e, dtype=jnp.float32) * gates[..., None], -2)
        wide = lambda w: w[...].astype(x.dtype).transpose(1, 0, 2).reshape(d, e * f)  # [D, E*F]
        gate = exact_ops.dense(x, wide(self.gate_proj), exact).reshape(*x.shape[:-1], e, f)
        up = exact_ops.dense(x, wide(self.up_proj), exact).reshape(*x.shape[:-1], e, f)
        fb = exact_ops.fusion_barrier if exact else (lambda v: v)  # no FMA: same bits in any shape
        h = fb(fb(fb(jax.nn.silu(gate)) * up) * combine.astype(x.dtype)[..., None])  # [B, T, E, F]
        y = exact_ops.dense(h, self.down_proj[...].astype(x.dtype), exact)  # over E and F
        if not hasattr(self, "shared_expert"):
            return y
        s = exact_ops.dense(x, self.shared_expert_gate[...].astype(x.dtype), exact)
        shared = jax.nn.sigmoid(s) * self.shared_expert(x, exact)
        return y + (exact_ops.fusion_barrier(shared) if exact else shared)


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
