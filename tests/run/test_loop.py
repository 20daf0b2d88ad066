"""The step loop every run uses (minirl/run/loop.py): however a run ends — its steps done, its
time budget, Ctrl-C, an error — the weights it reports (summary.json's "after") are in a
checkpoint that `minirl eval` reads, and a run resumed from it ends where an undisturbed one does.
Also: the cosine schedule's length follows rl.steps unless set."""

import json
import os
import re
import signal

import pytest

from minirl.cli import main
from minirl.configlib import ConfigError
from minirl.control.controller import Controller
from minirl.measure.metrics_log import replayed
from minirl.run import run_dir as run_dir_module
from minirl.run.loop import check_batch
from minirl.run.presets import make_config
from minirl.run.runner import Run
from minirl.store.checkpoints import CheckpointManager
from minirl.store.trees import assert_trees_equal
from minirl.training.optimizer import learning_rate

SMALL = ["eval.prompts=8", "eval.samples=2", "rl.checkpoint_every=10"]


def _run(path, *sets) -> Run:
    return Run(make_config("fixture", [*SMALL, *sets]), path, progress=False, log=lambda *a: None)


def _metrics(path) -> list[dict]:
    return [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]


def test_a_run_stopped_by_its_time_budget_checkpoints_the_weights_it_reports(tmp_path, capsys):
    """rl.time_budget stops after step 1 (no checkpoint was due before step 10): step 1 is
    checkpointed, and `minirl eval RUN` scores exactly summary.json's "after"."""
    run_dir = tmp_path / "run"
    sets = [f"--set={s}" for s in (*SMALL, "rl.steps=4", "rl.time_budget=1e-9")]
    assert main(["train", "--preset", "fixture", "--run-dir", str(run_dir), "--quiet", *sets]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped"] == "time_budget" and summary["counters"]["steps"] == 1
    assert CheckpointManager(run_dir).all_steps() == [1]
    capsys.readouterr()
    assert main(["eval", str(run_dir)]) == 0
    assert json.loads(capsys.readouterr().out) == {"step": 1, **summary["after"]}
    # the schedule's length the run used is recorded beside the config
    assert json.loads((run_dir / "config.json").read_text())["resolved"] == {
        "trainer.total_steps": 4
    }


def _interrupt_after_step_1(monkeypatch, raise_directly: bool):
    step = run_dir_module.StepRecorder.step

    def then_ctrl_c(self, metrics):
        step(self, metrics)
        if self.controller.counters.steps == 1:
            if raise_directly:  # Ctrl-C where no handler defers it (not the main thread)
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(run_dir_module.StepRecorder, "step", then_ctrl_c)


def test_ctrl_c_finishes_the_step_checkpoints_and_evaluates_it(tmp_path, monkeypatch):
    """The first Ctrl-C stops the run after the step under way, as the time budget does."""
    _interrupt_after_step_1(monkeypatch, raise_directly=False)
    summary = _run(tmp_path, "rl.steps=3").train()
    assert summary["stopped"] == "interrupted" and summary["counters"]["steps"] == 1
    assert CheckpointManager(tmp_path).all_steps() == [1]
    assert json.loads((tmp_path / "summary.json").read_text())["after"] == summary["after"]


def test_a_keyboard_interrupt_between_steps_leaves_the_last_step_checkpointed(
    tmp_path, monkeypatch
):
    _interrupt_after_step_1(monkeypatch, raise_directly=True)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, "rl.steps=3").train()
    assert CheckpointManager(tmp_path).all_steps() == [1]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """An undisturbed 3-step run (its only checkpoint: step 3)."""
    path = tmp_path_factory.mktemp("whole")
    _run(path, "rl.steps=3").train()
    return path


@pytest.mark.parametrize(
    "where, kept",
    [("_take_batch", [1]), ("_batch_metrics", [])],
    ids=["before_training", "after_training"],
)
def test_an_error_inside_a_step_keeps_the_last_whole_step_and_resumes_exactly(
    whole, tmp_path, monkeypatch, where, kept
):
    """An error inside step 2: before the trainer trained, step 1 is checkpointed from the state
    the loop kept after it (the controller's own state is half-way into step 2), and the
    resumed run ends bit for bit as the undisturbed one; after the trainer trained, its weights
    are step 2's and nothing is written in step 1's name."""
    original = getattr(Controller, where)

    def fails_in_step_2(self, *args):
        if self.counters.steps == 1:
            raise RuntimeError("a bug in step 2")
        return original(self, *args)

    monkeypatch.setattr(Controller, where, fails_in_step_2)
    with pytest.raises(RuntimeError, match="a bug in step 2"):
        _run(tmp_path, "rl.steps=3").train()
    assert CheckpointManager(tmp_path).all_steps() == kept
    monkeypatch.undo()
    _run(tmp_path, "rl.steps=3").train()
    got, ref = CheckpointManager(tmp_path).restore(), CheckpointManager(whole).restore()
    assert got.step == ref.step == 3
    assert_trees_equal(got.params, ref.params)
    assert_trees_equal(got.opt_state, ref.opt_state)
    assert [replayed(r) for r in _metrics(tmp_path)] == [replayed(r) for r in _metrics(whole)]


def test_each_step_logs_the_peak_resident_memory_so_far(whole):
    """memory/peak_rss_gb: this process's peak RSS (getrusage), in GB, at each step: a few
    hundred MB at least (the runtime alone), never falling, at most what the OS reports now."""
    from minirl.run.memory import peak_rss_gb

    peaks = [r["memory/peak_rss_gb"] for r in _metrics(whole)]
    now = peak_rss_gb()
    assert len(peaks) == 3 and 0.1 < peaks[0] and peaks == sorted(peaks) and peaks[-1] <= now


