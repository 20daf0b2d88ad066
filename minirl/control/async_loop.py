"""The `async` scheduler: generation and training run at the same time (AReaL §4–5, PipelineRL).

Two threads share the controller's buffer under one lock:

  rollout thread   keeps the engine busy: admits new prompts while the staleness bound allows,
                   calls `engine.step()`, assembles finished rollouts into groups, verifies them,
                   buffers them; when the trainer has published a version j or more ahead of the
                   engine's, it interrupts in-flight requests (`rl.reload_policy`: discard them
                   and start over, or continue them with the new weights) and reloads
  trainer thread   (the caller) waits for enough acceptable groups, takes the freshest (or,
                   with rl.batch_order = "oldest", the oldest), trains, publishes the new
                   version to the weight store

The bounds of the lockstep scheduler hold here too, enforced rather than scheduled:
  eta: groups to be trained (buffered + being trained) + groups in flight
       <= (eta + 1) * prompts_per_step   (AReaL's rate limit; controller.py's docstring)
  k:   a group is trained at version v only if (v + 1) - (its oldest token's version) <= k
  j:   the engine reloads only once the newest version is >= j ahead of its own
They hold on every batch (asserted), but which rollouts land in which batch depends on timing,
so runs are not bitwise reproducible — use `lockstep` for that.

The engine is reached through its worker (`controller.engine`), so it may live in this process
(JAX releases the GIL inside compiled computations: a decode chunk and a train step really do
overlap on two cores), in a local process or in a Ray actor (scale/ray_workers.py) with cores of
its own. If its process dies, the thread restarts it, reloads the weights it held and re-submits
every request in flight (their rollouts are keyed by counter-based RNG, so nothing is lost).
"""

from __future__ import annotations

import threading
import time

from minirl.control.workers import InProcessWorker, WorkerDied, call_restarting
from minirl.inference.scheduler import Request


