"""`python -m scale.launch ray`: `minirl train` with its parts in Ray actors.

    python -m scale.launch ray --preset countdown --engines 2            # a local Ray cluster
    python -m scale.launch ray --engine-cores 0 --trainer-cores 1        # one core each
    ray start --head --num-cpus 4                                        # or a real one:
    python -m scale.launch ray --address auto --model DIR --data train.jsonl --engines 8 \\
        --engine-gpus 1 --trainer-gpus 8

The run is tools.runner.Run, unchanged: the same config, run directory, checkpoints, resume and
metrics as `minirl train`; only where the parts live differs (scale/ray_workers.py's
RayPlacement). Engine replicas, the trainer and the verifier each get an actor with the Ray
resources asked for; the warm start and evaluation run in this (the driver's) process.

Without --address a local cluster is started with just the CPUs the actors ask for (logical
CPUs: Ray itself pins nothing; --ROLE-cores does). Ray starts before JAX here, so its processes are not forked from
a multithreaded JAX process.

With --weights URL the trainer and each engine replica are multi-host JAX jobs instead
(`RayJob`: --trainer-hosts / --engine-hosts actors joined by jax.distributed, the roles of
scale/launch.py), weights pass by reference through that TensorStore store, --checkpoints URL
gives the trainer job its own Orbax checkpoints; the step loop is the same (scale/roles.py's
`drive` calls minirl/run/loop.py): lockstep or async, evaluation, rl.time_budget.

Simplified on purpose: without --weights, weights travel by value (the trainer actor's numpy
arrays through the driver's weight store to each engine actor: fine for models one host holds).
"""

from __future__ import annotations

