"""Load a user dataset in the common math JSONL format into Prompts.

One JSON object per line, e.g. (GSM8K style):

    {"question": "what is 2+3?", "answer": "2+3=5\\n#### 5"}

Each good line becomes a Prompt with text `template.format(question=...)` (default: the question
and a newline), `task` = the dataset name, and meta
    {"answer": "5", "solution": "2+3=5\\n#### 5", "line": 1}
where "answer" is the text after the LAST "####" (what a math verifier compares) and "solution"
the whole worked answer (what a supervised warm-start may train on).

Bad lines never stop a load: each is counted with its line number and reason in the returned
`JsonlReport` (and logged) — invalid UTF-8 or JSON, not an object, missing/non-string/empty keys,
no "#### x", characters the tokenizer cannot encode. A file with zero good lines is an error.

Uids are stable: a hash of (dataset name, line number), so the same file gives the same uids in
every run. Simplification: the whole file is read into memory (fine up to ~10^6 short lines).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

from minirl.data.tasks import stable_hash
from minirl.tokenizer import CharTokenizer
from minirl.types import Prompt

log = logging.getLogger(__name__)


@dataclasses.dataclass
class JsonlReport:
    """What a load found: counts and, for every bad line, (line number, reason)."""

    path: str
    num_lines: int = 0
    num_good: int = 0
    bad: list[tuple[int, str]] = dataclasses.field(default_factory=list)

    @property
    def num_bad(self) -> int:
        return len(self.bad)

    def summary(self, max_lines: int = 5) -> str:
        head = f"{self.path}: {self.num_good} good, {self.num_bad} bad of {self.num_lines} lines"
        shown = [f"  line {n}: {why}" for n, why in self.bad[:max_lines]]
        more = [f"  ... and {self.num_bad - max_lines} more"] if self.num_bad > max_lines else []
        return "\n".join([head, *shown, *more])


def _parse_line(raw: bytes, question_key, answer_key, template, tokenizer, lowercase: bool):
    """(prompt text, meta) for one line, or raise ValueError(reason)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not valid UTF-8 (byte {e.start})") from None
    if not line.strip():
        raise ValueError("empty line")
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON: {e.msg} at column {e.colno}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    for key in (question_key, answer_key):
        if key not in obj:
            raise ValueError(f"missing key {key!r}")
        if not isinstance(obj[key], str):
            raise ValueError(f"{key!r} is not a string")
    question, solution = obj[question_key].strip(), obj[answer_key].strip()
    if lowercase:
        question, solution = question.lower(), solution.lower()
    if not question:
        raise ValueError(f"empty {question_key!r}")
    if "####" not in solution:
        raise ValueError(f"{answer_key!r} has no final '#### <answer>'")
    answer = solution.rsplit("####", 1)[1].strip()
    if not answer:
        raise ValueError(f"empty final answer after '####' in {answer_key!r}")
    text = template.format(question=question)
    for field, value in (("question", text), ("answer", solution)):
        try:
            tokenizer.encode(value)
        except ValueError as e:
            raise ValueError(f"{field}: {e}") from None
    return text, {"answer": answer, "solution": solution}


def load_jsonl(
    path: str | os.PathLike,
    name: str | None = None,
    *,
    tokenizer=None,
    question_key: str = "question",
    answer_key: str = "answer",
    template: str = "{question}\n",
    lowercase: bool = False,
    max_logged: int = 20,
) -> tuple[list[Prompt], JsonlReport]:
    """Read a math JSONL file. Returns (prompts, report); raises ValueError if no line is good.

    `tokenizer` defaults to the CharTokenizer (lower-case alphabet); `lowercase=True` lower-cases
    question and answer texts, for datasets written in mixed case.
    """
    if "{question}" not in template:
        raise ValueError("template must contain '{question}'")
    tokenizer = tokenizer or CharTokenizer()
    name = name or os.path.splitext(os.path.basename(os.fspath(path)))[0]
    report = JsonlReport(path=os.fspath(path))
    prompts = []
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the newline that ends the last line does not start another one
    for number, raw in enumerate(lines, start=1):
        raw = raw.rstrip(b"\r")
        try:
            text, meta = _parse_line(raw, question_key, answer_key, template, tokenizer, lowercase)
        except ValueError as e:
            report.bad.append((number, str(e)))
            if report.num_bad <= max_logged:
                log.warning("%s line %d skipped: %s", report.path, number, e)
            continue
        uid = stable_hash("jsonl", name, number)
        meta["line"] = number
        prompts.append(Prompt(uid, name, text, tokenizer.encode(text), meta))
    report.num_lines, report.num_good = len(lines), len(prompts)
    if report.num_bad:
        log.warning("%s", report.summary())
    if not prompts:
        raise ValueError(f"no usable lines in dataset {name!r}\n{report.summary()}")
    return prompts, report
