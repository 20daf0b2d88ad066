# %% [markdown]
r"""Lesson 03 — verifiers: from a completion to a reward, without trusting the completion.

    python tutorials/03_verifiers.py            # full mode (under a minute on 2 CPU cores)
    python tutorials/03_verifiers.py --fast     # fast mode (about 15 s; what CI runs)

Writes `verdicts.png` and `results.json` into `--out` (default `runs/tutorials/03_verifiers`).
Uses `minirl/verifiers/` (read `docs/verifiers.md` next). Mirrors, in miniature: RLAX §6.1,
math verification and Oubliette, the sandboxed code verifier (the paper has no figure for it;
the plot is ours).


THE IDEA
--------
In RL with verifiable rewards there is no reward model. A program reads what the policy wrote
and returns a number. That program is the ground truth of the whole run: if it can be fooled,
the policy learns to fool it, and if it can be crashed, the run dies. So a verifier follows one
rule: IT NEVER RAISES BECAUSE OF WHAT A MODEL WROTE. Unparsable, wrong, slow or hostile output
gets reward 0 and a reason you can read and count ("no answer found", "time limit on test 2").

Math. A model writes the same number in many ways: \boxed{\frac{1}{2}}, "the answer is 0.5",
"#### 2/4". The verifier first EXTRACTS the final answer (the last \boxed{...}, a "####" line,
"the answer is ...", else the last number), then decides EQUIVALENCE. Numbers are compared
exactly as fractions. Decimals and constants such as π are compared with a relative tolerance,
and expressions with variables symbolically (sympy, under a time limit). Nothing is `eval`-ed:
the LaTeX is parsed into a whitelisted syntax tree.

Code. The completion is a program. It is judged like an online judge does: compiled and run on
each test case, with its output compared to the expected one. Verdicts: accepted, wrong answer,
time limit, memory limit, runtime error, compile error, and so on. RLAX's Oubliette stores the
test data once and sends only a reference (a sha256) with each request, and minirl does the same
with a `TestRepository`.

Hostile code. Under RL pressure a policy will write programs that loop, fork, allocate memory
without end, write files, or go looking for the expected answers. Each program therefore runs in
a sandbox (minirl/verifiers/sandbox.py): its own session, a fresh temporary directory, rlimits
on CPU, memory, processes and file size, no network, a read-only view of the host filesystem,
and, as root, a fresh unprivileged uid per run, so that every process it leaves behind can be
killed. Step 3 runs some of these programs and then checks the host. The sandbox is strongest as
root ("uid" mode). `isolation_mode()` says what this machine gives you, and the table in
sandbox.py says what is weaker in the other modes.

WHAT THE SCRIPT DOES
--------------------
1. Math: one reference answer written in many forms, plus near misses, through `MathVerifier`.
2. Code: an "add two numbers" task with 3 test cases in a `TestRepository`, and programs that
   are accepted, wrong, too slow, crashing, or missing, through `CodeVerifier`.
3. Hostile: a fork bomb, a memory bomb, a program that writes outside its directory and one that
   reads the test data, scored as one batch by a 2-worker `VerifierPool`. Each prints "pwned"
   only if its attack worked, and the expected output is "pwned", so reward 1 would be a breach.
   (The one that writes outside its directory prints "contained" when every write failed, and
   is judged "wrong answer".)
   Afterwards the script checks the host: no leftover sandbox processes, no files outside, and
   the pool still scores a correct program.
4. Plots the time each verdict took.

Expected output (full mode, measured)
-------------------------------------
Measured on 2026-11-22 with `python tutorials/03_verifiers.py` on a shared virtual machine with
2 cores (nproc = 2), under heavy load from other jobs (load average 12-13). It took 31 s of
wall time and 2.7 s of CPU time (user + sys); most of the wall time is the time limits and the
sandboxes' start-up. The figure is figures/03_verifiers.png. The verdicts do not depend on the
machine, but the reasons for the slow programs do: on a loaded machine the busy loop and the
fork bomb hit the 2 s wall limit before the 1 s CPU limit (fast mode: the memory bomb too).

    mode: full   isolation mode here: 'uid'   limits per test: 1.0s CPU, 2.0s wall, 256 MB, 16 processes

    Step 1. math: extraction, then equivalence
      reference  model wrote                            reward  reason
      1/2        so the answer is \boxed{\frac{1}{2}}      1    correct   [boxed LaTeX fraction]
      1/2        The answer is 0.5                         1    correct   [decimal, 'the answer is']
      1/2        #### \dfrac12                             1    correct   [GSM8K-style line, \dfrac12]
      1/2        \boxed{2/4}                               1    correct   [unreduced fraction]
      1/2        \boxed{0.51}                              0    wrong answer: got '0.51', expected '1/2'   [near miss]
      1/2        I am not sure.                            0    no answer found   [no answer at all]
      \pi        \boxed{3.14159265}                        1    correct   [constant, within rel_tol 1e-6]
      \pi        \boxed{3.14}                              0    wrong answer: got '3.14', expected '\\pi'   [constant, outside rel_tol]
      2x+2       \boxed{2(x+1)}                            1    correct   [symbolic (sympy)]
      (1, 2)     \boxed{(1,2)}                             1    correct   [tuple]
      (1, 2)     \boxed{[1,2]}                             0    wrong answer: got '[1,2]', expected '(1, 2)'   [brackets must match]
      1000000    \boxed{1,000,000}                         1    correct   [thousands separators]
      1000000    \boxed{1000001}                           0    wrong answer: got '1000001', expected '1000000'   [exact: no tolerance on integers]
      0.5        \boxed{50\%}                              0    wrong answer: got '50\\%', expected '0.5'   [known simplification: 50% reads as 50]

    Step 2. code: 'print a + b', 3 test cases stored as 0e093b1d288f...
      correct                  reward 1    0.45s   accepted (3/3 tests)
      wrong (a - b)            reward 0    0.15s   wrong answer on test 1 (0/3 passed)
      too slow (busy loop)     reward 0    2.02s   time limit on test 1 (0/3 passed): cpu 0.71s, wall 2.02s, limit 1.0s
      crashes                  reward 0    0.09s   runtime error on test 1 (0/3 passed): exit 1: ZeroDivisionError: division by zero
      syntax error             reward 0    0.06s   runtime error on test 1 (0/3 passed): exit 1: SyntaxError: invalid syntax
      prose, no program        reward 0    0.05s   runtime error on test 1 (0/3 passed): exit 1: SyntaxError: invalid syntax
      C, correct               reward 1    0.52s   accepted (3/3 tests)
      C, does not compile      reward 0    0.09s   compile error: main.c: In function ‘main’: main.c:1:25: error: ‘x’ undeclared (first use in this fun

    Step 3. hostile programs, one batch through a VerifierPool of 2 workers
      fork bomb                reward 0   time limit on test 1 (0/1 passed): cpu 0.05s, wall 2.02s, limit 1.0s
      memory bomb              reward 0   memory limit on test 1 (0/1 passed)
      write outside its dir    reward 0   wrong answer on test 1 (0/1 passed)
      read the test data       reward 0   runtime error on test 1 (0/1 passed): exit 1: FileNotFoundError: [Errno 2] No such file or directory
      (the batch took 2.1s on 2 workers)
      host after the batch:
        every hostile program scored 0             True
        no sandbox process left                    True
        no file written outside                    True
        the pool still scores a correct program    True
        (pool worker restarts: 0; sandbox processes before the batch: 0, after: 0)

    wrote /work/main/runs/tutorials/03_verifiers/verdicts.png and /work/main/runs/tutorials/03_verifiers/results.json
"""

