"""Judge a program against test cases: compile, run each case in the sandbox, compare, verdict.

    verdicts = run_tests(code, [TestCase("1 2\\n", "3\\n")], Limits(cpu_s=1), language="python")
    verdicts.all_passed, verdicts.fraction, verdicts.reason()

This is a small online judge (what RLAX's Oubliette does per test-case pair, Sec. 6.1):

  languages   python (the sandbox's interpreter, `-S -s -B`), c (gcc -O2 -std=gnu11 -lm),
              cpp (g++ -O2 -std=gnu++17) — C/C++ only where the compiler is on PATH
              (`available_languages()`). Compilation runs in the sandbox too, with its own limits.
  comparison  "exact" bytes; "lines" (trailing spaces and trailing blank lines ignored);
              "tokens" (whitespace-separated, the default); "floats" (tokens, numbers equal
              within `float_tol` absolute OR relative, like Codeforces checkers);
              "last_line" (the last non-blank line, stripped: a harness's verdict line after
              whatever the program printed itself).
  checker     a Codeforces/testlib-style program for tasks with many right answers. It is run
              as `checker input.txt output.txt answer.txt` (testlib's argument order: the input,
              the contestant's output, the reference answer) in its own sandbox. Exit code 0 =
              accepted, 1 = wrong answer, 2 = presentation error (counted as wrong answer),
              anything else, a crash or a Python traceback = "checker error" (so a buggy checker
              never passes for a wrong answer silently). Its stdout/stderr is the detail.
  verdicts    accepted, wrong answer, time limit, memory limit, output limit, runtime error,
              compile error, checker error, sandbox error.

With `stop_on_failure` (the default), judging stops at the first failed case, like a judge; the
remaining cases count as not passed. Simplified on purpose: no interactive problems, no file I/O
problems, one source file per program, compiled checkers are not cached between calls.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import shutil
from collections.abc import Sequence
from typing import Any

from minirl.verifiers.sandbox import (
    Limits,
    RunResult,
    SandboxConfig,
    python_interpreter,
    run_sandboxed,
)

COMPARE_MODES = ("exact", "lines", "tokens", "floats", "last_line")
COMPILE_LIMITS = Limits(cpu_s=10.0, wall_s=20.0, memory_mb=2048, file_mb=64, nproc=32)
CHECKER_LIMITS = Limits(cpu_s=5.0, wall_s=10.0, memory_mb=512, output_bytes=1 << 16)


class Verdict(str, enum.Enum):
    ACCEPTED = "accepted"
    WRONG_ANSWER = "wrong answer"
    TIME_LIMIT = "time limit"
    MEMORY_LIMIT = "memory limit"
    OUTPUT_LIMIT = "output limit"
    RUNTIME_ERROR = "runtime error"
    COMPILE_ERROR = "compile error"
    CHECKER_ERROR = "checker error"
    SANDBOX_ERROR = "sandbox error"


_STATUS_TO_VERDICT = {
    "time limit": Verdict.TIME_LIMIT,
    "memory limit": Verdict.MEMORY_LIMIT,
    "output limit": Verdict.OUTPUT_LIMIT,
    "runtime error": Verdict.RUNTIME_ERROR,
    "sandbox error": Verdict.SANDBOX_ERROR,
}


@dataclasses.dataclass(frozen=True)
class TestCase:
    __test__ = False  # not a pytest class

    input: str
    output: str  # the expected output (or the reference answer a checker receives)


@dataclasses.dataclass(frozen=True)
class Program:
    """Source code in one of the supported languages (candidates and checkers alike)."""

    language: str
    source: str


@dataclasses.dataclass(frozen=True)
class CaseVerdict:
    verdict: Verdict
    time_s: float = 0.0  # CPU seconds
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "time_s": round(self.time_s, 4),
            "detail": self.detail,
        }


@dataclasses.dataclass(frozen=True)
class Verdicts:
    """The outcome of judging one program: one CaseVerdict per case run (fewer than `total`
    if judging stopped early), or a compile/checker error before any case ran."""

    cases: tuple[CaseVerdict, ...]
    total: int
    error: Verdict | None = None  # COMPILE_ERROR / CHECKER_ERROR / SANDBOX_ERROR before cases
    error_detail: str = ""

    @property
    def passed(self) -> int:
        return sum(c.verdict is Verdict.ACCEPTED for c in self.cases)

    @property
    def all_passed(self) -> bool:
        return self.error is None and self.total > 0 and self.passed == self.total

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def reward(self, mode: str = "all") -> float:
        """ "all": 1 if every case passed else 0. "fraction": share of cases passed."""
        if mode == "all":
            return 1.0 if self.all_passed else 0.0
        if mode == "fraction":
            return self.fraction
        raise ValueError(f"reward mode must be 'all' or 'fraction', got {mode!r}")

    def reason(self) -> str:
        if self.error is not None:
            return f"{self.error.value}: {self.error_detail}"[:300]
        if self.all_passed:
            return f"accepted ({self.passed}/{self.total} tests)"
        failed = next(
            (i for i, c in enumerate(self.cases) if c.verdict is not Verdict.ACCEPTED), None
        )
        if failed is None:
            return f"no tests run ({self.passed}/{self.total})"
        case = self.cases[failed]
        detail = f": {case.detail}" if case.detail else ""
        return f"{case.verdict.value} on test {failed + 1} ({self.passed}/{self.total} passed){detail}"[
            :300
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "cases": [c.to_dict() for c in self.cases],
            "total": self.total,
            "passed": self.passed,
            "error": self.error.value if self.error else None,
            "error_detail": self.error_detail,
        }


# --------------------------------------------------------------------------------- languages

_SOURCES = {"python": "main.py", "c": "main.c", "cpp": "main.cpp"}
_COMPILERS = {
    "c": ("gcc", "-O2", "-std=gnu11", "-o", "prog", "main.c", "-lm"),
    "cpp": ("g++", "-O2", "-std=gnu++17", "-o", "prog", "main.cpp"),
}


def available_languages() -> list[str]:
    return ["python"] + [lang for lang, cmd in _COMPILERS.items() if shutil.which(cmd[0])]


@dataclasses.dataclass(frozen=True)
class _Executable:
    argv: tuple[str, ...]
    files: dict[str, bytes]


def compile_program(program: Program, sandbox: SandboxConfig) -> _Executable | str:
    """An executable form of `program`, or the compiler's error text."""
    if program.language not in _SOURCES:
        return f"unsupported language {program.language!r}; use one of {sorted(_SOURCES)}"
    source = {_SOURCES[program.language]: program.source.encode("utf-8", "replace")}
    if program.language == "python":
        return _Executable((python_interpreter(sandbox), "-S", "-s", "-B", "main.py"), source)
    compiler = _COMPILERS[program.language]
    if not shutil.which(compiler[0]):
        return f"{compiler[0]} is not installed here"
    result = run_sandboxed(
        compiler, files=source, limits=COMPILE_LIMITS, config=sandbox, collect=("prog",)
    )
    if result.status(COMPILE_LIMITS) != "ok" or "prog" not in result.files:
        text = result.error or result.stderr.decode("utf-8", "replace").strip()
        return text[-2000:] or result.status(COMPILE_LIMITS)
    return _Executable(("./prog",), {"prog": result.files["prog"]})


