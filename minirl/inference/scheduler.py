"""The rollout engine's host-side bookkeeping: requests, the queue, slots, finish rules.

What it is: everything about continuous batching that is plain Python — no JAX. The engine
(minirl/inference/engine.py) owns the device state (weights, KV cache, compiled functions) and asks the
scheduler which requests go into which free slots, how to group them into prefill calls, when a
sequence is finished, and whom to preempt.

  queue   FIFO of `Request`s waiting for a slot (re-queued work goes to the front)
  slots   a fixed list; slot b holds one in-flight `Sequence` or None
  admit   pop the queue head into a free slot (the engine prefills it)
  finish  EOS, a stop sequence, or max_new_tokens -> a `Rollout`; the slot is free at once

A `Sequence` keeps the invariant of the engine's KV cache: the cache of its slot holds the
prompt and every generated token except the last one, which is "pending" — fed to the model at
the next decode step. So `cache_len = len(prompt) + len(tokens) - 1`.

Multi-turn episodes (`Request.multi_turn`, minirl/envs/episodes.py): when a turn finishes, the
sequence is `held` — it keeps its slot and KV cache — until the caller either queues an
observation (`observe`: the engine appends it to the cache, then the next turn decodes) or
releases it. `tokens` then holds every turn and observation after the prompt; `mask` marks the
policy's own tokens (1.0) against observation tokens (0.0, log-prob 0, version -1).

Simplified on purpose: admission is first-come-first-served (no priorities, no fairness between
prompts); preemption picks the youngest sequence (the one that loses least work).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable
from collections.abc import Sequence as Seq

import numpy as np

from minirl.types import Prompt, Rollout


@dataclasses.dataclass(frozen=True)
class Request:
    """Generate one completion (sample `sample_index` of the G samples) of `prompt`."""

    prompt: Prompt
    sample_index: int = 0
    max_new_tokens: int = 64  # per turn
    multi_turn: bool = False  # after each turn keep the slot and its cache (Engine.extend)
    stop: tuple[tuple[int, ...], ...] = ()  # this request's own stop sequences (token ids)

    def __post_init__(self):
        object.__setattr__(self, "stop", tuple(tuple(int(t) for t in s) for s in self.stop))
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.sample_index < 0:
            raise ValueError(f"sample_index must be >= 0, got {self.sample_index}")
        if len(self.prompt.tokens) < 1:
            raise ValueError(f"prompt {self.prompt.uid} has no tokens (it needs at least BOS)")


class Sequence:
    """One request in flight: the tokens generated so far, their log-probs and versions."""

    def __init__(self, request: Request, order: int):
        self.request = request
        self.order = order  # admission counter: larger = younger
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.needs_rebuild = False  # set by interrupt("continue"): re-prefill before decoding
        self.mask: list[float] = []  # 1.0: sampled by the policy; 0.0: an observation token
        self.turn_start = 0  # index in `tokens` of the current turn's first sampled token
        self.budget = request.max_new_tokens  # tokens the current turn may sample
        self.held = False  # multi-turn: a turn ended; waits for observe() or release
        self.observation: np.ndarray | None = None  # observe()d tokens, not yet in the cache
        self.routes: list[np.ndarray] = []  # MoE: [n, M, k] pieces, cache_len positions in all

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt.tokens)

    @property
    def cache_len(self) -> int:
        """Positions in the KV cache: prompt + generated tokens except the pending last one."""
        return self.prompt_len + len(self.tokens) - 1

    @property
    def remaining(self) -> int:
        return self.budget - (len(self.tokens) - self.turn_start)

    @property
    def decoding(self) -> bool:
        """Takes part in the next decode chunk (not held, no observation waiting)."""
        return not self.held and self.observation is None

    def cached_tokens(self) -> np.ndarray:
        """What the cache holds: prompt + tokens[:-1]   # [cache_len] int32"""
        return np.concatenate([self.request.prompt.tokens, self.tokens[:-1]]).astype(np.int32)

    def feed(self, kind: str) -> tuple[np.ndarray, int]:
        """What a prefill of `kind` runs for this sequence, and the completion index of the token
        it samples: "prompt" (admission), "rebuild" (what the cache holds: interrupt "continue")
        or "extend" (the pending last token and the observation, after what the cache holds)."""
        if kind == "prompt":
            return np.asarray(self.request.prompt.tokens, np.int32), 0
        if kind == "rebuild":
            return self.cached_tokens(), 0
        fed = np.concatenate([self.tokens[-1:], self.observation]).astype(np.int32)
        return fed, len(self.tokens) + len(self.observation)

    def add_routes(self, routes: np.ndarray, replace: bool = False) -> None:
        """The experts of positions the engine just ran (MoE): appended after the ones recorded,
        or, for a rebuild (`replace`), in place of all of them."""
        if replace:
            self.routes.clear()
        self.routes.append(routes)

    def append(self, token: int, logprob: float, version: int) -> None:
        self.tokens.append(int(token))
        self.logprobs.append(float(logprob))
        self.versions.append(int(version))
        self.mask.append(1.0)

    def observe(self, tokens: np.ndarray, max_new_tokens: int) -> None:
        """A held turn's successor: `tokens` go into the cache at the next step, then the next
        turn samples up to `max_new_tokens` tokens."""
        self.held, self.observation, self.budget = False, tokens, max_new_tokens

    def observation_cached(self) -> None:
        """The extension prefill wrote the observation into the cache: it joins `tokens`."""
        n = len(self.observation)
        self.tokens += self.observation.tolist()
        self.logprobs += [0.0] * n
        self.versions += [-1] * n
        self.mask += [0.0] * n
        self.observation, self.turn_start = None, len(self.tokens)

    def to_rollout(self, reason: str) -> Rollout:
        return Rollout(
            prompt=self.request.prompt,
            sample_index=self.request.sample_index,
            tokens=np.array(self.tokens, np.int32),
            logprobs=np.array(self.logprobs, np.float32),
            versions=np.array(self.versions, np.int32),
            finish_reason=reason,
            mask=np.array(self.mask, np.float32) if self.request.multi_turn else None,
            routes=np.concatenate(self.routes) if self.routes else None,
        )


