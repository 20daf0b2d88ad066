"""The side-by-side benchmark's driver (benchmarks/trl_side_by_side.py): how it starts each
library (default lane, no library run), and end to end on the tiny model: workload files, minirl
and TRL in their own processes, the summaries and ratios (slow: two fresh processes, minirl's
compiles; needs the `reference` extra, which builds and runs the TRL side).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import trl_side_by_side as bench  # noqa: E402


def test_each_library_runs_in_its_users_environment_and_every_pair_is_compared(monkeypatch):
    """No thread-policy variable is set for any child; Tunix runs by its own interpreter with
    nothing of minirl on its path; each round compares every minirl variant with every peer."""
    seen = []

    def fake_run(argv, env, **kw):
        seen.append((argv, env))
        return subprocess.CompletedProcess(argv, 0, bench.RESULT + json.dumps(TIMINGS), "")

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    variants = ["minirl", "minirl-f32", "trl", "tunix"]
    (res,) = bench.side_by_side(
        "/w",
        variants,
        1,
        dict(bench.WORK),
        log=lambda _: None,
        tunix_python="/venv-tunix/bin/python",
        tunix_env={"MALLOC_ARENA_MAX": "1"},
    )
    assert sorted(k for k in res if " / " in k) == [
        "minirl / trl",
        "minirl / tunix",
        "minirl-f32 / trl",
        "minirl-f32 / tunix",
    ]
    assert res["minirl / tunix"]["step"] == pytest.approx(1.0)  # the same fake timings
    assert res["tunix"]["peak_rss_gb"] == 3.5  # each child's own peak memory, as it reported it
    assert bench.table([res]).splitlines()[2].endswith("| 3.5, 3.5 |")
    for _, env in seen:
        assert not any(k.startswith(("OMP_", "MKL_")) for k in set(env) - set(os.environ))
    tunix_argv, tunix_env = seen[-1]
    assert tunix_argv[:2] == [
        "/venv-tunix/bin/python",
        str(bench.ROOT / "benchmarks" / "tunix_child.py"),
    ]
    assert "PYTHONPATH" not in tunix_env
    assert tunix_env["MALLOC_ARENA_MAX"] == "1"  # --tunix-env reaches the Tunix run alone
    assert all("MALLOC_ARENA_MAX" not in env for _, env in seen[:-1])
    assert seen[0][1]["PYTHONPATH"].startswith(str(bench.ROOT))
    with pytest.raises(ValueError, match="--tunix-python"):
        bench.run_child(Path("/w"), "tunix", bench.WORK)


def test_a_run_killed_for_memory_is_recorded_and_the_others_go_on(monkeypatch):
    """One library's run killed (SIGKILL, as the OOM killer sends it) costs its own row only:
    the failure is logged and tabled, every other variant still runs and is compared."""

    def fake_run(argv, env, **kw):
        if "tunix_child.py" in " ".join(argv):
            return subprocess.CompletedProcess(argv, -9, "", "Killed")
        return subprocess.CompletedProcess(argv, 0, bench.RESULT + json.dumps(TIMINGS), "")

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    logged = []
    rounds = bench.side_by_side(
        "/w", ["minirl", "trl", "tunix"], 2, dict(bench.WORK), log=logged.append, tunix_python="py"
    )
    for res in rounds:
        assert res["tunix"] == {"failed": "tunix failed (exit -9, killed: out of memory?)"}
        assert res["minirl / tunix"] is None
        assert res["minirl / trl"]["step"] == pytest.approx(1.0)
    assert sum("tunix failed" in x for x in logged) == 2
    lines = bench.table(rounds).splitlines()
    assert len(lines) == 2 + 4
    assert (
        lines[3]
        == "| 1 | minirl / tunix | 2.00 | tunix failed (exit -9, killed: out of memory?) |"
        + " |" * 5
    )


def test_the_command_prints_the_table_and_exits_1_when_a_run_failed(monkeypatch, tmp_path, capsys):
    ok = bench.summarize(TIMINGS)
    rounds = [{"round": 1, "minirl": ok, "tunix": {"failed": "tunix failed (exit -9)"}}]
    rounds[0]["minirl / tunix"] = None
    monkeypatch.setattr(bench, "make_workload", lambda *a: None)
    monkeypatch.setattr(bench, "machine", lambda: {})
    monkeypatch.setattr(bench, "side_by_side", lambda *a, **k: rounds)
    argv = ["--dir", str(tmp_path), "--variants", "minirl,tunix", "--tunix-python", "py"]
    assert bench.main([*argv, "--json", str(tmp_path / "r.json")]) == 1
    out = capsys.readouterr().out
    assert "| 1 | minirl / tunix | 2.00 | tunix failed (exit -9) |" in out
    assert out.strip().endswith("failed runs: round 1 tunix")
    assert json.loads((tmp_path / "r.json").read_text())["rounds"] == rounds  # nothing lost
    rounds[0]["tunix"] = ok
    rounds[0]["minirl / tunix"] = bench.ratios(ok, ok)
    assert bench.main(argv) == 0


@pytest.mark.parametrize("bad", ["MALLOC_ARENA_MAX", "=1", "A B=1"])
def test_a_malformed_tunix_env_is_a_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--rounds", "0", "--tunix-env", bad])
    assert exit_.value.code == 2 and "--tunix-env takes NAME=VALUE" in capsys.readouterr().err


TIMINGS = {
    "step_s": [9.0, 2.0, 2.0],
    "generate_s": [1.0, 1.0, 1.0],
    "tokens": [100, 200, 200],
    "peak_rss_gb": 3.5,
}


@pytest.mark.slow
@pytest.mark.reference
def test_workload_files(tmp_path):
    bench.make_workload(tmp_path, "tiny", rows=6)
    rows = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and len((tmp_path / "test.jsonl").read_text().splitlines()) == 4
    assert rows[0] == {
        "question": "Tom has 3 apples, buys 2. How many?",
        "answer": "3 + 2 = 5.\n#### 5",
    }
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (
        64,
        2,
        320,
    )
    assert bench._reward(["so #### 5", "7 or 5", "####5 then 6"], ["#### 5"] * 3) == [1.0, 1.0, 1.0]
    assert bench._reward(["5 then 6", "nothing"], ["#### 5"] * 2) == [0.0, 0.0]


@pytest.mark.slow
@pytest.mark.reference
def test_both_libraries_run_the_same_work_and_the_ratios_are_same_round(tmp_path):
    pytest.importorskip("trl")
    bench.make_workload(tmp_path, "tiny")
    work = dict(bench.WORK, steps=3, prompts=2, group=4, new_tokens=16)
    (res,) = bench.side_by_side(tmp_path, ["minirl", "trl"], 1, work, log=lambda _: None)
    mine, theirs, q = res["minirl"], res["trl"], res["minirl / trl"]
    for s in (mine, theirs):  # at most prompts x group x new tokens generated per step
        assert 0 < s["tokens_per_step"] <= 2 * 4 * 16
        assert 0 < s["generation_s"] < s["s_per_step"]
        assert s["train_phase_s"] == pytest.approx(s["s_per_step"] - s["generation_s"])
        assert 0.2 < s["peak_rss_gb"] < 20  # the child's own (VmHWM), not the driver's
    assert q["step"] == pytest.approx(theirs["s_per_step"] / mine["s_per_step"])
    assert q["tokens_per_s"] == pytest.approx(mine["tokens_per_s"] / theirs["tokens_per_s"])
    assert q["train_phase"] == pytest.approx(theirs["train_phase_s"] / mine["train_phase_s"])
    lines = bench.table([res]).splitlines()
    assert len(lines) == 3 and lines[2].startswith("| 1 | minirl / trl |")


@pytest.mark.slow
@pytest.mark.reference
def test_the_profile_of_a_run_step_names_each_phase_and_its_source_lines(tmp_path):
    """benchmarks/profile_ops.py run: step 2 of `minirl train` on the tiny work, traced in a fresh
    process (its HLO dump flag must be set before jax starts): the prefill, decode and train
    programs' op times, the ops mapped to the lines of minirl that made them."""
    bench.make_workload(tmp_path, "tiny")
    script = bench.ROOT / "benchmarks" / "profile_ops.py"
    argv = [sys.executable, str(script), "run", str(tmp_path), "--step", "2"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True).stdout
    assert "step 2 of minirl train on" in out
    for module in ("jit_prefill", "jit_decode", "jit_accumulate"):
        assert re.search(rf"^ *[\d.]+ ms +[\d.]+% +{module}$", out, re.M), out
    assert re.search(r"jit_accumulate +exact\.py:\d+ \w+: dot_general -> f32\[", out), out
