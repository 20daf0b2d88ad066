"""A run directory under a careless user and a hostile machine: a second writer, kills that land
in checkpoint pruning, a full disk, hand-edited or damaged files, a --force resume that cannot
fit. Each case ends in a one-line error that names the file (exit code 2, no traceback) or in a
directory that still resumes, and nothing of the run is lost or overwritten."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from minirl.cli import main
from minirl.measure.metrics_log import replayed, truncate_metrics
from minirl.run.presets import make_config
from minirl.run.run_dir import RunStopped, lock_run_dir
from minirl.run.runner import Run
from minirl.store.checkpoints import CheckpointManager

ROOT = Path(__file__).resolve().parents[2]
SETS = ["--set", "rl.steps=4", "--set", "rl.checkpoint_every=2", "--set", "eval.prompts=16"]


def _train(run_dir, *extra) -> int:
    return main(
        ["train", "--preset", "fixture", "--run-dir", str(run_dir), "--quiet", *SETS, *extra]
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 4-step fixture run (checkpoints at steps 2 and 4); tests work on copies."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert _train(run_dir) == 0
    return run_dir


@pytest.fixture
def run_copy(finished, tmp_path) -> Path:
    shutil.copytree(finished, tmp_path / "run")
    return tmp_path / "run"


def _one_line_error(capsys, *needles) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("error:") == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def test_a_second_writer_is_refused_and_a_killed_one_releases_the_lock(run_copy, capsys):
    with lock_run_dir(run_copy):
        assert main(["train", "--resume", str(run_copy), "--quiet"]) == 2
        _one_line_error(
            capsys, str(run_copy), "in use by another minirl process", f"pid {os.getpid()}"
        )
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from minirl.run.run_dir import lock_run_dir\n"
            "with lock_run_dir(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)",
            str(run_copy),
        ],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert holder.stdout.readline() == b"held\n"
    with pytest.raises(Exception, match="in use"), lock_run_dir(run_copy):
        pass
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    holder.stdout.close()
    with lock_run_dir(run_copy):  # the OS released the killed holder's lock
        pass


def test_leftovers_of_interrupted_prunes_go_on_resume(run_copy):
    """A kill inside a save or a prune leaves `.tmp-`/`.trash-` directories and one checkpoint
    too many; the resume removes them (and a second tidy finds nothing)."""
    ckpts = CheckpointManager(run_copy)
    (ckpts.directory / ".trash-step_00000001-9-9").mkdir()
    (ckpts.directory / ".tmp-step_00000005-abcd").mkdir()
    shutil.copytree(ckpts.path(2), ckpts.path(1))  # one more than rl.keep_checkpoints=2
    assert main(["train", "--resume", str(run_copy), "--quiet"]) == 0
    assert sorted(os.listdir(ckpts.directory)) == ["step_00000002", "step_00000004"]
    assert CheckpointManager(run_copy, keep=2).tidy(4) == []


def test_tidy_keeps_what_a_damaged_newest_checkpoint_needs(tmp_path):
    ckpts = CheckpointManager(tmp_path, keep=5)
    for step in (16, 20, 24):
        ckpts.save(step, {"w": [float(step)]})
    # restored = 20 (24 was damaged): count back from 20; 24 stays for the next save to discard
    assert CheckpointManager(tmp_path, keep=1).tidy(20) == ["step_00000016"]
    assert CheckpointManager(tmp_path).all_steps() == [20, 24]


def test_a_full_disk_says_what_was_kept_and_how_to_resume(tmp_path):
    """Writes fail (EFBIG from RLIMIT_FSIZE stands in for ENOSPC: both are OSErrors from
    write); the run ends with one line naming the last checkpoint and the resume command."""
    run_dir = tmp_path / "run"
    small_files = (  # SIGXFSZ ignored: a failed write, not a killed process
        "import resource, runpy, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))\n"
        "sys.argv[0] = 'minirl'\n"
        "runpy.run_module('minirl.cli', run_name='__main__')\n"
    )
    cmd = [
        sys.executable,
        "-c",
        small_files,
        "train",
        "--preset",
        "fixture",
        "--run-dir",
        str(run_dir),
        "--quiet",
        *SETS,
        "--set",
        "sft.cache=false",
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "the run stopped" in proc.stderr and f"minirl train --resume {run_dir}" in proc.stderr
    assert "no checkpoint was written yet" in proc.stderr


def test_an_os_error_without_an_errno_is_not_shown_as_errno_none(tmp_path):
    """A TimeoutError (an OSError) with a message alone, e.g. the async scheduler's "no batch
    after 600s", read "[Errno None] the run stopped: ..."; an errno that exists is kept."""
    stopped = RunStopped(tmp_path, TimeoutError("no batch after 600s"))
    assert str(stopped).startswith("the run stopped: no batch after 600s; no checkpoint")
    full = RunStopped(tmp_path, OSError(errno.ENOSPC, "No space left on device", "x.tree"))
    assert full.errno == errno.ENOSPC and "No space left on device (x.tree)" in str(full)


