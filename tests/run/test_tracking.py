"""Trackers as a user checks them: TensorBoard's own reader finds every scalar of metrics.jsonl
and the samples; a resumed run has one point per step; a W&B offline run is written and parsed;
a missing extra is a clear error and a failing tracker never stops training."""

import glob
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from minirl.cli import main
from minirl.run.presets import make_config
from minirl.run.runner import Run
from minirl.run.tracking import Trackers, _TensorBoard, tensorboard_tag
from minirl.store.checkpoints import CheckpointManager

pytest.importorskip("tensorboardX")
ROOT = Path(__file__).resolve().parents[2]
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

SETS = [
    "rl.steps=6",
    "rl.checkpoint_every=2",
    "rl.keep_checkpoints=3",
    "eval.every=2",
    "eval.prompts=8",
    "eval.samples=2",
    "log.samples_every=2",
    "log.samples_per_step=3",
]


def _run(run_dir, *extra, log=print):
    cfg = make_config("fixture", [*SETS, *extra])
    return Run(cfg, run_dir, progress=False, log=log).train()


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _events(run_dir):
    acc = event_accumulator.EventAccumulator(
        str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0}
    )
    acc.Reload()
    return acc


@pytest.fixture(scope="module")
def tb_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("tb") / "run"
    summary = _run(run_dir, "log.tensorboard=true")
    return run_dir, summary


