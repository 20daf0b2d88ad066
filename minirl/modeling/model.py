"""A Llama/Qwen-family decoder in Flax NNX, with an explicit KV cache (state in, new state out).

What it is: token embedding -> L x [RMSNorm -> grouped-query attention with RoPE -> residual ->
RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm -> LM head. The switches cover the families whose
checkpoints `minirl/hf/model_files.py` loads: optional q/k/v bias (Qwen2), optional per-head q/k RMSNorm (Qwen3),
tied or untied LM head, Llama-3 RoPE frequency scaling. It matches Hugging Face `transformers`
logits to ~1e-5 in float32 (tests/hf/test_hf.py).

The KV cache (`KVCache`) is a pytree passed in and returned, never hidden inside the module.
Rows are right-padded, a row's RoPE position is its cache index, and a call advances row b by
`num_new[b]` real tokens: prefill and single-token decode are one code path (docs/model.md).

Mixture of experts (cfg.num_experts > 0): the MoE layers (`cfg.moe_layers`) replace the SwiGLU
MLP with minirl/modeling/moe.py's routed experts; `routes=` replays recorded routing.

Simplifications on purpose: no sliding-window attention, no dropout, no flash kernel.

`token_logprobs(logits, targets, sampling)` is THE log-prob function: the rollout engine and
the trainer both call it, so they cannot disagree by construction of the API (they can still
disagree numerically; see `exact` below and minirl/measure/diagnostics.py).

Exact mode (`exact=True` on a call): every contraction (dense layers, attention, norms,
log-softmax) reduces in a fixed, shape-independent order — chunks of `EXACT_CHUNK` along the
contraction axis, summed left to right — so that a decode step ([B, 1] rows) and a training
forward ([B, T] rows) produce bitwise-equal results on XLA CPU (the VeXact idea; docs/model.md).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from minirl.modeling import exact as exact_ops
from minirl.modeling import lora, moe
from minirl.modeling.model_config import ModelConfig
from minirl.modeling.sampling import Sampling, truncate_logits


class KVCache(NamedTuple):
    """Per-layer keys and values plus each row's filled length. A pytree: pass it in, get a new
    one back."""

    k: tuple  # L x [B, S, K, Dh]
    v: tuple  # L x [B, S, K, Dh]
    lengths: jax.Array  # [B] int32 real tokens per row

    @staticmethod
    def zeros(cfg: ModelConfig, batch: int, size: int, dtype=None) -> KVCache:
        shape = (batch, size, cfg.num_kv_heads, cfg.head_dim)
        dt = dtype or cfg.compute_dtype
        zeros = tuple(jnp.zeros(shape, dt) for _ in range(cfg.num_layers))
        return KVCache(
            zeros,
            tuple(jnp.zeros(shape, dt) for _ in range(cfg.num_layers)),
            jnp.zeros((batch,), jnp.int32),
        )

    @property
    def size(self) -> int:  # S
        return self.k[0].shape[1]


def rope_frequencies(cfg: ModelConfig) -> jax.Array:
    """Inverse frequencies [Dh/2] (with Llama-3 scaling when configured)."""
    inv = 1.0 / (
        cfg.rope_theta ** (jnp.arange(0, cfg.head_dim, 2, dtype=jnp.float32) / cfg.head_dim)
    )
    if cfg.rope_scaling is None:
        return inv
    factor, low, high, original = cfg.rope_scaling
    wavelen = 2 * math.pi / inv
    low_wavelen, high_wavelen = original / low, original / high
    smooth = (original / wavelen - low) / (high - low)
    scaled = jnp.where(wavelen > low_wavelen, inv / factor, inv)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    return jnp.where(is_mid, mid, scaled)


def apply_rope(
    x: jax.Array, positions: jax.Array, inv_freq: jax.Array, exact: bool = False
) -> jax.Array:
    """Rotate-half RoPE (the Hugging Face convention). x [B, T, N, Dh], positions [B, T]."""
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, Dh/2]
    cos = jnp.concatenate([jnp.cos(angles)] * 2, -1)[:, :, None, :]
    sin = jnp.concatenate([jnp.sin(angles)] * 2, -1)[:, :, None, :]
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
    xf, rf = x.astype(jnp.float32) * cos, rotated.astype(jnp.float32) * sin
    if exact:  # round both products before the add, whatever XLA fuses (an FMA would not)
        xf, rf = exact_ops.fusion_barrier(xf), exact_ops.fusion_barrier(rf)
    return (xf + rf).astype(x.dtype)


def _param(rngs: nnx.Rngs, shape, std: float, cfg: ModelConfig) -> nnx.Param:
    return nnx.Param(
        (jax.random.normal(rngs.params(), shape, jnp.float32) * std).astype(cfg.storage_dtype)
    )


def _ones(shape, cfg: ModelConfig) -> nnx.Param:
    return nnx.Param(jnp.ones(shape, cfg.storage_dtype))


class RMSNorm(nnx.Module):
    def __init__(self, size: int, cfg: ModelConfig):
        self.weight = _ones((size,), cfg)
        self.eps = cfg.norm_eps

    def __call__(self, x: jax.Array, exact: bool = False) -> jax.Array:
        xf = x.astype(jnp.float32)
        mean_sq = exact_ops.mean_last(xf * xf, exact)
        y = (xf * jax.lax.rsqrt(mean_sq + self.eps)).astype(x.dtype)
        return self.weight[...].astype(x.dtype) * y


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d, h, k, dh = cfg.dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        std = 1.0 / math.sqrt(d)
        self.q_proj = _param(rngs, (d, h * dh), std, cfg)
        self.k_proj = _param(rngs, (d, k * dh), std, cfg)
        self.v_proj = _param(rngs, (d, k * dh), std, cfg)
        self.o_proj = _param(rngs, (h * dh, d), 1.0 / math.sqrt(h * dh * 2 * cfg.num_layers), cfg)
        if cfg.qkv_bias:
            self.q_bias = nnx.Param(jnp.zeros((h * dh,), cfg.storage_dtype))
            self.k_bias = nnx.Param(jnp.zeros((k * dh,), cfg.storage_dtype))
            self.v_bias = nnx.Param(jnp.zeros((k * dh,), cfg.storage_dtype))
        if cfg.qk_norm:
            self.q_norm = RMSNorm(dh, cfg)
            self.k_norm = RMSNorm(dh, cfg)
        self.cfg = cfg
        self.lora_scale = lora.scale(cfg) if cfg.lora_rank else 1.0

    def _project(self, x, name, heads, exact):
        y = lora.project(self, name, x, self.lora_scale, exact)
        if self.cfg.qkv_bias:
            y = y + getattr(self, f"{name}_bias")[...].astype(x.dtype)
        y = y.reshape(*x.shape[:-1], heads, self.cfg.head_dim)
        if self.cfg.qk_norm and name in ("q", "k"):
            y = getattr(self, f"{name}_norm")(y, exact)
        return y

    def __call__(
        self, x, positions, inv_freq, layer_cache, starts, exact=False, segments=None, window=None
    ):
        """x [B, T, D]; positions [B, T]; layer_cache (k, v) each [B, S, K, Dh] or None;
        starts [B] cache index of x[:, 0]; segments [B, T]: packed rows (no cache); window: read
        the cache's first `window` positions only. -> (y [B, T, D], new (k, v) or None)."""
        cfg = self.cfg
        b, t, _ = x.shape
        q = apply_rope(self._project(x, "q", cfg.num_heads, exact), positions, inv_freq, exact)
        k = apply_rope(self._project(x, "k", cfg.num_kv_heads, exact), positions, inv_freq, exact)
        v = self._project(x, "v", cfg.num_kv_heads, exact)
        if layer_cache is None:
            keys, values, key_index = k, v, jnp.arange(t)
        else:
            write = jax.vmap(
                lambda c, new, s: jax.lax.dynamic_update_slice(c, new.astype(c.dtype), (s, 0, 0))
            )
            keys = write(layer_cache[0], k, starts)
            values = write(layer_cache[1], v, starts)
            new_cache = (keys, values)
            keys, values = keys[:, :window], values[:, :window]  # read in place, not copied
            key_index = jnp.arange(keys.shape[1])
        # Causal mask by cache index: query at index starts+t sees keys at index <= its own.
        visible = key_index[None, None, :] <= positions[:, :, None]  # [B, T, S]
        if segments is not None:  # packed rows: causal by index, within one's own segment
            same = segments[:, :, None] == segments[:, None]  # [B, T, T]
            visible = (key_index <= key_index[:, None]) & same
        g = cfg.num_heads // cfg.num_kv_heads
        q = q.reshape(b, t, cfg.num_kv_heads, g, cfg.head_dim)  # [B, T, K, G, Dh]
        attend = exact_ops.causal_attention if layer_cache is None else exact_ops.attention
        out = attend(q, keys, values, visible, exact)  # a decode step reads the cache as stored
        y = lora.project(self, "o", out.reshape(b, t, -1), self.lora_scale, exact)
        return y, (None if layer_cache is None else new_cache)


