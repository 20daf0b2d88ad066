"""Workers as Ray actors: minirl.control.workers' "call a method, get a future", on a Ray cluster.

minirl's controller reaches its parts through `worker.call(method, *args) -> Future`
(minirl/control/workers.py). Here the part lives in a Ray actor, placed by Ray on any node of the cluster
with the resources it asks for:

    ray.init()                                      # or ray.init(address="auto") on a cluster
    engine = RayWorker(lambda: Engine(model_cfg, engine_cfg), name="engine", num_cpus=1)
    rollouts = engine.call("generate", requests).result()

  one actor, one process   calls run one at a time, in the order they were made (a Ray actor
                           with max_concurrency=1 runs one caller's calls in submission order)
  the same messages        arguments and results travel encoded by minirl.control.workers (msgpack, numpy
                           as raw buffers, registered dataclasses as tagged dicts), so a Ray
                           worker sees exactly what a local-process worker sees
  death                    an actor that dies (kill -9, its node lost, out of memory) fails its
                           pending futures with `WorkerDied`; `restart()` starts a fresh actor
                           from the same factory and the controller re-issues what was in flight
                           (minirl/control/controller.py), as for a local process
  placement                `num_cpus`, `num_gpus`, `resources` ({"TPU": 4}) and
                           `scheduling_strategy` (a placement group bundle) are passed to Ray;
                           `env` sets environment variables before the part is built (XLA flags,
                           thread counts: JAX reads them when it starts, in the actor);
                           `cores` pins the actor's process to those CPU cores (Linux), so
                           XLA's thread pool in it sizes itself to them

`RayJob` is one worker made of one actor per host of a multi-host JAX job (a TPU slice): the
actors join `jax.distributed` (process 0 picks the coordinator on its node) and every call runs
on all of them, SPMD; the caller gets process 0's answer.

The core never imports Ray: scale/ is where it is used (ray is in the `scale` extra).
"""

from __future__ import annotations

import functools
import os
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from minirl.configlib import optional_import
from minirl.control.workers import WorkerDied, WorkerError, decode, encode, gather


def _ray():
    return optional_import("ray", "scale", "Ray actors (scale/ray_workers.py)")


__all__ = ["BuildFailed", "PartRefused", "RayJob", "RayPlacement", "RayWorker"]


class BuildFailed(RuntimeError):
    """The actor's factory raised: every call says why (no retry helps)."""


class _BuildRefused(BuildFailed):
    """The factory raised a user's mistake (a ValueError or OSError: a setting, a file)."""


class PartRefused(WorkerError, ValueError):
    """A part could not be built for a user's mistake (a mesh the devices do not fit, a missing
    model directory): a ValueError too, so `python -m scale.launch` says it in one line."""


class _Host:
    """The actor: sets its environment and cores, builds the part (`build`, the first call it
    gets), then runs encoded calls on it."""

    def __init__(self, env: dict[str, str], cores: tuple[int, ...]):
        os.environ.update(env)  # before the factory imports JAX: XLA reads its flags once
        if cores:  # every thread there is now; threads started later (XLA's pool) inherit it
            for tid in os.listdir("/proc/self/task"):
                os.sched_setaffinity(int(tid), cores)
        self.obj, self.error, self.refused = None, None, False

    def build(self, factory: Callable[[], Any]) -> None:
        try:
            self.obj = factory()
        except BaseException as e:
            self.error = f"{type(e).__name__}: {e}"
            self.refused = isinstance(e, ValueError | OSError)
            raise

    def run(self, message: bytes) -> bytes:
        if self.error is not None:  # every call says why, not only the first
            raise (_BuildRefused if self.refused else BuildFailed)(
                f"could not be built: {self.error}"
            )
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

    def node(self) -> str:
        """The Ray node this actor runs on."""
        ray = _ray()

        return ray.get_runtime_context().get_node_id()

    def address(self) -> str:
        """host:port on this actor's node with a port free now (for a JAX coordinator)."""
        ray = _ray()

        with socket.socket() as sock:
            sock.bind(("", 0))
            return f"{ray.util.get_node_ip_address()}:{sock.getsockname()[1]}"