import argparse
import math
import os
import socket


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `python -m scale.launch ray`: minirl's config flags, the actors' resources,
    the verifier service and the multi-host jobs (their own group in --help)."""
    from minirl.run.config_args import add_config_arguments

    add_config_arguments(p)
    p.add_argument(
        "--run-dir", help="where to write the run (default: runs/<task>); an existing one resumes"
    )
    p.add_argument("--force", action="store_true", help="resume even if the run's config changed")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument(
        "--address",
        default=None,
        help="Ray cluster to join ('auto': the one `ray start` began on this machine); "
        "default: start a local one for this run",
    )
    p.add_argument("--engines", type=int, default=1, help="engine replicas (data-parallel rollout)")
    for role, cpus in (("engine", 1.0), ("trainer", 1.0), ("verifier", 1.0)):
        p.add_argument(
            f"--{role}-cpus", type=float, default=cpus, help=f"Ray CPUs per {role} actor"
        )
    for role in ("engine", "trainer"):
        p.add_argument(f"--{role}-gpus", type=float, default=0.0, help=f"Ray GPUs per {role} actor")
    for role in ("engine", "trainer", "verifier"):
        p.add_argument(
            f"--{role}-cores",
            default="",
            metavar="0,1",
            help=f"pin the {role} actor(s) to these CPU cores (one machine, Linux)",
        )
    _add_job_arguments(p)
    p.add_argument(
        "--verifier-url",
        default=None,
        metavar="URL",
        help="score with the HTTP verifier service there (python -m scale.launch "
        "verifier; shared secret in $MINIRL_TOKEN) instead of a verifier actor",
    )
    p.add_argument(
        "--resource",
        action="append",
        default=[],
        metavar="ROLE:NAME=N",
        help="a custom Ray resource for a role's actors, e.g. engine:TPU=4 (repeatable)",
    )


def _add_job_arguments(p: argparse.ArgumentParser) -> None:
    j = p.add_argument_group(
        "multi-host jobs (weights by reference)",
        "With --weights, the trainer and each engine replica are JAX jobs of --ROLE-hosts Ray "
        "actors (one per host, joined by jax.distributed; the trainer and engine roles of "
        "scale/roles.py), the trainer on an FSDP mesh publishing to the TensorStore store, the "
        "engines reading from it on tensor-parallel meshes; --checkpoints adds the trainer "
        "job's own Orbax checkpoints.",
    )
    j.add_argument(
        "--weights", default=None, metavar="URL", help="TensorStore store of the weights"
    )
    j.add_argument(
        "--keep", type=int, default=JOB_DEFAULTS["keep"], help="weight versions kept in the store"
    )
    j.add_argument(
        "--checkpoints",
        default=None,
        metavar="URL",
        help="the trainer job's Orbax checkpoints (a directory, gs://...)",
    )
    j.add_argument(
        "--trainer-hosts", type=int, default=1, help="processes (hosts) of the trainer job"
    )
    j.add_argument(
        "--engine-hosts", type=int, default=1, help="processes (hosts) of each engine job"
    )
    j.add_argument(
        "--trainer-mesh",
        default=JOB_DEFAULTS["trainer_mesh"],
        help="the trainer job's mesh (-1: the devices left): fsdp=N splits the weights along "
        "the model width and the batch rows, tensor=N attention heads and MLP columns, data=N "
        "the batch rows only",
    )
    j.add_argument(
        "--engine-mesh",
        default=JOB_DEFAULTS["engine_mesh"],
        help="each engine job's mesh (-1: the devices left): tensor=N splits the weights "
        "(attention and KV heads, MLP columns), data=N the slots and their KV cache "
        "(engine.slots a multiple of N); no fsdp. More engines: --engines",
    )
    j.add_argument(
        "--cpu-devices", type=int, default=0, help="fake N CPU devices per process (testing)"
    )


def placement_from_args(args, task=None, teacher: bool = False):
    """The RayPlacement the flags describe (ValueError naming a malformed --resource). `task`:
    the run's task, whose test-data repository a --verifier-url service may ask for. `teacher`:
    the run distils from a teacher, whose actor asks for the trainer's resources."""
    from scale.ray_workers import RayPlacement

    options = {
        role: {"num_cpus": getattr(args, f"{role}_cpus"), "resources": {}}
        for role in ("engine", "trainer", "verifier")
    }
    for role in ("engine", "trainer"):
        options[role]["num_gpus"] = getattr(args, f"{role}_gpus")
    for role in options:
        options[role]["cores"] = _cores(role, getattr(args, f"{role}_cores"))
        for kind in ("cpus", "gpus"):
            amount = options[role].get(f"num_{kind}", 0.0)
            if not 0 <= amount < math.inf:  # NaN too
                raise ValueError(f"--{role}-{kind} {amount}: expected a number >= 0")
    for item in args.resource:
        role, name, value = _resource(item)
        if role not in options:
            raise ValueError(
                f"--resource {item!r}: expected ROLE:NAME=N with ROLE one of "
                f"engine, trainer, verifier, N > 0 and NAME not CPU or GPU (--ROLE-cpus, "
                "--ROLE-gpus ask for those; e.g. engine:TPU=4)"
            )
        options[role]["resources"][name] = value
    check_job_arguments(args)
    hosts = {"trainer": args.trainer_hosts, "engine": args.engine_hosts} if args.weights else {}
    if teacher and args.weights:
        raise ValueError(
            "rl.teacher with --weights (multi-host jobs) is not supported yet: run the teacher "
            "with `minirl train` or `scale.launch ray` without --weights"
        )
    verifier = remote_verifier(args, task)
    teacher_options = dict(options["trainer"], resources=dict(options["trainer"]["resources"]))
    return RayPlacement(
        args.engines,
        hosts=hosts,
        verifier_worker=verifier,
        teacher=teacher_options if teacher else None,
        **options,
    )


JOB_DEFAULTS = {  # the multi-host jobs' flags: they mean something only with --weights
    "checkpoints": None,
    "keep": 8,
    "trainer_hosts": 1,
    "engine_hosts": 1,
    "trainer_mesh": "fsdp=-1",
    "engine_mesh": "tensor=-1",
    "cpu_devices": 0,
}


