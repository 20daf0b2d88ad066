"""The rollout engine: `Request`s in, `Rollout`s out, continuous batching over fixed slots
(RLAX §3 inference workers; AReaL §4 interruptible generation; docs/engine.md).

The calls, and what each does: `load_weights(version, params)`, `submit(requests)`, `step()`
(one scheduling round), `interrupt(policy)` ("discard" or "continue"), `generate(requests)`,
and for multi-turn episodes `extend` and `release` (minirl/envs/episodes.py): docs/engine.md,
"The interface". Also `cancel(uid, sample)`: drop a request, queued or in flight (minirl/agents/).

Each rollout token carries its behaviour log-prob (`model.token_logprobs` of the logits it was
sampled from) and the weight version loaded when it was sampled. With `exact=True` these equal
the trainer's recompute bit for bit, whatever the slot, batch or chunk (minirl/modeling/exact.py;
tests/inference/test_engine.py). On a mixture-of-experts model a rollout also carries `routes`,
the experts each MoE layer chose for every position it ran (replayed by `trainer.routing=replay`).

Python runs once per `decode_chunk` tokens, and compiled shapes are bounded, so nothing compiles
in steady state. The engine is passive: it never reloads weights or fetches work by itself, and
holds its cast weights and KV cache only while work is in flight. docs/engine.md: how a step
runs, memory, measured speed, what is simplified on purpose, and why.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np

from minirl.inference import decoding, paged_cache
from minirl.inference.cache_layout import OneDevice, cache_dtype, layout_of
from minirl.inference.decoding import Settings, cast_params, check_params, compiled
from minirl.inference.engine_config import EngineConfig
from minirl.inference.scheduler import Request, Scheduler, finish_reason, prefill_groups
from minirl.modeling import exact as exact_ops
from minirl.modeling import lora
from minirl.modeling.model import ModelConfig
from minirl.modeling.sampling import request_ids
from minirl.types import Rollout

__all__ = ["Engine", "EngineConfig", "Request"]

POLICIES = ("discard", "continue")


class Engine:
    """Continuous-batching rollout engine over `config.slots` slots (see the module docstring)."""

    def __init__(self, model_config: ModelConfig, config=None, seed: int = 0, slot_layout=None):
        """`config`: an EngineConfig (default: its defaults). `seed` keys every sampling draw (a
        run passes rl.seed; minirl/modeling/sampling.py). `slot_layout` places the slots' rows
        (default `OneDevice`: one device; scale.slots.MeshSlots splits them over a mesh)."""
        c = config = config or EngineConfig()
        if not 0 <= seed < 2**32:
            raise ValueError(f"seed must be in [0, 2**32), got {seed}")
        self.seed = seed
        if config.cache_len > model_config.max_seq_len:
            raise ValueError(
                f"cache_len {config.cache_len} exceeds the model's max_seq_len "
                f"{model_config.max_seq_len}"
            )
        ids = [*config.eos_ids, *(i for seq in config.stop_sequences for i in seq)]
        if outside := [i for i in ids if not 0 <= i < model_config.vocab_size]:
            raise ValueError(f"eos_ids / stop_sequences: {outside} are outside the vocabulary")
        # LoRA: both modes apply the adapters unmerged, as the trainer does (merging per reload
        # decoded no faster and cost a copy of the projections: docs/lora.md, "Engine").
        dtype = config.dtype or model_config.dtype
        self._lora = lora.EngineBase() if model_config.lora_rank else None  # adapters-only
        self.config = config
        self.model_config = dataclasses.replace(model_config, dtype=dtype, param_dtype=dtype)
        m = self.model_config  # untied where work_params lays a tied head out per work
        run = dataclasses.replace(m, tie_embeddings=False) if decoding.head_laid_out(m) else m
        self._static = Settings(run, c.sampling, c.decode_chunk, layout_of(c))
        self._sched = Scheduler(config.slots)
        self._kv = layout_of(c)(self.model_config, c)  # where keys and values live
        self._slot_layout = slot_layout or OneDevice()
        self._given = self._params = None  # as loaded; cast, while work is in flight
        self._version: int | None = None
        self._cache = None  # allocated at the first step (no work in the constructor)
        self._peak_tokens = 0
        # prefill_shared: rows that reused another row's forward; route_bytes: an MoE's routes
        counters = "prefill_calls prefill_rows prefill_shared decode_calls tokens finished "
        counters += "discarded preempted rebuilt extended slot_steps decode_tokens"
        counters = counters.split() + ["route_bytes"] * bool(model_config.num_experts)
        self.stats = dict.fromkeys(counters, 0)

    # ---- the interface -------------------------------------------------------------------

    def load_weights(self, version: int, params: Any) -> None:
        """Use `params` (`nnx.split(model)[1]` or its `nnx.to_pure_dict`) from now on, tokens
        sampled from now on carrying `version`; a LoRA model's: with its adapters, or after a
        whole load its adapters alone, never merged. JAX leaves are kept (the caller's: cast while
        work is in flight), numpy cast here, once, after the old version goes (docs/engine.md)."""
        if self._lora is not None:
            params = self._lora.whole(params)
        params = check_params(params, self.model_config)  # a tree that does not fit: raised here
        if self.config.exact:  # on a device mesh: only splits the fixed tree can be cut at
            exact_ops.check_layout(params, "exact mode (engine weights)")
        self._given = self._params = None  # the version before goes first: one cast copy at once
        borrowed = all(isinstance(x, jax.Array) for x in jax.tree.leaves(params))
        self._given = params if borrowed else cast_params(params, self.model_config)
        if self._lora is not None:  # its base (cast once, if numpy) joins the versions after it
            self._lora.keep(self._given)
        self._version = int(version)

    def submit(self, requests: Iterable[Request]) -> None:
        requests = list(requests)
        for req in requests:
            p = len(req.prompt.tokens)
            if p + req.max_new_tokens > self.config.cache_len:
                raise ValueError(
                    f"prompt {req.prompt.uid}: {p} prompt + {req.max_new_tokens} "
                    f"new tokens exceed cache_len {self.config.cache_len}"
                )
            if p > self.config.buckets[-1]:
                raise ValueError(
                    f"prompt {req.prompt.uid} ({p} tokens) exceeds the largest "
                    f"prefill bucket {self.config.buckets[-1]}"
                )
            toks = np.asarray(req.prompt.tokens)
            if toks.min() < 0 or toks.max() >= self.model_config.vocab_size:
                raise ValueError(f"prompt {req.prompt.uid} has token ids outside the vocabulary")
        self._sched.submit(requests)

    def step(self) -> list[Rollout]:
        """One round: rebuild interrupted caches, fill free slots, decode one chunk. Nothing left
        in flight: the cast weights and the KV cache go until work comes (docs/engine.md)."""
        if self._given is None:
            raise RuntimeError("no weights: call load_weights(version, params) first")
        if self._params is None:  # what the work reads (docs/engine.md, "Memory between calls")
            self._params = decoding.work_params(self._given, self.model_config)
        if self._cache is None:
            self._cache = self._slot_layout.empty(self._kv.empty)
        self._rebuild()
        finished = self._extend() + self._admit()
        if self._sched.decoding():
            finished += self._decode()
        if not (self._sched.queue or self._sched.active()):
            self._params = self._cache = None
        return finished

    def interrupt(self, policy: str) -> int:
        """Act on every in-flight request (see the module docstring); returns how many."""
        if policy not in POLICIES:
            raise ValueError(f"unknown interrupt policy {policy!r}; choose from {POLICIES}")
        active = self._sched.active()
        if policy == "discard":
            for b in active:
                self._kv.release(b)
            self._sched.requeue(active)
            self.stats["discarded"] += len(active)
        else:
            for b in active:
                self._sched.slots[b].needs_rebuild = True
        return len(active)

    def extend(self, uid: int, sample_index: int, tokens, max_new_tokens: int) -> None:
        """Queue a held multi-turn episode's observation `tokens` (turn markers included) and
        its next turn of up to `max_new_tokens` tokens (see the module docstring)."""
        seq = self._sched.slots[self._sched.find(uid, sample_index)]
        toks = np.asarray(tokens, np.int32).reshape(-1)
        if not seq.held:
            raise ValueError(f"prompt {uid}, sample {sample_index}: no finished turn to extend")
        if not len(toks) or toks.min() < 0 or toks.max() >= self.model_config.vocab_size:
            raise ValueError(f"prompt {uid}: observation tokens empty or outside the vocabulary")
        need = seq.prompt_len + len(seq.tokens) + len(toks) + max_new_tokens
        if need > self.config.cache_len or max_new_tokens < 1:
            raise ValueError(
                f"prompt {uid}: the episode ({need} positions with {max_new_tokens} >= 1 new "
                f"tokens) would not fit cache_len {self.config.cache_len}"
            )
        seq.observe(toks, max_new_tokens)

    def release(self, uid: int, sample_index: int) -> None:
        """A multi-turn episode is over: free its slot and cache."""
        b = self._sched.find(uid, sample_index)
        self._kv.release(b)
        self._sched.release(b)

    def cancel(self, uid: int, sample_index: int) -> None:
        """Drop a request, queued or in flight (its slot freed); nothing if unknown."""
        queue, key = self._sched.queue, (uid, sample_index)
        self._sched.queue = type(queue)(r for r in queue if (r.prompt.uid, r.sample_index) != key)
        with contextlib.suppress(KeyError):
            self.release(uid, sample_index)

    def generate(self, requests: Iterable[Request], progress=None) -> list[Rollout]:
        """Run `requests` to completion on an idle engine; rollouts in request order.
        `progress(n)`, if given, is called after each step with the n rollouts it finished."""
        if not self._sched.idle:
            raise RuntimeError(
                "generate() needs an idle engine; use submit() and step() to mix "
                "with work already in flight"
            )
        requests = list(requests)
        self.submit(requests)
        done: list[Rollout] = []
        while not self._sched.idle:
            finished = self.step()
            done += finished
            if progress is not None and finished:
                progress(len(finished))
        by_id: dict[tuple[int, int], list[Rollout]] = {}
        for r in done:
            by_id.setdefault((r.prompt.uid, r.sample_index), []).append(r)
        return [by_id[(q.prompt.uid, q.sample_index)].pop() for q in requests]

    # ---- introspection -------------------------------------------------------------------

    @property
    def version(self) -> int | None:
        return self._version

    @property
    def num_queued(self) -> int:
        return len(self._sched.queue)

    @property
    def num_active(self) -> int:
        return len(self._sched.active())

    def pending(self) -> int:
        """Requests admitted or waiting (a method, so callers behind a worker can ask)."""
        return self.num_active + self.num_queued

    def work_stats(self) -> dict[str, int]:
        """A copy of the counters in `stats` (for callers behind a worker transport)."""
        return dict(self.stats)

    def occupancy(self) -> float:
        """Share of the decode work that produced kept tokens: decode_tokens / slot_steps. Idle
        slots (a straggler tail, an empty queue) and steps past a finish inside a chunk lower it."""
        return self.stats["decode_tokens"] / max(self.stats["slot_steps"], 1)

    def compile_counts(self) -> dict[str, int]:
        """Compiled executables of the (shared) prefill and decode functions."""
        return {k: fn._cache_size() for k, fn in compiled(self._static)._asdict().items()}

    def memory_stats(self) -> dict[str, int]:
        """KV-cache bytes: allocated (while work is in flight), used now, peak used, and the
        per-call temporary (the paged cache's gathered view)."""
        m = self.model_config
        per_token = paged_cache.kv_bytes_per_token(m, cache_dtype(m))
        used = sum(self._sched.slots[b].cache_len for b in self._sched.active())
        positions = self._kv.memory(used, self._peak_tokens)
        return {k: n * per_token for k, n in positions.items()}

    # ---- the work ------------------------------------------------------------------------

    def _device_cache(self):
        return self._slot_layout.put(self._kv.for_device(self._cache))

    def _prefill(self, slots: list[int], rows: int, length: int, kind: str):
        """One prefill call for `slots`; `kind` says what each runs (`Sequence.feed`): "prompt",
        "rebuild" (a fresh cache) or "extend" (appended after what the slot's cache holds)."""
        c = self.config
        tokens = np.zeros((rows, length), np.int32)
        lengths, slot_ids = np.ones(rows, np.int32), np.full(rows, c.slots, np.int32)
        ids, index, src = np.zeros((rows, 3), np.uint32), *np.zeros((2, rows), np.int32)
        prompts: dict = {}  # distinct token rows (an extension's are its own): each runs once
        for r, b in enumerate(slots):
            seq = self._sched.slots[b]
            toks, index[r] = seq.feed(kind)
            u = src[r] = prompts.setdefault(r if kind == "extend" else toks.tobytes(), len(prompts))
            tokens[u, : len(toks)], lengths[u], slot_ids[r] = toks, len(toks), b
            ids[r] = request_ids(seq.request.prompt.uid, seq.request.sample_index)
        fns, cache = compiled(self._static), self._device_cache()
        keys_in = (ids, index, np.uint32(self.seed))
        if kind == "extend":  # after what each slot holds (its device length may run past)
            starts = np.zeros(rows, np.int32)
            starts[: len(slots)] = [self._sched.slots[b].cache_len for b in slots]
            width = next(w for w in c.windows if w >= max(starts + lengths))
            rows_in = (tokens, lengths, slot_ids, starts)
            out = fns.extend(self._params, cache, *rows_in, *keys_in, width=width)
        else:
            u = min(1 << (len(prompts) - 1).bit_length(), rows)  # distinct rows: a power of two
            rows_in = (tokens[:u], lengths[:u], src, slot_ids)
            out = fns.prefill(self._params, cache, *rows_in, *keys_in)
        self._cache, (tok, logp, routes) = out[0], self._slot_layout.host(out[1:])
        self.stats["prefill_calls"] += 1
        self.stats["prefill_rows"] += len(slots)
        self.stats["prefill_shared"] += len(slots) - len(prompts)
        if routes is not None:  # what each row ran: replaces (rebuild) or extends its record
            for r, b in enumerate(slots):
                self._sched.slots[b].add_routes(routes[r, : lengths[src[r]]], kind == "rebuild")
        return tok, logp

    def _rebuild(self) -> None:
        """interrupt("continue"): recompute the cache of flagged sequences with current weights."""
        slots, c = self._sched.slots, self.config
        todo = [(b, slots[b].cache_len) for b in self._sched.active() if slots[b].needs_rebuild]
        for length, rows, group in prefill_groups(todo, c.buckets, c.prefill_rows):
            self._prefill(group, rows, length, "rebuild")
            for b in group:
                slots[b].needs_rebuild = False
            self.stats["rebuilt"] += len(group)

    def _admit(self) -> list[Rollout]:
        """Fill free slots from the queue; a sequence can finish on its first token."""
        c, finished = self.config, []
        while self._sched.queue and self._sched.free_slots():
            admitted = []
            for b in self._sched.free_slots():
                if not self._sched.queue:
                    break
                first = len(self._sched.queue[0].prompt.tokens) + c.decode_chunk
                if not self._kv.ensure(b, min(first, c.cache_len)):
                    break  # the pool is full: wait for sequences to finish
                admitted.append((b, len(self._sched.admit(b).request.prompt.tokens)))
            if not admitted:
                break
            for length, rows, group in prefill_groups(admitted, c.buckets, c.prefill_rows):
                tok, logp = self._prefill(group, rows, length, "prompt")
                for r, b in enumerate(group):
                    finished += self._append(b, tok[r : r + 1], logp[r : r + 1])
        return finished

    def _extend(self) -> list[Rollout]:
        """Append each queued observation to its slot's cache and sample the next turn's first
        token (a turn can finish on it)."""
        c, slots, finished = self.config, self._sched.slots, []
        todo = [b for b in self._sched.active() if slots[b].observation is not None]
        budget = np.zeros(c.slots, np.int32)
        for b in todo:
            fed = 1 + len(slots[b].observation) + c.decode_chunk
            budget[b] = min(fed, c.cache_len - slots[b].cache_len)
        self._reserve(budget)  # may preempt (re-queue) some of them
        todo = [(b, 1 + len(slots[b].observation)) for b in todo if slots[b] is not None]
        for length, rows, group in prefill_groups(todo, c.buckets, c.prefill_rows):
            tok, logp = self._prefill(group, rows, length, "extend")
            for r, b in enumerate(group):
                slots[b].observation_cached()
                finished += self._append(b, tok[r : r + 1], logp[r : r + 1])
            self.stats["extended"] += len(group)
        return finished

    def _reserve(self, budget: np.ndarray) -> None:
        """Make room for budget[b] more positions in every active slot, preempting the youngest
        sequences (re-queued from scratch) while the cache is short (only a paged pool ever is)."""
        for b in sorted(self._sched.active(), key=lambda b: self._sched.slots[b].order):
            seq = self._sched.slots[b]
            while seq is not None and not self._kv.ensure(b, seq.cache_len + int(budget[b])):
                victim = self._sched.youngest()
                self._kv.release(victim)
                self._sched.requeue([victim])
                budget[victim] = 0
                self.stats["preempted"] += 1
                seq = self._sched.slots[b]

    def _decode(self) -> list[Rollout]:
        c, slots = self.config, self._sched.slots
        budget = np.zeros(c.slots, np.int32)
        for b in self._sched.decoding():
            budget[b] = min(c.decode_chunk, slots[b].remaining)
        self._reserve(budget)
        active = self._sched.decoding()
        last, index = np.zeros(c.slots, np.int32), np.zeros(c.slots, np.int32)  # [B] each
        ids = np.zeros((c.slots, 3), np.uint32)  # [B, 3]: each slot's sampling key ids
        for b in active:
            last[b], index[b] = slots[b].tokens[-1], len(slots[b].tokens)
            ids[b] = request_ids(slots[b].request.prompt.uid, slots[b].request.sample_index)
        ends = [slots[b].cache_len + int(budget[b]) for b in active]  # positions after the chunk
        self._peak_tokens = max(self._peak_tokens, sum(ends))
        width = next(w for w in c.windows if w >= max(ends))
        decode = compiled(self._static).decode
        args = (*self._slot_layout.put((last, index, ids, budget)), np.uint32(self.seed))
        self._cache, *out = decode(self._params, self._device_cache(), *args, width=width)
        toks, logps, routes = self._slot_layout.host(out)  # [B, N], routes [B, N, M, k]: one sync
        self.stats["decode_calls"] += 1
        self.stats["slot_steps"] += c.slots * c.decode_chunk  # computed, whether used or not
        finished, before = [], self.stats["tokens"]
        for b in active:
            fed = None if routes is None else routes[b, : budget[b]]
            finished += self._append(b, toks[b, : budget[b]], logps[b, : budget[b]], fed)
        self.stats["decode_tokens"] += self.stats["tokens"] - before
        return finished

    def _append(self, b: int, toks, logps, routes=None) -> list[Rollout]:
        """Add slot b's new tokens up to the first finishing one; free the slot if finished.
        routes [N, M, k] (decode, MoE): the experts of the token fed to sample each one."""
        seq = self._sched.slots[b]
        for i, (tok, logp) in enumerate(zip(toks, logps, strict=True)):
            if routes is not None:
                seq.add_routes(routes[i : i + 1])
            seq.append(tok, logp, self._version)
            self.stats["tokens"] += 1
            reason = finish_reason(seq, self.config.eos_ids, self.config.stop_sequences)
            if reason is not None:
                seq.held = seq.request.multi_turn  # a held slot keeps its cache for extend()
                if not seq.held:
                    self._kv.release(b)
                    self._sched.release(b)
                self.stats["finished"] += 1
                rollout = seq.to_rollout(reason)
                if rollout.routes is not None:
                    self.stats["route_bytes"] += rollout.routes.nbytes
                return [rollout]
        return []
