"""Benchmark: the cost of isolation — programs verified per second by the code verifier
against a bare `subprocess.run` loop over the same programs.

Run (well under a minute):
    python -m pytest benchmarks/test_bench_verifiers.py -q -s

The batch is 16 short, correct Python programs (each reads two numbers and prints a function of
them), one test case each. Every round times:

  bare        a loop of `subprocess.run([python, "-S", "-s", "-B", "-c", code], input=...)` plus
              a token comparison: no limits, no namespaces, no temp dir, no other uid
              (timed in pytest-benchmark's untimed setup, alternating with ours)
  in-process  `CodeVerifier.score(batch)` in this process: sandbox + data by reference + verdicts
  pool-1/2    the same through `VerifierPool` with 1 or 2 worker processes (started and warmed
              before timing)

and reports programs/s and `ratio = bare time / our time` (1.0 = isolation is free; the bare loop
runs one program at a time, so the 2-worker pool can exceed 1 on 2 idle cores). Both sides use
the same interpreter (the sandbox's). Absolute numbers on this shared 2-core machine are noisy.
"""

from __future__ import annotations

import gc
import shutil
import subprocess
import time

import numpy as np
import pytest

from minirl.types import Prompt, Rollout
from minirl.verifiers import (
    CodeVerifier,
    CodeVerifierConfig,
    Limits,
    PoolConfig,
    TestRepository,
    VerifierPool,
    isolation_mode,
    put_tests,
)
from minirl.verifiers.sandbox import python_interpreter, run_sandboxed

N_PROGRAMS = 16
ROUNDS = 5
OPS = ["a + b", "a * b", "a - b", "max(a, b)", "min(a, b)", "a * a + b", "abs(a - b)", "a // b"]


def programs():
    """(code, stdin, expected stdout) for N_PROGRAMS distinct programs."""
    out = []
    for i in range(N_PROGRAMS):
        op = OPS[i % len(OPS)]
        a, b = 7 + i, 3 + i % 5
        code = f"a, b = map(int, input().split())\nprint({op})\n"
        out.append((code, f"{a} {b}\n", f"{eval(op)}\n"))  # our own fixed expressions
    return out


@pytest.fixture(scope="module")
def setup_batch(tmp_path_factory):
    repo = TestRepository(tmp_path_factory.mktemp("bench") / "repo")
    batch = []
    for uid, (code, stdin, expected) in enumerate(programs()):
        sha = put_tests(repo, [(stdin, expected)])
        prompt = Prompt(uid, "code", "", np.zeros(1, np.int32), {"tests": sha})
        zeros = np.zeros(1, np.int32)
        batch.append(
            Rollout(
                prompt,
                0,
                zeros,
                np.zeros(1, np.float32),
                zeros,
                "eos",
                text=f"```python\n{code}```",
            )
        )
    verifier = CodeVerifier(repo, CodeVerifierConfig(limits=Limits(cpu_s=2.0)))
    return verifier, batch


def bare_loop(python: str) -> int:
    passed = 0
    for code, stdin, expected in programs():
        r = subprocess.run(
            [python, "-S", "-s", "-B", "-c", code],
            input=stdin.encode(),
            capture_output=True,
            timeout=10,
        )
        passed += r.stdout.split() == expected.encode().split()
    return passed


@pytest.mark.parametrize("runner", ["in-process", "pool-1", "pool-2"])
def test_programs_verified_per_second(benchmark, setup_batch, runner):
    verifier, batch = setup_batch
    python = python_interpreter()
    pool = None
    if runner.startswith("pool"):
        pool = VerifierPool(verifier, PoolConfig(workers=int(runner[-1])))
        pool.start()
        score = pool.score
    else:
        score = verifier.score
    assert all(s.reward == 1.0 for s in score(batch))  # warm-up and correctness
    assert bare_loop(python) == N_PROGRAMS
    bare_times = []

    def setup():
        gc.collect()
        t = time.perf_counter()
        bare_loop(python)
        bare_times.append(time.perf_counter() - t)

    try:
        benchmark.pedantic(lambda: score(batch), setup=setup, rounds=ROUNDS, iterations=1)
    finally:
        if pool is not None:
            pool.close()
    ours, bare = benchmark.stats.stats.median, float(np.median(bare_times))
    benchmark.extra_info.update(
        {
            "mode": isolation_mode(),
            "programs/s": N_PROGRAMS / ours,
            "bare programs/s": N_PROGRAMS / bare,
            "ratio vs bare": bare / ours,
        }
    )
    print(
        f"\n{runner} [{isolation_mode()} mode]: {N_PROGRAMS / ours:.1f} programs/s | bare "
        f"subprocess.run {N_PROGRAMS / bare:.1f} programs/s | ratio {bare / ours:.2f}"
    )


def test_sandbox_start_up(benchmark):
    """One empty program (/bin/true) through `run_sandboxed` against a bare `subprocess.run`
    of it, alternating: the fixed cost of the jail's layers (namespaces, the pid namespace's
    extra processes, mounts, rlimits, the seccomp filter, the per-run uid, the temp dir)."""
    true = shutil.which("true") or "/bin/true"
    runs, bare_times = 50, []

    def setup():
        t = time.perf_counter()
        for _ in range(runs):
            subprocess.run([true], check=True)
        bare_times.append(time.perf_counter() - t)

    def ours():
        for _ in range(runs):
            assert run_sandboxed([true]).returncode == 0

    ours()  # warm-up: the isolation mode is probed once
    benchmark.pedantic(ours, setup=setup, rounds=ROUNDS, iterations=1)
    ms, bare_ms = (1e3 * benchmark.stats.stats.median / runs, 1e3 * np.median(bare_times) / runs)
    benchmark.extra_info.update({"ms per run": ms, "bare ms per run": bare_ms})
    print(
        f"\nsandbox start-up [{isolation_mode()} mode]: {ms:.2f} ms per run | bare "
        f"subprocess.run {bare_ms:.2f} ms | ratio {bare_ms / ms:.2f}"
    )
