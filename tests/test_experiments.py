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
    subprocess.run([sys.executable, str(ROOT / "experiments" / "staleness.py"), what, "--fast",
                    "--out", str(tmp_path)], check=True, env=env, capture_output=True, timeout=900)
    result = json.loads((tmp_path / f"{what}.json").read_text())
    if what == "curves":
        assert {"j1_k1", "j1_k2", "j4_k8", "j4_k16", "plots"} <= set(result)
        assert result["j1_k1"]["max_step_mean_lag"] == 0.0  # on-policy: every token from the current version
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

    spec = importlib.util.spec_from_file_location("staleness", ROOT / "experiments" / "staleness.py")
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