def test_a_force_resume_that_cannot_fit_writes_nothing(run_copy, capsys):
    before = (run_copy / "config.json").read_bytes()
    assert main(["train", "--resume", str(run_copy), "--force", "--set", "model.dim=48"]) == 2
    _one_line_error(capsys, "step_00000004", "does not fit model.*", "(67, 48)")
    assert (run_copy / "config.json").read_bytes() == before


def test_every_checkpoint_damaged_is_one_line_for_train_and_eval(run_copy, capsys):
    for params in run_copy.glob("checkpoints/*/params.tree"):
        with open(params, "r+b") as f:
            f.seek(100)
            f.write(b"X")
    assert main(["train", "--resume", str(run_copy), "--set", "rl.steps=6"]) == 2
    _one_line_error(capsys, "no usable checkpoint", "sha256", "start afresh")
    assert main(["eval", str(run_copy)]) == 2
    _one_line_error(capsys, "no usable checkpoint")


def test_eval_and_export_read_the_weights_alone(run_copy, tmp_path, capsys):
    """`minirl eval` and `minirl export` read no optimizer state (2x the weights at fp32, never
    used there): they work with it gone, while a resume, which needs it, names it."""
    for opt in run_copy.glob("checkpoints/*/opt_state.tree"):
        opt.unlink()
    assert main(["eval", str(run_copy)]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 4
    assert main(["export", str(run_copy), "--out", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "config.json").exists()
    assert main(["train", "--resume", str(run_copy), "--set", "rl.steps=6"]) == 2
    _one_line_error(capsys, "no usable checkpoint", "opt_state.tree is missing")


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda d: d["config"]["rl"].update(steps="ten"), "rl.steps: expected int, got 'ten'"),
        (lambda d: d["config"]["engine"].update(prefill_buckets=16), "engine.prefill_buckets"),
        (lambda d: d.pop("hash"), "changed by hand or damaged"),
        (lambda d: d["config"]["model"].update(dim=0), "dim must be >= 1"),
    ],
)
def test_a_hand_edited_config_json_is_named(run_copy, capsys, edit, needle):
    path = run_copy / "config.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    assert main(["train", "--resume", str(run_copy)]) == 2
    _one_line_error(capsys, str(path), needle)
    assert main(["eval", str(run_copy)]) == 2
    _one_line_error(capsys, str(path))


@pytest.mark.parametrize(
    "assignment",
    [
        "eval.samples=0",
        "eval.prompts=0",
        "rl.time_budget=nan",
        "rl.time_budget=inf",
        "model.dim=0",
        "model.num_kv_heads=0",
        "model.num_layers=0",
        "rl.seed=-1",
        "sft.batch_size=0",
        "model.norm_eps=0",
        "engine.num_blocks=1",
        "engine.eos_ids=(-1,)",
    ],
)
def test_out_of_range_values_are_refused_where_declared(tmp_path, capsys, assignment):
    assert main(["config", "--set", assignment]) == 2
    _one_line_error(capsys, assignment.split("=")[0].split(".")[-1])


