"""The controller: the only active part of minirl (RLAX §3).

One train step reads like the pseudocode of every RL system for LLMs:

    fill the buffer   prompts -> engine -> verifier -> version-tagged groups   (_generate)
    take a batch      the freshest groups the staleness bound k accepts        (_take_batch)
    (teacher)         distillation: a frozen teacher scores the batch's tokens   (_train)
    train             trainer.train_step(batch)                                (trainer)
    publish           weight store <- new version; engine reloads every j-th   (_publish)
    report            the step's metrics, returned to the caller (the run loop
                      records them); `snapshot` at reload boundaries         (step)

Scheduling is `lockstep`: every decision depends only on logical counts (versions, groups
produced), never on timing, so a run is bitwise reproducible and resumes exactly. The staleness
knobs (RLAX §3.1; AReaL §5.1; docs/staleness.md has the exact rules):

  j = rl.reload_every   the engine loads version v only when v - (its version) >= j
  k = rl.max_lag        a group is accepted for the step that produces version v+1 only if
                        (v + 1) - (its oldest token's version) <= k; 0 means unbounded
  eta = rl.eta          at most (eta + 1) batches' worth of groups still to be trained on
                        (buffered, being trained, or in flight); 0 = synchronous
  rl.batch_order        the freshest acceptable groups first (RLAX) or the oldest (AReaL)

Workers are called through `minirl.control.workers` futures, so the same code drives in-process parts
or parts in other processes.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

import jax
import numpy as np

from minirl.control.evaluation import assistant_turns, decode_rollouts
from minirl.control.workers import call_restarting
from minirl.data.filters import dynamic_filter
from minirl.data.mixture import Mixture
from minirl.inference.scheduler import Request
from minirl.losses import make_objective
from minirl.measure.diagnostics import batch_diagnostics
from minirl.measure.metrics_log import flatten_metrics
from minirl.modeling import lora
from minirl.training.batching import make_batch
from minirl.training.host_memory import release_freed
from minirl.types import Rollout, Score


@dataclasses.dataclass
class Group:
    """The G scored rollouts of one prompt, tagged with when they were produced."""

    rollouts: list[Rollout]
    produced: int  # sequence number: the order groups entered the buffer

    @property
    def version(self) -> int:
        """The oldest policy token's version (an episode without one does not count)."""
        wrote = [r.oldest_version for r in self.rollouts if r.oldest_version >= 0]
        return min(wrote, default=-1)


@dataclasses.dataclass
class Counters:
    """What the controller has done so far: part of every snapshot."""

    version: int = 0  # weight version the trainer holds (= train steps that updated weights)
    engine_version: int = 0  # version the engine has loaded
    steps: int = 0  # train steps attempted (skipped non-finite steps included)
    groups_produced: int = 0  # groups that entered the buffer
    groups_trained: int = 0
    groups_stale: int = 0  # discarded: too old for the bound k
    groups_filtered: int = 0  # dropped by the dynamic filter (all rewards equal)
    rollouts_generated: int = 0
    skipped_steps: int = 0  # non-finite guard: update skipped, nothing published
    worker_restarts: int = 0  # engine/verifier/trainer processes that died and were restarted
    prompts_skipped: int = 0  # too long for the engine's cache (counted, not fatal)


