"""One accelerator check (issues #36, #37): every GPU figure minirl needs, in one JSON.

    bash benchmarks/accelerator_check.sh                 # on the GPU machine (at most 9.5 minutes)
    python benchmarks/accelerator_check.py --small       # the same driver on the CPU, tiny shapes

Rows (each one's figures, or its error: a failed row never stops the others; the order they
run in: `run_rows`):

  decode      `benchmarks/roofline.py`'s decode workload (16-token prompts, cache 64, chunks of
              8, temperature 1) at each slot count and dtype: the steady step (time of 40 new
              tokens - time of 8, / 32), tokens/s, and its ratio to the same-run roofline
              (`decode_limit`: bytes / copy rate vs FLOPs at a chain of the model's own matmuls);
              the prefill of the same requests (1 new token per prefill call) against
              `prefill_limit`; the sampler's share of the step
  train       `Trainer.train_step` (GRPO, one micro-batch) at rows x length tokens, compute in
              bfloat16 and parameters in float32, against `train_limit`, and its FLOPs over the
              same-run square matmul rate in the compute dtype
  train_run   `minirl train` for a few steps in a child process: median seconds per RL step,
              held-out pass@1 before and after
  lane        `pytest -m gpu` (the bitwise claims) in a child process: passed / failed / skipped

Limits measured in the same run: the copy rate (read + write bytes/s of a jitted in-place
update) and the square matmul rate per dtype, before the rows (`limits_before`: the rows' memory
and update times use its copy rate; each row's compute limit is its own matmul chain, timed
beside it) and after them (`limits_after`); `limits` keeps the faster of each, and is what
`minirl plan --calibrate-device` reads. Nothing is copied from roofline.py: its limits and
workloads are imported. On the CPU's tiny shapes (`--small`) the figures test the plumbing,
not the machine: a jitted call's fixed cost dominates both a step and its chain, and XLA CPU's
bfloat16 matmuls are slow, so ratios above 1 happen there.

The JSON names the device (`jax.devices()[0].device_kind`), the jax / jaxlib versions, the
commit (`MINIRL_COMMIT` or `git rev-parse HEAD`), the packages found and missing, and is
rewritten after every row, so a run stopped by its time limit keeps what it measured.
`--budget` seconds bound the whole check: an in-process row that would eat the time reserved
for the child-process rows is recorded as skipped, and each child gets what is left.
`minirl plan --calibrate-device FILE` reads this JSON (minirl/sim/measured_device.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.metadata
import itertools
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # roofline.py beside this file

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = 1

# What each part of the check imports (distribution names). minirl's core needs the first line;
# `minirl train` the second (multiprocess and dill are not on every GPU image: carry them as
# wheels, benchmarks/accelerator_check.sh says how); the lane needs pytest.
NEEDS = {
    "core": ("jax", "jaxlib", "flax", "optax", "numpy", "ml_dtypes", "msgpack"),
    "train_run": ("multiprocess", "dill", "matplotlib", "tqdm"),
    "lane": ("pytest",),
}


@dataclasses.dataclass(frozen=True)
class Plan:
    """The shapes of one check: the GPU's (default) or seconds on a CPU (`--small`)."""

    shape: str = "qwen2.5-0.5b"
    slots: tuple[int, ...] = (1, 64, 256)
    dtypes: tuple[str, ...] = ("bfloat16", "float32")
    train: tuple[tuple[int, int], ...] = ((16, 512), (4, 2048))  # rows x length tokens
    copy_bytes: int = 2**30
    square: int = 8192  # the square matmul of the peak rate
    train_run: tuple[str, ...] = ("--preset", "countdown", "--set", "rl.steps=30")
    train_run_s: float = 120.0  # time reserved for (and limit of) the `minirl train` row
    lane_files: tuple[str, ...] = ()  # empty: every tests/ file with a `gpu` mark
    lane_s: float = 300.0  # issue #45 added the Pallas kernel's and the layouts' gpu tests
    lane_test_s: int = 180  # per-test limit when pytest-timeout is installed


SMALL = Plan(
    shape="tiny",
    slots=(1, 4),
    train=((2, 64),),
    copy_bytes=2**24,
    square=256,
    train_run=("--preset", "fixture", "--set", "rl.steps=3"),
    train_run_s=120.0,
    lane_files=("tests/modeling/test_model.py",),
    lane_s=120.0,
    lane_test_s=60,
)