def check_job_arguments(args) -> None:
    """ValueError (one line, before Ray starts) for multi-host job flags that cannot work: any
    of them without --weights (they would change nothing), --keep or --ROLE-hosts below 1,
    negative --cpu-devices, a mesh that does not parse or, when --cpu-devices says how many
    devices a job has, does not fit them. (A mesh is otherwise checked by the job itself.)"""
    from scale.mesh import MeshConfig

    if not args.weights:
        given = [k for k, default in JOB_DEFAULTS.items() if getattr(args, k) != default]
        if given:
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise ValueError(
                f"{flags}: the multi-host jobs' flags need --weights (without it the trainer "
                "and each engine are one actor, and the run directory holds the checkpoints)"
            )
        return
    if min(args.keep, args.trainer_hosts, args.engine_hosts) < 1 or args.cpu_devices < 0:
        raise ValueError(
            "--keep, --trainer-hosts and --engine-hosts must be >= 1, --cpu-devices >= 0"
        )
    for role in ("trainer", "engine"):
        text = getattr(args, f"{role}_mesh")
        try:
            mesh = MeshConfig.parse(text)
            if args.cpu_devices:
                mesh.shape(args.cpu_devices * getattr(args, f"{role}_hosts"))
        except ValueError as e:
            raise ValueError(f"--{role}-mesh {text!r}: {e}") from None


def _cores(role: str, text: str) -> tuple[int, ...]:
    try:
        cores = tuple(int(c) for c in text.split(",")) if text else ()
    except ValueError:
        cores = (-1,)
    if any(c < 0 or c >= (os.cpu_count() or 1) for c in cores):
        raise ValueError(
            f"--{role}-cores {text!r}: expected comma-separated core numbers "
            f"0..{(os.cpu_count() or 1) - 1}"
        )
    return cores


def _resource(item: str) -> tuple[str, str, float]:
    """ROLE:NAME=N -> (role, name, N); ("", "", 0) when malformed."""
    role, _, rest = item.partition(":")
    name, _, amount = rest.partition("=")
    try:
        value = float(amount)
    except ValueError:
        value = -1.0
    ok = name and name not in ("CPU", "GPU") and 0 < value < math.inf  # CPU/GPU: --ROLE-cpus
    return (role, name, value) if ok else ("", "", 0.0)


def remote_verifier(args, task=None):
    """With --verifier-url: a worker around the HTTP verifier service's client (in the driver:
    it only sends requests), else None. A task that stores test data by reference
    (program_synthesis) uploads it from its repository the first time the service asks."""
    if not args.verifier_url:
        return None
    from minirl.control.workers import InProcessWorker
    from scale.remote_verifier import RemoteVerifier
    from scale.roles import shared_token

    repository = getattr(task, "repository", None)
    return InProcessWorker(RemoteVerifier(args.verifier_url, shared_token(), repository=repository))


