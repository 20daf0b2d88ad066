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
        assert set(result) == {"j1_k1", "j1_k2", "j4_k8", "j4_k16", "plots"}
        assert result["j1_k1"]["mean_lag"] == 0.0  # on-policy: every token from the current version
        assert result["j4_k16"]["mean_lag"] > 0.0
    else:
        assert {"sync_split", "async_split", "speedup"} <= set(result)
    assert any(p.suffix == ".png" for p in tmp_path.iterdir())
