"""`minirl train --agent` end to end (slow): the fixture model on arithmetic, the calculator agent
of experiments/calc_agent.py (the real `openai` client), warm-started on demonstrations the
agent lays out itself. With the engine (and so the endpoint and the agents) in this process and
in a worker process, the two runs are bitwise equal, and the episodes are multi-turn. Resume
after kill -9 and the async bounds: tests/run/test_preemption.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "experiments" / "calc_agent.py"
AGENT_RUN = [
    *("--agent", f"{AGENT}:solve"),
    *("--set", "task.name=arithmetic", "--set", 'task.args={"max_digits":1,"max_operands":3}'),
    *("--set", "engine.cache_len=64", "--set", "engine.prefill_buckets=(16,32)"),
    *("--set", "sft.steps=40"),
]


@pytest.mark.slow
def test_minirl_train_with_an_agent_in_process_and_in_a_worker_process(tmp_path):
    base = [sys.executable, "-m", "minirl.cli", "train", "--preset", "fixture", "--quiet"]
    base += [*AGENT_RUN, "--set", "rl.steps=3", "--set", "eval.prompts=16"]
    runs = {}
    for workers in ("inprocess", "process"):
        run_dir = tmp_path / workers
        cmd = [*base, "--run-dir", str(run_dir), "--set", f"rl.workers={workers}"]
        environ = {**os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run(cmd, check=True, env=environ, capture_output=True, timeout=900)
        runs[workers] = [
            json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()
        ]
    summary = json.loads((tmp_path / "inprocess" / "summary.json").read_text())
    assert summary["before"]["turns"] > 1.2  # the model calls the agent's calculator
    for a, b in zip(runs["inprocess"], runs["process"], strict=True):
        for key in ("reward/mean", "train/loss", "train/grad_norm", "turns/mean"):
            assert a[key] == b[key], key