def run(args) -> None:
    import functools

    from minirl.configlib import optional_import
    from minirl.run.config_args import train_config_and_dir
    from minirl.run.runner import Run, summary_json

    ray = optional_import("ray", "scale", "python -m scale.launch ray")
    cfg, run_dir = train_config_and_dir(args)  # as `minirl train`: derived values stay
    # the tokenizer and the dataset file read and checked before Ray starts: a user's mistake
    # there is one line, not a cluster brought up and down. Built once: the driver's task
    # serves the verifier service's uploads, the warm start and the evaluation
    log = functools.partial(print, flush=True)  # read line by line by scripts
    run = Run(cfg, run_dir, log=log, progress=not args.quiet)
    run.placement = placement = placement_from_args(args, run.task, bool(cfg.rl.teacher))
    if args.weights:
        check_engine_mesh(args, cfg)
    if args.weights and cfg.engine.exact:
        check_exact_meshes(args, cfg)
    if args.address:
        _reachable(args.address)
        ray.init(address=args.address, log_to_driver=not args.quiet)
    else:
        # logical CPUs for the actors; GPUs as Ray detects them; no made-up TPUs (the placement
        # check then names what this machine lacks)
        cpus = placement.needs().get("CPU", 0)
        # address="local": a new cluster even if $RAY_ADDRESS names another one
        ray.init(
            address="local",
            num_cpus=max(1, int(-(-cpus // 1))),
            include_dashboard=False,
            log_to_driver=not args.quiet,
        )
    try:
        placement.check()  # before the warm start: a cluster that can never hold it fails now
        if args.weights:
            summary = run_jobs(args, run, placement)
        else:
            summary = run.train(resume=True, force=args.force)
    finally:
        placement.close()
        ray.shutdown()
    print(summary_json(run_dir, summary))


def check_engine_mesh(args, cfg) -> None:
    """The engine job's mesh against what an engine splits (scale.slots.check_slots: weights over
    "tensor", its engine.slots slots over "data", nothing over "fsdp"), before any job starts.
    A "-1" size is resolved when --cpu-devices says how many devices the job has; otherwise the
    job checks it once it has its devices (scale.roles.engine_role)."""
    from scale import mesh as mesh_lib
    from scale import slots as slots_lib

    mesh_cfg = mesh_lib.MeshConfig.parse(args.engine_mesh)
    sizes = (mesh_cfg.data, mesh_cfg.fsdp, mesh_cfg.tensor)
    if args.cpu_devices:
        sizes = mesh_cfg.shape(args.cpu_devices * args.engine_hosts)
    named = dict(zip(mesh_lib.AXES, sizes, strict=True))
    slots_lib.check_slots(named, mesh_lib.tensor_parallel(), cfg.engine.slots)


def check_exact_meshes(args, cfg) -> None:
    """Exact mode (engine.exact) keeps its bits only on layouts that split each weight 1, 2, 4
    or 8 ways (scale.mesh.check_exact): refuse any other before a job starts. A mesh whose size
    is "-1" (all devices) is checked here when --cpu-devices says how many; otherwise by the
    job itself, once it has its devices."""
    from scale import mesh as mesh_lib

    jobs = (
        (args.trainer_mesh, args.trainer_hosts, mesh_lib.fsdp()),
        (args.engine_mesh, args.engine_hosts, mesh_lib.tensor_parallel()),
    )
    for text, hosts, rules in jobs:
        mesh_cfg = mesh_lib.MeshConfig.parse(text)
        sizes = (mesh_cfg.data, mesh_cfg.fsdp, mesh_cfg.tensor)
        devices = args.cpu_devices * hosts or (0 if -1 in sizes else math.prod(sizes))
        if devices > 0:  # known: fake devices, or no -1 among the sizes
            mesh_lib.check_exact(cfg.model, mesh_cfg, devices, rules)


def _reachable(address: str, timeout_s: float = 10.0) -> None:
    """Refuse at once a host:port where no Ray head answers (ray.init would retry for minutes,
    printing only connection warnings). "auto" and ray:// addresses are left to Ray, which
    answers those quickly."""
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(
            f"--address {address!r}: expected host:port (the head's GCS port, 6379 "
            "by default), 'auto' or ray://host:port"
        )
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConnectionError(
            f"no Ray cluster answers at {address} ({e}); start one there with "
            "`ray start --head`, or leave out --address for a local one"
        ) from None


def run_jobs(args, run, placement) -> dict:
    """--weights: scale/roles.py's trainer and engine roles as Ray jobs, the step loop here."""
    from minirl.control.workers import Replicas
    from minirl.run.starting_point import make_verifier
    from scale.ray_workers import RayJob, RayWorker
    from scale.roles import drive, engine_role, trainer_role

    env = {}
    if args.cpu_devices:
        env = {
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.cpu_devices}",
        }
    role_args = dict(vars(args), run_dir=str(run.run_dir))
    t_args = argparse.Namespace(**{**role_args, "mesh": args.trainer_mesh})
    e_args = argparse.Namespace(**{**role_args, "mesh": args.engine_mesh})
    opts = placement.options
    trainer = RayJob(
        lambda i: trainer_role(t_args),
        args.trainer_hosts,
        name="trainer",
        options=[opts["trainer"]] * args.trainer_hosts,
        env=env,
    )
    engines = [
        RayJob(
            lambda i: engine_role(e_args),
            args.engine_hosts,
            name=f"engine{k}",
            options=[opts["engine"]] * args.engine_hosts,
            env=env,
        )
        for k in range(args.engines)
    ]
    cfg = run.cfg
    verifier = placement.verifier_worker or RayWorker(
        lambda: make_verifier(cfg), "verifier", **opts["verifier"]
    )
    jobs = [trainer, *engines] + ([] if placement.verifier_worker else [verifier])
    try:
        for job in jobs:
            job.start()
        engine = engines[0] if len(engines) == 1 else Replicas(engines)
        return drive(argparse.Namespace(**role_args), run, engine, trainer, verifier)
    finally:
        for job in jobs:
            job.close()
