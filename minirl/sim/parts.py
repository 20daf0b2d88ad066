"""Simulated engine, trainer and weight store: the real interfaces, durations from a cost model.

`SimEngine` is a pool of engine replicas. Each replica keeps its requests in the real
`minirl.inference.scheduler.Scheduler` (FIFO queue, slots, admission order, requeue from scratch on a
discard) and, instead of running a model, counts tokens up to the length the workload drew for
that request; what each call would have cost comes from `minirl.sim.costs.Costs`.
Work is charged to a `VirtualClock`, never slept.

A replica decodes in chunks of `decode_chunk` steps, as the engine does. To stay fast at
cluster scale it jumps several chunks at once — up to the first chunk in which a sequence
finishes, or the one running when `until` (the next outside event) passes — which decides
exactly what chunk-by-chunk stepping decides, since nothing can change in between.

Not simulated: the paged cache's preemption, multi-turn episodes, stop sequences (a completion
ends at its drawn length: with EOS, or at max_new_tokens for "length", the engine's own rule).
"""

from __future__ import annotations

import math

import numpy as np

from minirl.inference.engine_config import EngineConfig
from minirl.inference.scheduler import Request, Scheduler, prefill_groups
from minirl.sim.costs import Costs
from minirl.sim.workload import Lengths
from minirl.types import Rollout

TOKEN, EOS = 1, 2  # placeholder ids: every sampled token is TOKEN, a natural end is EOS


