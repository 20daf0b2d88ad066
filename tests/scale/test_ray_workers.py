"""Ray actors as minirl workers (scale/ray_workers.py), on a local Ray cluster this module starts.

The run tests compare against `minirl train`'s in-process run: the same config, the same weights
bit for bit, whatever process (or how many engine replicas) did the work.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from minirl.control.workers import WorkerDied, WorkerError  # noqa: E402
from minirl.run.presets import make_config  # noqa: E402
from minirl.run.runner import Run  # noqa: E402
from minirl.store.checkpoints import CheckpointManager  # noqa: E402
from minirl.types import Prompt  # noqa: E402
from scale.ray_workers import PartRefused, RayPlacement, RayWorker  # noqa: E402

CPUS = 4  # logical CPUs of the test cluster: engine x 2, trainer, verifier
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # actors cannot import tests/


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=CPUS, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


class Counter:
    def __init__(self):
        self.calls = []

    def add(self, x, y=0):
        self.calls.append(x)
        return x + y

    def seen(self):
        return self.calls

    def echo(self, value):
        return value

    def fail(self):
        raise ValueError("bad input 42")

    def sleep(self, seconds):
        time.sleep(seconds)
        return seconds


class Unbuildable:
    def __init__(self):
        raise ValueError("no such model directory: /nope")


class Buggy:
    def __init__(self):
        raise ZeroDivisionError("a bug of the part's, not a setting")


def test_calls_run_in_order_carry_minirl_types_and_name_errors(cluster):
    worker = RayWorker(Counter, name="counter").start()
    futures = [worker.call("add", i, y=10) for i in range(30)]
    assert [f.result(60) for f in futures] == [i + 10 for i in range(30)]
    assert worker.call("seen").result(60) == list(range(30))  # one at a time, in call order
    prompt = Prompt(7, "t", "hi", np.array([1, 2, 3], np.int32), {"answer": "4"})
    back = worker.call("echo", {"p": prompt, "x": np.arange(5.0)}).result(60)
    assert (
        isinstance(back["p"], Prompt) and back["p"].uid == 7 and back["p"].meta == {"answer": "4"}
    )
    np.testing.assert_array_equal(back["x"], np.arange(5.0))
    with pytest.raises(WorkerError, match="counter: ValueError: bad input 42"):
        worker.call("fail").result(60)
    with pytest.raises(WorkerError, match="private method"):
        worker.call("__init__").result(60)
    assert worker.alive()
    worker.close()
    # a part that cannot be built is an error that says why, not a death to restart from; for
    # a user's mistake (a ValueError) a ValueError too: scale.launch's one-line error
    with pytest.raises(
        WorkerError, match="could not be built: ValueError: no such model directory"
    ) as e:
        RayWorker(Unbuildable, name="broken").call("echo", 1).result(60)
    assert isinstance(e.value, PartRefused) and isinstance(e.value, ValueError)
    with pytest.raises(WorkerError, match="could not be built: ZeroDivisionError") as e:
        RayWorker(Buggy, name="buggy").call("echo", 1).result(60)
    assert not isinstance(e.value, ValueError)  # a bug keeps its traceback


def test_a_killed_actor_fails_its_pending_calls_with_worker_died_and_restarts(cluster):
    worker = RayWorker(Counter, name="victim").start()
    pid = worker.pid
    pending = worker.call("sleep", 30)
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerDied, match="victim"):
        pending.result(60)
    assert not worker.alive()
    worker.restart()
    assert worker.alive() and worker.pid != pid
    assert worker.call("add", 1, y=2).result(60) == 3
    worker.close()


def test_a_placement_the_cluster_cannot_hold_is_refused_naming_the_resource(cluster):
    placement = RayPlacement(engines=CPUS, engine={"num_cpus": 1})
    assert placement.needs() == {"CPU": CPUS + 2}
    with pytest.raises(ValueError, match=f"CPU: {CPUS + 2:g} needed, {CPUS:g} in the cluster"):
        placement.check()
    with pytest.raises(ValueError, match="TPU: 4 needed, 0 in the cluster"):
        RayPlacement(trainer={"num_cpus": 1, "resources": {"TPU": 4}}).check()


def _params(run_dir):
    return CheckpointManager(run_dir).restore().params


def _assert_same_params(a, b):
    import jax

    same = jax.tree.map(lambda x, y: bool(np.array_equal(np.asarray(x), np.asarray(y))), a, b)
    assert all(jax.tree.leaves(same))


def _rewards(run_dir):
    import json

    return [json.loads(line)["reward/mean"] for line in open(run_dir / "metrics.jsonl")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """`minirl train` in this process: the run every Ray run must equal."""
    run_dir = tmp_path_factory.mktemp("inprocess")
    Run(
        make_config("fixture", ["rl.steps=3", "rl.checkpoint_every=1"]),
        run_dir,
        log=lambda *a: None,
        progress=False,
    ).train()
    return run_dir


@pytest.mark.slow  # ~20 s: a Ray cluster, two engine replicas, two runs
def test_a_lockstep_run_on_ray_actors_with_two_engine_replicas_equals_the_in_process_run(
    cluster, reference, tmp_path
):
    """Engine x 2, trainer and verifier each in its own actor (process), the driver evaluating:
    the same rewards every step and the same final weights, bit for bit (the actors inherit the
    driver's XLA settings; sampling is keyed per prompt and sample, so which replica made a
    rollout does not matter)."""
    cfg = make_config("fixture", ["rl.steps=3", "rl.checkpoint_every=1"])
    placement = RayPlacement(engines=2)
    summary = Run(cfg, tmp_path, log=lambda *a: None, progress=False, placement=placement).train()
    pids = {w.name: w.pid for w in placement.workers}
    placement.close()
    assert sorted(pids) == ["engine0", "engine1", "trainer", "verifier"]
    assert len(set(pids.values()) | {os.getpid()}) == 5  # four actor processes and this one
    assert summary["counters"]["rollouts_generated"] == 3 * 8 * 4
    assert _rewards(tmp_path) == _rewards(reference)
    _assert_same_params(_params(tmp_path), _params(reference))


@pytest.mark.slow
def test_a_distillation_run_with_its_teacher_in_a_ray_actor_equals_the_in_process_run(
    cluster, tmp_path
):
    """On-policy distillation (rl.loss=distill, a `tiny` preset teacher): the teacher in its own
    actor gives the in-process run's teacher log-probs, so the same metrics and weights."""
    cfg = make_config(
        "fixture", ["rl.steps=2", "rl.checkpoint_every=1", "rl.loss=distill", "rl.teacher=tiny"]
    )
    Run(cfg, tmp_path / "local", log=lambda *a: None, progress=False).train()
    placement = RayPlacement(engines=1, teacher={"num_cpus": 1})
    Run(cfg, tmp_path / "ray", log=lambda *a: None, progress=False, placement=placement).train()
    names = sorted(w.name for w in placement.workers)
    placement.close()
    assert names == ["engine0", "teacher", "trainer", "verifier"]
    kl = lambda d: [json.loads(x)["train/distill/reverse_kl"] for x in open(d / "metrics.jsonl")]
    assert kl(tmp_path / "ray") == kl(tmp_path / "local") and len(kl(tmp_path / "local")) == 2
    _assert_same_params(_params(tmp_path / "ray"), _params(tmp_path / "local"))
    with pytest.raises(ValueError, match="RayPlacement\\(teacher="):
        RayPlacement().teacher(lambda: None)


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["engine1", "trainer", "verifier"])
def test_a_killed_actor_is_replaced_and_the_run_ends_where_an_undisturbed_one_does(
    cluster, reference, tmp_path, victim
):
    """kill -9 one actor once the first step is logged. An engine replica: the controller
    restarts the replicas, reloads their weights and re-issues the requests. The verifier: it
    is restarted and asked again. The trainer: its state is gone, so the run goes back to the
    last checkpoint with a fresh trainer and redoes the steps after it. Every way, the run's
    metrics and final weights equal the undisturbed run's: nothing lost, nothing trained twice."""
    cfg = make_config("fixture", ["rl.steps=3", "rl.checkpoint_every=1"])
    placement = RayPlacement(engines=2)
    killed = []

    def kill_once():
        deadline = time.time() + 300
        while time.time() < deadline:
            if (tmp_path / "metrics.jsonl").exists():
                worker = next(w for w in placement.workers if w.name == victim)
                os.kill(worker.pid, signal.SIGKILL)
                killed.append(worker.pid)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_once)
    killer.start()
    summary = Run(cfg, tmp_path, log=lambda *a: None, progress=False, placement=placement).train()
    killer.join()
    placement.close()
    assert killed and summary["counters"]["worker_restarts"] >= 1
    assert _rewards(tmp_path) == _rewards(reference)
    _assert_same_params(_params(tmp_path), _params(reference))


