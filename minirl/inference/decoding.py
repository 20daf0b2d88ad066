"""The rollout engine's compiled device functions, jitted once per setting, the KV cache donated
(updated in place): what `minirl.inference.engine.Engine` calls.

  prefill   a group of prompts right-padded to [U, T] (U distinct prompts: a power of two, T:
            a length bucket) runs through the model with a fresh [U, T] cache; its keys/values
            go into the slots of the R rows that asked for them (a group's samples share one
            row of the forward); each row samples its next token from its prompt's last logits.
  extend    a group of held multi-turn slots, each with new tokens [R, T] (the pending last
            token and an observation, right-padded to a length bucket) appended after the
            positions its cache already holds — a prefill at a per-slot offset, so an episode's
            history is never re-run — then each row's next token is sampled, as in prefill.
  decode    `chunk` single-token steps for every slot in one `lax.fori_loop`; step i samples
            completion index `index + i` with the key fold_in(seed, uid, sample, index + i).
            A spent slot keeps computing (static shapes) but stops advancing. The chunk attends
            over the cache's first `width` positions (enough for the longest active sequence):
            read in place (contiguous), or a gathered view written back to the pool (paged).

Both report each sampled token's behaviour log-prob with `model.token_logprobs` on the logits it
was sampled from — the function the trainer uses — so exact mode is bitwise reproducible. On a
mixture-of-experts model each also returns the experts every MoE layer sent each position it ran
to (`routes`, [R, T, M, k] for a prefill or extend, [B, chunk, M, k] for a decode chunk, in the
smallest unsigned dtype that holds E - 1: what the host copies back); a dense model returns None.

Simplified on purpose: sampling settings are static (one compile per temperature / top-k /
top-p), and every slot decodes every step of a chunk.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from minirl.modeling import moe
from minirl.modeling.model import KVCache, ModelConfig, abstract_model, token_logprobs
from minirl.modeling.sampling import Sampling, sample_tokens, token_keys
from minirl.store.trees import TreeMismatchError, match_template


class Settings(NamedTuple):
    """What the compiled functions are specialised on (hashable; shared between engines)."""

    model: ModelConfig
    sampling: Sampling
    chunk: int
    layout: type  # minirl.inference.cache_layout.ContiguousLayout or PagedLayout


def route_dtype(num_experts: int):
    """The smallest dtype a rollout's routes are kept in: uint8 up to 256 experts, else uint16."""
    return jnp.uint8 if num_experts <= 256 else jnp.uint16


def _routes(s: Settings, model):
    """The experts this call of `model` chose, compact ([B, T, M, k]), or None (dense)."""
    routes = moe.collect(model)[0]
    return None if routes is None else routes.astype(route_dtype(s.model.num_experts))


def _sample(s: Settings, logits, keys):
    """logits [B, V] -> (token [B], behaviour log-prob [B])."""
    tok = sample_tokens(keys, logits, s.sampling)
    logp = token_logprobs(logits[:, None], tok[:, None], s.sampling.scoring)[:, 0]
    return tok, logp


def prefill(graphdef, s: Settings, params, cache, tokens, lengths, src, slot_ids, ids, index, seed):
    """tokens [U, T] right-padded, lengths [U]: run each prompt once; row r (of R) is prompt
    src[r]: write its keys/values into slot slot_ids[r] and sample its next token (completion
    index index[r], its own key) from the prompt's last logits (prefix sharing)."""
    model = nnx.merge(graphdef, params)
    rows, t = tokens.shape
    cache_in = KVCache.zeros(s.model, rows, t)
    logits, fresh = model(
        tokens, cache=cache_in, num_new=lengths, exact=s.sampling.exact, last_only=True
    )
    fresh, routes = jax.tree.map(lambda x: x[src], (fresh, _routes(s, model)))  # U rows -> R
    tok, logp = _sample(s, logits[src, 0], token_keys(seed, ids, index))  # logits [U, 1, V]
    return s.layout.write_rows(cache, fresh, slot_ids, fresh.lengths), tok, logp, routes


def decode(graphdef, s: Settings, params, cache, last, index, ids, budget, seed, *, width: int):
    """`s.chunk` decode steps for every slot, attending over the first `width` cache positions
    (enough for the longest active sequence). last [B] pending tokens, index [B] completion index
    of the next token, budget [B] steps each slot may take. -> tokens, log-probs [B, N], routes
    [B, N, M, k] of the token each step fed (None: dense)."""
    view = s.layout.view(cache, width)
    starts, exact = view.lengths, s.sampling.exact

    def one_step(i, carry):
        view, last, toks, logps, routes = carry
        model = nnx.merge(graphdef, params)  # per step: what it records stays in this trace
        live = (i < budget).astype(jnp.int32)  # [B] a spent slot writes but does not advance
        logits, view = model(last[:, None], cache=view, num_new=live, exact=exact, window=width)
        tok, logp = _sample(s, logits[:, 0], token_keys(seed, ids, index + i))
        if routes is not None:
            routes = routes.at[:, i].set(_routes(s, model)[:, 0])
        return view, tok, toks.at[:, i].set(tok), logps.at[:, i].set(logp), routes

    b, m = last.shape[0], s.model
    routes = None
    if m.num_experts:
        shape = (b, s.chunk, len(m.moe_layers), m.experts_per_token)
        routes = jnp.zeros(shape, route_dtype(m.num_experts))
    toks, logps = jnp.zeros((b, s.chunk), jnp.int32), jnp.zeros((b, s.chunk), jnp.float32)
    view, _, toks, logps, routes = jax.lax.fori_loop(
        0, s.chunk, one_step, (view, last, toks, logps, routes)
    )
    return s.layout.write_back(cache, view, starts, budget, s.chunk), toks, logps, routes


