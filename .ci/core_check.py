"""CI's first phase (issue #44): what `pip install -e .` alone gives a new user works.

Run in a virtual environment with minirl installed WITHOUT extras, from any directory:

    python .ci/core_check.py [--lessons] [--work DIR]

1. No extra is installed here (else this phase proves nothing), and every module of minirl/ and
   scale/ imports.
2. The README's first command, shortened so it still passes every phase (warm start, evaluation
   before, RL steps, checkpoint, evaluation after, dashboard): `minirl train --set rl.steps=2
   --set eval.prompts=8`, and what the README promises of it: config.json, meta.json,
   metrics.jsonl, checkpoints/, summary.json with before/after, plots/dashboard.png.
3. The commands a user runs next on that run: eval, export, samples, plot; plan and diagnose.
4. Each path that needs an extra says which one in one line (no traceback).
5. With --lessons: every lesson's fast mode that needs no extra.
Exit status 0 when everything holds; the first failure is printed with its output.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXTRAS_ONLY = ["ray", "pyarrow", "math_verify", "tensorboardX", "wandb", "torch", "pytest"]
EXTRAS_ONLY += ["openai"]
LESSONS_NEEDING_EXTRAS = {"11_scaling_out.py": "scale", "16_bring_your_own_agent.py": "agent"}
TIMEOUT_S = 1800  # generous: a fresh machine compiles everything once


def fail(what: str, out: subprocess.CompletedProcess | None = None) -> None:
    print(f"core check FAILED: {what}")
    if out is not None:
        print(f"--- exit {out.returncode}\n--- stdout\n{out.stdout[-4000:]}\n--- stderr")
        print(out.stderr[-4000:])
    sys.exit(1)


def run(*cmd: str, cwd: pathlib.Path, ok: bool = True) -> subprocess.CompletedProcess:
    start = time.time()
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S)
    print(f"  {time.time() - start:6.1f} s  exit {out.returncode}  {' '.join(cmd)}", flush=True)
    if ok and out.returncode != 0:
        fail(" ".join(cmd), out)
    return out


def check_environment() -> None:
    present = [m for m in EXTRAS_ONLY if importlib.util.find_spec(m) is not None]
    if present:
        fail(f"this venv has packages of an extra: {present} (install with `pip install -e .`)")
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for top in ("minirl", "scale")
        for p in (ROOT / top).rglob("*.py")
    )
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - every failure is reported the same way
            fail(f"import {name}: {type(e).__name__}: {e}")
    print(f"no extra installed; {len(modules)} modules of minirl/ and scale/ import")


def check_main_job(work: pathlib.Path) -> pathlib.Path:
    run("minirl", "--help", cwd=work)
    run("minirl", "train", "--help", cwd=work)
    run("minirl", "config", cwd=work)
    start = time.time()
    short = ["--set", "rl.steps=2", "--set", "eval.prompts=8", "--set", "log.samples_every=1"]
    run("minirl", "train", *short, cwd=work)
    print(f"the README's first command, shortened: {time.time() - start:.0f} s")
    run_dir = work / "runs" / "countdown"
    for name in ("config.json", "meta.json", "metrics.jsonl", "summary.json"):
        if not (run_dir / name).is_file():
            fail(f"{run_dir / name} was not written")
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").open()]
    if steps != [1, 2]:
        fail(f"metrics.jsonl has steps {steps}, expected [1, 2]")
    summary = json.loads((run_dir / "summary.json").read_text())
    for side in ("before", "after"):
        if not {"pass@1", "pass@8"} <= set(summary.get(side, {})):
            fail(f"summary.json lacks {side}'s pass@1 / pass@8: {summary}")
    if summary.get("stopped") != "steps" or not any((run_dir / "checkpoints").iterdir()):
        fail(f"the run did not end with its steps checkpointed: {summary.get('stopped')}")
    if not (run_dir / "plots" / "dashboard.png").read_bytes().startswith(b"\x89PNG"):
        fail("plots/dashboard.png is not a PNG")
    return run_dir


def check_next_commands(work: pathlib.Path, run_dir: pathlib.Path) -> None:
    evaluated = json.loads(run("minirl", "eval", str(run_dir), cwd=work).stdout)
    if evaluated.get("step") != 2 or "pass@1" not in evaluated:
        fail(f"minirl eval printed {evaluated}")
    run("minirl", "export", str(run_dir), "--out", str(work / "exported"), cwd=work)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (work / "exported" / name).is_file():
            fail(f"minirl export wrote no {name}")
    run("minirl", "samples", str(run_dir), cwd=work)
    run("minirl", "plot", str(run_dir), cwd=work)
    run("minirl", "plan", "--model", "qwen2.5-7b", cwd=work)
    run("minirl", "diagnose", "--fast", cwd=work)


def check_one_line_errors(work: pathlib.Path) -> None:
    (work / "data.parquet").write_bytes(b"PAR1")
    (work / "agent.py").write_text("async def solve(client, row):\n    return 1.0\n")
    asks = [
        (["minirl", "train", "--run-dir", "r", "--set", "log.tensorboard=true"], "track"),
        (["minirl", "train", "--run-dir", "r", "--set", "log.wandb=project"], "track"),
        (["minirl", "train", "--data", "data.parquet", "--run-dir", "r"], "hf"),
        (["minirl", "train", "--agent", "agent.py:solve", "--run-dir", "r"], "agent"),
        ([sys.executable, "-m", "scale.launch", "ray", "--run-dir", "r"], "scale"),
    ]
    for cmd, extra in asks:
        out = run(*cmd, cwd=work, ok=False)
        lines = out.stderr.strip().splitlines()
        if out.returncode != 2 or len(lines) != 1 or f"minirl[{extra}]" not in lines[0]:
            fail(f"{' '.join(cmd)} should say in one line to install the {extra!r} extra", out)
    run(sys.executable, "-m", "scale.launch", "--help", cwd=work)


def check_lessons(work: pathlib.Path) -> None:
    for lesson in sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py")):
        if lesson.name in LESSONS_NEEDING_EXTRAS:
            continue
        out_dir = work / "lessons" / lesson.stem
        run(sys.executable, str(lesson), "--fast", "--out", str(out_dir), cwd=work)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lessons", action="store_true", help="also every lesson's fast mode")
    p.add_argument("--work", help="working directory (default: a new temporary one)")
    args = p.parse_args()
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="minirl-core-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    check_environment()
    run_dir = check_main_job(work)
    check_next_commands(work, run_dir)
    check_one_line_errors(work)
    if args.lessons:
        check_lessons(work)
    print("core check passed")


if __name__ == "__main__":
    main()