@pytest.mark.slow
def test_a_lora_run_on_ray_actors_sends_adapters_only_and_equals_the_in_process_run(
    cluster, tmp_path, monkeypatch
):
    """model.lora_rank=16 with engine, trainer and verifier in actors: the trainer actor returns
    each version's adapters alone (store/version_bytes: 131072, by hand in
    tests/modeling/test_lora.py), the engine actor gets the base once and then the adapters
    alone, and the final weights equal the in-process LoRA run's bit for bit."""
    import json

    from lora_transport import ADAPTER_BYTES, assert_adapters_only_transport, spy_load_weights

    import scale.ray_workers

    sets = ["rl.steps=2", "model.lora_rank=16", "eval.prompts=8", "eval.samples=2"]
    Run(make_config("fixture", sets), tmp_path / "ref", log=lambda *a: None, progress=False).train()
    sizes = spy_load_weights(monkeypatch, scale.ray_workers)
    placement = RayPlacement(engines=1)
    cfg = make_config("fixture", sets)
    Run(cfg, tmp_path / "ray", log=lambda *a: None, progress=False, placement=placement).train()
    placement.close()
    assert_adapters_only_transport(sizes, steps=2)
    records = [json.loads(line) for line in open(tmp_path / "ray" / "metrics.jsonl")]
    assert [r["store/version_bytes"] for r in records] == [ADAPTER_BYTES] * 2
    assert _rewards(tmp_path / "ray") == _rewards(tmp_path / "ref")
    _assert_same_params(_params(tmp_path / "ray"), _params(tmp_path / "ref"))


