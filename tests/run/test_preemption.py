"""Preemption (RLAX §3.2) with real processes: SIGKILL a training run at random moments, resume it,
and compare with a run that was never interrupted.

lockstep: the resumed run must end with bitwise-equal parameters and identical metrics.
async:    not bitwise reproducible, but no prompt may be lost or trained on twice, and every
          batch respects the bound k (the controller asserts it; a violation kills the run).
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from minirl.store.checkpoints import CheckpointManager
from minirl.store.trees import assert_trees_equal

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8


def _cmd(run_dir, extra):
    return [
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
        f"rl.steps={STEPS}",
        "--set",
        "rl.checkpoint_every=1",
        *extra,
    ]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(run_dir, extra):
    subprocess.run(_cmd(run_dir, extra), check=True, env=_env(), capture_output=True, timeout=600)


def _run_with_kills(run_dir, extra, kills: int, seed: int):
    """Start, SIGKILL after a random delay (`kills` times), then run to completion."""
    rng = random.Random(seed)
    killed = 0
    for _ in range(kills):
        proc = subprocess.Popen(
            _cmd(run_dir, extra), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        # Wait until RL has started (metrics appear), then kill somewhere inside the next steps:
        # before, during or after a checkpoint write.
        deadline = time.time() + 300
        metrics = run_dir / "metrics.jsonl"
        while time.time() < deadline and proc.poll() is None:
            if metrics.exists() and metrics.stat().st_size > 0:
                break
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.5))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed += 1
        proc.wait()
    _run(run_dir, extra)
    return killed


def _metrics(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _assert_same_run(ref_dir, killed_dir, *keys):
    """Both runs end at step STEPS with bitwise-equal weights and optimizer state, and log the
    same reward, loss, gradient norm and `keys` at every step."""
    ref, got = CheckpointManager(ref_dir).restore(), CheckpointManager(killed_dir).restore()
    assert ref.step == got.step == STEPS
    assert_trees_equal(got.params, ref.params)
    assert_trees_equal(got.opt_state, ref.opt_state)
    a, b = _metrics(ref_dir), _metrics(killed_dir)
    assert [r["step"] for r in b] == list(range(1, STEPS + 1))
    for x, y in zip(a, b, strict=True):
        for key in ("reward/mean", "train/loss", "train/grad_norm", *keys):
            assert x[key] == y[key], (x["step"], key)


@pytest.mark.slow
@pytest.mark.parametrize("staleness", ["on_policy", "one_step_off"])
def test_lockstep_resume_after_sigkill_is_bitwise_exact(tmp_path, staleness):
    extra = ["--staleness", staleness]
    _run(tmp_path / "ref", extra)
    killed = _run_with_kills(tmp_path / "killed", extra, kills=3, seed=len(staleness))
    assert killed >= 1
    _assert_same_run(tmp_path / "ref", tmp_path / "killed", "mismatch/mean_abs_dlogp")


@pytest.mark.slow
def test_a_lora_run_with_dropout_resumes_bitwise_after_sigkill(tmp_path):
    """Issue #39: kill -9 a LoRA run (rank 8, adapter dropout 0.1, keys from counters) and
    resume it: the adapters, the frozen base and the adapters' optimizer state end bitwise equal
    to the uninterrupted run's."""
    extra = ["--set", "model.lora_rank=8", "--set", "model.lora_dropout=0.1"]
    _run(tmp_path / "ref", extra)
    killed = _run_with_kills(tmp_path / "killed", extra, kills=2, seed=39)
    assert killed >= 1
    _assert_same_run(tmp_path / "ref", tmp_path / "killed", "mismatch/mean_abs_dlogp")
    params = CheckpointManager(tmp_path / "killed").restore().params
    assert params["layers"][0]["attn"]["q_lora_a"].shape[1] == 8  # a LoRA run indeed


