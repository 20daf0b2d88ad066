"""The code verifier: reward a completion by running its program on test data held by reference.

Flow for one rollout (RLAX Sec. 6.1: the request carries code plus links, never the test data):

    text --extract_code--> code --make_request(code, meta)--> request (plain JSON-able dict)
         --verify_request(request, repository)--> response (plain dict) --> Score(reward, reason)

`verify_request` is the whole service side: a remote verifier (scale/) only has to move these two
dicts over the network and keep a `TestRepository` next to the sandboxes.

Task meta keys (on `rollout.prompt.meta`); the tests come in one of three ways:
  "tests"            sha256 of a test file in the repository, a JSON object
                     {"cases": [{"input": "...", "output": "..."}, ...]}; a case may give
                     "input_sha256"/"output_sha256" instead, for large files stored separately
  "cases"            or the cases themselves, [{"input": "...", "output": "..."}, ...] (a dataset
                     row's tests, tasks/code_rows.py: no repository needed)
  "test_code"        or assert-based tests (HumanEval, MBPP), with "entry_point" and
                     "code_prefix": the program run is code_prefix + the completion's code +
                     test_code + `check(entry_point)` (when an entry point is given), and it
                     passes when it reaches its end: a last line the program cannot know in
                     advance is printed after the checks (`assert_program`)
  "checker"          sha256 of a checker program {"language": "python"|"c"|"cpp", "source": ...}
  "language"         "python" (default from the config) | "c" | "cpp"
  "time_limit_s"     CPU seconds per test (default from the config's Limits)
  "memory_limit_mb"  address-space limit per run
  "compare"          "exact" | "lines" | "tokens" | "floats"
  "reward_mode"      "all" (1 only if every test passes; stops at the first failure) | "fraction"

Code extraction: the last fenced block (```python ... ```) whose tag names the task's language
(or has no tag); without any fence, the whole text as it is (a HumanEval completion continues
a function body: its indentation is code). An unclosed final fence (the model ran out of tokens)
counts up to the end of the text. A block loses its blank first and last lines, nothing else.

The repository's root is added to the sandbox's hidden paths, so a program cannot read the
expected outputs from disk.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from minirl.data.verifier_api import safe_scores
from minirl.types import Rollout, Score
from minirl.verifiers.code_runner import COMPARE_MODES, Program, TestCase, run_tests
from minirl.verifiers.repository import RepositoryError, TestRepository, check_sha
from minirl.verifiers.sandbox import Limits, SandboxConfig

LANGUAGES = ("python", "c", "cpp")
REWARD_MODES = ("all", "fraction")
_ALIASES = {
    "python": ("python", "python3", "py"),
    "c": ("c",),
    "cpp": ("cpp", "c++", "cc", "cxx"),
}
_FENCE_RE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class CodeVerifierConfig:
    language: str = "python"
    limits: Limits = Limits()
    compare: str = "tokens"
    float_tol: float = 1e-6
    reward_mode: str = "all"
    max_code_bytes: int = 64 * 1024
    sandbox: SandboxConfig = SandboxConfig()

    def __post_init__(self):
        if self.language not in LANGUAGES:
            raise ValueError(f"language must be one of {LANGUAGES}, got {self.language!r}")
        if self.compare not in COMPARE_MODES:
            raise ValueError(f"compare must be one of {COMPARE_MODES}, got {self.compare!r}")
        if self.reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {self.reward_mode!r}")
        if not self.float_tol >= 0 or self.max_code_bytes <= 0:
            raise ValueError("float_tol must be >= 0 and max_code_bytes > 0")


def extract_code(text: str, language: str = "python") -> str | None:
    """The program in a completion (rules in the module docstring), or None."""
    return _extract(text, language)[0]


def _extract(text: str, language: str) -> tuple[str | None, bool]:
    """(code or None, whether it came from a fenced block)."""
    text = text or ""
    blocks = _FENCE_RE.findall(text)
    if not blocks:
        return (text if text.strip() else None), False
    wanted = _ALIASES.get(language, (language,))
    for tag, body in reversed(blocks):
        if tag.lower() in wanted or not tag:
            body = body.rstrip().lstrip("\n")
            return (body if body.strip() else None), True
    return None, True


def assert_program(code: str, meta: Mapping[str, Any], fenced: bool) -> tuple[str, str]:
    """(program, its last line when every check passed) for assert-based tests: the row's
    code prefix (a function head), the completion (a continuation; a fenced block is whole code
    and starts on a new line), the tests, `check(entry_point)`, then a marker line made from a
    hash of everything before it, written past the program's own output."""
    prefix, entry = meta.get("code_prefix") or "", meta.get("entry_point")
    tests = meta["test_code"]
    if not isinstance(prefix, str) or not isinstance(tests, str):
        raise ValueError("code_prefix and test_code must be strings")
    program = prefix + ("\n" if fenced else "") + code + "\n\n" + tests + "\n"
    if entry:
        program += f"\ncheck({entry})\n"
    marker = "minirl: checks passed " + hashlib.sha256(program.encode()).hexdigest()[:16]
    program += (
        "\nimport os as _minirl_os, sys as _minirl_sys\n_minirl_sys.stdout.flush()\n"
        f"_minirl_os.write(1, b'\\n{marker}\\n')\n"
    )
    return program, marker