def _remote_host():
    ray = _ray()

    return ray.remote(max_concurrency=1, max_restarts=0)(_Host)


def _outcome(name: str, ray_future: Future) -> tuple[Any, BaseException | None]:
    """Ray's outcome of a call -> minirl's: (result, None), or (None, WorkerError) when the method
    raised or the part could not be built, or (None, WorkerDied) when the actor is gone."""
    import ray.exceptions as rx

    try:
        return decode(ray_future.result()), None
    except rx.RayTaskError as e:  # the method raised: name the original exception
        cause = e.cause if e.cause is not None else e
        if isinstance(cause, BuildFailed):  # the factory raised: no retry helps
            return None, (PartRefused if isinstance(cause, _BuildRefused) else WorkerError)(
                f"{name}: {cause}"
            )
        return None, WorkerError(f"{name}: {type(cause).__name__}: {cause}")
    except (
        rx.RayActorError,
        rx.ActorUnavailableError,
        rx.WorkerCrashedError,
        rx.ObjectLostError,
    ) as e:
        return None, WorkerDied(f"{name}: actor died ({type(e).__name__})")
    except BaseException as e:  # noqa: BLE001 - e.g. a cancelled call: the caller sees it
        return None, e


class RayWorker:
    """A minirl worker (`call`, `alive`, `restart`, `close`) whose object lives in a Ray actor
    built by `factory()`. Ray must be initialised (`ray.init`) before the first call."""

    def __init__(
        self,
        factory: Callable[[], Any],
        name: str = "worker",
        *,
        num_cpus: float = 1,
        num_gpus: float = 0,
        resources: dict[str, float] | None = None,
        env: dict[str, str] | None = None,
        cores: tuple[int, ...] = (),
        scheduling_strategy: Any = None,
    ):
        self.factory, self.name, self.env, self.cores = factory, name, dict(env or {}), tuple(cores)
        self._options = {"num_cpus": num_cpus, "num_gpus": num_gpus, "resources": resources or {}}
        if scheduling_strategy is not None:
            self._options["scheduling_strategy"] = scheduling_strategy
        self._actor, self._pid = None, None
        self._dead = False

    def start(self) -> RayWorker:
        self._create()
        self._build(self.factory)
        return self

    def _create(self) -> None:
        """The actor, without its part yet (a RayJob first needs process 0's address)."""
        self._actor = _remote_host().options(**self._options).remote(self.env, self.cores)
        self._dead, self._pid = False, None

    def _build(self, factory: Callable[[], Any]) -> None:
        self._actor.build.remote(factory)  # runs before any call made after it (one caller)

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
        ray = _ray()

        if self._actor is None:
            self.start()
        if self._pid is None:
            self._pid = ray.get(self._actor.pid.remote())
        return self._pid

    def cpu_seconds(self) -> float:
        """CPU seconds the actor's process has used so far (all its threads)."""
        ray = _ray()

        return ray.get(self._actor.cpu_seconds.remote())

    def alive(self) -> bool:
        return self._actor is not None and not self._dead

    def restart(self) -> None:
        """Kill the actor (if any) and start a fresh one from the same factory."""
        self.close()
        self.start()

    def close(self) -> None:
        ray = _ray()

        if self._actor is not None:
            ray.kill(self._actor, no_restart=True)
            self._actor = None


def _join_job(factory: Callable[[int], Any], coordinator: str, n: int, i: int) -> Any:
    """In process i of a RayJob: join the JAX job, then build this process's part."""
    from scale.mesh import DistributedConfig, initialize

    initialize(DistributedConfig(coordinator, n, i))
    return factory(i)


