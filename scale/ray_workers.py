"""Workers as Ray actors: minirl.workers' "call a method, get a future", on a Ray cluster.

minirl's controller reaches its parts through `worker.call(method, *args) -> Future`
(minirl/workers.py). Here the part lives in a Ray actor, placed by Ray on any node of the cluster
with the resources it asks for:

    ray.init()                                      # or ray.init(address="auto") on a cluster
    engine = RayWorker(lambda: Engine(model_cfg, engine_cfg), name="engine", num_cpus=1)
    rollouts = engine.call("generate", requests).result()

  one actor, one process   calls run one at a time, in the order they were made (a Ray actor
                           with max_concurrency=1 runs one caller's calls in submission order)
  the same messages        arguments and results travel encoded by minirl.workers (msgpack, numpy
                           as raw buffers, registered dataclasses as tagged dicts), so a Ray
                           worker sees exactly what a local-process worker sees
  death                    an actor that dies (kill -9, its node lost, out of memory) fails its
                           pending futures with `WorkerDied`; `restart()` starts a fresh actor
                           from the same factory and the controller re-issues what was in flight
                           (minirl/controller.py), as for a local process
  placement                `num_cpus`, `num_gpus`, `resources` ({"TPU": 4}) and
                           `scheduling_strategy` (a placement group bundle) are passed to Ray;
                           `env` sets environment variables before the part is built (XLA flags,
                           thread counts: JAX reads them when it starts, in the actor);
                           `cores` pins the actor's process to those CPU cores (Linux), so
                           XLA's thread pool in it sizes itself to them

The core never imports Ray: this module is the only place that does (ray is in the `scale`
extra).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from minirl.workers import WorkerDied, WorkerError, decode, encode

__all__ = ["RayPlacement", "RayWorker"]


class _Host:
    """The actor: builds the part from its factory, then runs encoded calls on it."""

    def __init__(self, factory: Callable[[], Any], env: dict[str, str], cores: tuple[int, ...]):
        os.environ.update(env)  # before the factory imports JAX: XLA reads its flags once
        if cores:  # every thread there is now; threads started later (XLA's pool) inherit it
            for tid in os.listdir("/proc/self/task"):
                os.sched_setaffinity(int(tid), cores)
        self.obj = factory()

    def run(self, message: bytes) -> bytes:
        method, args, kwargs = decode(message)
        if method.startswith("_"):
            raise AttributeError(f"private method {method!r} cannot be called on a worker")
        return encode(getattr(self.obj, method)(*args, **kwargs))

    def pid(self) -> int:
        return os.getpid()

    def cpu_seconds(self) -> float:
        """CPU time this process has used (user + system, every thread)."""
        t = os.times()
        return t.user + t.system


def _remote_host():
    import ray

    return ray.remote(max_concurrency=1, max_restarts=0)(_Host)


def _outcome(name: str, ray_future: Future) -> tuple[Any, BaseException | None]:
    """Ray's outcome of a call -> minirl's: (result, None), or (None, WorkerError) when the method
    raised or the part could not be built, or (None, WorkerDied) when the actor is gone."""
    import ray.exceptions as rx

    try:
        return decode(ray_future.result()), None
    except rx.RayTaskError as e:  # the method raised: name the original exception
        cause = e.cause if e.cause is not None else e
        return None, WorkerError(f"{name}: {type(cause).__name__}: {cause}")
    except rx.RayActorError as e:
        if getattr(e, "actor_init_failed", False):  # the factory raised: restarting cannot help
            last = str(e).strip().splitlines()[-1]
            return None, WorkerError(f"{name}: could not be built: {last}")
        return None, WorkerDied(f"{name}: actor died ({type(e).__name__})")
    except (rx.ActorUnavailableError, rx.WorkerCrashedError, rx.ObjectLostError) as e:
        return None, WorkerDied(f"{name}: actor died ({type(e).__name__})")
    except BaseException as e:  # noqa: BLE001 - e.g. a cancelled call: the caller sees it
        return None, e


class RayWorker:
    """A minirl worker (`call`, `alive`, `restart`, `close`) whose object lives in a Ray actor
    built by `factory()`. Ray must be initialised (`ray.init`) before the first call."""

    def __init__(self, factory: Callable[[], Any], name: str = "worker", *, num_cpus: float = 1,
                 num_gpus: float = 0, resources: dict[str, float] | None = None,
                 env: dict[str, str] | None = None, cores: tuple[int, ...] = (),
                 scheduling_strategy: Any = None):
        self.factory, self.name, self.env, self.cores = factory, name, dict(env or {}), tuple(cores)
        self._options = {"num_cpus": num_cpus, "num_gpus": num_gpus, "resources": resources or {}}
        if scheduling_strategy is not None:
            self._options["scheduling_strategy"] = scheduling_strategy
        self._actor, self._pid = None, None
        self._dead = False

    def start(self) -> RayWorker:
        self._actor = _remote_host().options(**self._options).remote(self.factory, self.env, self.cores)
        self._dead, self._pid = False, None
        return self

    def call(self, method: str, *args, **kwargs) -> Future:
        if self._actor is None:
            self.start()
        future: Future = Future()
        ray_future = self._actor.run.remote(encode((method, args, kwargs))).future()

        def done(f: Future) -> None:
            value, error = _outcome(self.name, f)
            if error is None:
                future.set_result(value)
                return
            if isinstance(error, WorkerDied):
                self._dead = True  # before the caller wakes up and asks alive()
            future.set_exception(error)

        ray_future.add_done_callback(done)
        return future

    @property
    def pid(self) -> int:
        """The actor's process id (the first time: starts the actor if needed and waits for it
        and for the calls already made, since calls run in order)."""
        import ray

        if self._actor is None:
            self.start()
        if self._pid is None:
            self._pid = ray.get(self._actor.pid.remote())
        return self._pid

    def cpu_seconds(self) -> float:
        """CPU seconds the actor's process has used so far (all its threads)."""
        import ray

        return ray.get(self._actor.cpu_seconds.remote())

    def alive(self) -> bool:
        return self._actor is not None and not self._dead

    def restart(self) -> None:
        """Kill the actor (if any) and start a fresh one from the same factory."""
        self.close()
        self.start()

    def close(self) -> None:
        import ray

        if self._actor is not None:
            ray.kill(self._actor, no_restart=True)
            self._actor = None


