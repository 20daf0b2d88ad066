"""The experiment scripts run end to end in their fast modes (numbers are not checked here)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("what", ["curves", "speedup"])
def test_staleness_experiment_fast_mode(tmp_path, what):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "experiments" / "staleness.py"),
            what,
            "--fast",
            "--out",
            str(tmp_path),
        ],
        check=True,
        env=env,
        capture_output=True,
        timeout=900,
    )
    result = json.loads((tmp_path / f"{what}.json").read_text())
    if what == "curves":
        assert {"j1_k1", "j1_k2", "j4_k8", "j4_k16", "plots"} <= set(result)
        assert (
            result["j1_k1"]["max_step_mean_lag"] == 0.0
        )  # on-policy: every token from the current version
        assert result["j4_k16"]["mean_lag"] > 0.0
    else:
        for arm in ("sync", "sync_1core", "async", "async_1core"):
            split = result[arm]["split"]
            assert 0.0 < split["occupancy"] <= 1.0
            assert split["engine"]["generate"] > 0 and split["trainer"]["train"] > 0
            assert [e["step"] for e in result[arm]["heldout"]] == [0, 2, 4]  # base + checkpoints
        assert result["sync"]["split"]["overlap"] <= 1.0 + 1e-6  # lockstep: one part at a time
        assert result["sync"]["time_to_target"]["train_reward"] is not None  # reaches its own final
    assert any(p.suffix == ".png" for p in tmp_path.iterdir())


def _staleness_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "staleness", ROOT / "experiments" / "staleness.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_staleness_reward_smoothing_and_time_to_target():
    import numpy as np

    s = _staleness_module()
    assert s.trailing_mean(np.array([1.0, 2.0, 3.0, 4.0]), 2).tolist() == [1.0, 1.5, 2.5, 3.5]
    times = np.array([10.0, 20.0, 30.0, 40.0])
    assert s.first_time(times, np.array([0.1, 0.5, 0.4, 0.6]), 0.45) == 20.0
    assert s.first_time(times, np.array([0.1, 0.5, 0.4, 0.6]), 0.45, start=2) == 40.0
    assert s.first_time(times, np.array([0.1, 0.2, 0.3, 0.4]), 0.45) is None
    # RL time starts at the first step's start: wall time of step 1 minus its duration
    recs = [{"wall_time": 105.0, "time/step": 5.0}, {"wall_time": 108.0, "time/step": 3.0}]
    assert s.elapsed(recs).tolist() == [5.0, 8.0]
    assert s.value_at(times, np.array([0.1, 0.5, 0.4, 0.6]), 35.0) == 0.4
    assert s.value_at(times, np.array([0.1, 0.5, 0.4, 0.6]), 5.0) == 0.1  # before the first: first


def _rl_vs_sft_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "rl_vs_sft", ROOT / "experiments" / "rl_vs_sft.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["rl_vs_sft"] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _reachable(numbers: list[int], ops: str) -> set:
    """Every value of an expression using each number once (brute force over splits)."""
    import itertools
    from fractions import Fraction

    def values(items):
        if len(items) == 1:
            return {Fraction(items[0])}
        out = set()
        for k in range(1, len(items)):
            for a in values(items[:k]):
                for b in values(items[k:]):
                    out |= {a + b} if "+" in ops else set()
                    out |= {a - b} if "-" in ops else set()
                    out |= {a * b} if "*" in ops else set()
        return out

    return set().union(*(values(list(p)) for p in itertools.permutations(numbers)))


def test_rl_vs_sft_decoys_and_demonstration_rate(tmp_path):
    from minirl.run.presets import make_config
    from minirl.run.runner import Run

    m = _rl_vs_sft_module()
    run = Run(make_config("countdown", ["eval.prompts=24"]), tmp_path, progress=False)
    decoys = m.decoy_prompts(run)
    truth = m.heldout_prompts(run.task, 24)
    assert [d.uid for d in decoys] == [p.uid for p in truth]
    for d, p in zip(decoys, truth, strict=True):
        numbers, target = d.text.split(" -> ")
        assert [int(x) for x in numbers.split()] == p.meta["numbers"]
        decoy = int(target.rstrip(":"))
        assert decoy != p.meta["target"] and decoy in _reachable(p.meta["numbers"], "+-")
        assert d.tokens.tolist() == run.tokenizer.encode(d.text).tolist() != p.tokens.tolist()
    # With "+" only, every expression over all the numbers is their sum, which is the target:
    # the demonstrations always hit it (and no prompt has a decoy, so it keeps its target).
    plus = Run(
        make_config("countdown", ["eval.prompts=8", "task.args.ops=+"]), tmp_path, progress=False
    )
    assert m.demonstration_pass1(plus, samples=4) == 1.0
    assert [d.text for d in m.decoy_prompts(plus)] == [
        p.text for p in m.heldout_prompts(plus.task, 8)
    ]
    assert 0.2 < m.demonstration_pass1(run, samples=16) < 0.45  # docs/results.md: 0.304 at 256 x 64


def test_rl_vs_sft_cpu_clock_does_not_count_waiting():
    import time

    clock = _rl_vs_sft_module().Clock("cpu")
    clock.start()
    time.sleep(0.3)
    clock.stop()
    assert clock.totals["wall"] >= 0.3 and clock.spent == clock.totals["cpu"] < 0.1


@pytest.mark.slow
def test_rl_vs_sft_fast_mode(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "experiments" / "rl_vs_sft.py"),
            "--fast",
            "--seeds",
            "0",
            "--budget",
            "4",
            "--out",
            str(tmp_path),
        ],
        check=True,
        env=env,
        capture_output=True,
        timeout=900,
    )
    result = json.loads((tmp_path / "rl_vs_sft.json").read_text())
    r = result["per_seed"]["0"]
    for arm in ("rl", "sft"):
        curve = r[arm]["curve"]
        assert curve[0]["pass@1"] == r["base"]["pass@1"]  # the same engine keys: base == step 0
        assert curve[-1]["t"] >= 4.0 and r[arm]["steps"] == curve[-1]["steps"] > 0
        assert 0.0 <= r[arm]["final"]["decoy_pass@1"] <= 1.0
    assert (tmp_path / "rl_vs_sft.png").stat().st_size > 0


@pytest.mark.slow
def test_apart_experiment_fast_mode(tmp_path):
    """experiments/apart.py: the four arms run (three on Ray actors pinned to one core each) and
    the pinning held: each actor's threads were seen running only on its own core."""
    pytest.importorskip("ray")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "experiments" / "apart.py"),
            "--fast",
            "--steps",
            "4",
            "--checkpoint-every",
            "2",
            "--heldout-prompts",
            "8",
            "--heldout-samples",
            "1",
            "--out",
            str(tmp_path / "runs"),
            "--results",
            str(tmp_path),
        ],
        check=True,
        env=env,
        capture_output=True,
        timeout=1200,
    )
    result = json.loads((tmp_path / "apart.json").read_text())
    assert result["ideal_speedup"] >= 1.0
    for arm in ("colocated_sync", "apart_sync", "apart_eta1", "apart_eta2"):
        assert [e["step"] for e in result[arm]["heldout"]] == [0, 2, 4]
        if arm != "colocated_sync":
            assert set(result[arm]["cores_seen"]["engine0"]) == {"0"}
            assert set(result[arm]["cores_seen"]["trainer"]) == {"1"}
            assert result[arm]["cpu_per_wall"]["trainer"] <= 1.05  # one core at most
    assert (tmp_path / "apart.png").exists()