# Multi-turn episodes with a calculator (task.tools, docs/multiturn.md) on the fixture model: a
# short warm start on calculator demonstrations makes most episodes call the tool (turns > 1).
TOOL_RUN = [
    *("--set", "task.name=arithmetic", "--set", 'task.args={"max_digits":1,"max_operands":3}'),
    *("--set", "task.tools=calc", "--set", "engine.cache_len=64"),
    *("--set", "engine.prefill_buckets=(16,32)", "--set", "sft.steps=40"),
]
# Your own agent (issue #47, minirl/agents/): the calculator agent of experiments/calc_agent.py
# with the real openai client, warm-started on demonstrations it lays out itself.
AGENT_RUN = [
    *("--agent", f"{ROOT}/experiments/calc_agent.py:solve"),
    *("--set", "task.name=arithmetic", "--set", 'task.args={"max_digits":1,"max_operands":3}'),
    *("--set", "engine.cache_len=64", "--set", "engine.prefill_buckets=(16,32)"),
    *("--set", "sft.steps=40"),
]


@pytest.mark.slow
def test_agent_run_resumes_bitwise_after_sigkill(tmp_path):
    """Issue #47: kill -9 while agent episodes are in flight (an agent between its calls, a call
    in the engine) and resume: the lost episodes run again from their start with fresh agents
    and replay to the same tokens (keys per episode, call and position; the runner's barrier
    makes the engine's batches independent of timing), so the run ends bitwise equal; an
    episode is never half-counted (it becomes a rollout only when its agent returns)."""
    _run(tmp_path / "ref", AGENT_RUN)
    killed = _run_with_kills(tmp_path / "killed", AGENT_RUN, kills=3, seed=47)
    assert killed >= 1
    summary = json.loads((tmp_path / "ref" / "summary.json").read_text())
    assert summary["before"]["turns"] > 1.2  # the agent's calls really are several per episode
    _assert_same_run(tmp_path / "ref", tmp_path / "killed", "length/mean", "turns/mean")


@pytest.mark.slow
def test_async_agent_run_loses_and_repeats_no_episode(tmp_path):
    """The async scheduler over agent episodes, killed twice and resumed: every episode's
    prompt is trained once or accounted for, within the bounds k and eta."""
    run_dir = tmp_path / "async_agent"
    _run_with_kills(run_dir, [*AGENT_RUN, *ASYNC], kills=2, seed=8)
    _assert_every_prompt_accounted_for(run_dir)


@pytest.mark.slow
def test_multi_turn_run_resumes_bitwise_after_sigkill(tmp_path):
    """Issue #23: kill -9 while episodes are in flight (mid-episode: a held slot waiting for its
    observation, or a later turn decoding) and resume; the episodes are replayed to the same
    tokens (counter-based keys per episode position), so the run ends bitwise equal."""
    _run(tmp_path / "ref", TOOL_RUN)
    killed = _run_with_kills(tmp_path / "killed", TOOL_RUN, kills=3, seed=23)
    assert killed >= 1
    summary = json.loads((tmp_path / "ref" / "summary.json").read_text())
    assert summary["before"]["turns"] > 1.2  # the episodes really are multi-turn
    _assert_same_run(tmp_path / "ref", tmp_path / "killed", "length/mean", "turns/mean")


ASYNC = ["--set", "rl.scheduler=async", "--set", "rl.max_lag=3", "--set", "rl.eta=2"]


@pytest.mark.slow
def test_async_resume_loses_and_repeats_no_prompt(tmp_path):
    run_dir = tmp_path / "async"
    _run_with_kills(run_dir, ASYNC, kills=2, seed=7)
    _assert_every_prompt_accounted_for(run_dir)