class Controller:
    """Drives engine, verifier, trainer and weight store through worker futures."""

    def __init__(
        self,
        cfg,
        *,
        engine,
        trainer,
        verifier,
        store,
        mixture: Mixture,
        tokenizer,
        max_new_tokens: int,
        clock: Callable[[], float] = time.perf_counter,
        log=print,
        teacher=None,
    ):
        self.cfg, self.rl = cfg, cfg.rl
        # DAPO's dynamic sampling is part of its preset (Objective.dynamic_filtering), so
        # `rl.loss=dapo` filters without also setting rl.dynamic_filter.
        self.dynamic_filter = (
            cfg.rl.dynamic_filter
            or make_objective(cfg.rl.loss, cfg.rl.behaviour_cap, cfg.rl.kl_coef).dynamic_filtering
        )
        self.engine, self.trainer, self.verifier, self.store = engine, trainer, verifier, store
        self.teacher = teacher  # distillation: a loss-free Trainer on frozen weights, or None
        self.mixture, self.tokenizer, self.max_new_tokens = mixture, tokenizer, max_new_tokens
        self.clock, self.log = clock, log
        self.counters = Counters()
        self.buffer: list[Group] = []
        self.trained_uids: list[int] = []  # prompt uid of every group trained on, in order
        self.last_trained: list[Group] = []  # the groups of the latest step (for samples)
        self.cond = threading.Condition()  # guards buffer and counters under the async scheduler
        self.pending_on_restore: list = []  # prompts in flight at the snapshot (async resume)
        self.times = {"generate": 0.0, "verify": 0.0, "tokens": 0}
        work = ("decode_tokens", "slot_steps", "route_bytes")  # the engine's counts (MoE: routes)
        self._engine_seen = dict.fromkeys(work, 0)  # engine counters at the last step
        self._frozen = None  # a LoRA run's base weights, for engine_weights

    def params(self, host: bool = True):
        """The trainer's current weights, through its worker (numpy arrays with `host=True`)."""
        return self.trainer.call("params", host).result()

    # ---- one step ----------------------------------------------------------------------------

    def step(self) -> dict[str, float]:
        t_start = self.clock()
        self.times = {"generate": 0.0, "verify": 0.0, "tokens": 0}
        rl = self.rl
        self.discard_stale()
        self._generate(upto=rl.prompts_per_step)  # what this step needs
        groups = self._take_batch()
        self._generate(upto=(rl.eta + 1) * rl.prompts_per_step)  # run ahead (eta)
        t_train = self.clock()
        metrics, batch, prox = self._train(groups)
        t_trained = self.clock()
        metrics.update(self._batch_metrics(batch, prox, groups))
        self._count_trained(groups)
        t_publish = self.clock()
        published = self._publish(metrics, reload_engine=True)
        t_end = self.clock()
        metrics.update(
            {
                "time/generate": self.times["generate"],
                "time/verify": self.times["verify"],
                "time/train": t_trained - t_train,
                "time/publish": t_end - t_publish,
                "time/step": t_end - t_start,
                "published": float(published),
                "generate/tokens": float(self.times["tokens"]),
                "generate/tokens_per_s": self.times["tokens"] / max(self.times["generate"], 1e-9),
            }
        )
        # The controller's own overhead: batching decisions, diagnostics, publishing, bookkeeping.
        metrics["time/other"] = max(
            0.0,
            metrics["time/step"]
            - self.times["generate"]
            - self.times["verify"]
            - metrics["time/train"],
        )
        metrics.update(self._engine_work(self._call_engine("work_stats")))
        return self._with_counters(metrics)

    def _engine_work(self, stats: dict) -> dict[str, float]:
        """The engine's decode work during this step: kept tokens and slot-steps computed (their
        ratio is the slot occupancy, minirl.inference.engine.Engine.occupancy). Per step, not cumulative,
        so a resumed run logs the same numbers as an uninterrupted one (the engine restarts at 0;
        so does an engine process that died and was replaced: then its counters are this step's)."""
        out = {
            f"engine/{k}": float(stats[k] - seen if stats[k] >= seen else stats[k])
            for k, seen in self._engine_seen.items()
            if k in stats
        }
        self._engine_seen = {k: stats.get(k, seen) for k, seen in self._engine_seen.items()}
        return out

    def _train(self, groups: list[Group]):
        """One trainer step on `groups`: batch, the teacher's log-probs (distillation), log pi_prox
        (recomputed unless on-policy), update."""
        batch = make_batch(
            [r for g in groups for r in g.rollouts],
            self.tokenizer.pad_id,
            self.cfg.trainer.bucket_minimum,
        )
        t0 = self.clock()
        if self.teacher is not None:  # a pure function of the batch: a dead process is asked again
            restarted = self._restarted("teacher", "scoring again")
            batch.teacher_logprobs = call_restarting(  # [B, T] log pi_T(targets), 0 off the mask
                self.teacher, "recompute_logprobs", batch, on_restart=restarted
            )
        t_teacher = self.clock() - t0
        # every counted token sampled under the weights the trainer holds: the trainer may skip
        # its log pi_prox recompute (Trainer.skips_recompute) and hands back what it used
        on_policy = bool(np.all(batch.versions[batch.mask > 0] == self.counters.version))
        metrics, prox = self.trainer.call("train_step_with_prox", batch, None, on_policy).result()
        metrics = {f"train/{k}": v for k, v in metrics.items()}
        if self.teacher is not None:
            metrics["time/teacher"] = t_teacher
        return metrics, batch, prox

    def _count_trained(self, groups: list[Group]) -> None:
        k = self.rl.max_lag
        if k and max(self._lag(g) for g in groups) > k:  # the bound is a promise: check it
            raise AssertionError(
                f"a batch holds a group of lag {max(self._lag(g) for g in groups)} > k={k}"
            )
        self.counters.steps += 1
        self.counters.groups_trained += len(groups)
        self.last_trained = groups
        self.trained_uids += [g.rollouts[0].prompt.uid for g in groups]

    def _with_counters(self, metrics: dict) -> dict:
        metrics["version"] = self.counters.version
        metrics.update(
            {f"count/{k}": float(v) for k, v in dataclasses.asdict(self.counters).items()}
        )
        return metrics

    # ---- the parts of a step -----------------------------------------------------------------

    def unconsumed(self) -> int:
        """Groups produced and still to be trained on: the buffer plus the batch being trained
        (not yet counted). What eta bounds; stale discards and finished steps are out of it."""
        c = self.counters
        return c.groups_produced - c.groups_stale - c.groups_trained

    def _generate(self, upto: int) -> None:
        """Produce groups until `upto` are waiting to be trained on (`unconsumed`)."""
        c, rl = self.counters, self.rl
        dropped = c.groups_filtered
        while self.unconsumed() < upto:
            self.check_filtering(dropped)
            need = upto - self.unconsumed()
            prompts = self.usable(self.mixture.next_prompts(need))
            requests = [
                Request(p, i, self.max_new_tokens) for p in prompts for i in range(rl.group_size)
            ]
            t0 = self.clock()
            rollouts = self._call_engine("generate", requests)
            self.times["generate"] += self.clock() - t0
            self.times["tokens"] += sum(len(r.tokens) for r in rollouts)
            groups = [
                rollouts[i : i + rl.group_size] for i in range(0, len(rollouts), rl.group_size)
            ]
            self._add_groups(groups)

    def check_filtering(self, dropped: int) -> None:
        """ValueError (the run's data and model, not a bug) once the dynamic filter has dropped
        32 batches' worth of groups since it had dropped `dropped` (both schedulers' wait)."""
        if (n := self.counters.groups_filtered - dropped) >= 32 * self.rl.prompts_per_step:
            raise ValueError(
                f"dynamic filtering dropped {n} groups and could not fill a batch: every group "
                "has equal rewards (the task is too easy or too hard for the current model)"
            )

    def step_async(self, rollouts) -> dict[str, float]:
        """One train step of the `async` scheduler (minirl/control/async_loop.py): wait for a batch the
        bounds accept, train on it while the rollout thread keeps generating, publish."""
        from minirl.control.async_loop import take_when_ready

        t_start = self.clock()
        groups = take_when_ready(self, rollouts)
        t_train = self.clock()
        metrics, batch, prox = self._train(groups)
        t_publish = self.clock()
        with self.cond:
            metrics.update(self._batch_metrics(batch, prox, groups))
            self._count_trained(groups)
            published = self._publish(metrics, reload_engine=False)
            self.cond.notify_all()
        t_end = self.clock()
        metrics.update(
            {
                "time/wait": t_train - t_start,
                "time/train": t_publish - t_train,
                "time/step": t_end - t_start,
                "published": float(published),
                "engine/in_flight": float(len(rollouts.in_flight)),
                **{f"engine/{part}_seconds": s for part, s in rollouts.seconds.items()},
                **self._engine_work(rollouts.work_stats()),
            }
        )
        with self.cond:
            return self._with_counters(metrics)

    def usable(self, prompts):
        """Prompts the engine can hold; the others are skipped and counted, never fatal."""
        e = self.cfg.engine
        fits = [p for p in prompts if len(p.tokens) + self.max_new_tokens <= e.cache_len]
        if len(fits) < len(prompts):
            self.counters.prompts_skipped += len(prompts) - len(fits)
            self.log(
                f"skipped {len(prompts) - len(fits)} prompts: prompt + {self.max_new_tokens} new "
                f"tokens exceed engine.cache_len={e.cache_len}"
            )
        return fits

    def _call_engine(self, method: str, *args):
        """Call the engine; if its process died, restart it, reload its weights and call again
        (requests are keyed by counter-based RNG, so the retry produces the same rollouts)."""

        def reload() -> None:  # a fresh engine process: the whole weights
            version, params = self.engine_weights(self.counters.engine_version, whole=True)
            self.engine.call("load_weights", version, params).result()

        restarted = self._restarted("engine", "re-issuing its requests")
        return call_restarting(self.engine, method, *args, on_restart=restarted, recover=reload)

    def _restarted(self, name: str, then: str):
        """What a worker's death leaves: a count and a log line."""

        def note(error: Exception) -> None:
            with self.cond:
                self.counters.worker_restarts += 1
            self.log(f"{name} worker died ({error}); restarting it and {then}")

        return note

    def _add_groups(self, groups: list[list[Rollout]]) -> list[Group]:
        self._score(groups)
        return self._buffer_groups(groups)

    def _score(self, groups: list[list[Rollout]]) -> None:
        """Decode and verify complete groups (a non-finite reward becomes 0 with a reason)."""
        flat = [r for g in groups for r in g]
        decode_rollouts(flat, self.tokenizer)
        t0 = self.clock()
        # a verdict depends only on the rollout: a fresh verifier called again gives the same
        restarted = self._restarted("verifier", "calling again")
        scores = call_restarting(self.verifier, "score", flat, on_restart=restarted)
        self.times["verify"] += self.clock() - t0
        for r, s in zip(flat, scores, strict=True):
            r.score = s if np.isfinite(s.reward) else Score(0.0, f"non-finite reward ({s.reason})")

    def _buffer_groups(self, groups: list[list[Rollout]]) -> list[Group]:
        """Count, filter (DAPO) and buffer scored groups, tagging their production order."""
        c = self.counters
        c.rollouts_generated += sum(len(g) for g in groups)
        if self.dynamic_filter:
            groups, dropped = dynamic_filter(groups)
            c.groups_filtered += dropped
        added = []
        for g in groups:
            added.append(Group(list(g), c.groups_produced))
            c.groups_produced += 1
        self.buffer += added
        return added

    def _lag(self, group: Group) -> int:
        return self.counters.version + 1 - group.version

    def discard_stale(self) -> None:
        """Drop (and count) buffered groups the bound k can no longer accept."""
        k = self.rl.max_lag
        if k:
            stale = [g for g in self.buffer if self._lag(g) > k]
            self.counters.groups_stale += len(stale)
            self.buffer = [g for g in self.buffer if self._lag(g) <= k]

    def _take_batch(self) -> list[Group]:
        """The freshest (or, `rl.batch_order="oldest"`, the oldest) `prompts_per_step` acceptable
        groups; ties: first produced first."""
        self.discard_stale()
        sign = -1 if self.rl.batch_order == "freshest" else 1
        order = sorted(self.buffer, key=lambda g: (sign * g.version, g.produced))
        taken = order[: self.rl.prompts_per_step]
        if len(taken) < self.rl.prompts_per_step:
            raise RuntimeError(
                "not enough acceptable groups in the buffer: check rl.max_lag / rl.eta"
            )
        ids = {id(g) for g in taken}
        self.buffer = [g for g in self.buffer if id(g) not in ids]
        return sorted(taken, key=lambda g: g.produced)

    def _publish(self, metrics: dict, reload_engine: bool) -> bool:
        """Store the new version and (lockstep) reload the engine every j-th version; never
        publish the weights of a skipped (non-finite) step."""
        c = self.counters
        if metrics.get("train/skipped_nonfinite", 0.0) > 0:
            c.skipped_steps += 1
            return False
        # The trainer's JAX arrays, never mutated or donated: the store makes the one host copy
        # and an in-process engine uses them as they are (no copy back to the device). LoRA: a
        # version is the adapters alone, and so is what reaches the engine (it keeps its base).
        version = self.trainer.call("params", False, True).result()
        self.store.put(c.version + 1, version)
        if isinstance(version, dict):  # the bytes one version holds (Ray: a handle)
            metrics["store/version_bytes"] = float(
                sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(version))
            )
        c.version += 1
        if reload_engine and self.reload_due():
            self.move_engine(c.version, version, self._call_engine)
        return True

    def move_engine(self, version: int, params, call) -> None:
        """The engine to `version` through `call`, the store's versions before it gone first, then
        what both let go (the trainer's old arrays) back to the system (docs/trainer.md)."""
        with self.cond:
            self.counters.engine_version = version
            self.store.release(version)
        call("load_weights", version, params)
        release_freed()

    def engine_weights(self, version: int | None = None, whole: bool = False):
        """(version, params) from the store for the engine. A LoRA run's versions hold the
        adapters alone: an engine that holds its base joins them itself (lora.EngineBase);
        `whole=True` (a fresh engine process) joins them here with the frozen base (the
        trainer's arrays, read once)."""
        version, params = self.store.get(version)
        if whole and self.cfg.model.lora_rank and isinstance(params, dict):
            if self._frozen is None:
                self._frozen = lora.partition(self.params(host=False), lora.is_adapter)[1]
            params = lora.join(params, self._frozen)
        return version, params

    def reload_due(self) -> bool:
        """j: the engine moves to the newest version once it is j or more versions behind."""
        return self.counters.version - self.counters.engine_version >= self.rl.reload_every

    def _batch_metrics(self, batch, prox, groups) -> dict[str, float]:
        rewards = batch.rewards.reshape(len(groups), -1)
        lens = batch.mask.sum(axis=1)
        out = {
            "reward/mean": float(rewards.mean()),
            "reward/mixed_groups": float(np.mean(rewards.std(axis=1) > 0)),
            "length/mean": float(lens.mean()),
            "length/max": float(lens.max()),
            "lag/mean": float(np.mean([self._lag(g) - 1 for g in groups])),
            "buffer/groups": float(len(self.buffer)),
        }
        episodes = [r for g in groups for r in g.rollouts]
        if any(r.mask is not None for r in episodes):  # multi-turn (task.tools)
            out["turns/mean"] = float(np.mean([assistant_turns(r) for r in episodes]))
        out.update(
            flatten_metrics(batch_diagnostics(batch, np.asarray(prox), self.counters.version))
        )
        return out

    # ---- snapshot / restore (RLAX §3.2 preemption) ---------------------------------------------

    def snapshot(self, in_flight=()) -> dict:
        """The controller's whole state as plain data (weights travel separately). `in_flight`:
        prompts issued but not yet buffered (async); a resumed run issues them again."""
        return {
            "in_flight": list(in_flight),
            "counters": dataclasses.asdict(self.counters),
            "mixture": self.mixture.state(),
            "buffer": [{"produced": g.produced, "rollouts": g.rollouts} for g in self.buffer],
            "trained_uids": np.asarray(self.trained_uids, np.int64),
        }

    def restore(self, snap: dict) -> None:
        self.counters = Counters(**snap["counters"])
        self.mixture.load_state(snap["mixture"])
        self.buffer = [Group(list(g["rollouts"]), int(g["produced"])) for g in snap["buffer"]]
        self.trained_uids = [int(u) for u in snap["trained_uids"]]
        self.pending_on_restore = list(snap.get("in_flight", []))