def test_a_damaged_metrics_line_is_moved_aside_on_resume(tmp_path):
    """Issue #34: a torn line in the kept part stayed in metrics.jsonl for good (steps read
    1, ?, 3, ...). It goes to a side file, every record stays byte for byte."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "reward/me\n{"step": 2}\n{"step": 4}\n{"st')
    assert truncate_metrics(tmp_path, 2) == tmp_path / "metrics.jsonl.torn-1"
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'  # 4 and the torn tail: redone
    assert (tmp_path / "metrics.jsonl.torn-1").read_text() == '{"step": 2, "reward/me\n'
    path.write_text('{"step": 1}\n[1]\n\n{"step": 2}\n{"st')
    assert truncate_metrics(tmp_path, 2) == tmp_path / "metrics.jsonl.torn-2"  # 1 is kept
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
    assert (tmp_path / "metrics.jsonl.torn-2").read_text() == "[1]\n"
    assert truncate_metrics(tmp_path, 2) is None  # nothing damaged: no side file


@pytest.mark.slow  # redoes two steps (~20 s on 2 cores); the unit test above is the fast lane's
def test_a_run_with_a_torn_metrics_line_resumes_without_a_gap(run_copy, capsys):
    """A torn write of step 3 before the complete line of step 4; the run resumes from step
    2's checkpoint: metrics.jsonl reads 1, 2, 3, 4, the torn bytes are in the side file, and
    the log says so."""
    path = run_copy / "metrics.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    torn = lines[2][:30] + b"\n"  # cut mid-write; the next writer starts a new line
    path.write_bytes(b"".join([*lines[:2], torn, lines[3]]))
    shutil.rmtree(CheckpointManager(run_copy).path(4))
    assert main(["train", "--resume", str(run_copy), "--quiet"]) == 0
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2, 3, 4]
    assert (run_copy / "metrics.jsonl.torn-1").read_bytes() == torn
    assert "their bytes are in " + str(run_copy / "metrics.jsonl.torn-1") in capsys.readouterr().out


def test_held_out_evaluation_does_not_leak_into_a_resumed_runs_metrics(tmp_path):
    """eval.every evaluates on an engine of its own: the rollout engine's per-step counters of
    a run resumed after an evaluation step equal the uninterrupted run's."""
    sets = ["rl.checkpoint_every=2", "eval.every=2", "eval.prompts=8", "eval.samples=2"]
    whole = Run(make_config("fixture", ["rl.steps=4", *sets]), tmp_path / "whole", progress=False)
    whole.train()
    Run(make_config("fixture", ["rl.steps=2", *sets]), tmp_path / "cut", progress=False).train()
    Run(make_config("fixture", ["rl.steps=4", *sets]), tmp_path / "cut", progress=False).train()

    def lines(run):
        return [json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]

    a, b = lines("whole"), lines("cut")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for x, y in zip(a, b, strict=True):
        assert replayed(x) == replayed(y), x["step"]
    assert a[2]["engine/decode_tokens"] > 0


def test_a_resumed_run_keeps_no_copy_of_the_checkpoint_it_read(run_copy, monkeypatch):
    """A resume reads each array of the weights, m and v straight into an XLA buffer, which the
    trainer keeps as it is: at the first step after it, every array the checkpoint gave is
    alive as the trainer's own, and nothing else of it (no host copy, no second copy)."""
    import gc
    import weakref

    import jax

    from minirl.training.trainer import Trainer

    read, seen = [], []
    restore = CheckpointManager.restore

    def recording_restore(self, *args, **kwargs):
        ckpt = restore(self, *args, **kwargs)
        read.extend(weakref.ref(x) for x in jax.tree.leaves((ckpt.params, ckpt.opt_state)))
        return ckpt

    step = Trainer.train_step_with_prox

    def checking_step(self, *args, **kwargs):
        gc.collect()
        mine = {id(x) for x in jax.tree.leaves((self._params, self._opt_state))}
        alive = [ref() for ref in read if ref() is not None]
        seen.append((len(alive), sum(id(x) in mine for x in alive)))
        return step(self, *args, **kwargs)

    monkeypatch.setattr(CheckpointManager, "restore", recording_restore)
    monkeypatch.setattr(Trainer, "train_step_with_prox", checking_step)
    assert main(["train", "--resume", str(run_copy), "--quiet", "--set", "rl.steps=5"]) == 0
    assert len(read) > 10 and seen[0] == (len(read), len(read))  # all alive, all the trainer's