# ------------------------------------------------------------------------- data by reference


def put_tests(repo: TestRepository, cases: Sequence[TestCase | tuple[str, str]]) -> str:
    """Store a test file; returns the sha to put in `meta["tests"]`."""
    pairs = [(c.input, c.output) if isinstance(c, TestCase) else tuple(c) for c in cases]
    return repo.put({"cases": [{"input": i, "output": o} for i, o in pairs]})


def put_checker(repo: TestRepository, language: str, source: str) -> str:
    """Store a checker program; returns the sha to put in `meta["checker"]`."""
    if language not in LANGUAGES:
        raise ValueError(f"checker language must be one of {LANGUAGES}, got {language!r}")
    return repo.put({"language": language, "source": source})


def load_tests(repo: TestRepository, sha: str) -> list[TestCase]:
    obj = repo.get_json(sha)
    if not isinstance(obj, dict) or not isinstance(obj.get("cases"), list) or not obj["cases"]:
        raise RepositoryError(f"test file {sha[:12]}… has no 'cases' list")
    cases = []
    for case in obj["cases"]:
        fields = {}
        for key in ("input", "output"):
            if isinstance(case, dict) and isinstance(case.get(key), str):
                fields[key] = case[key]
            elif isinstance(case, dict) and f"{key}_sha256" in case:
                fields[key] = repo.get(check_sha(case[f"{key}_sha256"])).decode("utf-8")
            else:
                raise RepositoryError(f"test file {sha[:12]}…: a case lacks {key!r}")
        cases.append(TestCase(**fields))
    return cases


def load_checker(repo: TestRepository, sha: str) -> Program:
    obj = repo.get_json(sha)
    if not (
        isinstance(obj, dict)
        and obj.get("language") in LANGUAGES
        and isinstance(obj.get("source"), str)
    ):
        raise RepositoryError(f"checker {sha[:12]}… is not {{'language', 'source'}}")
    return Program(obj["language"], obj["source"])


# -------------------------------------------------------------------------- request/response


def make_request(code: str, meta: Mapping[str, Any], config: CodeVerifierConfig) -> dict[str, Any]:
    """The JSON-able request for one program; raises ValueError on bad task meta. The tests go
    by reference (meta["tests"]) or, for a dataset row's own cases, by value (meta["cases"])."""
    tests, cases = meta.get("tests"), meta.get("cases")
    if not isinstance(tests, str) and cases is None:
        raise ValueError("meta['tests'] (sha256 of the test file) or meta['cases'] is missing")
    checker = meta.get("checker")
    limits = config.limits
    cpu_s = meta.get("time_limit_s", limits.cpu_s)
    return {
        "code": code,
        "language": meta.get("language", config.language),
        **({"tests": tests} if isinstance(tests, str) else {"cases": cases}),
        "checker": checker,
        "limits": {
            "cpu_s": cpu_s,
            "wall_s": limits.wall_s if "time_limit_s" not in meta else None,
            "memory_mb": meta.get("memory_limit_mb", limits.memory_mb),
            "output_bytes": limits.output_bytes,
        },
        "compare": meta.get("compare", config.compare),
        "float_tol": meta.get("float_tol", config.float_tol),
        "reward_mode": meta.get("reward_mode", config.reward_mode),
    }


def _response(reward: float, reason: str, verdicts: dict | None = None) -> dict[str, Any]:
    return {"reward": float(reward), "reason": reason, "verdicts": verdicts}


