"""Smoke test of scale/launch.py: the localhost recipe of scale/README.md, as four processes on
127.0.0.1 — verifier service, engine job (2 fake CPU devices, tensor=2), trainer job (2 fake
CPU devices, fsdp=2) and the controller — running two RL steps of the fixture task with the
weights travelling by reference through a TensorStore store."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETS = ["--set", "rl.prompts_per_step=4", "--set", "rl.group_size=4", "--set", "engine.slots=16"]


def _start(args: list[str], env: dict, pattern: str, timeout: float = 300.0):
    """Start `python -m scale.launch ARGS` in its own process group; wait for `pattern` in its
    output and return (process, the matched address)."""
    proc = subprocess.Popen([sys.executable, "-m", "scale.launch", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 0.2)[0]:
            out += os.read(proc.stdout.fileno(), 4096)
            match = re.search(pattern.encode(), out)
            if match:
                return proc, match.group(1).decode()
    proc.kill()
    raise RuntimeError(f"{args[0]} did not start: {out.decode(errors='replace')[-3000:]}")


@pytest.mark.slow
def test_four_processes_on_localhost_run_two_steps(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(MINIRL_TOKEN="smoke-test-secret", PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    weights = f"file://{tmp_path}/weights"
    procs = []
    try:
        verifier, url = _start(["verifier", "--host", "127.0.0.1", "--port", "0", "--workers", "1",
                                "--verifier", "task:fixture", "--repository", str(tmp_path / "vdata")],
                               env, r"on (http://127\.0\.0\.1:\d+)")  # fmt: skip
        procs.append(verifier)
        jobs = {}
        for role, mesh in (("engine", "tensor=2"), ("trainer", "fsdp=2")):
            proc, address = _start([role, "--listen", "127.0.0.1:0", "--weights", weights, "--preset",
                                    "fixture", *SETS, "--cpu-devices", "2", "--mesh", mesh],
                                   env, r"listening on (127\.0\.0\.1:\d+)")  # fmt: skip
            procs.append(proc)
            jobs[role] = address
        controller = subprocess.run(
            [sys.executable, "-m", "scale.launch", "controller", "--engine", jobs["engine"],
             "--trainer", jobs["trainer"], "--verifier-url", url, "--weights", weights,
             "--run-dir", str(tmp_path / "run"), "--preset", "fixture", *SETS, "--steps", "2",
             "--shutdown-workers"],
            cwd=ROOT, env=env, capture_output=True, timeout=600)  # fmt: skip
        assert controller.returncode == 0, (
            controller.stdout.decode()[-3000:] + controller.stderr.decode()[-3000:]
        )
        for proc in procs[1:]:  # engine and trainer stop when the controller says so
            assert proc.wait(60) == 0
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["steps"] == 2 and summary["version"] == 2
        assert summary["weights"][-1] == 2  # the trainer job published v2; old ones released
        assert summary["verifier"]["requests"] >= 2 and summary["verifier"]["unscored"] == 0
        lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in lines] == [1, 2]
        assert all(0.0 <= json.loads(line)["reward/mean"] <= 1.0 for line in lines)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            proc.stdout.close()