# %%
from __future__ import annotations

import argparse
import json
import os
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from minirl.types import Prompt, Rollout
from minirl.verifiers import (
    CodeVerifier,
    CodeVerifierConfig,
    Limits,
    MathVerifier,
    PoolConfig,
    TestRepository,
    VerifierPool,
    available_languages,
    isolation_mode,
    put_tests,
)
from minirl.verifiers.isolation import stray_processes


# %%
def rollout(text: str, meta: dict) -> Rollout:
    """A rollout whose model output is `text`. A verifier reads only `text` and `prompt.meta`."""
    prompt = Prompt(uid=0, task="lesson", text="", tokens=np.ones(1, np.int32), meta=meta)
    zeros = np.zeros(1, np.int32)
    return Rollout(prompt, 0, zeros, np.zeros(1, np.float32), zeros, "eos", text=text)


# %%
def fenced(source: str | None, language: str = "python") -> str:
    """How a model would write a program: a fenced block (the verifier takes the last one).
    Without a fence the verifier reads the whole text as the program."""
    if source is None:
        return "I would read the two numbers and add them."
    return f"Here is my solution.\n```{language}\n{textwrap.dedent(source).strip()}\n```"


# %% [markdown]
# Step 1: math. (reference answer, what the model wrote, why this case is here)