def inline_cases(cases: Any) -> list[TestCase]:
    """A request's own cases, checked: a non-empty list of {"input": str, "output": str}."""
    if not isinstance(cases, list) or not cases:
        raise RepositoryError("the request's cases must be a non-empty list")
    out = []
    for case in cases:
        if not (
            isinstance(case, dict)
            and isinstance(case.get("input"), str)
            and isinstance(case.get("output"), str)
        ):
            raise RepositoryError("each case must be {'input': str, 'output': str}")
        out.append(TestCase(case["input"], case["output"]))
    return out


def _load(request: Mapping[str, Any], repo: TestRepository | None):
    """(test cases, checker or None) of a request, by value or from `repo`."""
    if "cases" in request:
        tests = inline_cases(request["cases"])
    elif repo is None:
        raise RepositoryError("no repository here to read test references from")
    else:
        tests = load_tests(repo, check_sha(request["tests"]))
    checker = request.get("checker")
    if checker is not None and repo is None:
        raise RepositoryError("no repository here to read the checker from")
    return tests, (load_checker(repo, check_sha(checker)) if checker is not None else None)


def verify_request(
    request: Mapping[str, Any],
    repo: TestRepository | None,
    sandbox: SandboxConfig = SandboxConfig(),
) -> dict[str, Any]:
    """Judge one request against `repo` (the service side; None when every request carries
    its cases). Returns {"reward": float, "reason": str, "verdicts": Verdicts.to_dict() |
    None}; never raises for bad code, bad references or corrupt data — those are reward 0 with
    the cause as reason."""
    try:
        language, mode = request["language"], request["reward_mode"]
        if language not in LANGUAGES or mode not in REWARD_MODES:
            raise ValueError(f"language {language!r} / reward_mode {mode!r} not supported")
        if request["compare"] not in COMPARE_MODES:
            raise ValueError(f"compare mode {request['compare']!r} not supported")
        limits = Limits(**request["limits"])
        float_tol = float(request["float_tol"])
        code = request["code"]
        if not isinstance(code, str):
            raise ValueError("code must be a string")
    except (KeyError, TypeError, ValueError) as e:
        return _response(0.0, f"bad request: {e}")
    try:
        tests, checker = _load(request, repo)
    except (RepositoryError, UnicodeDecodeError) as e:
        return _response(0.0, f"test data: {e}")
    roots = (repo.root,) if repo is not None else ()
    hidden = dataclasses.replace(sandbox, hidden_paths=(*sandbox.hidden_paths, *roots))
    verdicts = run_tests(
        code,
        tests,
        limits,
        language=language,
        compare=request["compare"],
        float_tol=float_tol,
        checker=checker,
        sandbox=hidden,
        stop_on_failure=mode == "all",
    )
    return _response(verdicts.reward(mode), verdicts.reason(), verdicts.to_dict())


class CodeVerifier:
    """`Verifier` for code tasks: test data by reference in `repository`, or carried by the
    rows themselves (meta "cases" or "test_code"; `repository` may then be None)."""

    def __init__(
        self,
        repository: TestRepository | None = None,
        config: CodeVerifierConfig = CodeVerifierConfig(),
    ):
        self.repository = repository
        self.config = config

    def score_one(self, text: str, meta: Mapping[str, Any]) -> Score:
        language = meta.get("language", self.config.language)
        code, fenced = _extract(text, language if isinstance(language, str) else "")
        if code is None:
            return Score(0.0, f"no {language} code found")
        if len(code.encode("utf-8", "replace")) > self.config.max_code_bytes:
            return Score(0.0, f"code longer than {self.config.max_code_bytes} bytes")
        try:
            if "test_code" in meta:  # assert-based: one run, judged by its last line
                code, marker = assert_program(code, meta, fenced)
                cases = [{"input": "", "output": marker}]
                meta = {**meta, "cases": cases, "compare": "last_line", "language": "python"}
            request = make_request(code, meta, self.config)
        except ValueError as e:
            return Score(0.0, f"bad task meta: {e}")
        response = verify_request(request, self.repository, self.config.sandbox)
        return Score(response["reward"], response["reason"])

    def score(self, rollouts: Sequence[Rollout]) -> list[Score]:
        return safe_scores(
            lambda r: self.score_one(r.text, r.prompt.meta), rollouts, "code verifier error"
        )