class MLP(nnx.Module):
    """SwiGLU: down(silu(x gate) * (x up)), `size` wide (default cfg.mlp_dim)."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, size: int = 0):
        f = size or cfg.mlp_dim
        std = 1.0 / math.sqrt(cfg.dim)
        self.gate_proj = _param(rngs, (cfg.dim, f), std, cfg)
        self.up_proj = _param(rngs, (cfg.dim, f), std, cfg)
        self.down_proj = _param(rngs, (f, cfg.dim), 1.0 / math.sqrt(f * 2 * cfg.num_layers), cfg)
        self.lora_scale = lora.scale(cfg) if cfg.lora_rank else 1.0

    def __call__(self, x, exact=False):
        s = self.lora_scale
        h = jax.nn.silu(lora.project(self, "gate", x, s, exact)) * lora.project(
            self, "up", x, s, exact
        )
        return lora.project(self, "down", h, s, exact)


class Block(nnx.Module):
    """One decoder layer; its MLP is a dense `MLP` or, on an MoE layer, a `moe.MoE`."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, sparse: bool = False):
        self.attn_norm = RMSNorm(cfg.dim, cfg)
        self.attn = Attention(cfg, rngs)
        self.mlp_norm = RMSNorm(cfg.dim, cfg)
        shared = MLP(cfg, rngs, cfg.shared_expert_dim) if sparse and cfg.shared_expert_dim else None
        self.mlp = moe.MoE(cfg, rngs, shared) if sparse else MLP(cfg, rngs)
        self.sparse = sparse

    def __call__(self, x, positions, inv_freq, layer_cache, starts, exact=False, routes=None, **kw):
        normed = self.attn_norm(x, exact)
        h, new_cache = self.attn(normed, positions, inv_freq, layer_cache, starts, exact, **kw)
        x = x + h
        normed = self.mlp_norm(x, exact)
        x = x + (self.mlp(normed, routes, exact) if self.sparse else self.mlp(normed, exact))
        return x, new_cache