# %%
MATH_CASES = [
    ("1/2", r"so the answer is \boxed{\frac{1}{2}}", "boxed LaTeX fraction"),
    ("1/2", "The answer is 0.5", "decimal, 'the answer is'"),
    ("1/2", r"#### \dfrac12", "GSM8K-style line, \\dfrac12"),
    ("1/2", r"\boxed{2/4}", "unreduced fraction"),
    ("1/2", r"\boxed{0.51}", "near miss"),
    ("1/2", "I am not sure.", "no answer at all"),
    (r"\pi", r"\boxed{3.14159265}", "constant, within rel_tol 1e-6"),
    (r"\pi", r"\boxed{3.14}", "constant, outside rel_tol"),
    ("2x+2", r"\boxed{2(x+1)}", "symbolic (sympy)"),
    ("(1, 2)", r"\boxed{(1,2)}", "tuple"),
    ("(1, 2)", r"\boxed{[1,2]}", "brackets must match"),
    ("1000000", r"\boxed{1,000,000}", "thousands separators"),
    ("1000000", r"\boxed{1000001}", "exact: no tolerance on integers"),
    ("0.5", r"\boxed{50\%}", "known simplification: 50% reads as 50"),
]
MATH_FAST = [0, 1, 2, 4, 5, 8, 13]  # a subset for the fast mode

# %% [markdown]
# Step 2: code. Task: read two integers, print their sum.


# %%
ADD_TESTS = [("1 2\n", "3\n"), ("-5 5\n", "0\n"), ("123456789 987654321\n", "1111111110\n")]
C_ADD = """
#include <stdio.h>
int main(void) { long long a, b; scanf("%lld %lld", &a, &b); printf("%lld\\n", a + b); return 0; }
"""
CODE_CASES = {  # name: (language, source; None = the model wrote prose, no program)
    "correct": ("python", "a, b = map(int, input().split())\nprint(a + b)"),
    "wrong (a - b)": ("python", "a, b = map(int, input().split())\nprint(a - b)"),
    "too slow (busy loop)": ("python", "a, b = map(int, input().split())\nwhile True:\n    pass"),
    "crashes": ("python", "a, b = map(int, input().split())\nprint(a / 0)"),
    "syntax error": ("python", "def f(:\n    pass"),
    "prose, no program": ("python", None),
    "C, correct": ("c", C_ADD),
    "C, does not compile": ("c", "int main(void) { return x; }"),
}
CODE_FAST = ["correct", "wrong (a - b)", "too slow (busy loop)", "crashes"]


# %%
def hostile_programs(marker: str, out: Path, repo_file: str) -> dict[str, str]:
    """Each prints "pwned" only if its attack worked. The expected output is "pwned"."""
    outside = [str(out / f"escape-{marker}"), f"/var/tmp/escape-{marker}", f"../../escape-{marker}"]
    return {
        "fork bomb": """
            import os
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
            """,
        "memory bomb": """
            chunks = []
            while True:
                chunks.append(bytearray(50 * 2**20))
            """,
        "write outside its dir": f"""
            wrote = 0
            for path in {outside!r}:
                try:
                    open(path, "w").write("x")
                    wrote += 1
                except OSError:
                    pass
            print("pwned" if wrote else "contained")
            """,
        "read the test data": f"""
            import json
            print(json.load(open({repo_file!r}))["cases"][0]["output"])
            """,
    }


# %%
def one_line(reason: str, width: int = 100) -> str:
    return " ".join(reason.split())[:width]


# %%
def timed_scores(verifier, rollouts):
    """Score one rollout at a time, to show what each verdict costs."""
    out = []
    for r in rollouts:
        t0 = time.perf_counter()
        (score,) = verifier.score([r])
        out.append((score, time.perf_counter() - t0))
    return out


