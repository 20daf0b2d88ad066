"""The TRL side-by-side benchmark's driver (benchmarks/trl_side_by_side.py), end to end on the
tiny model: workload files, both libraries in their own processes, the summaries and ratios.

Slow (about a minute: two fresh processes, minirl's compiles) and needs the `reference` extra
(transformers and trl build and run the TRL side).
"""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import trl_side_by_side as bench  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.reference]
pytest.importorskip("trl")


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


def test_both_libraries_run_the_same_work_and_the_ratios_are_same_round(tmp_path):
    bench.make_workload(tmp_path, "tiny")
    work = dict(bench.WORK, steps=3, prompts=2, group=4, new_tokens=16)
    (res,) = bench.side_by_side(tmp_path, ["minirl", "trl"], 1, work, log=lambda _: None)
    mine, theirs, q = res["minirl"], res["trl"], res["minirl / trl"]
    for s in (mine, theirs):  # at most prompts x group x new tokens generated per step
        assert 0 < s["tokens_per_step"] <= 2 * 4 * 16
        assert 0 < s["generation_s"] < s["s_per_step"]
        assert s["train_phase_s"] == pytest.approx(s["s_per_step"] - s["generation_s"])
    assert q["step"] == pytest.approx(theirs["s_per_step"] / mine["s_per_step"])
    assert q["tokens_per_s"] == pytest.approx(mine["tokens_per_s"] / theirs["tokens_per_s"])
    assert q["train_phase"] == pytest.approx(theirs["train_phase_s"] / mine["train_phase_s"])
    lines = bench.table([res]).splitlines()
    assert len(lines) == 3 and lines[2].startswith("| 1 | minirl / trl |")