class Transformer(nnx.Module):
    """The decoder. `model(tokens)` -> logits; `model(tokens, cache=c, num_new=n)` -> (logits, c')."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = _param(rngs, (cfg.vocab_size, cfg.dim), 1.0 / math.sqrt(cfg.dim), cfg)
        sparse = set(cfg.moe_layers)
        self.layers = nnx.List([Block(cfg, rngs, i in sparse) for i in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.dim, cfg)
        if not cfg.tie_embeddings:
            self.lm_head = _param(rngs, (cfg.dim, cfg.vocab_size), 1.0 / math.sqrt(cfg.dim), cfg)
        if cfg.lora_rank:  # drawn after every base weight: the base is the rank-0 model's
            adapters = lora.init_adapters(cfg, rngs.params())["layers"]
            for i, parts in adapters.items():
                for part, leaves in parts.items():
                    for name, value in leaves.items():
                        setattr(getattr(self.layers[i], part), name, nnx.Param(value))

    def __call__(
        self,
        tokens,
        cache: KVCache | None = None,
        num_new=None,
        exact=False,
        last_only=False,
        routes=None,
        packed=None,
        window=None,
    ):
        """tokens [B, T] int32, right-padded. Without a cache: full causal forward from position
        0, returns logits [B, T, V] (float32). With a cache: row b's tokens go to cache indices
        cache.lengths[b] + t, `num_new` [B] (default T) of them are real; returns
        (logits [B, T, V], new cache). `last_only` (with a cache): logits [B, 1, V] of each
        row's last real token only — a prefill samples from nothing else, and with a 152k
        vocabulary the LM head over every position is a quarter of a prefill's FLOPs.
        MoE: `routes` int32 [B, T, M, k] (M = len(cfg.moe_layers)) replays those experts, None
        lets the routers choose; `moe.collect(model)` returns what they did (minirl/modeling/moe.py).
        `packed`: rows packed with sequences (no cache): their `positions`, `segments` [B, T].
        `window` (static): attend over the cache's first `window` positions only, read in place."""
        x, new_cache = self.hidden(tokens, cache, num_new, exact, routes, packed, window)
        if last_only:  # after the norm: gathered before it, bf16 exact mode rounded differently
            last = (tokens.shape[1] if num_new is None else num_new) - 1  # [B] or a number
            x = jnp.take_along_axis(x, jnp.broadcast_to(last, x.shape[:1])[:, None, None], axis=1)
        head = self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]  # [D, V]
        logits = exact_ops.dense(x, head, exact, jnp.float32)  # [B, T, V]: float32 (not rounded)
        return logits if cache is None else (logits, new_cache)

    def hidden(
        self, tokens, cache=None, num_new=None, exact=False, routes=None, packed=None, window=None
    ):
        """`__call__` without the LM head: (final-normed hidden states [B, T, D], the new cache
        or None); the trainer's way to never hold [B, T, V] logits (chunked_logprobs.py)."""
        cfg = self.cfg
        b, t = tokens.shape
        starts = jnp.zeros((b,), jnp.int32) if cache is None else cache.lengths
        positions = starts[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]  # [B, T]
        segments = None if packed is None else packed["segments"]  # [B, T]
        positions = positions if packed is None else packed["positions"]
        inv_freq = rope_frequencies(cfg)
        x = self.embed[...][tokens].astype(cfg.compute_dtype)  # [B, T, D]; float32 gradient sums
        new_k, new_v = [], []
        sparse = cfg.moe_layers
        # only what is set: a wrapper of the six dense arguments (the trainer's remat) still fits
        extra = {k: v for k, v in (("segments", segments), ("window", window)) if v is not None}
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else (cache.k[i], cache.v[i])
            args = (x, positions, inv_freq, layer_cache, starts, exact)
            if routes is not None and i in sparse:  # replay this MoE layer's routes [B, T, k]
                args = (*args, routes[:, :, sparse.index(i)])
            x, kv = layer(*args, **extra)
            if kv is not None:
                new_k.append(kv[0])
                new_v.append(kv[1])
        if num_new is None:
            num_new = jnp.full((b,), t, jnp.int32)
        if cache is not None:
            cache = KVCache(tuple(new_k), tuple(new_v), cache.lengths + num_new)
        return self.final_norm(x, exact), cache


