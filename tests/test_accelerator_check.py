"""The prepared accelerator check (benchmarks/accelerator_check.py, issue #37) run on the CPU, and
the GPU lane of the suite (tests/conftest.py, issue #36): `pytest -m gpu` keeps the CPU
unforced and skips each bitwise claim with one line where JAX sees no accelerator."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_CHECK = Path(__file__).parent / "data" / "accelerator_check_cpu.json"


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def check():
    return _module("accelerator_check", ROOT / "benchmarks" / "accelerator_check.py")


@pytest.fixture(scope="module")
def lane():
    return _module("minirl_tests_conftest", Path(__file__).parent / "conftest.py")


# ---- the GPU lane -----------------------------------------------------------------------------


def test_the_lane_is_asked_for_by_a_marker_expression_that_selects_gpu(lane):
    for expr, asked in [
        ("gpu", True),
        ("gpu and not slow", True),
        ("slow or gpu", True),
        ("not gpu", False),
        ("not slow", False),
        ("", False),
        ("gpus", False),
    ]:
        assert lane.gpu_lane(expr) is asked, expr


class _Config:
    def __init__(self, expr: str):
        self.expr = expr

    def getoption(self, name, default=None):
        assert name == "markexpr"
        return self.expr


def test_the_lane_does_not_force_the_cpu_and_the_default_lane_does(lane, monkeypatch):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    lane.pytest_configure(_Config("gpu"))
    assert "JAX_PLATFORMS" not in os.environ  # JAX picks the accelerator it finds
    lane.pytest_configure(_Config("not slow"))
    assert os.environ["JAX_PLATFORMS"] == "cpu"
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    lane.pytest_configure(_Config("not slow"))
    assert os.environ["JAX_PLATFORMS"] == "cuda"  # the user's choice is kept in every lane


class _Item:
    def __init__(self, gpu: bool):
        self.gpu, self.markers = gpu, []

    def get_closest_marker(self, name):
        return name == "gpu" and self.gpu or None

    def add_marker(self, marker):
        self.markers.append(marker)


def test_without_an_accelerator_each_gpu_test_is_skipped_with_one_line(lane, monkeypatch):
    items = [_Item(True), _Item(False)]
    lane.pytest_collection_modifyitems(_Config("gpu"), items)
    (mark,) = items[0].markers
    reason = mark.kwargs["reason"]
    assert mark.name == "skip" and "\n" not in reason and items[1].markers == []
    assert reason.startswith("GPU lane: JAX sees no accelerator here (backend 'cpu'")
    lane.pytest_collection_modifyitems(_Config("not slow"), items)  # outside the lane: runs
    assert len(items[0].markers) == 1
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert lane.no_accelerator_reason() is None

    def broken():
        raise RuntimeError("Unable to initialize backend 'cuda': no CUDA devices\nmore")

    monkeypatch.setattr(jax, "default_backend", broken)
    reason = lane.no_accelerator_reason()
    assert "failed here: Unable to initialize backend 'cuda': no CUDA devices" in reason
    assert "\n" not in reason


# ---- the check on the CPU ---------------------------------------------------------------------


def _assert_sane(check, report):
    assert check.problems(report) == []
    assert report["schema"] == check.SCHEMA and report["commit"]
    assert report["device"]["device_kind"] and report["device"]["jax"]
    assert report["packages"]["versions"]["jax"]
    limits = report["limits"]
    assert limits["copy_bytes_per_s"] > 0 and all(
        r > 0 for r in limits["matmul_flops_per_s"].values()
    )
    for row in report["rows"]:
        if row["ok"] and row["kind"] == "decode":
            assert row["context"] == 40 and row["step_s"] > 0
            assert row["tokens_per_s"] == pytest.approx(row["slots"] / row["step_s"])
            assert row["efficiency"] == pytest.approx(row["limit_s"] / row["step_s"])
            assert row["limit_s"] == pytest.approx(max(row["memory_s"], row["compute_s"]))


def _ran(row: dict) -> bool:
    """A row ran: ok, or (a decode row on this shared CPU) refused a noisy difference of times."""
    return row["ok"] or row["kind"] == "decode" and row["error"].startswith("RuntimeError: timing")


@pytest.mark.slow  # ~12 s cold: the whole prepared check on the CPU
def test_the_check_runs_on_the_cpu_and_writes_a_sane_json(check, tmp_path):
    """The same driver as on a GPU, one tiny decode row (the other rows: the slow test below)."""
    out = tmp_path / "check.json"
    argv = ["--small", "--slots", "4", "--dtypes", "bfloat16", "--out", str(out)]
    assert check.main([*argv, "--skip", "train,train_run,lane"]) == 0
    report = json.loads(out.read_text())
    _assert_sane(check, report)
    assert report["device"]["device_kind"] == jax.devices()[0].device_kind
    assert report["device"]["jax"] == jax.__version__ and report["mode"] == "small"
    rows = {r["kind"]: r for r in report["rows"]}
    assert [r["kind"] for r in report["rows"]] == ["decode", "train", "train_run", "lane"]
    assert _ran(rows["decode"]) and rows["decode"]["slots"] == 4
    assert rows["decode"]["dtype"] == "bfloat16"
    for kind in ("train", "train_run", "lane"):
        assert rows[kind]["skipped"] == "not asked for (--skip)"


def test_problems_names_what_is_wrong(check):
    report = json.loads(CPU_CHECK.read_text())
    assert check.problems(report) == []
    bad = json.loads(json.dumps(report))
    bad["limits"]["copy_bytes_per_s"] = 0.0
    decode = next(r for r in bad["rows"] if r["kind"] == "decode")
    decode["efficiency"] = math.inf
    failed = {"kind": "train", "name": "t", "ok": False}
    bad["rows"].append(failed)
    assert check.problems(bad) == [
        "limit 0.0 is not > 0",
        f"{decode['name']}: efficiency = inf",
        "t: failed without an error",
    ]
    assert check.problems({"rows": []})[0] == "no 'schema'"


def test_the_committed_cpu_dry_run_is_sane_and_complete(check):
    """tests/data/accelerator_check_cpu.json: `bash benchmarks/accelerator_check.sh --small` on
    this CPU (the calibration tests in test_sim.py read it): every row ran or says why not."""
    report = json.loads(CPU_CHECK.read_text())
    _assert_sane(check, report)
    kinds = [r["kind"] for r in report["rows"]]
    assert kinds == ["decode", "decode", "train", "decode", "decode", "train_run", "lane"]
    assert [r.get("dtype") for r in report["rows"][:5]] == ["bfloat16"] * 2 + [None] + [
        "float32"
    ] * 2
    assert all(r["ok"] for r in report["rows"])
    lane_row = report["rows"][-1]
    assert lane_row["tests_skipped"] > 0 and lane_row["tests_passed"] == 0
    assert lane_row["skip_reasons"][0].startswith("GPU lane: JAX sees no accelerator here")


@pytest.mark.slow
def test_the_check_script_runs_every_row_on_the_cpu(tmp_path):
    """The shell script end to end on tiny shapes (~1-2 minutes here): every row ok, the lane's
    bitwise claims skipped with their reason (no accelerator)."""
    out = tmp_path / "accelerator_check.json"  # the script writes $OUT/accelerator_check.json
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path))
    env.pop("JAX_PLATFORMS", None)
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "accelerator_check.sh"), "--small"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    check = _module("accelerator_check_slow", ROOT / "benchmarks" / "accelerator_check.py")
    report = json.loads(out.read_text())
    _assert_sane(check, report)
    assert all(map(_ran, report["rows"])), [r.get("error") for r in report["rows"]]
    lane_row = report["rows"][-1]
    assert lane_row["tests_skipped"] > 0 and lane_row["tests_failed"] == 0


def test_the_lane_row_counts_verdicts_from_a_report_or_from_what_pytest_printed(check, tmp_path):
    printed = [
        "tests/modeling/test_model.py::test_a[float32] PASSED                       [ 33%]",
        "tests/modeling/test_model.py::test_b FAILED                                [ 66%]",
        "tests/inference/test_engine.py::test_c SKIPPED (GPU lane: no GPU)           [100%]",
        "some other line",
    ]
    verdicts = [m.groups() for m in map(check.VERDICT.match, printed) if m]
    assert check._count(verdicts) == {
        "tests_passed": 1,
        "tests_failed": 1,
        "tests_skipped": 1,
        "failures": ["tests/modeling/test_model.py::test_b"],
        "skip_reasons": [],
    }
    xml = tmp_path / "lane.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_model" name="test_a"/>'
        '<testcase classname="tests.test_model" name="test_b"><failure message="bits differ"/>'
        '</testcase><testcase classname="tests.test_engine" name="test_c">'
        '<skipped message="GPU lane: why"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert check._count(check._junit_verdicts(xml)) == {
        "tests_passed": 1,
        "tests_failed": 1,
        "tests_skipped": 1,
        "failures": ["tests.test_model::test_b: bits differ"],
        "skip_reasons": ["GPU lane: why"],
    }
    files = check.lane_files(check.Plan())
    assert {
        "tests/modeling/test_model.py",
        "tests/training/test_trainer.py",
        "tests/inference/test_engine.py",
    } <= set(files)