class RayPlacement:
    """Where a run's parts live on a Ray cluster (minirl.runner.Run's `placement`): the engine
    as `engines` actors (data-parallel rollout, minirl.workers.Replicas), the trainer and the
    verifier one actor each, every actor with the Ray resources given for its role, e.g.
    `{"num_cpus": 1}` on a laptop or `{"resources": {"TPU": 4}}` on a pod. Evaluation and the
    warm start stay in the driver. `env` is set in every actor before its part is built."""

    def __init__(self, engines: int = 1, *, engine: dict | None = None, trainer: dict | None = None,
                 verifier: dict | None = None, env: dict[str, str] | None = None):
        if engines < 1:
            raise ValueError(f"engines must be >= 1, got {engines}")
        self.engines, self.env = engines, dict(env or {})
        self.options = {"engine": engine or {}, "trainer": trainer or {}, "verifier": verifier or {}}
        self.workers: list[RayWorker] = []  # every actor started, for close()

    def needs(self) -> dict[str, float]:
        """The Ray resources all the run's actors ask for together."""
        total: dict[str, float] = {}
        for role, count in (("engine", self.engines), ("trainer", 1), ("verifier", 1)):
            o = self.options[role]
            asks = {"CPU": o.get("num_cpus", 1), "GPU": o.get("num_gpus", 0), **o.get("resources", {})}
            for name, amount in asks.items():
                if amount:
                    total[name] = total.get(name, 0) + count * amount
        return total

    def check(self) -> None:
        """Refuse, naming what is missing, a placement the cluster can never hold (Ray would
        wait for the resources forever, printing nothing)."""
        import ray

        have = ray.cluster_resources()
        short = {k: (v, have.get(k, 0)) for k, v in self.needs().items() if v > have.get(k, 0)}
        if short:
            detail = ", ".join(f"{k}: {need:g} needed, {got:g} in the cluster"
                               for k, (need, got) in short.items())
            raise ValueError(f"the Ray cluster cannot hold this run's actors ({detail}); "
                             "start it with more (ray start --num-cpus N) or ask for less per role")

    def _start(self, role: str, factory: Callable[[], Any], name: str) -> RayWorker:
        if not self.workers:
            self.check()
        worker = RayWorker(factory, name, env=self.env, **self.options[role]).start()
        self.workers.append(worker)
        return worker

    def engine(self, factory: Callable[[], Any], local: Any = None):
        from minirl.workers import Replicas

        workers = [self._start("engine", factory, f"engine{i}") for i in range(self.engines)]
        return workers[0] if self.engines == 1 else Replicas(workers)

    def trainer(self, factory: Callable[[], Any]):
        return self._start("trainer", factory, "trainer")

    def verifier(self, factory: Callable[[], Any], local: Any = None):
        return self._start("verifier", factory, "verifier")

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
        self.workers = []