def token_logprobs(logits, targets, sampling: Sampling = Sampling()):
    """log softmax(logits / temperature)[targets]: logits [B, T, V], targets [B, T] -> [B, T].

    The one log-prob function shared by the rollout engine (behaviour log-probs log mu) and the
    trainer (log pi_theta, log pi_prox), under a `Sampling` spec with temperature > 0 (pass
    `spec.scoring` for a greedy one). The behaviour policy IS the tempered distribution. With
    top-k / top-p set (default: off), it is the tempered distribution truncated and
    renormalised exactly as the engine samples (`minirl.modeling.sampling.truncate_logits`)."""
    s = sampling
    z = logits.astype(jnp.float32) / s.temperature
    if s.top_k or s.top_p < 1.0:
        z = truncate_logits(z, s.top_k, s.top_p, s.exact)
    logp = exact_ops.log_softmax(z, s.exact)
    return jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def init_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    return Transformer(cfg, nnx.Rngs(params=seed))


@functools.lru_cache(maxsize=32)
def abstract_model(cfg: ModelConfig) -> tuple[nnx.GraphDef, dict]:
    """(graphdef, pure-dict template of jax.ShapeDtypeStruct leaves), nothing allocated: what
    every compiled function merges its parameters into, and what loaded ones must match."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: init_model(cfg)))
    return graphdef, nnx.to_pure_dict(state)


def param_shapes(cfg: ModelConfig) -> dict:
    """The pure parameter dict `cfg` builds, as jax.ShapeDtypeStruct leaves: a fresh one to fill
    in (`abstract_model`'s is cached, so a caller that filled it kept its arrays alive)."""
    return jax.tree.map(lambda leaf: leaf, abstract_model(cfg)[1])