# -------------------------------------------------------------------------------- comparison


def _is_close(a: str, b: str, tol: float) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    if math.isnan(x) or math.isnan(y):
        return False
    return abs(x - y) <= tol or abs(x - y) <= tol * abs(y)


def outputs_match(got: str, expected: str, mode: str = "tokens", float_tol: float = 1e-6) -> bool:
    """Compare a program's output with the expected output (modes in the module docstring)."""
    if mode == "exact":
        return got == expected
    if mode == "lines":
        strip = lambda s: [line.rstrip() for line in s.rstrip().splitlines()]
        return strip(got) == strip(expected)
    if mode == "last_line":
        return got.strip().rsplit("\n", 1)[-1].strip() == expected.strip()
    got_tokens, expected_tokens = got.split(), expected.split()
    if len(got_tokens) != len(expected_tokens):
        return False
    if mode == "tokens":
        return got_tokens == expected_tokens
    if mode == "floats":
        return all(
            _is_close(a, b, float_tol) for a, b in zip(got_tokens, expected_tokens, strict=True)
        )
    raise ValueError(f"compare mode must be one of {COMPARE_MODES}, got {mode!r}")


def _case_verdict(result: RunResult, limits: Limits) -> CaseVerdict | None:
    """The verdict when the run itself failed; None when it finished cleanly."""
    status = result.status(limits)
    if status == "ok":
        return None
    detail = result.error
    if status == "time limit":
        detail = f"cpu {result.cpu_s:.2f}s, wall {result.wall_s:.2f}s, limit {limits.cpu_s}s"
    elif status == "runtime error":
        tail = result.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        detail = f"exit {result.returncode}" + (f": {tail[0][:120]}" if tail else "")
    return CaseVerdict(_STATUS_TO_VERDICT[status], result.cpu_s, detail)