@pytest.mark.slow
def test_an_async_run_on_ray_actors_keeps_its_bounds_and_loses_nothing(cluster, tmp_path):
    """The async scheduler over Ray: the rollout thread drives two engine actors while the
    trainer actor trains; eta and k hold on every step, every issued prompt is accounted for
    and none is trained twice."""
    cfg = make_config(
        "fixture",
        ["rl.steps=4", "rl.checkpoint_every=2", "rl.scheduler=async", "rl.eta=1", "rl.max_lag=2"],
    )
    placement = RayPlacement(engines=2)
    Run(cfg, tmp_path, log=lambda *a: None, progress=False, placement=placement).train()
    placement.close()
    import json

    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(
        r["lag/mean"] <= 1 for r in records
    )  # lag - 1 <= k - 1 (the loop asserts k per batch)
    ckpt = CheckpointManager(tmp_path).restore()
    from minirl.control.workers import from_plain

    ctl = from_plain(ckpt.controller_state)["controller"]
    c = ctl["counters"]
    assert c["groups_trained"] == 4 * cfg.rl.prompts_per_step
    trained = ctl["trained_uids"]
    assert len(set(trained)) == len(trained), "a prompt was trained on twice"
    issued = ctl["mixture"]["position"]
    assert issued == (
        c["groups_trained"]
        + c["groups_stale"]
        + c["groups_filtered"]
        + len(ctl["buffer"])
        + len(ctl["in_flight"])
    )


