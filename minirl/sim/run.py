"""Run the real controller on simulated parts and virtual time; return a trace.

lockstep  `minirl train`'s step loop (minirl/run/loop.py's `run_steps`) and
          `minirl.control.controller.Controller.step` itself, unchanged in every decision, drive a
          SimEngine, SimTrainer, SimVerifier and SimStore through in-process workers, with the
          virtual clock as their clock. The one subclass (`SimController`) replaces what touches
          tensors: the batch the trainer would get becomes its token count, and the batch
          diagnostics are left out (they are measurements, not decisions).
async     a discrete-event version of minirl/control/async_loop.py: each engine replica runs the
          rollout thread's loop (reload when j allows -> admit while eta allows -> one engine
          step -> verify and buffer finished groups) and the trainer runs the trainer thread's
          (wait for a batch k accepts -> train -> publish). Both call the controller's own
          methods for every bound (discard_stale, _take_batch, unconsumed, usable,
          _buffer_groups, _count_trained, _publish), so the rules are the real code's; only the
          threads and their lock are replaced by an event queue. With eta = 0 it makes the
          threaded scheduler's decisions (tests/sim/test_sim.py).

The trace holds per-step records (simulated seconds, lag, versions, counters, like
metrics.jsonl) and a summary: steps/hour, trained tokens/s, each pool's busy share, tokens
generated and thrown away, and the distribution of token lags in trained batches.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from types import SimpleNamespace

import numpy as np

from minirl.config import RLConfig
from minirl.control.controller import Controller
from minirl.control.workers import InProcessWorker
from minirl.inference.engine_config import EngineConfig
from minirl.inference.scheduler import Request
from minirl.run.loop import run_steps
from minirl.sim.costs import DEVICES, SHAPES, Costs
from minirl.sim.parts import SimEngine, SimStore, SimTokenizer, SimTrainer, VirtualClock
from minirl.sim.workload import Lengths, SimPrompts, SimVerifier
from minirl.training.batching import bucket_length


@dataclasses.dataclass(frozen=True)
class Setup:
    """Everything a simulation depends on."""

    costs: Costs
    rl: RLConfig
    engine: EngineConfig
    lengths: Lengths
    replicas: int = 1
    max_new_tokens: int = 1024
    prompt_len: int = 64
    verify_s: float = 0.0  # per verifier call
    verify_per_rollout_s: float = 0.0
    verify_sigma: float = 0.0  # log-normal spread of the per-rollout latency
    unsolved: float = 0.0  # share of prompts no sample solves (the dynamic filter drops them)
    seed: int = 0
    # engine and trainer on the same cores (async): each runs this many times slower while the
    # other is busy (processor sharing; minirl.sim.calibrate measures it for this machine)
    colocated_slowdown: float = 1.0
    # async without interruptible generation (AReaL Fig. 6's baseline): a replica due for new
    # weights takes no new prompts and reloads only once its requests have finished
    wait_for_in_flight: bool = False
    controller_s: float = 0.0  # the controller's own work per step (batching, diagnostics)
    # train on padded batches (minirl's trainer: its bucket_minimum); 0 = packed sequences
    pad_to_bucket: int = 0


def cluster(
    model: str,
    device: str,
    engine_devices: int,
    trainer_devices: int,
    prompts: int,
    group: int,
    max_new: int,
    lengths: str,
    slots: int = 64,
    prompt_len: int = 512,
    decode_chunk: int = 32,
    **rl,
) -> Setup:
    """A Setup for a named model shape on a device preset: replicas of the fewest devices that
    hold the weights and `slots` sequences' KV cache, the trainer on `trainer_devices`."""
    costs = Costs(SHAPES[model], DEVICES[device])
    cache = prompt_len + max_new
    per = costs.replica_devices_needed(slots * cache)
    return Setup(
        costs=dataclasses.replace(costs, engine_devices=per, trainer_devices=trainer_devices),
        rl=RLConfig(prompts_per_step=prompts, group_size=group, **rl),
        engine=EngineConfig(
            slots=slots, cache_len=cache, prefill_buckets=(prompt_len,), decode_chunk=decode_chunk
        ),
        lengths=Lengths.parse(lengths),
        replicas=max(1, engine_devices // per),
        max_new_tokens=max_new,
        prompt_len=prompt_len,
    )


def trained_tokens(groups, bucket_minimum: int = 0) -> int:
    """What a train step processes: every rollout's prompt and completion, packed
    (`bucket_minimum` 0), or padded as minirl's trainer pads: rows x the bucket of the longest
    (minirl.training.batching.bucket_length)."""
    lengths = [len(r.prompt.tokens) + len(r.tokens) for g in groups for r in g.rollouts]
    if bucket_minimum:
        return len(lengths) * bucket_length(max(lengths), bucket_minimum)
    return sum(lengths)


class SimController(Controller):
    """The controller with the trainer's tensors replaced by a token count."""

    def __init__(self, cfg, *, setup: Setup, **parts):
        super().__init__(cfg, **parts)
        self.setup = setup

    def _train(self, groups):
        tokens = trained_tokens(groups, self.setup.pad_to_bucket)
        metrics = self.trainer.call("train_step", tokens).result()
        return {f"train/{k}": v for k, v in metrics.items()}, None, None

    def _batch_metrics(self, batch, prox, groups) -> dict[str, float]:
        self.clock.advance(self.setup.controller_s)  # the real controller's own work
        lens = [len(r.tokens) for g in groups for r in g.rollouts]
        return {
            "length/mean": float(np.mean(lens)),
            "length/max": float(max(lens)),
            "lag/mean": float(np.mean([self._lag(g) - 1 for g in groups])),
            "buffer/groups": float(len(self.buffer)),
        }


def build(setup: Setup, clock: VirtualClock, mixture=None):
    """A SimController with its parts, at version 0 everywhere. `mixture`: the prompt source
    (default: SimPrompts of `prompt_len` tokens)."""
    cfg = SimpleNamespace(  # what the controller reads of a RunConfig (full fine-tuning, no LoRA)
        rl=setup.rl,
        engine=setup.engine,
        trainer=SimpleNamespace(bucket_minimum=1),
        model=SimpleNamespace(lora_rank=0),
    )
    engine = SimEngine(setup.engine, setup.costs, setup.lengths, clock, setup.replicas)
    store = SimStore(keep=max(4, setup.rl.reload_every + 2))
    store.put(0, {"version": 0})
    verifier = SimVerifier(
        clock,
        0.5,
        setup.verify_s,
        setup.verify_per_rollout_s,
        setup.verify_sigma,
        setup.seed,
        setup.unsolved,
    )
    ctl = SimController(
        cfg,
        setup=setup,
        engine=InProcessWorker(engine),
        trainer=InProcessWorker(SimTrainer(setup.costs, clock)),
        verifier=InProcessWorker(verifier),
        store=store,
        mixture=mixture or SimPrompts(setup.prompt_len, setup.seed),
        tokenizer=SimTokenizer(),
        max_new_tokens=setup.max_new_tokens,
        clock=clock,
        log=lambda *a: None,
    )
    return ctl, engine


def simulate(setup: Setup, steps: int, mixture=None) -> dict:
    """`steps` train steps under `setup.rl.scheduler`; the trace (module docstring)."""
    if setup.rl.scheduler == "lockstep":
        return _lockstep(setup, steps, mixture)
    return AsyncSim(setup, mixture).run(steps)


def _lockstep(setup: Setup, steps: int, mixture) -> dict:
    """`minirl train`'s own step loop (minirl.run.loop.run_steps) on the virtual clock."""
    clock = VirtualClock()
    ctl, engine = build(setup, clock, mixture)
    recorder = Recorder(ctl, engine)
    started = [clock()]

    def on_step(metrics: dict) -> None:
        gen = metrics["time/generate"] + metrics["time/verify"]
        seconds = clock() - started[0]
        recorder.step(metrics, seconds, engine_busy=gen, trainer_busy=metrics["time/train"])
        started[0] = clock()

    run_steps(ctl, steps, on_step, clock=clock)
    return recorder.summary(clock())


class Recorder:
    """Per-step records and the run's totals."""

    def __init__(self, ctl: Controller, engine: SimEngine):
        self.ctl, self.engine = ctl, engine
        self.steps: list[dict] = []
        self.lag_counts = np.zeros(1, np.int64)  # trained tokens by lag (versions behind)
        self.trained_tokens = 0
        self.busy = {"engine": 0.0, "trainer": 0.0}

    def step(self, metrics: dict, seconds: float, engine_busy: float, trainer_busy: float):
        version = self.ctl.counters.version
        for g in self.ctl.last_trained:
            for r in g.rollouts:
                counts = np.bincount(version - 1 - r.versions)
                if len(counts) > len(self.lag_counts):
                    self.lag_counts = np.pad(
                        self.lag_counts, (0, len(counts) - len(self.lag_counts))
                    )
                self.lag_counts[: len(counts)] += counts
                self.trained_tokens += len(r.tokens)
        self.busy["engine"] += engine_busy
        self.busy["trainer"] += trainer_busy
        keep = ("version", "lag/mean", "length/mean", "length/max", "time/wait", "time/train")
        record = {k: float(metrics[k]) for k in keep if k in metrics}
        record.update({k: v for k, v in metrics.items() if k.startswith("count/")})
        record["time/step"] = float(seconds)
        record["trained_uids"] = [g.rollouts[0].prompt.uid for g in self.ctl.last_trained]
        self.steps.append(record)

    def summary(self, seconds: float, in_flight=()) -> dict:
        """Totals; `in_flight`: rollouts finished but not yet in a group (async). Wasted =
        generated - trained - what is still buffered or in flight at the end: discarded at a
        reload, too stale for k, or dropped by the dynamic filter."""
        generated = self.engine.work_stats()["tokens"]
        pending = sum(len(r.tokens) for g in self.ctl.buffer for r in g.rollouts)
        pending += sum(len(r.tokens) for r in in_flight)
        pending += sum(rep.in_flight_tokens() for rep in self.engine.replicas)
        seconds = float(max(seconds, 1e-12))
        return {
            "steps": self.steps,
            "seconds": seconds,
            "seconds_per_step": seconds / max(len(self.steps), 1),
            "steps_per_hour": 3600 * len(self.steps) / seconds,
            "trained_tokens_per_s": self.trained_tokens / seconds,
            "busy": {k: min(1.0, v / seconds) for k, v in self.busy.items()},  # work past the end
            "generated_tokens": generated,
            "wasted_tokens": generated - self.trained_tokens - pending,
            "lag_histogram": self.lag_counts.tolist() if self.trained_tokens else [],
            "engine": self.engine.work_stats(),
        }


class AsyncSim:
    """The async scheduler as events on one virtual clock (module docstring)."""

    def __init__(self, setup: Setup, mixture=None):
        self.setup, self.rl = setup, setup.rl
        self.scratch = VirtualClock()  # parts charge their time here; events read the deltas
        self.ctl, self.engine = build(setup, self.scratch, mixture)
        self.recorder = Recorder(self.ctl, self.engine)
        self.now = 0.0
        self.events: list = []  # (time, order, kind, replica)
        self._order = 0
        self.in_flight: dict[int, list] = {}  # prompt uid -> rollouts finished so far
        self.idle: set[int] = set()  # replicas waiting for the trainer
        self.training: dict | None = None  # the step being trained (see _on_trainer)
        self.step_start = 0.0
        self._engine_was_busy = True

    def _at(self, t: float, kind: str, replica: int = -1, payload=None) -> None:
        heapq.heappush(self.events, (t, self._order, kind, replica, payload))
        self._order += 1

    def _cost(self, fn, *args):
        t0 = self.scratch()
        out = fn(*args)
        return out, self.scratch() - t0

    def run(self, steps: int) -> dict:
        for i in range(len(self.engine.replicas)):
            self._at(0.0, "loop", i)
        self._at(0.0, "trainer")
        while self.ctl.counters.steps < steps:
            if not self.events:
                raise RuntimeError("the simulation stalled: no event can make progress")
            self.now, _, kind, i, payload = heapq.heappop(self.events)
            getattr(self, f"_on_{kind}")(i, payload)
            if self._engine_busy() != self._engine_was_busy:
                self._engine_was_busy = not self._engine_was_busy
                self._retime_training()
        finished = [r for group in self.in_flight.values() for r in group]
        finished += [r for *_, kind, _, rs in self.events if kind == "collect" for r in rs]
        return self.recorder.summary(self.now, finished)

    # ---- the rollout thread, one per replica ------------------------------------------------

    def _engine_busy(self) -> bool:
        return len(self.idle) < len(self.engine.replicas)

    def _reload_due(self, replica) -> bool:
        return self.ctl.counters.version - replica.version >= self.rl.reload_every

    def _on_loop(self, i: int, _) -> None:
        ctl, replica = self.ctl, self.engine.replicas[i]
        seconds = 0.0
        waits = self.setup.wait_for_in_flight and replica.pending() > 0
        if self._reload_due(replica) and not waits:  # RolloutThread._maybe_reload
            replica.interrupt(self.rl.reload_policy)
            replica.version = ctl.counters.version
            seconds += self.setup.costs.reload()
            ctl.counters.engine_version = min(r.version for r in self.engine.replicas)
            ctl.store.release(min(ctl.counters.engine_version, ctl.counters.version))
        self._admit()
        if replica.pending() == 0:
            self.idle.add(i)
            self.recorder.busy["engine"] += seconds / len(self.engine.replicas)
            return
        # decode until the next outside event at the latest (where the thread would look again)
        until = (self.events[0][0] if self.events else math.inf) - self.now - seconds
        slow = self.setup.colocated_slowdown if self.training else 1.0
        finished, spent = replica.step(until / slow)
        seconds += spent * slow
        self.recorder.busy["engine"] += seconds / len(self.engine.replicas)
        self._at(self.now + seconds, "collect", i, finished)

    def _admit(self) -> None:
        """RolloutThread._admit: issue prompts while eta allows, each group to the least loaded
        replica whose weights are current (none current: issue nothing, as the thread waits
        for its reload)."""
        ctl, rl = self.ctl, self.rl
        current = [r for r in self.engine.replicas if not self._reload_due(r)]
        if not current:
            return
        allowed = (rl.eta + 1) * rl.prompts_per_step - ctl.unconsumed() - len(self.in_flight)
        prompts = ctl.usable(ctl.mixture.next_prompts(allowed)) if allowed > 0 else []
        for p in prompts:
            self.in_flight[p.uid] = []
            replica = min(current, key=lambda r: r.pending())
            replica.submit([Request(p, s, self.setup.max_new_tokens) for s in range(rl.group_size)])
        woken = {i for i in self.idle if self.engine.replicas[i].pending()}
        for i in sorted(woken):
            self._at(self.now, "loop", i)
        self.idle -= woken

    def _on_collect(self, i: int, finished) -> None:
        complete = []
        for r in finished:
            group = self.in_flight[r.prompt.uid]
            group.append(r)
            if len(group) == self.rl.group_size:
                complete.append(sorted(group, key=lambda x: x.sample_index))
        if not complete:
            self._at(self.now, "loop", i)
            return
        _, seconds = self._cost(self.ctl._score, complete)
        self.recorder.busy["engine"] += seconds / len(self.engine.replicas)
        self._at(self.now + seconds, "buffer", i, complete)

    def _on_buffer(self, i: int, complete) -> None:
        self.ctl._buffer_groups(complete)
        for group in complete:
            del self.in_flight[group[0].prompt.uid]
        self._at(self.now, "loop", i)
        self._at(self.now, "trainer")

    # ---- the trainer thread ------------------------------------------------------------------

    def _wake(self) -> None:
        for i in sorted(self.idle):
            self._at(self.now, "loop", i)
        self.idle.clear()

    def _on_trainer(self, *_) -> None:
        if self.training is not None:
            return
        ctl = self.ctl
        stale = ctl.counters.groups_stale
        ctl.discard_stale()
        if len(ctl.buffer) < self.rl.prompts_per_step:
            if ctl.counters.groups_stale != stale:
                self._wake()
            return
        groups = ctl._take_batch()
        tokens = trained_tokens(groups, self.setup.pad_to_bucket)
        metrics, seconds = self._cost(lambda: ctl.trainer.call("train_step", tokens).result())
        self.training = {
            "groups": groups,
            "metrics": {f"train/{k}": v for k, v in metrics.items()},
            "took": self.now,
            # seconds of work left were the trainer alone (+ the batch's metrics and the publish)
            "work": seconds + self.setup.controller_s,
            "since": self.now,
            "slow": 1.0,
            "ticket": 0,
        }
        self._wake()
        self._retime_training()

    def _retime_training(self) -> None:
        """Processor sharing on colocated parts: the step's work goes at 1 / slowdown while the
        engine is busy, at full speed while it idles; re-plan its end at every change."""
        t = self.training
        if t is None:
            return
        t["work"] -= (self.now - t["since"]) / t["slow"]
        t["since"] = self.now
        t["slow"] = self.setup.colocated_slowdown if self._engine_busy() else 1.0
        t["ticket"] = self._order  # unique: an end planned earlier (for any step) is void
        self._at(self.now + max(t["work"], 0.0) * t["slow"], "trained", payload=t["ticket"])

    def _on_trained(self, _, ticket) -> None:
        if self.training is None or ticket != self.training["ticket"]:
            return  # an end planned before the engine's load changed
        ctl = self.ctl
        groups, metrics, took = (self.training[k] for k in ("groups", "metrics", "took"))
        self.training = None
        metrics.update(ctl._batch_metrics(None, None, groups))
        ctl._count_trained(groups)
        ctl._publish(metrics, reload_engine=False)
        metrics["time/wait"] = took - self.step_start
        metrics["time/train"] = self.now - took
        self.recorder.step(
            ctl._with_counters(metrics), self.now - self.step_start, 0.0, self.now - took
        )
        self.step_start = self.now
        self._wake()
        self._at(self.now, "trainer")
