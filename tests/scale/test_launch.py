"""`python -m scale.launch ray --weights ...` on 127.0.0.1: the RLAX layout on a local Ray
cluster — a trainer job of two processes (FSDP over both processes' fake devices), a
tensor-parallel engine job, weights by reference through a TensorStore store — and the HTTP
verifier service. Two steps of the `fixture` preset at a small batch; resume after the driver
is killed; a user's model directory and dataset file."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from minirl.verifiers.pool import remove_stale_scratch
from scale.launch import wait_for_output

pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]
SETS = [
    "--set",
    "rl.prompts_per_step=4",
    "--set",
    "rl.group_size=4",
    "--set",
    "engine.slots=16",
    "--set",
    "rl.checkpoint_every=2",
]
JOBS = ["--trainer-hosts", "2", "--cpu-devices", "2", "--engine-mesh", "tensor=2"]
# deterministic per step: equal in a redone step (times and counters of restarts are not)
REPLAYED = (
    "reward/mean",
    "train/loss",
    "train/grad_norm",
    "length/mean",
    "version",
    "mismatch/mean_abs_dlogp",
    "train/dlogp_no_recompute/mean_abs_dlogp",
)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "RAY_ADDRESS")}
    env.update(MINIRL_TOKEN="smoke-test-secret", PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    return env


def _launch(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "scale.launch", *args],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        proc.stdout.close()
    remove_stale_scratch()  # the killed jobs' verifier pools could not remove their temp files


@pytest.mark.slow  # ~1-2 min: a local Ray cluster, three jobs, six RL steps
@pytest.mark.parametrize("trainer_side", [False, True], ids=["through_controller", "orbax"])
def test_a_killed_driver_resumes_exactly(tmp_path, trainer_side):
    """Kill the whole command (driver, its Ray cluster, every job) during step 3 and run it again:
    it resumes from step 2 and redoes step 3 exactly. Without --checkpoints the controller's
    checkpoint holds the trainer job's state; with them the trainer job wrote its own."""
    run, orbax = tmp_path / "run", tmp_path / "orbax"
    cmd = [
        "ray",
        "--preset",
        "fixture",
        *SETS,
        "--set",
        "rl.steps=4",
        *JOBS,
        "--weights",
        f"file://{tmp_path}/weights",
        "--run-dir",
        str(run),
        "--quiet",
        *(["--checkpoints", str(orbax)] if trainer_side else []),
    ]
    procs = []
    try:
        first = _launch(cmd)  # killed during step 3 (checkpoints: step 2 only)
        procs.append(first)
        wait_for_output(first, r"(step 3) version")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
        attempt1 = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").open())}
        assert sorted(os.listdir(run / "checkpoints")) == ["step_00000002"]
        if trainer_side:
            assert sorted(os.listdir(orbax)) == ["2"]
        second = subprocess.run(
            [sys.executable, "-m", "scale.launch", *cmd],
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            timeout=900,
        )
        log = second.stdout.decode() + second.stderr.decode()
        assert second.returncode == 0, log[-3000:]
        assert "resumed" in log and "at step 2 (version 2)" in log
        records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
        assert [r["step"] for r in records] == [1, 2, 3, 4]  # the killed attempt's 3 redone
        for step in (1, 2, 3):
            for key in REPLAYED:
                assert records[step - 1][key] == attempt1[step][key], (step, key)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["steps"] == 4 and summary["version"] == 4
        assert summary["weights"][-1] == 4  # the trainer job published v4; old ones released
        if trainer_side:
            assert sorted(os.listdir(orbax)) == ["2", "4"]
    finally:
        _stop(procs)