class RayJob:
    """One worker made of `n` actors that form one multi-process JAX job (a TPU slice, several
    GPU nodes): every call runs on every actor — SPMD, each process runs the same jitted code on
    its devices — and the future holds process 0's answer. Process 0's actor picks the
    coordinator address on its node; every actor joins `jax.distributed` with it and then builds
    its part with `factory(process_id)`. If any actor dies the job has died (`WorkerDied`);
    `restart()` starts all of them again with a fresh coordinator.

    `options` are each actor's Ray options (one dict per process, e.g. `{"num_gpus": 8}` or
    `{"resources": {"TPU": 4}}`). A job of several processes is gang-scheduled: one placement
    group reserves every process's resources at once (all or nothing, so half a job never sits
    waiting for the rest), spread over nodes when it can be (`strategy="SPREAD"`;
    "STRICT_SPREAD" insists on one host each); a job the cluster cannot hold within
    `place_timeout_s` is refused, naming what it asked for."""

    def __init__(
        self,
        factory: Callable[[int], Any],
        n: int,
        name: str = "job",
        *,
        options: Sequence[dict] | None = None,
        env: dict[str, str] | None = None,
        strategy: str = "SPREAD",
        place_timeout_s: float = 300.0,
    ):
        if n < 1:
            raise ValueError(f"a job needs >= 1 process, got {n}")
        self.factory, self.n, self.name = factory, n, name
        self.options = list(options) if options is not None else [{} for _ in range(n)]
        if len(self.options) != n:
            raise ValueError(f"{len(self.options)} option dicts for {n} processes")
        self.env, self.strategy, self.place_timeout_s = dict(env or {}), strategy, place_timeout_s
        self.workers: list[RayWorker] = []
        self._group = None
        self._order = threading.Lock()  # one caller at a time submits to all processes

    def _reserve(self) -> list[dict]:
        """Each process's options, pointed at its bundle of a placement group made for the job."""
        ray = _ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self.n == 1:
            return self.options
        bundles = [
            {"CPU": o.get("num_cpus", 1), "GPU": o.get("num_gpus", 0), **o.get("resources", {})}
            for o in self.options
        ]
        bundles = [{k: v for k, v in b.items() if v} or {"CPU": 0.01} for b in bundles]
        self._group = placement_group(bundles, strategy=self.strategy, name=f"minirl-{self.name}")
        try:
            ray.get(self._group.ready(), timeout=self.place_timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.util.remove_placement_group(self._group)
            self._group = None
            raise ValueError(
                f"{self.name}: the cluster could not place {self.n} processes "
                f"({bundles}, {self.strategy}) within {self.place_timeout_s:.0f} s"
            ) from None
        return [
            {**o, "scheduling_strategy": PlacementGroupSchedulingStrategy(self._group, i)}
            for i, o in enumerate(self.options)
        ]

    def start(self) -> RayJob:
        ray = _ray()

        options = self._reserve()
        self.workers = [
            RayWorker(None, f"{self.name}[{i}]", env=self.env, **options[i]) for i in range(self.n)
        ]
        for w in self.workers:
            w._create()
        coordinator = ray.get(self.workers[0]._actor.address.remote())
        for i, w in enumerate(self.workers):
            w.factory = functools.partial(_join_job, self.factory, coordinator, self.n, i)
            w._build(w.factory)
        return self

    def call(self, method: str, *args, **kwargs) -> Future:
        """Process 0's answer once every process has answered. One death fails the call at
        once (minirl.control.workers.gather): the others may be stuck in a collective waiting for the
        dead one. Calls from several threads (the async scheduler's two) reach every process in
        the same order, or the processes would run different collectives and hang."""
        if not self.workers:
            self.start()
        with self._order:
            futures = [w.call(method, *args, **kwargs) for w in self.workers]
        return gather(futures, lambda results: results[0])

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    def alive(self) -> bool:
        return bool(self.workers) and all(w.alive() for w in self.workers)

    def restart(self) -> None:
        self.close()
        self.start()

    def close(self) -> None:
        ray = _ray()

        for w in self.workers:
            w.close()
        self.workers = []
        if self._group is not None:
            ray.util.remove_placement_group(self._group)
            self._group = None


class RayPlacement:
    """Where a run's parts live on a Ray cluster (minirl.run.runner.Run's `placement`): the engine
    as `engines` actors (data-parallel rollout, minirl.control.workers.Replicas), the trainer and the
    verifier one actor each, every actor with the Ray resources given for its role, e.g.
    `{"num_cpus": 1}` on a laptop or `{"resources": {"TPU": 4}}` on a pod. `teacher`: the Ray
    options of a distillation teacher's actor (minirl/training/teacher.py), None for a run
    without one. Evaluation and the warm start stay in the driver. `env` is set in every actor
    before its part is built."""

    def __init__(
        self,
        engines: int = 1,
        *,
        engine: dict | None = None,
        trainer: dict | None = None,
        verifier: dict | None = None,
        teacher: dict | None = None,
        env: dict[str, str] | None = None,
        hosts: dict[str, int] | None = None,
        verifier_worker: Any = None,
    ):
        if engines < 1:
            raise ValueError(f"engines must be >= 1, got {engines}")
        self.engines, self.env = engines, dict(env or {})
        self.hosts = {"engine": 1, "trainer": 1, **(hosts or {})}  # actors per job (RayJob)
        self.verifier_worker = verifier_worker  # e.g. a RemoteVerifier service: no actor then
        self.options = {
            "engine": engine or {},
            "trainer": trainer or {},
            "verifier": verifier or {},
            "teacher": teacher or {},
        }
        self.has_teacher = teacher is not None
        self.workers: list[RayWorker] = []  # every actor started, for close()

    def needs(self) -> dict[str, float]:
        """The Ray resources all the run's actors ask for together."""
        total: dict[str, float] = {}
        counts = (
            ("engine", self.engines * self.hosts["engine"]),
            ("trainer", self.hosts["trainer"]),
            ("verifier", 0 if self.verifier_worker is not None else 1),
            ("teacher", int(self.has_teacher)),
        )
        for role, count in counts:
            o = self.options[role]
            asks = {
                "CPU": o.get("num_cpus", 1),
                "GPU": o.get("num_gpus", 0),
                **o.get("resources", {}),
            }
            for name, amount in asks.items():
                if amount:
                    total[name] = total.get(name, 0) + count * amount
        return total

    def check(self) -> None:
        """Refuse, naming what is missing, a placement the cluster can never hold (Ray would
        wait for the resources forever, printing nothing)."""
        ray = _ray()

        have = ray.cluster_resources()
        short = {k: (v, have.get(k, 0)) for k, v in self.needs().items() if v > have.get(k, 0)}
        if short:
            detail = ", ".join(
                f"{k}: {need:g} needed, {got:g} in the cluster" for k, (need, got) in short.items()
            )
            raise ValueError(
                f"the Ray cluster cannot hold this run's actors ({detail}); "
                "start it with more (ray start --num-cpus N) or ask for less per role"
            )

    def _start(self, role: str, factory: Callable[[], Any], name: str) -> RayWorker:
        if not self.workers:
            self.check()
        worker = RayWorker(factory, name, env=self.env, **self.options[role]).start()
        self.workers.append(worker)
        return worker

    def engine(self, factory: Callable[[], Any], local: Any = None):
        from minirl.control.workers import Replicas

        workers = [self._start("engine", factory, f"engine{i}") for i in range(self.engines)]
        return workers[0] if self.engines == 1 else Replicas(workers)

    def trainer(self, factory: Callable[[], Any]):
        return self._start("trainer", factory, "trainer")

    def verifier(self, factory: Callable[[], Any], local: Any = None):
        if self.verifier_worker is not None:
            return self.verifier_worker
        return self._start("verifier", factory, "verifier")

    def teacher(self, factory: Callable[[], Any]):
        if not self.has_teacher:
            raise ValueError(
                "this run has a teacher but its RayPlacement plans no actor for it: "
                "RayPlacement(teacher={...})"
            )
        return self._start("teacher", factory, "teacher")

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
        self.workers = []
