"""LoRA: low-rank adapters on the decoder's projections (Hu et al., 2021), all the maths in one place.

A targeted projection y = x W (W [I, O]) becomes

    y = x W + ((x A) B) * alpha / r          A [I, r], B [r, O]

with the base W frozen and only A, B trained. A starts random (Kaiming-uniform over its fan-in, as
the paper's code does), B starts at zero, so the adapted model at step 0 IS the base model, bit
for bit (the adapter term is an exact zero added to x W).

    cfg = ModelConfig(lora_rank=16, lora_alpha=32.0, lora_targets=("q", "v"))
    params = add_adapters(base_params, cfg, seed)    # fresh adapters beside loaded base weights
    trainable, frozen = partition(params, cfg)       # what the trainer differentiates and updates
    merged = merge(params, cfg)                       # W + A B alpha / r: a plain model (export)
    base = EngineBase(); whole = base.whole(version); base.keep(whole)  # an engine's side

Where the adapters live: beside their projection, `{target}_lora_a` / `{target}_lora_b` in the
same module (layers/i/attn/q_lora_a, layers/i/mlp/up_lora_b, ...), stored in float32 whatever
the base's storage dtype. The model calls `project`; exact mode sends both adapter products
through `minirl.modeling.exact.dense`, so a decode step and a training forward stay bitwise equal.

Dropout (`lora_dropout` p > 0) drops the adapter's input, x -> dropout(x) A B, in the training
forward only: the trainer calls `set_dropout` on the model it differentiates, with a key folded
from (seed, step, update, micro-batch), so a resumed run draws the same masks. The engine and
the log pi_prox recompute never call it: they see the adapters without dropout.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from minirl.modeling import exact as exact_ops

TARGETS = {
    "q": "attn",
    "k": "attn",
    "v": "attn",
    "o": "attn",
    "gate": "mlp",
    "up": "mlp",
    "down": "mlp",
}
_SUFFIXES = ("_lora_a", "_lora_b")
_INDEX = {t: i for i, t in enumerate(TARGETS)}


def check(rank: int, alpha: float, targets: tuple, dropout: float = 0.0) -> None:
    """ValueError unless rank >= 0, alpha > 0, 0 <= dropout < 1 (0 without adapters) and targets
    a non-empty subset of TARGETS."""
    if rank < 0 or not alpha > 0 or not 0 <= dropout < 1 or (dropout and not rank):
        raise ValueError(
            f"lora_rank must be >= 0, lora_alpha > 0 and lora_dropout in [0, 1) (> 0: needs "
            "lora_rank > 0), "
            f"got {rank}, {alpha}, {dropout}"
        )
    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets or len(set(targets)) != len(targets):
        raise ValueError(
            f"lora_targets must be distinct names out of {tuple(TARGETS)}, got {tuple(targets)}"
        )


def scale(cfg) -> float:
    """alpha / r: how much the adapter product counts."""
    return cfg.lora_alpha / cfg.lora_rank


def project(module, name: str, x: jax.Array, lora_scale: float, exact: bool) -> jax.Array:
    """x [..., I] through `module.{name}_proj` [I, O], plus its adapter if `module` has one.
    Everything is computed in x's dtype."""
    y = exact_ops.dense(x, getattr(module, f"{name}_proj")[...], exact)  # cast to x.dtype there
    a = getattr(module, f"{name}_lora_a", None)
    if a is None:
        return y
    drop = getattr(module, "lora_dropout", None)  # set_dropout's key: a training forward
    if drop is not None:
        rate = module.lora_dropout_rate
        key = jax.random.fold_in(jax.random.wrap_key_data(drop[...]), _INDEX[name])
        keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
        x = jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros((), x.dtype))
    low = exact_ops.dense(x, a[...].astype(x.dtype), exact)  # [..., r]
    delta = exact_ops.dense(low, getattr(module, f"{name}_lora_b")[...].astype(x.dtype), exact)
    delta = delta * jnp.asarray(lora_scale, x.dtype)
    if exact:  # round the product before the add in every shape (no fused multiply-add)
        delta = exact_ops.fusion_barrier(delta)
    return y + delta


class DropoutKey(nnx.Variable):
    """A training forward's LoRA dropout key (raw key data), held by an attention or MLP module;
    never a parameter, never saved."""


def set_dropout(model, rate: float, key: jax.Array) -> None:
    """Make `project` drop the adapters' inputs of `model` (a Transformer, built inside the
    traced training forward) with probability `rate` (surviving inputs scaled 1 / (1 - rate)).
    Layer i's attention draws from fold_in(key, 2 i), its MLP from fold_in(key, 2 i + 1), each
    target from a further fold of its index."""
    for i, block in enumerate(model.layers):
        for j, part in enumerate((block.attn, block.mlp)):
            part.lora_dropout = DropoutKey(jax.random.key_data(jax.random.fold_in(key, 2 * i + j)))
            part.lora_dropout_rate = float(rate)


def dropout_key(seed: int, step: int, update: int, micro_batch: int) -> jax.Array:
    """The dropout key of one micro-batch of one update of one step: counters, never time."""
    key = jax.random.key(seed)
    for counter in (step, update, micro_batch):
        key = jax.random.fold_in(key, counter)
    return key