def test_a_bad_model_directory_or_data_file_says_so_in_one_line(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1 + 1?", "answer": "2"}\n')
    for bad, says in (
        (["--model", str(tmp_path), "--data", str(data)], "has no config.json"),
        (["--data", str(tmp_path / "nope.jsonl")], "no dataset file"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "scale.launch", "ray", "--weights", "memory://w", *bad],
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert r.stderr.startswith("python -m scale.launch ray: error:") and says in r.stderr


@pytest.mark.parametrize(
    "bad, says",
    [
        # without --weights these had changed nothing, silently
        (["--trainer-mesh", "fsdp=3"], "--trainer-mesh: the multi-host jobs' flags need --weights"),
        (["--keep", "2", "--cpu-devices", "2"], "--keep, --cpu-devices: the multi-host"),
        # with it, these had started Ray and every job, then failed in a traceback from an actor
        (["--weights", "memory://w", "--trainer-mesh", "fsdp=3", *JOBS], "needs 3 devices, got 4"),
        (["--weights", "memory://w", "--engine-mesh", "tensr=2"], "--engine-mesh 'tensr=2'"),
        (["--weights", "memory://w", "--trainer-mesh", "fsdp=2,fsdp=4"], "each of"),
        (["--weights", "memory://w", "--keep", "0"], "--keep, --trainer-hosts"),
        # an engine mesh axis that would change nothing; slots that do not split over "data"
        (["--weights", "memory://w", "--engine-mesh", "fsdp=2,tensor=2"], "engine mesh fsdp=2"),
        (
            ["--weights", "memory://w", "--cpu-devices", "3", "--engine-mesh", "data=-1"],
            "engine.slots=32 cannot be split over 3 data replicas",
        ),
        (["--weights", "memory://w", "--cpu-devices", "-2"], "--cpu-devices >= 0"),
        # these had reached Ray: a NaN count, a negative one, CPU asked for twice
        (["--engine-cpus", "nan"], "--engine-cpus nan: expected a number >= 0"),
        (["--trainer-gpus", "-1"], "--trainer-gpus -1.0"),
        (["--resource", "engine:GPU=2", "--engine-gpus", "1"], "NAME not CPU or GPU"),
    ],
)
def test_job_flags_that_cannot_work_are_refused_in_one_line_before_ray_starts(
    tmp_path, capsys, bad, says
):
    import ray

    from scale.launch import main

    with pytest.raises(SystemExit) as exit_:
        main(["ray", "--preset", "fixture", "--run-dir", str(tmp_path / "run"), "--quiet", *bad])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("python -m scale.launch ray: error:"), err
    assert says in err and not ray.is_initialized()


@pytest.mark.slow  # ~1-2 min: the verifier service, a local Ray cluster, two RL steps of a tiny Qwen2
@pytest.mark.reference  # the model directory is written by transformers
def test_a_users_model_directory_and_dataset_with_the_verifier_service(tmp_path):
    """`--model DIR --data FILE` (issue #15 item 9): every process of the trainer job reads the
    checkpoint into its FSDP layout block by block, the HTTP verifier service scores with the
    math verifier (--verifier-url), and the run ends with both steps logged."""
    from hf_tiny import make_model_dir

    model = make_model_dir(tmp_path / "model", arch="qwen2")
    data = tmp_path / "train.jsonl"
    rows = [
        {
            "question": f"Tom has {i % 7 + 1} apples and buys 2 more. How many now?",
            "answer": f"#### {i % 7 + 3}",
        }
        for i in range(16)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    procs = []
    try:
        verifier = _launch(
            [
                "verifier",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--workers",
                "1",
                "--verifier",
                "math",
                "--repository",
                str(tmp_path / "vdata"),
            ]
        )
        procs.append(verifier)
        url, _ = wait_for_output(verifier, r"on (http://127\.0\.0\.1:\d+)")
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "scale.launch",
                "ray",
                "--model",
                str(model),
                "--data",
                str(data),
                "--verifier",
                "math",
                "--set",
                "engine.cache_len=96",
                "--set",
                "engine.prefill_buckets=(64,)",
                "--set",
                "data.max_new_tokens=16",
                *SETS,
                "--set",
                "rl.steps=2",
                *JOBS,
                "--weights",
                f"file://{tmp_path}/weights",
                "--verifier-url",
                url,
                "--run-dir",
                str(run),
            ],
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
        log = r.stdout + r.stderr
        assert r.returncode == 0, log[-3000:]
        # both trainer processes read their own blocks (their prints reach the driver's log)
        assert (
            len(re.findall(r"read [\d,]+ bytes of .*model \(the blocks this process holds\)", log))
            == 2
        ), log[-3000:]
        records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
        assert [r["step"] for r in records] == [1, 2]
        assert all(0.0 <= r["reward/mean"] <= 1.0 and r["train/tokens"] > 0 for r in records)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["steps"] == 2 and summary["verifier"]["unscored"] == 0
    finally:
        _stop(procs)


def _ray(cmd: list[str], timeout: int = 900) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "scale.launch", "ray", *cmd],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    return log


@pytest.mark.slow  # ~1 min: a local Ray cluster, two one-process jobs, three RL steps
def test_the_weights_path_ends_bitwise_where_minirl_train_does(tmp_path):
    """One loop: the same lockstep config run by `minirl train` in this process and by
    `scale.launch ray --weights` (trainer and engine as JAX jobs on one device each, weights by
    reference) logs the same steps and ends with bitwise-equal weights and optimizer state;
    the multi-host run now evaluates before and after, as `minirl train` does."""
    from minirl.cli import main
    from minirl.store.checkpoints import CheckpointManager
    from minirl.store.trees import assert_trees_equal

    sets = [*SETS, "--set", "rl.steps=3", "--set", "eval.prompts=8", "--set", "eval.samples=2"]
    here, jobs = tmp_path / "here", tmp_path / "jobs"
    assert main(["train", "--preset", "fixture", *sets, "--run-dir", str(here), "--quiet"]) == 0
    _ray(
        ["--preset", "fixture", *sets, "--cpu-devices", "1", "--trainer-mesh", "fsdp=1"]
        + ["--engine-mesh", "tensor=1", "--weights", f"file://{tmp_path}/weights"]
        + ["--run-dir", str(jobs), "--quiet"]
    )
    a, b = CheckpointManager(here).restore(), CheckpointManager(jobs).restore()
    assert a.step == b.step == 3
    assert_trees_equal(b.params, a.params)
    assert_trees_equal(b.opt_state, a.opt_state)
    mine, theirs = ([json.loads(x) for x in (d / "metrics.jsonl").open()] for d in (here, jobs))
    assert [r["step"] for r in theirs] == [1, 2, 3]
    for x, y in zip(mine, theirs, strict=True):
        assert [x[k] for k in REPLAYED] == [y[k] for k in REPLAYED], x["step"]
    s_here, s_jobs = (json.loads((d / "summary.json").read_text()) for d in (here, jobs))
    assert s_jobs["before"] == s_here["before"] and s_jobs["after"] == s_here["after"]


@pytest.mark.slow  # ~1-2 min: a local Ray cluster, three jobs, three RL steps
def test_a_lora_weights_run_stores_adapters_only_and_ends_bitwise_where_minirl_train_does(
    tmp_path,
):
    """LoRA over `--weights`: each version in the TensorStore store holds the adapters alone,
    the frozen base is written once beside it (URL + "-base/"), the engine job and the driver's
    evaluation join the two; the run ends where `minirl train` in this process does, bitwise."""
    from minirl.cli import main
    from minirl.modeling import lora
    from minirl.store.checkpoints import CheckpointManager
    from minirl.store.trees import assert_trees_equal, flatten_tree
    from scale.tensorstore_weights import TensorStoreWeightStore

    sets = [*SETS, "--set", "rl.steps=3", "--set", "eval.prompts=8", "--set", "eval.samples=2"]
    sets += ["--set", "model.lora_rank=4"]
    here, jobs = tmp_path / "here", tmp_path / "jobs"
    assert main(["train", "--preset", "fixture", *sets, "--run-dir", str(here), "--quiet"]) == 0
    _ray(
        ["--preset", "fixture", *sets, "--cpu-devices", "1", "--trainer-mesh", "fsdp=1"]
        + ["--engine-mesh", "tensor=1", "--weights", f"file://{tmp_path}/weights"]
        + ["--run-dir", str(jobs), "--quiet"]
    )
    a, b = CheckpointManager(here).restore(), CheckpointManager(jobs).restore()
    assert a.step == b.step == 3
    assert_trees_equal(b.params, a.params)
    s_here, s_jobs = (json.loads((d / "summary.json").read_text()) for d in (here, jobs))
    assert s_jobs["before"] == s_here["before"] and s_jobs["after"] == s_here["after"]
    version, stored = TensorStoreWeightStore(f"file://{tmp_path}/weights").get()
    names = [path.split("/")[-1] for path in flatten_tree(stored)]
    assert version == 3 and names and all(lora.is_adapter(n) for n in names), names
    adapters = lora.partition(a.params, lora.is_adapter)[0]
    assert_trees_equal(stored, adapters)  # the newest version: the run's final adapters
    base_store = TensorStoreWeightStore(f"file://{tmp_path}/weights-base/")
    assert base_store.versions() == [0]  # written once
    _, base = base_store.get(0)
    assert_trees_equal(base, lora.partition(a.params, lambda n: not lora.is_adapter(n))[0])


@pytest.mark.slow  # ~2 min: a local Ray cluster, three jobs, a killed and a resumed attempt
@pytest.mark.parametrize("lora", [[], ["--set", "model.lora_rank=4"]], ids=["full", "lora"])
def test_an_async_weights_run_holds_its_bounds_and_resumes_after_kill_9(tmp_path, lora):
    """rl.scheduler=async on the multi-host layout (a rollout thread driving the engine job
    while the trainer job trains): every batch within k (no token more than max_lag - 1
    versions behind the weights it trains) and eta (in flight + buffered at most (eta + 1)
    batches); killed with SIGKILL during step 3 and run again, it ends at step 4 with every
    prompt issued accounted for and none trained twice."""
    from minirl.store.checkpoints import CheckpointManager

    run = tmp_path / "run"
    cmd = [
        "ray",
        "--preset",
        "fixture",
        *SETS,
        *("--set", "rl.steps=4", "--set", "rl.checkpoint_every=1"),
        *("--set", "rl.scheduler=async", "--set", "rl.max_lag=2", "--set", "rl.eta=1"),
        *lora,  # LoRA: versions of adapters alone; the restarted jobs read the base again
        *JOBS,
        *("--weights", f"file://{tmp_path}/weights", "--run-dir", str(run), "--quiet"),
    ]
    procs = []
    try:
        first = _launch(cmd)
        procs.append(first)
        wait_for_output(first, r"(step 2) version")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
        log = _ray(cmd[1:])
        assert "resumed" in log
    finally:
        _stop(procs)
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for r in records:
        behind = [k for k, v in r.items() if re.match(r"lag/\[(\d+),", k) and v]
        assert all(int(re.match(r"lag/\[(\d+),", k)[1]) < 2 for k in behind if "tokens" in k)
        assert r["engine/in_flight"] <= 2 * 4  # (eta + 1) * prompts_per_step
    ckpt = CheckpointManager(run).restore()
    assert ckpt.step == 4
    ctl = ckpt.controller_state["controller"]
    trained = list(ctl["trained_uids"])
    assert len(trained) == 4 * 4 and len(set(trained)) == len(trained)
    c = ctl["counters"]
    accounted = c["groups_trained"] + c["groups_stale"] + c["groups_filtered"]
    assert ctl["mixture"]["position"] == accounted + len(ctl["buffer"]) + len(ctl["in_flight"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4 and "after" in summary