def _assert_every_prompt_accounted_for(run_dir):
    """Trained once each, or discarded, filtered, buffered or in flight: nothing lost, nothing
    trained twice (and the controller asserted the bound k at every step)."""
    ckpt = CheckpointManager(run_dir).restore()
    assert ckpt.step == STEPS
    ctl = ckpt.controller_state["controller"]
    trained = np.asarray(ctl["trained_uids"]).tolist()
    assert len(trained) == STEPS * 8  # fixture preset: 8 prompts per step
    assert len(set(trained)) == len(trained), "a prompt was trained on twice"
    c = ctl["counters"]
    buffered = sum(1 for _ in ctl["buffer"])
    in_flight = len(ctl["in_flight"])
    # Every issued prompt is accounted for: trained, discarded as stale, filtered, or still queued.
    issued = ctl["mixture"]["position"]
    assert (
        issued
        == c["groups_trained"] + c["groups_stale"] + c["groups_filtered"] + buffered + in_flight
    )


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["model.lora_rank=8"]], ids=["full", "lora"])
def test_dead_engine_process_is_restarted_and_its_work_reissued(tmp_path, monkeypatch, extra):
    """rl.workers=process: kill the engine's process mid-run; the controller restarts it, reloads
    its weights, re-issues the requests, and (counter-based RNG) ends bitwise where an
    undisturbed run ends. With LoRA the fresh process gets the whole weights (base and current
    adapters), then adapters-only versions again."""
    import dataclasses
    import threading

    from minirl.control.workers import ProcessWorker
    from minirl.run.presets import make_config
    from minirl.run.runner import Run

    sets = ["rl.steps=4", "rl.checkpoint_every=1", "rl.workers=process", *extra]
    cfg = make_config("fixture", sets)
    Run(cfg, tmp_path / "ref", log=lambda *a: None, progress=False).train()

    started = []
    original = ProcessWorker.start

    def start(self):
        started.append(original(self))
        return started[-1]

    monkeypatch.setattr(ProcessWorker, "start", start)

    def kill_engine_once():
        deadline = time.time() + 300
        while time.time() < deadline:
            if (tmp_path / "killed" / "metrics.jsonl").exists():
                engine = next(w for w in started if w.name == "engine")
                os.kill(engine.pid, signal.SIGKILL)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_engine_once)
    killer.start()
    summary = Run(cfg, tmp_path / "killed", log=lambda *a: None, progress=False).train()
    killer.join()
    assert summary["counters"]["worker_restarts"] >= 1
    ref = CheckpointManager(tmp_path / "ref").restore()
    got = CheckpointManager(tmp_path / "killed").restore()
    assert_trees_equal(got.params, ref.params)
    assert dataclasses.is_dataclass(cfg)


@pytest.mark.slow
def test_async_run_with_its_engine_in_a_process_survives_the_engine_dying(tmp_path, monkeypatch):
    """rl.workers=process with the async scheduler: the rollout thread drives the engine in its
    own process (it used to stay in this one). Kill that process mid-run: the thread restarts
    it, reloads the weights it held and re-submits what was in flight; every prompt trained once."""
    import threading

    from minirl.control.workers import ProcessWorker, from_plain
    from minirl.run.presets import make_config
    from minirl.run.runner import Run

    cfg = make_config(
        "fixture",
        [
            "rl.steps=6",
            "rl.checkpoint_every=6",
            "rl.workers=process",
            "rl.scheduler=async",
            "rl.eta=1",
            "rl.max_lag=2",
        ],
    )
    started = []
    original = ProcessWorker.start

    def start(self):
        started.append(original(self))
        return started[-1]

    monkeypatch.setattr(ProcessWorker, "start", start)

    def kill_engine_once():
        deadline = time.time() + 300
        while time.time() < deadline:
            if (tmp_path / "metrics.jsonl").exists():
                os.kill(next(w for w in started if w.name == "engine").pid, signal.SIGKILL)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_engine_once)
    killer.start()
    summary = Run(cfg, tmp_path, log=lambda *a: None, progress=False).train()
    killer.join()
    assert summary["counters"]["worker_restarts"] >= 1
    ctl = from_plain(CheckpointManager(tmp_path).restore().controller_state)["controller"]
    trained = [int(u) for u in ctl["trained_uids"]]
    assert len(trained) == 6 * cfg.rl.prompts_per_step and len(set(trained)) == len(trained)