def test_tensorboard_scalars_equal_metrics_jsonl(tb_run):
    run_dir, summary = tb_run
    acc = _events(run_dir)
    tags = set(acc.Tags()["scalars"])
    records = _lines(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    checked = 0
    for record in records:
        for key, value in record.items():
            if key in ("step", "wall_time") or value is None:
                continue
            points = {e.step: e.value for e in acc.Scalars(tensorboard_tag(key))}
            assert points[record["step"]] == np.float32(value), (key, record["step"])
            checked += 1
    assert checked > 300 and "train/loss" in tags and "eval/pass_1" in tags  # "@" is not allowed
    before = {e.step: e.value for e in acc.Scalars("eval/pass_1")}
    assert before[0] == np.float32(summary["before"]["pass@1"])  # the held-out curve starts at 0
    assert sorted(before) == [0, 2, 4, 6]


def test_samples_reach_tensorboard_samples_jsonl_and_the_terminal(tb_run, capsys):
    run_dir, _ = tb_run
    rows = _lines(run_dir / "samples.jsonl")
    assert [r["step"] for r in rows] == [2] * 3 + [4] * 3 + [6] * 3
    for row in rows:
        assert {"prompt", "completion", "reward", "reason", "length", "lag"} <= set(row)
    texts = {
        e.step: e.tensor_proto.string_val[0].decode()
        for e in _events(run_dir).Tensors("samples/text_summary")
    }
    assert sorted(texts) == [2, 4, 6]
    assert all(
        r["completion"] in texts[r["step"]] and r["reason"] in texts[r["step"]] for r in rows
    )
    assert main(["samples", str(run_dir), "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("── step 6 ·") == 2 and rows[-3]["prompt"] in out
    assert main(["samples", str(run_dir), "--worst", "-n", "1"]) == 0
    worst = min(r["reward"] for r in rows)
    assert f"reward {worst} (" in capsys.readouterr().out
    assert main(["samples", str(run_dir), "--step", "3"]) == 2
    assert "no samples at step 3" in capsys.readouterr().err


def test_a_resumed_run_has_one_point_per_step(tb_run, tmp_path):
    """As after a kill that landed after step 6 was logged but before its checkpoint: the run
    resumes from step 4 and redoes 5 and 6; TensorBoard's reader drops the first attempt's."""
    run_dir = tmp_path / "run"
    shutil.copytree(tb_run[0], run_dir)
    shutil.rmtree(CheckpointManager(run_dir).path(6))
    _run(run_dir, "log.tensorboard=true")
    files = glob.glob(str(run_dir / "tensorboard" / "events.*"))
    assert len(files) == 2, files
    acc = _events(run_dir)
    for tag in acc.Tags()["scalars"]:
        steps = [e.step for e in acc.Scalars(tag)]
        assert steps == sorted(set(steps)), tag
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in _lines(run_dir / "samples.jsonl")] == [2] * 3 + [4] * 3 + [6] * 3


def _wandb_records(path):
    """The records of a W&B .wandb file: a 7-byte header, then 32 KiB blocks of records, each
    with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, block, out, partial = open(path, "rb").read(), 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer: too short for a header
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        partial += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(partial)
            out.append(record)
            partial = b""
        elif kind == 0:
            break
    return out


def test_wandb_offline_run_is_written_and_linked(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    run_dir = tmp_path / "run"
    _run(run_dir, "log.wandb=minirl-test", "rl.steps=2", "log.samples_every=1")
    # run.finish() returns before W&B's service process has written the whole .wandb file;
    # teardown waits for that process to end, so the file is complete (no timing involved)
    wandb.teardown()
    link = json.loads((run_dir / "wandb.json").read_text())
    assert link["mode"] == "offline" and link["project"] == "minirl-test"
    files = glob.glob(f"{link['dir']}/run-{link['id']}.wandb")
    assert len(files) == 1
    history, config = {}, {}
    for record in _wandb_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            history[items.get("_step")] = items
        elif kind in ("run", "config"):  # the config comes with the run record, updates after
            updates = record.run.config.update if kind == "run" else record.config.update
            config |= {i.key: json.loads(i.value_json) for i in updates}
    assert config["run_dir"] == str(run_dir.resolve()) and config["rl"]["steps"] == 2
    for record in _lines(run_dir / "metrics.jsonl"):
        assert history[record["step"]]["train/loss"] == pytest.approx(record["train/loss"])
    assert history[2]["samples/_type"] == "table-file" and history[2]["samples/nrows"] == 3


def test_a_missing_extra_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import fails as if not installed
    assert (
        main(
            [
                "train",
                "--preset",
                "fixture",
                "--run-dir",
                str(tmp_path / "run"),
                "--set",
                "log.tensorboard=true",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "log.tensorboard needs the 'tensorboardX' package" in err and "minirl[track]" in err
    assert not (tmp_path / "run").exists()  # refused before any work


def test_a_failing_tracker_is_reported_once_and_training_goes_on(tmp_path, monkeypatch):
    calls = []

    def full_disk(self, metrics, step):
        calls.append(step)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_TensorBoard, "log", full_disk)
    messages = []
    summary = _run(tmp_path / "run", "log.tensorboard=true", "rl.steps=3", log=messages.append)
    failed = [m for m in messages if "tensorboard logging failed" in m]
    assert len(failed) == 1 and "No space left" in failed[0] and calls == [0]
    assert summary["counters"]["steps"] == 3
    assert len(_lines(tmp_path / "run" / "metrics.jsonl")) == 3


def test_trackers_off_by_default_write_only_samples(tmp_path):
    trackers = Trackers.open(make_config("fixture"), tmp_path)
    assert trackers.parts == [] and trackers.samples_due(10) and not trackers.samples_due(3)
    trackers.samples([{"reward": 1.0, "completion": "4"}], 10)
    trackers.close()
    assert _lines(tmp_path / "samples.jsonl") == [{"step": 10, "reward": 1.0, "completion": "4"}]


@pytest.mark.slow  # ~20 s: two processes, each compiling
def test_sigkill_and_resume_leave_one_point_per_step(tmp_path):
    """The real thing: SIGKILL a run after it logged steps past its last checkpoint, resume."""
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "minirl.cli",
        "train",
        "--preset",
        "fixture",
        "--run-dir",
        str(run_dir),
        "--quiet",
        "--set",
        "rl.steps=12",
        "--set",
        "rl.checkpoint_every=5",
        "--set",
        "log.tensorboard=true",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = run_dir / "metrics.jsonl"
    # 7 lines: step 6's points are in the event file (step 7's line is written after them)
    while proc.poll() is None and not (metrics.exists() and metrics.read_text().count("\n") >= 7):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    logged = [e.step for e in _events(run_dir).Scalars("train/loss")]
    assert CheckpointManager(run_dir).all_steps() == [5] and max(logged) > 5, logged
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=600)
    acc = _events(run_dir)
    for tag in acc.Tags()["scalars"]:
        steps = [e.step for e in acc.Scalars(tag)]
        assert steps == sorted(set(steps)), tag
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, 13))


def test_wandb_unreachable_is_reported_once_and_the_others_go_on(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")

    def no_network(**kwargs):
        raise ConnectionError("api.wandb.ai unreachable")

    monkeypatch.setattr(wandb, "init", no_network)
    messages = []
    cfg = make_config("fixture", ["log.wandb=p", "log.tensorboard=true"])
    trackers = Trackers.open(cfg, tmp_path, log=messages.append)
    trackers.log({"reward/mean": 0.5}, 1)
    trackers.close()
    assert messages == [
        "wandb logging failed (ConnectionError: api.wandb.ai unreachable); the "
        "run goes on without wandb"
    ]
    assert [e.value for e in _events(tmp_path).Scalars("reward/mean")] == [0.5]