def extend(
    graphdef,
    s: Settings,
    params,
    cache,
    tokens,
    lengths,
    slot_ids,
    starts,
    ids,
    index,
    seed,
    *,
    width: int,
):
    """tokens [R, T] right-padded, lengths [R]: append them to slots `slot_ids` after the first
    starts[r] positions (what the host knows each holds: a held slot's device length may have
    run past its turn's end inside a decode chunk), attending over the first `width` cache
    positions (enough for every row after the append); sample each row's next token
    (completion index `index`)."""
    model = nnx.merge(graphdef, params)
    t = tokens.shape[1]
    view = s.layout.view(cache, width)  # every slot: at least its first W positions
    held = view.lengths.at[slot_ids].set(starts, mode="drop")  # [B]
    pad = ((0, 0), (0, t), (0, 0), (0, 0))  # room for T new positions after any row's start
    take = lambda x: jnp.pad(x.at[slot_ids, :width].get(mode="clip"), pad)  # noqa: E731  [R, W+T, K, Dh]
    rows = KVCache(tuple(map(take, view.k)), tuple(map(take, view.v)), starts)
    logits, rows = model(
        tokens, cache=rows, num_new=lengths, exact=s.sampling.exact, last_only=True
    )
    put = lambda full, part: full.at[slot_ids, :width].set(part[:, :width], mode="drop")  # noqa: E731
    added = jnp.zeros_like(held).at[slot_ids].set(lengths, mode="drop")  # [B] 0: untouched
    view = KVCache(tuple(map(put, view.k, rows.k)), tuple(map(put, view.v, rows.v)), held + added)
    tok, logp = _sample(s, logits[:, 0], token_keys(seed, ids, index))  # logits [R, 1, V]
    return s.layout.write_back(cache, view, held, added, t), tok, logp, _routes(s, model)


class Compiled(NamedTuple):
    """The jitted device functions of one setting (the KV cache, argument 1, donated)."""

    prefill: Any
    decode: Any  # static: width
    extend: Any  # static: width


@functools.lru_cache(maxsize=32)
def compiled(s: Settings) -> Compiled:
    """The jitted prefill, decode and extend for one static setting (engines with equal settings
    share them, and so share their compiled executables)."""
    graphdef = abstract_model(s.model)[0]

    def jit(fn, **static):
        return jax.jit(functools.partial(fn, graphdef, s), donate_argnums=(1,), **static)

    width = ("width",)
    return Compiled(
        jit(prefill), jit(decode, static_argnames=width), jit(extend, static_argnames=width)
    )


def check_params(params: Any, cfg: ModelConfig) -> dict:
    """`nnx.split(model)[1]` or its `nnx.to_pure_dict` form (numpy or JAX leaves) -> the pure
    dict the compiled functions take, checked against the model's shapes (trees.match_template,
    as the trainer checks them); leaves as given (`cast_params` casts them)."""
    if isinstance(params, nnx.State):
        params = nnx.to_pure_dict(params)
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be an nnx.State or a nested dict, got {type(params)}")
    try:
        return match_template(params, abstract_model(cfg)[1], check_dtype=False)
    except TreeMismatchError as e:
        raise TreeMismatchError(f"params do not match the model: {e}") from None


def cast_params(params: dict, cfg: ModelConfig) -> dict:
    """`check_params`' dict in the compute dtype (bitwise the model's own per-use casts), the
    token embedding as given: XLA CPU widens a bf16 table whole to look rows up (docs/engine.md)."""
    template = {**abstract_model(cfg)[1], "embed": params["embed"]}  # the embedding: its own dtype
    return jax.tree.map(lambda x, t: jnp.asarray(x, t.dtype), params, template)


def head_laid_out(cfg: ModelConfig) -> bool:
    """Below float32 a tied head is laid out [D, V] once per work (`work_params`), and the
    compiled functions run the model untied: else XLA CPU casts and transposes the table at
    every call (0.55 GB of a decode's scratch at a 152k vocabulary; float32 reads it in place)."""
    return cfg.tie_embeddings and cfg.compute_dtype != jnp.float32


def work_params(params: dict, cfg: ModelConfig) -> dict:
    """What the compiled functions read while work is in flight: `cast_params`' dict, with the
    LM head `head_laid_out` asks for (the embedding cast and transposed: the same values)."""
    params = cast_params(params, cfg)
    if head_laid_out(cfg):
        params = {**params, "lm_head": params["embed"].astype(cfg.compute_dtype).T}
    return params