class VirtualClock:
    """Simulated seconds; `clock()` reads it, as the controller reads time.perf_counter."""

    def __init__(self, start: float = 0.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0 or not math.isfinite(seconds):
            raise ValueError(f"cannot advance the clock by {seconds}")
        self.now += seconds


class Replica:
    """One engine replica: a scheduler, a weight version, the work it did.

    The scheduler holds the requests (queue, slots, admission order, requeue); the tokens of a
    sequence in flight are kept as counts — `made[b]` and the runs of weight versions that
    sampled them — and become a Rollout's arrays only when it finishes, so a simulated
    million-token step costs a few thousand Python operations, not a million."""

    def __init__(self, config: EngineConfig, costs: Costs, lengths: Lengths):
        self.config, self.costs, self.lengths = config, costs, lengths
        self.sched = Scheduler(config.slots)
        self.version = 0
        self.targets: dict[int, int] = {}  # slot -> the length its sequence will reach
        self.made: dict[int, int] = {}  # slot -> tokens sampled so far
        self.runs: dict[int, list[list[int]]] = {}  # slot -> [[version, count], ...]
        self.stats = dict.fromkeys(
            (
                "tokens",
                "decode_tokens",
                "slot_steps",
                "decode_calls",
                "prefill_calls",
                "finished",
                "discarded",
                "rebuilt",
            ),
            0,
        )

    def pending(self) -> int:
        return len(self.sched.queue) + len(self.sched.active())

    def in_flight_tokens(self) -> int:
        return sum(self.made.values())

    def submit(self, requests) -> None:
        self.sched.submit(requests)

    def interrupt(self, policy: str) -> int:
        """As Engine.interrupt: discard (re-queue from scratch) or continue (re-prefill the
        cache with the new weights before the next decode)."""
        active = self.sched.active()
        if policy == "discard":
            for b in active:
                del self.targets[b], self.made[b], self.runs[b]
            self.sched.requeue(active)
            self.stats["discarded"] += len(active)
        else:
            for b in active:
                self.sched.slots[b].needs_rebuild = True
        return len(active)

    def step(self, until: float = math.inf) -> tuple[list[Rollout], float]:
        """Rebuild, admit, decode; returns the finished rollouts and the seconds it took.
        Decodes up to the first finish, or until `until` seconds have passed."""
        seconds = self._prefill("rebuild") + self._prefill("prompt")
        finished: list[Rollout] = []
        if self.sched.active():
            more, spent = self._decode(until - seconds)
            finished, seconds = more, seconds + spent
        return finished, seconds

    def _cache_len(self, b: int) -> int:
        """Positions in slot b's cache: the prompt and every sampled token but the pending one."""
        return self.sched.slots[b].prompt_len + self.made[b] - 1

    def _prefill(self, kind: str) -> float:
        if kind == "prompt":
            slots = []
            while self.sched.queue and self.sched.free_slots():
                b = self.sched.free_slots()[0]
                req = self.sched.admit(b).request
                self.targets[b] = self.lengths(req.prompt.uid, req.sample_index, req.max_new_tokens)
                self.made[b], self.runs[b] = 0, []
                slots.append(b)
        else:
            slots = [b for b in self.sched.active() if self.sched.slots[b].needs_rebuild]
        items = []
        for b in slots:
            self.sched.slots[b].needs_rebuild = False
            items.append(
                (b, self.sched.slots[b].prompt_len if kind == "prompt" else self._cache_len(b))
            )
        seconds = 0.0
        buckets = self.config.buckets
        for length, rows, group in prefill_groups(items, buckets, self.config.prefill_rows):
            seconds += self.costs.prefill(rows, length)
            self.stats["prefill_calls"] += 1
            if kind == "prompt":  # the prefill samples each sequence's first token
                for b in group:
                    self._append(b, 1)
            else:
                self.stats["rebuilt"] += len(group)
        return seconds

    def _decode(self, budget_s: float) -> tuple[list[Rollout], float]:
        c = self.config
        active = [b for b in self.sched.active() if self.targets[b] > self.made[b]]
        finished = [self._finish(b) for b in self.sched.active() if b not in active]
        if not active:
            return finished, 0.0
        to_go = [self.targets[b] - self.made[b] for b in active]
        chunks_max = min(math.ceil(n / c.decode_chunk) for n in to_go)
        context = np.mean([self._cache_len(b) for b in active])
        seconds, chunks = 0.0, 0
        while chunks < chunks_max:
            seconds += self.costs.decode_chunk(
                c.slots, context + chunks * c.decode_chunk, c.decode_chunk
            )
            chunks += 1
            if seconds >= budget_s:
                break
        self.stats["decode_calls"] += chunks
        self.stats["slot_steps"] += chunks * c.slots * c.decode_chunk
        before = self.stats["tokens"]
        for b, n in zip(active, to_go, strict=True):
            self._append(b, min(n, chunks * c.decode_chunk))
        self.stats["decode_tokens"] += self.stats["tokens"] - before
        done = [b for b in active if self.made[b] == self.targets[b]]
        return finished + [self._finish(b) for b in done], seconds

    def _append(self, b: int, n: int) -> None:
        """Sample `n` more tokens in slot b with the replica's current weights."""
        n = min(n, self.targets[b] - self.made[b])
        runs = self.runs[b]
        if runs and runs[-1][0] == self.version:
            runs[-1][1] += n
        elif n:
            runs.append([self.version, n])
        self.made[b] += n
        self.stats["tokens"] += n

    def _finish(self, b: int) -> Rollout:
        """The finished sequence as the engine would return it: every token TOKEN, the last
        one EOS if the drawn length ended before max_new_tokens (reason "eos"), else "length"."""
        seq = self.sched.release(b)
        n, runs = self.made.pop(b), self.runs.pop(b)
        del self.targets[b]
        tokens = np.full(n, TOKEN, np.int32)
        natural = n < seq.request.max_new_tokens
        if natural:
            tokens[-1] = EOS
        versions = np.repeat([v for v, _ in runs], [k for _, k in runs]).astype(np.int32)
        self.stats["finished"] += 1
        return Rollout(
            prompt=seq.request.prompt,
            sample_index=seq.request.sample_index,
            tokens=tokens,
            logprobs=np.zeros(n, np.float32),
            versions=versions,
            finish_reason="eos" if natural else "length",
        )


class SimEngine:
    """`replicas` engine replicas with the Engine's interface (load_weights, generate, submit,
    step, interrupt, pending, work_stats). Requests go to replicas by prompt: a group's
    samples stay together, prompt i to replica i mod R in `generate`, to the least loaded in
    `submit`."""

    def __init__(
        self, config: EngineConfig, costs: Costs, lengths: Lengths, clock, replicas: int = 1
    ):
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        self.config, self.costs, self.clock = config, costs, clock
        self.replicas = [Replica(config, costs, lengths) for _ in range(replicas)]

    def load_weights(self, version: int, params=None) -> None:
        """Every replica receives the new version (in parallel: one reload's time)."""
        self.clock.advance(self.costs.reload())
        for r in self.replicas:
            r.version = version

    def generate(self, requests) -> list[Rollout]:
        """Run `requests` to completion; the replicas work in parallel, the clock moves by the
        slowest one. Rollouts in request order."""
        requests = list(requests)
        uids = list(dict.fromkeys(q.prompt.uid for q in requests))
        home = {uid: i % len(self.replicas) for i, uid in enumerate(uids)}
        for q in requests:
            self.replicas[home[q.prompt.uid]].submit([q])
        done, slowest = {}, 0.0
        for r in self.replicas:
            seconds = 0.0
            while r.pending():
                finished, spent = r.step()
                seconds += spent
                done.update({(x.prompt.uid, x.sample_index): x for x in finished})
            slowest = max(slowest, seconds)
        self.clock.advance(slowest)
        return [done[(q.prompt.uid, q.sample_index)] for q in requests]

    def submit(self, requests) -> None:
        by_prompt: dict[int, list[Request]] = {}
        for q in requests:
            by_prompt.setdefault(q.prompt.uid, []).append(q)
        for group in by_prompt.values():
            min(self.replicas, key=Replica.pending).submit(group)

    def step(self) -> list[Rollout]:
        """One Engine.step on every replica (one decode chunk each); the clock moves by the
        slowest. For callers written against the Engine (the threaded async scheduler)."""
        finished, slowest = [], 0.0
        for r in self.replicas:
            done, seconds = r.step(until=0.0)
            finished += done
            slowest = max(slowest, seconds)
        self.clock.advance(slowest)
        return finished

    def pending(self) -> int:
        return sum(r.pending() for r in self.replicas)

    def interrupt(self, policy: str) -> int:
        return sum(r.interrupt(policy) for r in self.replicas)

    def work_stats(self) -> dict[str, int]:
        return {k: sum(r.stats[k] for r in self.replicas) for k in self.replicas[0].stats}


class SimTrainer:
    """A trainer that trains nothing: a step costs what `Costs.train_step` says for the
    batch's tokens; the weights are a version number."""

    def __init__(self, costs: Costs, clock):
        self.costs, self.clock, self.version = costs, clock, 0

    def train_step(self, tokens: int) -> dict[str, float]:
        self.clock.advance(self.costs.train_step(tokens))
        self.version += 1
        return {"loss": 0.0, "tokens": float(tokens)}

    def params(self, host: bool = True, published: bool = False) -> dict:
        return {"version": self.version}


class SimStore:
    """The weight store's interface over version numbers (nothing to copy)."""

    def __init__(self, keep: int = 4):
        self.keep, self.held = keep, {}

    def put(self, version: int, params) -> None:
        self.held[version] = params

    def get(self, version: int | None = None):
        version = max(self.held) if version is None else version
        return version, self.held[version]

    def versions(self) -> list[int]:
        return sorted(self.held)

    def release(self, before_version: int) -> list[int]:
        gone = [v for v in self.held if v < before_version]
        for v in gone:
            del self.held[v]
        return gone


class SimTokenizer:
    pad_id = 0

    def decode(self, tokens) -> str:
        return ""