def _check(
    checker: _Executable, case: TestCase, output: bytes, sandbox: SandboxConfig
) -> CaseVerdict:
    files = dict(checker.files)
    files.update(
        {"input.txt": case.input.encode(), "output.txt": output, "answer.txt": case.output.encode()}
    )
    argv = (*checker.argv, "input.txt", "output.txt", "answer.txt")
    result = run_sandboxed(argv, files=files, limits=CHECKER_LIMITS, config=sandbox)
    message = (result.stdout + result.stderr).decode("utf-8", "replace").strip()[:200]
    crashed = b"Traceback (most recent call last)" in result.stderr  # a Python checker's bug
    if result.status(CHECKER_LIMITS) in ("ok", "runtime error") and not crashed:
        if result.returncode == 0:
            return CaseVerdict(Verdict.ACCEPTED, 0.0, message)
        if result.returncode in (1, 2):
            return CaseVerdict(Verdict.WRONG_ANSWER, 0.0, message)
    return CaseVerdict(Verdict.CHECKER_ERROR, 0.0, f"{result.status(CHECKER_LIMITS)}: {message}")


def run_tests(
    code: str,
    tests: Sequence[TestCase],
    limits: Limits | None = None,
    *,
    language: str = "python",
    compare: str = "tokens",
    float_tol: float = 1e-6,
    checker: Program | None = None,
    sandbox: SandboxConfig | None = None,
    stop_on_failure: bool = True,
) -> Verdicts:
    """Judge `code` on `tests`. Never raises for anything the code does."""
    limits = limits or Limits()
    sandbox = sandbox or SandboxConfig()
    if compare not in COMPARE_MODES:
        raise ValueError(f"compare mode must be one of {COMPARE_MODES}, got {compare!r}")
    total = len(tests)
    program = compile_program(Program(language, code), sandbox)
    if isinstance(program, str):
        return Verdicts((), total, Verdict.COMPILE_ERROR, program)
    judge = None
    if checker is not None:
        judge = compile_program(checker, sandbox)
        if isinstance(judge, str):
            return Verdicts((), total, Verdict.CHECKER_ERROR, f"checker does not compile: {judge}")
    cases: list[CaseVerdict] = []
    for case in tests:
        result = run_sandboxed(
            program.argv,
            files=program.files,
            stdin=case.input.encode(),
            limits=limits,
            config=sandbox,
        )
        verdict = _case_verdict(result, limits)
        if verdict is None and judge is not None:
            verdict = _check(judge, case, result.stdout, sandbox)
            verdict = dataclasses.replace(verdict, time_s=result.cpu_s)
        elif verdict is None:
            got = result.stdout.decode("utf-8", "replace")
            same = outputs_match(got, case.output, compare, float_tol)
            verdict = CaseVerdict(Verdict.ACCEPTED if same else Verdict.WRONG_ANSWER, result.cpu_s)
        cases.append(verdict)
        if stop_on_failure and verdict.verdict is not Verdict.ACCEPTED:
            break
    return Verdicts(tuple(cases), total)