# %%
def wait_for_no_strays(timeout_s: float = 5.0) -> list[int]:
    """A SIGKILLed process needs a moment to disappear; poll until none is left."""
    deadline = time.monotonic() + timeout_s
    while (left := stray_processes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


# %%
def plot(rows, path: Path) -> None:
    """rows: (label, seconds, reward)."""
    fig = Figure(figsize=(8, 0.32 * len(rows) + 1.2), layout="constrained")
    ax = fig.subplots()
    labels = [r[0] for r in rows][::-1]
    secs = [r[1] for r in rows][::-1]
    colors = ["tab:green" if r[2] >= 1 else "tab:red" for r in rows][::-1]
    ax.barh(range(len(rows)), secs, color=colors)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("seconds to a verdict (green: reward 1, red: reward 0)")
    ax.set_title(
        "what a verdict costs: math answers take micro- to milliseconds (the first symbolic\n"
        "check also imports sympy); a program takes a sandbox per test, up to its limits",
        fontsize=9,
    )
    fig.savefig(path, dpi=110)


# %%
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="fewer cases, tighter limits (CI)")
    parser.add_argument("--out", default="runs/tutorials/03_verifiers")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    limits = Limits(cpu_s=0.5, wall_s=1.0) if args.fast else Limits(cpu_s=1.0, wall_s=2.0)
    print(
        f"mode: {'fast' if args.fast else 'full'}   isolation mode here: {isolation_mode()!r}   "
        f"limits per test: {limits.cpu_s}s CPU, {limits.wall_limit_s}s wall, "
        f"{limits.memory_mb} MB, {limits.nproc} processes"
    )
    plot_rows, results = [], {}

    print("\nStep 1. math: extraction, then equivalence")
    cases = [MATH_CASES[i] for i in MATH_FAST] if args.fast else MATH_CASES
    scored = timed_scores(
        MathVerifier(), [rollout(text, {"answer": ref}) for ref, text, _ in cases]
    )
    print(f"  {'reference':10s} {'model wrote':38s} reward  reason")
    for (ref, text, why), (score, secs) in zip(cases, scored, strict=True):
        print(f"  {ref:10s} {text:38s} {score.reward:4.0f}    {score.reason}   [{why}]")
        plot_rows.append((f"math: {why}", secs, score.reward))
    results["math"] = [
        dict(reference=r, text=t, reward=s.reward, reason=s.reason)
        for (r, t, _), (s, _) in zip(cases, scored, strict=True)
    ]

    with tempfile.TemporaryDirectory() as tmp:  # the test repository lives outside `out`
        repo = TestRepository(Path(tmp) / "repo")
        tests = put_tests(repo, ADD_TESTS)  # stored once; tasks refer to it by sha256
        print(
            f"\nStep 2. code: 'print a + b', {len(ADD_TESTS)} test cases stored as {tests[:12]}..."
        )
        verifier = CodeVerifier(repo, CodeVerifierConfig(limits=limits))
        names = [
            n
            for n in (CODE_FAST if args.fast else CODE_CASES)
            if CODE_CASES[n][0] in available_languages()
        ]  # C needs gcc on PATH
        batch = [
            rollout(
                fenced(CODE_CASES[n][1], CODE_CASES[n][0]),
                {"tests": tests, "language": CODE_CASES[n][0]},
            )
            for n in names
        ]
        scored = timed_scores(verifier, batch)
        for name, (score, secs) in zip(names, scored, strict=True):
            print(
                f"  {name:24s} reward {score.reward:.0f}   {secs:5.2f}s   {one_line(score.reason)}"
            )
            plot_rows.append((f"code: {name}", secs, score.reward))
        results["code"] = {
            n: dict(reward=s.reward, reason=s.reason)
            for n, (s, _) in zip(names, scored, strict=True)
        }

        print("\nStep 3. hostile programs, one batch through a VerifierPool of 2 workers")
        pwned = put_tests(repo, [("", "pwned\n")])
        repo_file = os.path.join(repo.root, pwned[:2], pwned)  # where the answers sit on disk
        marker = uuid.uuid4().hex[:12]
        programs = hostile_programs(marker, out, repo_file)
        strays_before = len(stray_processes())
        batch = [rollout(fenced(src), {"tests": pwned}) for src in programs.values()]
        config = CodeVerifierConfig(limits=limits)
        with VerifierPool(
            CodeVerifier(repo, config), PoolConfig(workers=2, item_timeout_s=30)
        ) as pool:
            t0 = time.perf_counter()
            scores = pool.score(batch)
            batch_s = time.perf_counter() - t0
            for name, score in zip(programs, scores, strict=True):
                print(f"  {name:24s} reward {score.reward:.0f}   {one_line(score.reason)}")
                plot_rows.append(
                    (f"hostile: {name} (batch mean)", batch_s / len(batch), score.reward)
                )
            print(f"  (the batch took {batch_s:.1f}s on 2 workers)")
            (after,) = pool.score([rollout(fenced(CODE_CASES["correct"][1]), {"tests": tests})])
            restarts = pool.restarts

        left = wait_for_no_strays()
        escaped = [
            p for p in (out / f"escape-{marker}", Path(f"/var/tmp/escape-{marker}")) if p.exists()
        ]
        checks = {
            "every hostile program scored 0": all(s.reward == 0 for s in scores),
            "no sandbox process left": not left,
            "no file written outside": not escaped,
            "the pool still scores a correct program": after.reward == 1.0,
        }
        print("  host after the batch:")
        for what, ok in checks.items():
            print(f"    {what:42s} {ok}")
        print(
            f"    (pool worker restarts: {restarts}; sandbox processes before the batch: "
            f"{strays_before}, after: {len(left)})"
        )
        results["hostile"] = {
            n: dict(reward=s.reward, reason=s.reason) for n, s in zip(programs, scores, strict=True)
        }
        results["host_checks"] = checks

    plot(plot_rows, out / "verdicts.png")
    results["mode"] = "fast" if args.fast else "full"
    results["isolation_mode"] = isolation_mode()
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out / 'verdicts.png'} and {out / 'results.json'}")
    if not all(checks.values()):
        raise SystemExit("the sandbox did NOT contain every hostile program: see above")


# %%
if __name__ == "__main__":
    main()