def test_the_cosine_schedule_follows_rl_steps_unless_set():
    """trainer.total_steps = 0 (the default) is rl.steps, derived, so the config hash (what a
    resume is checked against) does not move with rl.steps; set, it stays."""
    from minirl.configlib import config_hash
    from minirl.run.run_dir import RESUMABLE_CHANGES

    cosine = ["trainer.schedule=cosine", "trainer.learning_rate=1.0", "trainer.min_lr_ratio=0.25"]
    cfg = make_config("fixture", [*cosine, "rl.steps=7"])
    assert cfg.trainer.total_steps == 0 and cfg.trainer_config().total_steps == 7
    assert learning_rate(cfg.trainer_config(), 7) == 0.25  # the bottom of the decay at step 7
    assert learning_rate(cfg.trainer_config(), 3) > 0.25
    longer = make_config("fixture", [*cosine, "rl.steps=70"])
    assert config_hash(cfg, ignore=RESUMABLE_CHANGES) == config_hash(
        longer, ignore=RESUMABLE_CHANGES
    )
    fixed = make_config("fixture", [*cosine, "rl.steps=7", "trainer.total_steps=5"])
    assert fixed.trainer_config().total_steps == 5
    assert make_config("countdown", ["rl.steps=60"]).trainer_config().total_steps == 300
    with pytest.raises(ValueError, match="cosine schedule needs its length"):
        learning_rate(cfg.trainer, 3)  # a TrainerConfig alone must be given the length


@pytest.mark.parametrize(
    "sets, message",
    [
        (["trainer.num_minibatches=100"], "num_minibatches=100 is more than the 32 rows"),
        (["rl.group_size=1"], "rl.group_size=1 with rl.loss=grpo: .* RL would learn nothing"),
        (["rl.group_size=1", "rl.loss=rloo"], "rl.loss=rloo"),
    ],
)
def test_a_batch_the_loss_cannot_use_is_refused_before_any_work(tmp_path, capsys, sets, message):
    """More mini-batches than a step's rows failed at step 1, after the warm start and the first
    evaluation; a group of one under a group-relative advantage (GRPO, RLOO, Dr. GRPO, ...) ran
    to the end with every advantage 0. Both are one-line errors before anything is written; PPO's
    advantage (GAE of the reward) needs no group."""
    argv = ["train", "--preset", "fixture", "--quiet", "--run-dir", str(tmp_path / "r")]
    assert main([*argv, *[a for s in sets for a in ("--set", s)]]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "r").exists()
    check_batch(make_config("fixture", ["rl.group_size=1", "rl.loss=ppo"]))


def test_a_step_that_cannot_fit_in_memory_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """rl.group_size=100000 ran "forever": the rollouts of a step are one engine call, and the
    batch they make is held at once (on countdown, 3.2 million rollouts: 25 minutes of rollouts
    with nothing shown, and about 30 GB). Fixture: 8 prompts x 100,000 = 800,000 rollouts of
    8,000 bytes + up to 32 positions x 36 bytes = 7.3216 GB; refused on a machine of 7 GB,
    taken on one of 8 GB."""
    from minirl.run import loop

    cfg = make_config("fixture", ["rl.group_size=100000"])
    monkeypatch.setattr(loop, "machine_memory_bytes", lambda: 7_000_000_000)
    with pytest.raises(ConfigError, match=r"= 800,000 rollouts .* about 7\.32 GB .* 7\.00 GB"):
        check_batch(cfg)
    monkeypatch.setattr(loop, "machine_memory_bytes", lambda: 8_000_000_000)
    check_batch(cfg)
    monkeypatch.setattr(loop, "machine_memory_bytes", lambda: None)  # not reported: no check
    check_batch(cfg)
    monkeypatch.undo()  # this machine's own memory: a billion samples fit on none
    argv = ["train", "--preset", "fixture", "--quiet", "--run-dir", str(tmp_path / "r")]
    assert main([*argv, "--set", "rl.group_size=1000000000"]) == 2
    err = capsys.readouterr().err
    assert "lower rl.group_size or rl.prompts_per_step" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_long_generation_shows_a_bar_of_its_rollouts(capsys, monkeypatch):
    """A step's rollouts are one engine call: the RL bar moved only when it ended. RolloutBar
    (what `minirl train` wraps an engine in this process with) counts them as they finish,
    once a call has run 5 seconds; a shorter one draws nothing."""
    from minirl.run.runner import RolloutBar

    clock = [0.0]  # tqdm's clock: every rollout takes 1.5 s

    class Engine:
        slots = 8

        def generate(self, requests, progress=None):
            for _ in requests:
                clock[0] += 1.5
                progress(1)
            return [r * 10 for r in requests]

    monkeypatch.setattr("tqdm.std.time", lambda: clock[0])
    engine = RolloutBar(Engine())
    assert engine.slots == 8  # everything else is the engine's
    assert engine.generate(iter([1, 2])) == [10, 20]  # 3 s: no bar
    assert "rollouts" not in capsys.readouterr().err
    assert engine.generate(range(6)) == [0, 10, 20, 30, 40, 50]  # 9 s
    assert re.search(r"rollouts: +\d+%.*\| [4-6]/6", capsys.readouterr().err)
