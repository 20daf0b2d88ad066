"""RayJob: one multi-process JAX job as Ray actors, on a cluster of two Ray nodes (two raylets on
127.0.0.1) that this module starts. Each actor joins `jax.distributed` and the job's calls run
SPMD on all of them."""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from minirl.control.workers import WorkerDied  # noqa: E402
from scale.ray_workers import RayJob  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # actors cannot import tests/
ENV = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"node0": 1}}
    )
    cluster.add_node(num_cpus=2, resources={"node1": 1})
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


class Spmd:
    """Process i of a job: sums a vector sharded over every device of the job."""

    def __init__(self, process_id: int):
        import jax

        assert jax.process_index() == process_id
        self.jax = jax

    def info(self) -> dict:
        jax = self.jax
        return {
            "process": jax.process_index(),
            "processes": jax.process_count(),
            "devices": jax.device_count(),
            "local": jax.local_device_count(),
        }

    def total(self, n: int) -> float:
        import jax.numpy as jnp
        from jax.sharding import NamedSharding, PartitionSpec

        jax = self.jax
        mesh = jax.make_mesh((jax.device_count(),), ("x",))
        values = np.arange(n, dtype=np.float32)
        x = jax.make_array_from_callback(
            (n,), NamedSharding(mesh, PartitionSpec("x")), lambda index: values[index]
        )
        total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, PartitionSpec()))(x)
        return float(total.addressable_data(0))


def _job() -> RayJob:
    options = [{"num_cpus": 1, "resources": {f"node{i}": 1}} for i in range(2)]
    return RayJob(Spmd, 2, name="spmd", options=options, env=ENV).start()


def test_a_job_spans_two_nodes_and_runs_spmd(two_nodes):
    job = _job()
    nodes = [ray.get(w._actor.node.remote()) for w in job.workers]
    assert len(set(nodes)) == 2  # one actor on each Ray node
    assert job.call("info").result(120) == {"process": 0, "processes": 2, "devices": 4, "local": 2}
    assert job.call("total", 64).result(120) == float(np.arange(64).sum())  # data on all 4 devices
    job.close()


@pytest.mark.slow  # ~8 s: a job killed and rebuilt on a local Ray cluster
def test_a_dead_process_fails_the_job_at_once_and_restart_rebuilds_it(two_nodes):
    job = _job()
    assert job.call("total", 8).result(120) == 28.0
    os.kill(job.workers[1].pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(WorkerDied, match=r"spmd\[1\]"):
        job.call("total", 8).result(120)
    assert time.monotonic() - t0 < 60 and not job.alive()
    job.restart()  # all processes again, with a fresh coordinator
    assert job.alive() and job.call("total", 16).result(120) == 120.0
    job.close()


@pytest.mark.slow
def test_launch_ray_with_jobs_trains_by_reference_and_resumes_exactly(tmp_path):
    """`python -m scale.launch ray --weights ... --checkpoints ... --trainer-hosts 2`: the trainer
    is a 2-process JAX job in two Ray actors (FSDP over both processes' devices) writing its own
    Orbax checkpoints, the engine a tensor-parallel job reading weights by reference. Undo the
    controller's last checkpoint (a crash after the trainer committed it) and run again: the
    resume from step 2 redoes steps 3-4 exactly."""
    import json
    import shutil
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    run, orbax = tmp_path / "run", tmp_path / "orbax"
    cmd = [
        sys.executable,
        "-m",
        "scale.launch",
        "ray",
        "--preset",
        "fixture",
        "--set",
        "rl.steps=4",
        "--set",
        "rl.checkpoint_every=2",
        "--set",
        "rl.prompts_per_step=4",
        "--set",
        "rl.group_size=4",
        "--set",
        "engine.slots=16",
        "--weights",
        f"file://{tmp_path}/weights",
        "--checkpoints",
        str(orbax),
        "--trainer-hosts",
        "2",
        "--cpu-devices",
        "2",
        "--engine-mesh",
        "tensor=2",
        "--run-dir",
        str(run),
        "--quiet",
    ]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = str(root)

    def launch():
        r = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        return r.stdout, [json.loads(line) for line in open(run / "metrics.jsonl")]

    _, first = launch()
    assert [r["step"] for r in first] == [1, 2, 3, 4]
    assert sorted(os.listdir(orbax)) == ["2", "4"] and sorted(os.listdir(run / "checkpoints")) == [
        "step_00000002",
        "step_00000004",
    ]
    shutil.rmtree(run / "checkpoints" / "step_00000004")
    out, second = launch()
    assert "resumed" in out and "at step 2 (version 2)" in out
    assert sorted(os.listdir(orbax)) == ["2", "4"]
    for a, b in zip(first, second, strict=True):
        for key in ("reward/mean", "train/loss", "train/grad_norm", "length/mean", "version"):
            assert a[key] == b[key], (a["step"], key)


def test_a_job_the_cluster_cannot_place_is_refused_naming_what_it_asked_for(two_nodes):
    job = RayJob(
        Spmd,
        2,
        name="big",
        options=[{"num_cpus": 1, "resources": {"TPU": 4}}] * 2,
        env=ENV,
        place_timeout_s=2,
    )
    with pytest.raises(ValueError, match=r"big: the cluster could not place 2 processes .*TPU"):
        job.start()
    assert ray.util.placement_group_table() and not job.workers
    assert all(
        g["state"] == "REMOVED"
        for g in ray.util.placement_group_table().values()
        if g["name"] == "minirl-big"
    )