# ---- what is there ----------------------------------------------------------------------------


def packages() -> dict:
    """Version of every package the check needs (None: missing), and what each part lacks."""
    found = {}
    for name in sorted({n for names in NEEDS.values() for n in names}):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    missing = {part: [n for n in names if found[n] is None] for part, names in NEEDS.items()}
    return {"versions": found, "missing": {k: v for k, v in missing.items() if v}}


def commit() -> str:
    if os.environ.get("MINIRL_COMMIT"):
        return os.environ["MINIRL_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_info() -> dict:
    import jax
    import jaxlib

    dev = jax.devices()[0]
    stats = {}
    try:
        stats = dev.memory_stats() or {}
    except Exception:  # noqa: BLE001 - not every backend reports memory
        pass
    return {
        "device_kind": dev.device_kind,
        "platform": dev.platform,
        "device_count": jax.device_count(),
        "memory_bytes": stats.get("bytes_limit"),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "python": platform.python_version(),
        "jax_platforms": os.environ.get("JAX_PLATFORMS", ""),
    }


# ---- limits -----------------------------------------------------------------------------------


def measure_limits(plan: Plan) -> dict:
    """The same-run copy rate and square matmul rate per dtype."""
    import jax.numpy as jnp
    from roofline import copy_rate, matmul_rate

    return {
        "copy_bytes_per_s": copy_rate(plan.copy_bytes),
        "matmul_flops_per_s": {d: matmul_rate(plan.square, jnp.dtype(d)) for d in plan.dtypes},
    }


def faster(a: dict, b: dict) -> dict:
    """Each rate at the larger of two measurements (a limit measured in a slow moment would
    flatter the rows)."""
    return {
        "copy_bytes_per_s": max(a["copy_bytes_per_s"], b["copy_bytes_per_s"]),
        "matmul_flops_per_s": {
            d: max(r, b["matmul_flops_per_s"][d]) for d, r in a["matmul_flops_per_s"].items()
        },
    }


# ---- rows -------------------------------------------------------------------------------------


def _params(cfg):
    from flax import nnx

    from minirl.modeling.model import init_model

    return nnx.to_pure_dict(nnx.split(init_model(cfg, seed=0))[1])


def decode_row(plan: Plan, dtype: str, slots: int, params, copy: float) -> dict:
    """The decode step and the prefill of `slots` requests against their same-run limits."""
    from roofline import (
        CONTEXT,
        LONG,
        PROMPT,
        SHORT,
        decode_engine,
        decode_limit,
        decode_step_time,
        generate_time,
        prefill_limit,
        sampling_time,
    )

    from minirl.modeling.model import ModelConfig

    cfg = ModelConfig.preset(plan.shape, dtype=dtype, param_dtype=dtype)
    engine = decode_engine(cfg, slots, params)
    step = decode_step_time(engine, cfg, slots)
    if step <= 0:  # a difference of two times: a loaded machine can make the longer run faster
        raise RuntimeError(f"timing noise: {LONG} new tokens took no longer than {SHORT}")
    calls = -(-slots // engine.config.prefill_rows)
    prefill = generate_time(engine, cfg, slots, 1) / calls
    limit = decode_limit(cfg, slots, CONTEXT, copy)
    fill = prefill_limit(cfg, engine.config.prefill_rows, PROMPT, copy)
    return {
        "context": CONTEXT,
        "step_s": step,
        "tokens_per_s": slots / step,
        "limit_s": limit["limit_s"],
        "memory_s": limit["memory_s"],
        "compute_s": limit["compute_s"],
        "bound": limit["bound"],
        "efficiency": limit["limit_s"] / step,
        "memory_efficiency": limit["memory_s"] / step,
        "chain_flops_per_s": 1e9 * limit["chain_gflops"],
        "prefill_rows": engine.config.prefill_rows,
        "prefill_length": PROMPT,
        "prefill_s": prefill,
        "prefill_limit_s": fill["limit_s"],
        "prefill_bound": fill["bound"],
        "prefill_efficiency": fill["limit_s"] / prefill,
        "sampling_share": sampling_time(cfg, slots) / step,
    }


def train_row(plan: Plan, rows: int, length: int, limits: dict) -> dict:
    """One GRPO train step on rows x length tokens (one micro-batch) against `train_limit`."""
    from roofline import best_time, train_batch, train_limit

    from minirl.losses import get_preset
    from minirl.modeling.model import ModelConfig
    from minirl.training.trainer import Trainer, TrainerConfig

    cfg = ModelConfig.preset(plan.shape, dtype="bfloat16", param_dtype="float32")
    limit = train_limit(cfg, rows, length, limits["copy_bytes_per_s"])
    config = TrainerConfig(learning_rate=1e-6, micro_batch_tokens=rows * length)
    trainer = Trainer(cfg, _params(cfg), get_preset("grpo"), config)
    batch = train_batch(rows, length, vocab=cfg.vocab_size)
    step = best_time(lambda: trainer.train_step(batch), repeats=2)
    peak = limits["matmul_flops_per_s"].get("bfloat16") or max(
        limits["matmul_flops_per_s"].values()
    )
    return {
        "tokens": rows * length,
        "step_s": step,
        "tokens_per_s": rows * length / step,
        "limit_s": limit["limit_s"],
        "compute_s": limit["compute_s"],
        "update_s": limit["update_s"],
        "efficiency": limit["limit_s"] / step,
        "flops": limit["flops"],
        "flops_per_s": limit["flops"] / step,
        "fraction_of_peak": limit["flops"] / step / peak,
    }


def train_run_row(plan: Plan, timeout: float) -> dict:
    """`minirl train` in a child process; its metrics.jsonl and summary.json read back."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp, "run")
        cmd = [sys.executable, "-m", "minirl.cli", "train", *plan.train_run]
        cmd += ["--run-dir", str(run), "--quiet"]
        t0 = time.perf_counter()
        _child(cmd, timeout)
        wall = time.perf_counter() - t0
        steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
        summary = json.loads((run / "summary.json").read_text())
    times = [s["time/step"] for s in steps]
    return {
        "command": "minirl train " + " ".join(plan.train_run),
        "steps": len(steps),
        "median_step_s": statistics.median(times),
        "median_step_s_after_2": statistics.median(times[2:] or times),
        "rl_seconds": summary["rl_seconds"],
        "pass1_before": summary["before"]["pass@1"],
        "pass1_after": summary["after"]["pass@1"],
        "wall_s": wall,
    }


VERDICT = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)")


def lane_files(plan: Plan) -> list[str]:
    """The test files the lane collects: the plan's, or every tests/ file with a `gpu` mark
    (only those: a test file whose imports fail on a bare GPU image cannot stop the lane)."""
    if plan.lane_files:
        return list(plan.lane_files)
    tests = sorted((ROOT / "tests").rglob("test_*.py"))
    return [str(p.relative_to(ROOT)) for p in tests if "mark.gpu" in p.read_text()]


def lane_row(plan: Plan, timeout: float) -> dict:
    """`pytest -m gpu` in a child process: counts and failures from its JUnit XML, or, when it
    runs out of time, the verdicts it printed so far (and an error saying so)."""
    files = lane_files(plan)
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp, "lane.xml")
        cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "gpu"]
        cmd += ["--continue-on-collection-errors", *files]
        if _has("pytest_timeout"):
            cmd += [f"--timeout={plan.lane_test_s}"]
        row = {"command": " ".join(["pytest", *cmd[3:]]), "files": files}
        cmd += [f"--junitxml={xml}", "-o", "junit_family=xunit2"]
        t0 = time.perf_counter()
        try:
            out = _child(cmd, timeout, check=False)
        except subprocess.TimeoutExpired as e:
            printed = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
            verdicts = [m.groups() for m in map(VERDICT.match, printed.splitlines()) if m]
            return row | _count(verdicts) | {"error": f"timed out after {timeout:.0f} s"}
        row |= {"exit": out.returncode, "wall_s": time.perf_counter() - t0}
        if not xml.is_file():
            return row | {"error": f"pytest wrote no report (exit {out.returncode}): {_tail(out)}"}
        return row | _count(_junit_verdicts(xml))


def _junit_verdicts(xml: Path) -> list[tuple[str, str, str]]:
    """(test, PASSED | FAILED | SKIPPED, message) per test case of a JUnit XML report."""
    out = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        bad = [case.find(t) for t in ("failure", "error") if case.find(t) is not None]
        skip = case.find("skipped")
        if bad:
            out.append((name, "FAILED", bad[0].get("message") or ""))
        elif skip is not None:
            out.append((name, "SKIPPED", skip.get("message") or ""))
        else:
            out.append((name, "PASSED", ""))
    return out


def _count(verdicts) -> dict:
    """Counts of (test, verdict[, message]) tuples; the failures and the distinct skip reasons."""
    result = {"tests_passed": 0, "tests_failed": 0, "tests_skipped": 0}
    result |= {"failures": [], "skip_reasons": []}
    for name, verdict, *message in verdicts:
        text = (message or [""])[0][:300]
        if verdict in ("FAILED", "ERROR"):
            result["tests_failed"] += 1
            result["failures"].append(f"{name}: {text}".rstrip(": "))
        elif verdict == "SKIPPED":
            result["tests_skipped"] += 1
            if text and text not in result["skip_reasons"]:
                result["skip_reasons"].append(text)
        else:
            result["tests_passed"] += 1
    return result


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _tail(out, n: int = 400) -> str:
    return ((out.stderr or "") + (out.stdout or ""))[-n:].strip().replace("\n", " | ")


def _child(cmd: list[str], timeout: float, check: bool = True):
    """Run `cmd` at the repository root with minirl importable; a failure raises with the tail
    of its output."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), _pythonpath()])))
    out = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(timeout, 1)
    )
    if check and out.returncode:
        raise RuntimeError(f"exit {out.returncode}: {_tail(out)}")
    return out


def _pythonpath() -> str:
    return os.environ.get("PYTHONPATH", "")


# ---- the check --------------------------------------------------------------------------------


class Check:
    """The report, its file, and the clock of the budget."""

    def __init__(self, plan: Plan, out: Path, budget: float, skip: set[str]):
        self.plan, self.out, self.skip = plan, out, skip
        self.deadline = time.monotonic() + budget
        self.report = {
            "schema": SCHEMA,
            "mode": "small" if plan.shape == SMALL.shape else "full",
            "plan": dataclasses.asdict(plan),
            "budget_s": budget,
            "commit": commit(),
            "packages": packages(),
            "rows": [],
        }

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def reserve(self) -> float:
        """Seconds kept for the child-process rows not yet run."""
        children = {"train_run": self.plan.train_run_s, "lane": self.plan.lane_s}
        done = {r["kind"] for r in self.report["rows"]}
        return sum(s for k, s in children.items() if k not in done and k not in self.skip)

    def row(self, kind: str, name: str, fn, child: bool = False) -> dict:
        """Run one row: its figures, or its error; skipped when asked or out of time."""
        row = {"kind": kind, "name": name, "ok": False}
        room = self.left() if child else self.left() - self.reserve()
        if kind in self.skip:
            row["skipped"] = "not asked for (--skip)"
        elif room <= 0:
            row["skipped"] = f"out of time (budget {self.report['budget_s']:.0f} s)"
        else:
            t0 = time.perf_counter()
            try:
                row |= fn(room) if child else fn()
                row["ok"] = "error" not in row
            except Exception as e:  # noqa: BLE001 - a failed row records its error, the rest run
                row["error"] = f"{type(e).__name__}: {e}"[:2000]
                row["traceback"] = traceback.format_exc()[-2000:]
            row["seconds"] = time.perf_counter() - t0
        self.report["rows"].append(row)
        self.write()
        print(f"[check] {name}: {_summary(row)}", flush=True)
        return row

    def write(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.report, indent=1, default=float) + "\n")
        tmp.replace(self.out)