def finish_reason(
    seq: Sequence, eos_ids: Seq[int], stop_sequences: Seq[tuple[int, ...]]
) -> str | None:
    """Why `seq` must stop after its last token, or None. EOS and stop-sequence tokens stay in
    the completion (they were sampled and have behaviour log-probs the trainer needs). A stop
    sequence (the engine's or the request's) counts only inside the current turn."""
    if seq.tokens[-1] in eos_ids:
        return "eos"
    turn = seq.tokens[seq.turn_start :]
    for stop in (*stop_sequences, *seq.request.stop):
        if len(turn) >= len(stop) and tuple(turn[-len(stop) :]) == stop:
            return "stop"
    if seq.remaining <= 0:
        return "length"
    return None


def bucket(length: int, buckets: Seq[int]) -> int:
    """The smallest bucket >= length (buckets sorted ascending)."""
    for b in buckets:
        if b >= length:
            return b
    raise ValueError(f"length {length} exceeds the largest bucket {buckets[-1]}")


def prefill_groups(
    items: Seq[tuple[int, int]], buckets: Seq[int], max_rows: int
) -> list[tuple[int, int, list[int]]]:
    """Group (slot, length) pairs into prefill calls: sorted by length, at most max_rows per
    call. Returns (length bucket, row bucket, slots); row buckets are powers of two <= max_rows,
    so at most len(buckets) x log2(max_rows) shapes ever compile."""
    items = sorted(items, key=lambda item: item[1])
    groups = []
    for start in range(0, len(items), max_rows):
        part = items[start : start + max_rows]
        rows = min(1 << (len(part) - 1).bit_length(), max_rows)
        groups.append((bucket(part[-1][1], buckets), rows, [slot for slot, _ in part]))
    return groups


class Scheduler:
    """The queue and the slots."""

    def __init__(self, slots: int):
        self.queue: collections.deque[Request] = collections.deque()
        self.slots: list[Sequence | None] = [None] * slots
        self._admitted = 0

    def submit(self, requests: Iterable[Request]) -> None:
        self.queue.extend(requests)

    def free_slots(self) -> list[int]:
        return [b for b, seq in enumerate(self.slots) if seq is None]

    def active(self) -> list[int]:
        return [b for b, seq in enumerate(self.slots) if seq is not None]

    def decoding(self) -> list[int]:
        return [b for b, seq in enumerate(self.slots) if seq is not None and seq.decoding]

    @property
    def idle(self) -> bool:
        """Nothing to do until the caller acts: no queue, every slot free or held."""
        return not self.queue and all(self.slots[b].held for b in self.active())

    def find(self, uid: int, sample_index: int) -> int:
        """The slot of the sequence in flight for (prompt uid, sample index)."""
        for b in self.active():
            req = self.slots[b].request
            if (req.prompt.uid, req.sample_index) == (uid, sample_index):
                return b
        raise KeyError(f"no sequence in flight for prompt {uid}, sample {sample_index}")

    def admit(self, slot: int) -> Sequence:
        """Move the queue head into `slot`."""
        assert self.slots[slot] is None
        seq = Sequence(self.queue.popleft(), self._admitted)
        self._admitted += 1
        self.slots[slot] = seq
        return seq

    def release(self, slot: int) -> Sequence:
        seq, self.slots[slot] = self.slots[slot], None
        return seq

    def requeue(self, slots: Iterable[int]) -> None:
        """Drop the sequences in `slots` and put their requests back at the queue front, in
        admission order, to be generated again from scratch."""
        seqs = sorted((self.release(b) for b in slots), key=lambda s: s.order)
        self.queue.extendleft(seq.request for seq in reversed(seqs))

    def youngest(self) -> int:
        return max(self.active(), key=lambda b: self.slots[b].order)