def _shapes(cfg) -> dict[str, tuple[int, int]]:
    """(I, O) of each projection."""
    d, q, kv, f = (
        cfg.dim,
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
        cfg.mlp_dim,
    )
    return {
        "q": (d, q),
        "k": (d, kv),
        "v": (d, kv),
        "o": (q, d),
        "gate": (d, f),
        "up": (d, f),
        "down": (f, d),
    }


def init_adapters(cfg, key: jax.Array) -> dict:
    """Fresh adapters for every layer and target, as a pure-dict subtree of the model's params:
    {"layers": {i: {"attn": {"q_lora_a": A, "q_lora_b": B}, ...}}}. A ~ U(-1/sqrt(I), 1/sqrt(I))
    (Kaiming-uniform with a = sqrt(5), the paper's code), B = 0; float32."""
    r, shapes, layers = cfg.lora_rank, _shapes(cfg), {}
    for i in range(cfg.num_layers):
        layer = {}
        for j, t in enumerate(cfg.lora_targets):
            fan_in, out = shapes[t]
            bound = 1.0 / math.sqrt(fan_in)
            k = jax.random.fold_in(key, i * len(TARGETS) + j)
            a = jax.random.uniform(k, (fan_in, r), jnp.float32, -bound, bound)
            layer.setdefault(TARGETS[t], {})[t + "_lora_a"] = a
            layer[TARGETS[t]][t + "_lora_b"] = jnp.zeros((r, out), jnp.float32)
        layers[i] = layer
    return {"layers": layers}


def base_config(cfg):
    """`cfg` without adapters, its LoRA knobs at their defaults (what a checkpoint directory
    and the warm start describe)."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg) if f.name.startswith("lora_")}
    return dataclasses.replace(cfg, **defaults)


def is_adapter(name: str) -> bool:
    return name.endswith(_SUFFIXES)


def partition(params: dict, keep) -> tuple[dict, dict]:
    """Split a nested dict by leaf name: (leaves where keep(name), the rest); empty dicts dropped."""
    yes, no = {}, {}
    for k, v in params.items():
        if isinstance(v, dict):
            a, b = partition(v, keep)
            if a:
                yes[k] = a
            if b:
                no[k] = b
        else:
            (yes if keep(str(k)) else no)[k] = v
    return yes, no


def join(a: dict, b: dict | None) -> dict:
    """The union of two nested dicts with disjoint leaves (partition's inverse)."""
    if not b:
        return a
    out = dict(b)
    for k, v in a.items():
        out[k] = join(v, out[k]) if isinstance(v, dict) and k in out else v
    return out


def trainable(params: dict, cfg) -> tuple[dict, dict]:
    """(what the trainer updates, what stays frozen): the adapters and the rest with LoRA on,
    everything and nothing with it off."""
    if cfg.lora_rank == 0:
        return params, {}
    return partition(params, is_adapter)


def published(params: dict, cfg) -> dict:
    """What a new version publishes: the adapters alone with LoRA on (the base never changes),
    everything without it (or where `params` is a handle, not a dict: the Ray trainer's)."""
    return (
        partition(params, is_adapter)[0] if cfg.lora_rank and isinstance(params, dict) else params
    )


def add_adapters(params: dict, cfg, seed: int) -> dict:
    """Base `params` (no adapters) with fresh seed-`seed` adapters added (unchanged if LoRA is off
    or `params` already has them)."""
    if cfg.lora_rank == 0 or partition(params, is_adapter)[0]:
        return params
    return join(init_adapters(cfg, jax.random.key(seed)), params)


def merge(params: dict, cfg) -> dict:
    """The base parameters with each adapter folded in: W + (A B) alpha / r, in W's dtype (the
    params of `base_config(cfg)`)."""
    adapters, base = partition(params, is_adapter)
    if cfg.lora_rank == 0 or not adapters:
        return base
    s = scale(cfg)

    def fold(base: dict, adapters: dict) -> dict:
        out = dict(base)
        for k, v in adapters.items():
            if isinstance(v, dict):
                out[k] = fold(base[k], v)
            elif k.endswith("_lora_a"):
                name = k[: -len("_lora_a")]
                w = base[name + "_proj"]
                delta = jnp.asarray(v, jnp.float32) @ jnp.asarray(
                    adapters[name + "_lora_b"], jnp.float32
                )
                out[name + "_proj"] = (jnp.asarray(w, jnp.float32) + delta * s).astype(w.dtype)
        return out

    return fold(base, adapters)


class EngineBase:
    """An engine's side of adapters-only versions (a LoRA run's store holds the adapters alone):
    the base of the whole set the engine holds (`keep`: the caller's arrays, or the engine's cast
    of numpy from another process) is joined to each later version; adapters stay unmerged."""

    def __init__(self):
        self.base = None

    def whole(self, params) -> dict:
        """`params` (an nnx.State or pure dict: whole, or adapters alone) as the whole set."""
        if not isinstance(params, dict):
            params = nnx.to_pure_dict(params)
        adapters, base = partition(params, is_adapter)
        if not base and self.base is None:
            raise ValueError("adapters-only weights before any whole load: no base to join")
        return params if base else join(adapters, self.base)

    def keep(self, params: dict) -> None:
        """The whole set the engine now holds: its base serves the versions after it."""
        self.base = partition(params, is_adapter)[1]
