"""Code problems in dataset rows: the tests a row carries -> the meta the code verifier reads.

    meta = code_tests(row)     # ValueError when the row has no tests minirl can run

Two kinds of rows (field names as the public datasets spell them):

  stdin/stdout (APPS, CodeContests)   the program reads a test's input and must print its output
    "test_cases": [{"input": "1 2\\n", "output": "3\\n"}, ...]  (or {"input": [..], "output": [..]})
    "inputs": [...], "outputs": [...]
    "input_output": {"inputs": [...], "outputs": [...]}         (APPS; also as a JSON string)
    "public_tests" / "private_tests" / "generated_tests": {"input": [...], "output": [...]}
                                                                  (CodeContests; all are used)
    -> meta {"cases": [{"input", "output"}, ...]}

  assert-based (HumanEval, MBPP)      the program passes when its tests run without an error
    "test": "def check(candidate): assert ...", "entry_point": "add"   (HumanEval: the row's
        "prompt" is the function's head; the completion continues it)
    "test_list": ["assert add(1, 2) == 3", ...], "test_setup_code": "..."   (MBPP)
    -> meta {"test_code", "entry_point", "code_prefix"}; the code verifier runs
       code_prefix + completion + test_code + `check(entry_point)` (code_verifier.py)

APPS rows whose tests call a function (`"fn_name"`) are refused: only stdin/stdout is run.
A row's worked solution for a warm start: "canonical_solution" (HumanEval) or "solution".
"""

from __future__ import annotations

import json
from typing import Any

CONTEST_SPLITS = ("public_tests", "private_tests", "generated_tests")


def _pairs(inputs: Any, outputs: Any, field: str) -> list[dict[str, str]]:
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise ValueError(f"{field}: inputs and outputs must be lists")
    if len(inputs) != len(outputs):
        raise ValueError(f"{field}: {len(inputs)} inputs but {len(outputs)} outputs")
    if not all(isinstance(x, str) for x in inputs + outputs):
        raise ValueError(f"{field}: every input and output must be a string")
    return [{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)]


def _stdin_cases(row: dict) -> list[dict[str, str]] | None:
    """The row's stdin/stdout cases, or None if it has none of the fields above."""
    if "test_cases" in row:
        cases = row["test_cases"]
        if isinstance(cases, dict):
            return _pairs(cases.get("input"), cases.get("output"), "test_cases")
        if not isinstance(cases, list) or not all(isinstance(c, dict) for c in cases):
            raise ValueError("test_cases must be a list of {input, output} objects")
        return _pairs(
            [c.get("input") for c in cases], [c.get("output") for c in cases], "test_cases"
        )
    if "inputs" in row or "outputs" in row:
        return _pairs(row.get("inputs"), row.get("outputs"), "inputs/outputs")
    if "input_output" in row:
        spec = row["input_output"]
        if isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except json.JSONDecodeError as e:
                raise ValueError(f"input_output is not JSON: {e.msg}") from None
        if not isinstance(spec, dict):
            raise ValueError("input_output must be an object with inputs and outputs")
        if spec.get("fn_name"):
            raise ValueError("input_output calls a function (fn_name): only stdin/stdout tests run")
        return _pairs(spec.get("inputs"), spec.get("outputs"), "input_output")
    splits = [s for s in CONTEST_SPLITS if isinstance(row.get(s), dict)]
    if splits:
        return [c for s in splits for c in _pairs(row[s].get("input"), row[s].get("output"), s)]
    return None


def _assert_tests(row: dict, prompt_code: str) -> dict[str, Any] | None:
    """The meta of an assert-based row, or None if it has no "test" / "test_list"."""
    if isinstance(row.get("test"), str) and row["test"].strip():
        test = row["test"]
    elif isinstance(row.get("test_list"), list) and row["test_list"]:
        if not all(isinstance(t, str) for t in row["test_list"]):
            raise ValueError("test_list must be a list of strings")
        test = "\n".join(row["test_list"])
    else:
        return None
    setup = row.get("test_setup_code") or ""
    if not isinstance(setup, str):
        raise ValueError("test_setup_code must be a string")
    entry = row.get("entry_point")
    if entry is not None and not (isinstance(entry, str) and entry.isidentifier()):
        raise ValueError(f"entry_point must be a Python name, got {entry!r}")
    return {
        "test_code": (setup + "\n" + test) if setup else test,
        "entry_point": entry,
        "code_prefix": prompt_code if entry else "",
    }


def code_tests(row: dict, prompt_code: str = "") -> dict[str, Any]:
    """The code verifier's meta for one row (the module docstring lists the fields).
    `prompt_code` is the row's prompt, the function head a HumanEval completion continues."""
    cases = _stdin_cases(row)
    if cases is not None:
        if not cases:
            raise ValueError("the row's test cases are empty")
        return {"cases": cases}
    tests = _assert_tests(row, prompt_code)
    if tests is None:
        raise ValueError(
            "no tests: a code row needs test_cases, inputs/outputs, input_output, "
            "public_tests, or test (+ entry_point) / test_list"
        )
    return tests


def code_solution(row: dict) -> str | None:
    """The row's worked solution (what a warm start trains on), if it has one."""
    for key in ("canonical_solution", "solution"):
        if isinstance(row.get(key), str) and row[key].strip():
            return row[key]
    return None