def _summary(row: dict) -> str:
    if "skipped" in row:
        return "skipped: " + row["skipped"]
    if not row["ok"]:
        return "FAILED " + row["error"].splitlines()[0][:200]
    keys = ("step_s", "efficiency", "tokens_per_s", "fraction_of_peak", "median_step_s")
    keys += ("pass1_after", "tests_passed", "tests_failed", "tests_skipped")
    return ", ".join(f"{k}={_fmt(row[k])}" for k in keys if k in row)


def _fmt(x) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def decode_rows(check: Check, dtype: str) -> None:
    """The decode rows of one dtype; its weights live for them only."""
    plan, holder = check.plan, {}

    def params():
        if "params" not in holder:
            from minirl.modeling.model import ModelConfig

            cfg = ModelConfig.preset(plan.shape, dtype=dtype, param_dtype=dtype)
            holder["params"] = _params(cfg)
        return holder["params"]

    copy = check.report["limits_before"]["copy_bytes_per_s"]
    for slots in plan.slots:
        check.row(
            "decode",
            f"decode {plan.shape} {dtype} slots={slots}",
            lambda s=slots: (
                {"dtype": dtype, "slots": s} | decode_row(plan, dtype, s, params(), copy)
            ),
        )
    holder.clear()
    gc.collect()