class RolloutThread(threading.Thread):
    """Feeds the controller's buffer from the engine until `stop()`. `engine` is a worker
    (default: the controller's) or, in tests, an engine-like object."""

    def __init__(self, controller, engine=None):
        super().__init__(name="minirl-rollouts", daemon=True)
        engine = controller.engine if engine is None else engine
        self.ctl = controller
        self.engine = engine if hasattr(engine, "call") else InProcessWorker(engine)
        self.restarts = 0  # engine processes that died and were replaced
        self._stats = {"decode_tokens": 0, "slot_steps": 0}
        self.in_flight: dict[int, dict] = {}  # prompt uid -> {"prompt", "rollouts"}
        self.error: BaseException | None = None
        # where this thread's time goes (seconds since start): engine steps (prefill + decode),
        # verification, weight reloads, and waiting because the eta bound allows no new prompt
        self.seconds = dict.fromkeys(("busy", "verify", "reload", "idle"), 0.0)
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        with self.ctl.cond:
            self.ctl.cond.notify_all()

    def pending_prompts(self):
        with self.ctl.cond:
            return [entry["prompt"] for entry in self.in_flight.values()]

    def work_stats(self) -> dict[str, int]:
        """The engine's work counters (for the trainer thread's metrics). If its process just
        died, the last counters seen: the rollout thread is replacing it."""
        try:
            self._stats = self.engine.call("work_stats").result()
        except WorkerDied:
            pass
        return self._stats

    def resubmit(self, prompts) -> None:
        """Re-issue prompts that were in flight when a snapshot was taken (resume)."""
        prompts = list(prompts)
        with self.ctl.cond:
            self._track(prompts)
        self._submit(prompts)

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                self._timed("reload", self._maybe_reload)
                self._admit()
                with self.ctl.cond:
                    # nothing in flight, so nothing in the engine: wait until the trainer
                    # consumes or publishes (no round trip to the engine to ask)
                    if not self.in_flight:
                        self._timed("idle", self.ctl.cond.wait, 0.05)
                        continue
                self._collect(self._timed("busy", self._call, "step"))
        except BaseException as e:  # noqa: BLE001 - re-raised in the trainer thread
            self.error = e
            with self.ctl.cond:
                self.ctl.cond.notify_all()

    def _call(self, method: str, *args):
        """Call the engine; if its process died, bring up a fresh one with the weights the old
        one held, re-submit everything in flight (partial rollouts are dropped: they come back
        identical) and call again."""

        def restarted(error: Exception) -> None:
            self.ctl.log(
                f"engine worker died ({error}); restarting it and re-submitting its requests"
            )
            self.restarts += 1

        def recover() -> bool:
            with self.ctl.cond:
                self.ctl.counters.worker_restarts += 1
                version = self.ctl.counters.engine_version
                prompts = [entry["prompt"] for entry in self.in_flight.values()]
                for entry in self.in_flight.values():
                    entry["rollouts"] = []
            self.engine.call("load_weights", *self.ctl.engine_weights(version, True)).result()
            self._submit(prompts)
            return method == "submit"  # what it submitted is in flight: just re-submitted

        return call_restarting(self.engine, method, *args, on_restart=restarted, recover=recover)

    def _timed(self, part: str, fn, *args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds[part] += time.perf_counter() - t0

    def _maybe_reload(self) -> None:
        ctl = self.ctl
        with ctl.cond:
            if not ctl.reload_due():
                return
            version = ctl.counters.version
        self._call("interrupt", ctl.rl.reload_policy)
        ctl.move_engine(version, ctl.engine_weights(version)[1], self._call)

    def _admit(self) -> None:
        ctl, rl = self.ctl, self.ctl.rl
        with ctl.cond:
            if ctl.reload_due():  # the trainer published since _maybe_reload: reload first, or the
                return  # new prompts would be sampled by weights the bound k may refuse
            allowed = (rl.eta + 1) * rl.prompts_per_step - ctl.unconsumed() - len(self.in_flight)
            prompts = ctl.usable(ctl.mixture.next_prompts(allowed)) if allowed > 0 else []
            # In the same critical section as the mixture's advance: a snapshot (taken under this
            # lock) sees each prompt either not yet issued or in flight, never neither.
            self._track(prompts)
        self._submit(prompts)

    def _track(self, prompts) -> None:
        """Record prompts as in flight (call with ctl.cond held)."""
        for p in prompts:
            self.in_flight[p.uid] = {"prompt": p, "rollouts": []}

    def _submit(self, prompts) -> None:
        if prompts:
            g = self.ctl.rl.group_size
            self._call(
                "submit",
                [Request(p, i, self.ctl.max_new_tokens) for p in prompts for i in range(g)],
            )

    def _collect(self, finished) -> None:
        complete = []
        for r in finished:
            entry = self.in_flight[r.prompt.uid]
            entry["rollouts"].append(r)
            if len(entry["rollouts"]) == self.ctl.rl.group_size:
                complete.append(sorted(entry["rollouts"], key=lambda x: x.sample_index))
        if not complete:
            return
        self._timed("verify", self.ctl._score, complete)  # outside the lock: it may take a while
        with self.ctl.cond:
            self.ctl._buffer_groups(complete)
            for group in complete:
                del self.in_flight[group[0].prompt.uid]
            self.ctl.cond.notify_all()


def take_when_ready(ctl, rollout_thread, timeout: float = 600.0):
    """Block until a batch of acceptable groups exists, then take it (trainer thread)."""
    deadline = time.monotonic() + timeout
    with ctl.cond:
        dropped = ctl.counters.groups_filtered
        while True:
            if rollout_thread.error is not None:
                raise RuntimeError("the rollout thread failed") from rollout_thread.error
            ctl.discard_stale()
            if len(ctl.buffer) >= ctl.rl.prompts_per_step:
                return ctl._take_batch()
            ctl.check_filtering(dropped)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no batch after {timeout:.0f}s: the rollout thread is stuck")
            ctl.cond.wait(timeout=0.1)