def test_launch_ray_refuses_malformed_flags_and_an_unreachable_cluster_in_one_line(capsys):
    from scale.launch import main

    for bad in (
        ["--resource", "engine:TPU"],
        ["--resource", "driver:TPU=4"],
        ["--engines", "0"],
        ["--address", "127.0.0.1:1"],
        ["--address", "nohost"],  # no cluster, not host:port
        ["--checkpoints", "/tmp/x"],
        ["--engine-cores", "99"],
    ):
        with pytest.raises(SystemExit) as exit_:
            main(["ray", "--preset", "fixture", *bad])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("python -m scale.launch ray: error:") and err.count("\n") == 1, err


@pytest.mark.slow
def test_launch_ray_trains_on_a_local_cluster_and_resumes(tmp_path):
    """The command scale/README.md gives: a local Ray cluster of its own, two engine replicas,
    the run directory of `minirl train`; run again with more steps, it resumes."""
    import json
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    run = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "scale.launch",
        "ray",
        "--preset",
        "fixture",
        "--engines",
        "2",
        "--run-dir",
        str(run),
        "--quiet",
    ]
    env = {**os.environ, "PYTHONPATH": str(root)}
    for steps in (2, 3):
        r = subprocess.run(
            [*cmd, "--set", f"rl.steps={steps}"],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads(r.stdout[r.stdout.index("{") :])["run_dir"] == str(run)
    records = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [r["step"] for r in records] == [1, 2, 3]


@pytest.mark.slow
def test_a_killed_driver_resumes_and_ends_where_an_undisturbed_run_does(reference, tmp_path):
    """kill -9 the whole `python -m scale.launch ray` process group (driver, its local Ray
    cluster, every actor) once a step is logged, then run the same command again: it resumes
    from the last checkpoint and ends with the in-process run's weights, bit for bit."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    run = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "scale.launch",
        "ray",
        "--preset",
        "fixture",
        "--engines",
        "2",
        "--set",
        "rl.steps=3",
        "--set",
        "rl.checkpoint_every=1",
        "--run-dir",
        str(run),
        "--quiet",
    ]
    env = {**os.environ, "PYTHONPATH": str(root)}
    first = subprocess.Popen(
        cmd,
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 300
    while not (run / "metrics.jsonl").exists() and time.time() < deadline and first.poll() is None:
        time.sleep(0.05)
    assert first.poll() is None, "the run ended before it could be killed"
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(30)
    second = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert _rewards(run) == _rewards(reference)
    _assert_same_params(_params(run), _params(reference))


@pytest.mark.slow
def test_an_agent_run_on_ray_actors_equals_the_in_process_run(cluster, tmp_path):
    """Issue #47: with `task.agent` each engine actor holds an AgentRunner, so the endpoint and
    the agents live in the actor's process, beside its engine. Two engine replicas, the
    calculator agent of experiments/calc_agent.py: the same rewards every step and the same
    final weights as the in-process run (keys per episode, call and position)."""
    from pathlib import Path

    agent = Path(__file__).resolve().parents[2] / "experiments" / "calc_agent.py"
    sets = ["rl.steps=2", "rl.checkpoint_every=1", "task.name=arithmetic", "sft.steps=20"]
    sets += ['task.args={"max_digits":1,"max_operands":3}', f"task.agent={agent}:solve"]
    sets += ["engine.cache_len=64", "engine.prefill_buckets=(16,32)", "eval.prompts=8"]
    cfg = make_config("fixture", sets)
    quiet = dict(log=lambda *a: None, progress=False)
    Run(cfg, tmp_path / "here", **quiet).train()
    placement = RayPlacement(engines=2)
    Run(cfg, tmp_path / "ray", placement=placement, **quiet).train()
    placement.close()
    assert _rewards(tmp_path / "ray") == _rewards(tmp_path / "here")
    _assert_same_params(_params(tmp_path / "ray"), _params(tmp_path / "here"))