def train_rows(check: Check, rows: int, length: int) -> None:
    plan, limits = check.plan, check.report["limits_before"]
    check.row(
        "train",
        f"train {plan.shape} bf16/fp32 {rows}x{length}",
        lambda: {"rows": rows, "length": length} | train_row(plan, rows, length, limits),
    )
    gc.collect()


def run_rows(check: Check) -> None:
    """Every row of the plan, the most wanted first where time may run out: each dtype's decode
    rows followed by one train shape (bf16 decode, 16 x 512, fp32 decode, 4 x 2048), then the
    child processes (their time is reserved: `Check.reserve`)."""
    plan = check.plan
    for dtype, shape in itertools.zip_longest(plan.dtypes, plan.train):
        if dtype is not None:
            decode_rows(check, dtype)
        if shape is not None:
            train_rows(check, *shape)
    check.row("train_run", "minirl train", lambda room: train_run_row(plan, room), child=True)
    check.row("lane", "pytest -m gpu", lambda room: lane_row(plan, room), child=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--small", action="store_true", help="tiny shapes: seconds on a CPU")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/accelerator_check.json")
    p.add_argument("--budget", type=float, default=570.0, help="seconds for the whole check")
    p.add_argument("--skip", default="", help="row kinds to leave out: decode,train,train_run,lane")
    p.add_argument("--slots", help="decode slot counts instead of the plan's, e.g. 1,64")
    p.add_argument("--dtypes", help="decode dtypes instead of the plan's, e.g. bfloat16")
    args = p.parse_args(argv)
    plan = SMALL if args.small else Plan()
    if args.slots:
        plan = dataclasses.replace(plan, slots=tuple(int(s) for s in args.slots.split(",")))
    if args.dtypes:
        plan = dataclasses.replace(plan, dtypes=tuple(args.dtypes.split(",")))
    check = Check(plan, args.out, args.budget, {s for s in args.skip.split(",") if s})
    missing = check.report["packages"]["missing"]
    if missing:
        print(
            f"[check] missing packages (their rows will fail): {missing}; install them, or put "
            "their wheels in .whl/ (`bash benchmarks/accelerator_check.sh wheels` fetches "
            "multiprocess and dill)",
            flush=True,
        )
    if "core" in missing:
        check.write()
        print("[check] minirl's core cannot run without them: nothing measured", flush=True)
        return 1
    check.report["device"] = device_info()
    print(f"[check] device: {check.report['device']}", flush=True)
    check.report["limits_before"] = measure_limits(plan)
    run_rows(check)
    check.report["limits_after"] = measure_limits(plan)
    check.report["limits"] = faster(check.report["limits_before"], check.report["limits_after"])
    check.write()
    print(f"[check] wrote {args.out}", flush=True)
    return 0


def problems(report: dict) -> list[str]:
    """What is wrong with a check's JSON (empty: none): the schema, limits > 0, every figure
    finite, every failed row with its error. (Nothing about time: the rows' own checks raise.)"""
    bad = []
    for key in ("schema", "device", "commit", "packages", "rows", "limits"):
        if key not in report:
            bad.append(f"no {key!r}")
    if bad:
        return bad
    limits = report["limits"]
    rates = [limits["copy_bytes_per_s"], *limits["matmul_flops_per_s"].values()]
    bad += [f"limit {r} is not > 0" for r in rates if not (isinstance(r, float) and r > 0)]
    if not report["device"].get("device_kind"):
        bad.append("no device_kind")
    for row in report["rows"]:
        if row["ok"]:
            for k, v in row.items():
                if isinstance(v, float) and not math.isfinite(v):
                    bad.append(f"{row['name']}: {k} = {v}")
        elif "skipped" not in row and not row.get("error"):
            bad.append(f"{row['name']}: failed without an error")
    return bad


if __name__ == "__main__":
    sys.exit(main())