@pytest.mark.slow
def test_tools_experiment_fast_mode(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    script = str(ROOT / "experiments" / "tools.py")
    subprocess.run(
        [sys.executable, script, "--fast", "--out", str(tmp_path)],
        check=True,
        env=env,
        capture_output=True,
        timeout=900,
    )
    result = json.loads((tmp_path / "tools.json").read_text())
    calc = result["seeds"]["0"]["calc"]
    assert calc["after"]["calls"] > 0 and len(calc["train_rewards"]) == 2


@pytest.mark.slow
def test_sim_papers_fast_mode(tmp_path):
    """experiments/sim_papers.py: every study runs on the simulator and writes its figures."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    script = str(ROOT / "experiments" / "sim_papers.py")
    cmd = [sys.executable, script, "--fast", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=1200)
    result = json.loads((tmp_path / "papers_fast.json").read_text())
    assert result["areal"]["32"]["speedup"] > 1.0  # async beats sync on long-tailed lengths
    assert set(result["rlax"]) == {"stale-16", "stale-32"}
    assert result["pipeline"]["max_lag=1"]["lag_share"] == [1.0]  # on-policy: every token lag 0
    for png in ("areal_sync_vs_async.png", "rlax_stale16_vs_stale32.png", "pipelinerl_lag.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_agent_experiment_fast_mode(tmp_path):
    """experiments/agent.py: `minirl train --agent` (Run) with the openai-SDK calculator agent."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), MINIRL_CACHE=str(tmp_path / "cache"))
    script = str(ROOT / "experiments" / "agent.py")
    cmd = [sys.executable, script, "--fast", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=900)
    result = json.loads((tmp_path / "agent.json").read_text())
    (seed,) = result["seeds"].values()
    assert 0.0 <= seed["before"]["pass@1"] <= 1.0 and 0.0 <= seed["after"]["pass@1"] <= 1.0
    assert seed["before"]["turns"] >= 1.0 and set(result["claim_holds"]) == {"0"}
