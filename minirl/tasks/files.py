"""Dataset files of your own: rows of problems with gold answers -> Prompts, read lazily.

    task = FileTask.load("train.jsonl", tokenizer, get_verifier("math"), eval_path="test.jsonl")
    task.train[0]                  # a Prompt, built from its row only when asked for
    task.reports["train"].summary()  # good rows, and every bad row's number and reason

Formats: `.jsonl` (one JSON object per line) and `.parquet`. A row is either

    {"question": "Tom has 3 apples ...", "answer": "3 + 4 = 7\\n#### 7"}             GSM8K
    {"problem": "...", "solution": "... so the answer is \\\\boxed{\\\\frac12}."}       MATH
    {"question": "...", "answer": "7"} or {"question": "...", "answer": 7}           plain
    {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", ...}]}    chat

with the field names as config (`prompt_key`, `answer_key`, `messages_key`). The gold answer is the
text after the LAST `####`, else the LAST `\\boxed{...}` (nested braces), else the whole (short)
answer. A chat row's final assistant message is its worked solution (and its gold answer when the
row has no answer field). Prompt meta: {"answer": gold, "solution": worked text or None, "row": n}
— the verifier compares with "answer", a warm start may train on "solution".

Prompt text: the row becomes chat messages (an optional system prompt, then the question with an
optional instruction suffix such as "Put the final answer in \\\\boxed{}."), rendered with the
tokenizer's chat template when it has one and `use_chat_template` (encoded without an extra BOS:
the template writes its own), else as plain text with BOS.

Bad rows (invalid UTF-8 or JSON, not an object, a missing, empty or non-string field, malformed
messages, no gold answer, a prompt longer than `max_prompt_tokens`) are counted with their row
number (1-based, in file order, for both formats) and reason, logged, and skipped — never fatal.
A file with no good row is an error.

Memory: files of hundreds of MB are never held as Python objects. Loading streams the file once
(JSONL line by line; Parquet in record batches) to check every row, keeping only a numpy array
of the good rows' positions (JSONL byte offsets, Parquet row indices; the Parquet table itself
stays in Arrow memory). A Prompt is built when `PromptFile[i]` is read.

Held-out split: `eval_path`, or — when there is none — a hash of each row's content decides
(`tasks.split_of`, `test_fraction`), so no held-out problem is ever trained on and the split does
not depend on row order. Uids hash (dataset name, content): stable across runs and reorderings.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from minirl.configlib import optional_import
from minirl.data.task_api import split_of, stable_hash
from minirl.tasks.code_rows import code_solution, code_tests
from minirl.types import Prompt
from minirl.verifiers.math_extract import find_boxed

log = logging.getLogger(__name__)
FORMATS = (".jsonl", ".parquet")
TARGETS = ("answer", "tests", "row", "messages")
PROMPT_FALLBACKS = (
    "prompt",
    "question",
    "problem",
    "description",
    "text",
)  # code rows, "row" targets
MAX_PLAIN_ANSWER = (
    100  # characters: a longer answer without #### or \boxed is a solution, not a gold
)


@dataclasses.dataclass(frozen=True)
class FileFormat:
    """How a row becomes a prompt (the `data.*` settings of minirl.config.DataConfig)."""

    prompt_key: str = "question"
    answer_key: str = "answer"
    messages_key: str = "messages"
    system_prompt: str = ""
    instruction: str = ""
    use_chat_template: bool = True
    chat_template_kwargs: dict = dataclasses.field(default_factory=dict)
    max_prompt_tokens: int | None = None
    # what a row must hold besides its prompt: "answer" (a gold answer), "tests" (a code
    # problem's tests, tasks/code_rows.py), "row" (nothing: your reward function reads the row),
    # "messages" (nothing: a reward model reads the prompt's chat messages)
    targets: str = "answer"
    with_row: bool = False  # every prompt's meta also holds the row ("fields": your env or agent)

    def __post_init__(self):
        if self.targets not in TARGETS:
            raise ValueError(f"targets must be one of {TARGETS}, got {self.targets!r}")


@dataclasses.dataclass
class FileReport:
    """What a load found: row counts and, for every bad row, (row number, reason)."""

    path: str
    num_rows: int = 0
    num_good: int = 0
    bad: list[tuple[int, str]] = dataclasses.field(default_factory=list)

    @property
    def num_bad(self) -> int:
        return len(self.bad)

    def summary(self, max_lines: int = 5) -> str:
        head = f"{self.path}: {self.num_good} good, {self.num_bad} bad of {self.num_rows} rows"
        shown = [f"  row {n}: {why}" for n, why in self.bad[:max_lines]]
        more = [f"  ... and {self.num_bad - max_lines} more"] if self.num_bad > max_lines else []
        return "\n".join([head, *shown, *more])


# ------------------------------------------------------------------------------- one row


def gold_answer(value, field: str) -> tuple[str, str | None]:
    """(gold answer, worked solution or None) from an answer field; ValueError if there is none."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (str(value), None) if np.isfinite(value) else _bad(f"{field!r} is not finite")
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{field!r} is missing, empty or not a string")
    text = value.strip()
    if "####" in text:
        gold = text.rsplit("####", 1)[1].strip()
        return (gold, text) if gold else _bad(f"nothing after the last '####' in {field!r}")
    boxed = find_boxed(text)
    if boxed is not None:
        return (boxed.strip(), text) if boxed.strip() else _bad(f"empty \\boxed{{}} in {field!r}")
    if len(text) > MAX_PLAIN_ANSWER:
        raise ValueError(f"{field!r} has no final answer ('#### x' or \\boxed{{x}})")
    return text, None


def _bad(reason: str):
    raise ValueError(reason)


def row_messages(obj, fmt: FileFormat) -> tuple[list[dict], dict, str | None]:
    """(chat messages of the prompt, what the verifier reads, solution) of one decoded row. What
    the verifier reads is {"answer": gold} for answers, the code verifier's meta for tests
    (tasks/code_rows.py), {"fields": row} for a reward function of your own, {"messages": the
    prompt's messages} for a reward model."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    messages, prompt, solution = _prompt_messages(obj, fmt)
    if fmt.targets == "tests":
        targets, solution = code_tests(obj, prompt), code_solution(obj) or solution
    elif fmt.targets == "row":
        targets = {"fields": obj}
    elif fmt.targets == "messages":  # this list, with the edits below
        targets = {"messages": messages}
    elif fmt.answer_key in obj:
        gold, worked = gold_answer(obj[fmt.answer_key], fmt.answer_key)
        targets, solution = {"answer": gold}, worked or solution
    elif solution is not None:
        targets = {"answer": gold_answer(solution, "the assistant message")[0]}
    else:
        raise ValueError(f"missing answer field {fmt.answer_key!r}")
    if fmt.with_row:
        targets = {**targets, "fields": obj}
    if fmt.system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": fmt.system_prompt})
    if fmt.instruction:
        messages[-1] = {"role": "user", "content": messages[-1]["content"] + fmt.instruction}
    return messages, targets, solution


def _prompt_messages(obj: dict, fmt: FileFormat) -> tuple[list[dict], str, str | None]:
    """(messages, the prompt field as written or "", a chat row's final assistant message)."""
    if obj.get(fmt.messages_key) is not None:
        messages, solution = _check_messages(obj[fmt.messages_key], fmt.messages_key), None
        if messages[-1]["role"] == "assistant":
            solution = messages.pop()["content"]
        if not messages or messages[-1]["role"] != "user":
            raise ValueError(f"{fmt.messages_key!r} must end with a user message")
        return messages, "", solution
    keys = (fmt.prompt_key,) + (PROMPT_FALLBACKS if fmt.targets != "answer" else ())
    for key in keys:
        if isinstance(obj.get(key), str) and obj[key].strip():
            return [{"role": "user", "content": obj[key].strip()}], obj[key], None
    raise ValueError(
        f"no prompt: {fmt.prompt_key!r} (or {fmt.messages_key!r}) is missing, empty or not a string"
    )


def check_prompt_length(messages: list[dict], tokenizer, fmt: FileFormat) -> None:
    """A prompt whose text alone is longer than any `max_prompt_tokens`-token prompt can be is
    refused before it is tokenized (tokenizing a 50 MB line takes a minute): no token covers
    more than the tokenizer's `max_token_chars` characters (x 2 for normalisers that merge
    characters), so more characters than that bound means more tokens than the budget."""
    per_token = getattr(tokenizer, "max_token_chars", None)
    if fmt.max_prompt_tokens is None or not per_token:
        return
    chars = sum(len(m["content"]) for m in messages)
    bound = fmt.max_prompt_tokens * per_token * 2
    if chars > bound:
        raise ValueError(
            f"prompt of {chars} characters is longer than {fmt.max_prompt_tokens} tokens can "
            f"be (at most {bound} characters; engine.cache_len - data.max_new_tokens)"
        )


def _check_messages(value, key: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{key!r} must be a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        if not (
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
        ):
            raise ValueError(f"{key!r}[{i}] must be an object with string 'role' and 'content'")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def render(messages: list[dict], tokenizer, fmt: FileFormat) -> tuple[str, np.ndarray]:
    """(prompt text, its tokens): the chat template's layout, or plain text with BOS."""
    if fmt.use_chat_template and tokenizer.chat_template is not None:
        kwargs = fmt.chat_template_kwargs
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
        return text, tokenizer.encode(text, bos=False)
    text = "\n\n".join(m["content"] for m in messages) + "\n"
    return text, tokenizer.encode(text, bos=True)


# ------------------------------------------------------------------------------- the files


def _jsonl_rows(path: Path) -> Iterator[tuple[int, bytes]]:
    """(byte offset, raw line) for every line of a JSONL file."""
    offset = 0
    with open(path, "rb") as f:
        for raw in f:
            yield offset, raw
            offset += len(raw)


def _decode_line(raw: bytes):
    try:
        line = raw.decode("utf-8").lstrip("\ufeff")  # a byte-order mark some editors write
    except UnicodeDecodeError as e:
        raise ValueError(f"not valid UTF-8 (byte {e.start})") from None
    if not line.strip():
        raise ValueError("empty line")
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON: {e.msg} at column {e.colno}") from None


def _pyarrow_parquet():
    return optional_import("pyarrow.parquet", "hf", "a .parquet data file")


def _parquet_rows(path: Path, batch_rows: int = 1024) -> Iterator[tuple[int, object]]:
    """(row index, row) for every row of a Parquet file; a file pyarrow cannot read (not Parquet,
    truncated) is a ValueError that names it (pyarrow's own says only what it found)."""
    pq = _pyarrow_parquet()

    index = 0
    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows):
            for row in batch.to_pylist():
                yield index, row
                index += 1
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise ValueError(f"{path} is not a readable Parquet file: {e}") from None


class _Rows:
    """Random access to row `position` of a file: a JSONL byte offset or a Parquet row index."""

    def __init__(self, path: Path):
        self.path, self._table = path, None

    def __getitem__(self, position: int):
        if self.path.suffix == ".jsonl":
            with open(self.path, "rb") as f:
                f.seek(position)
                return _decode_line(f.readline())
        if self._table is None:  # Arrow memory, not Python objects; memory-mapped file
            pq = _pyarrow_parquet()
            self._table = pq.read_table(self.path, memory_map=True)
        return self._table.slice(position, 1).to_pylist()[0]


class PromptFile(Sequence):
    """The good rows of one file, in file order, as Prompts built on demand. `positions[i]`
    finds row i in the file, `numbers[i]` is its 1-based row number (for messages)."""

    def __init__(
        self,
        name: str,
        rows: _Rows,
        positions: np.ndarray,
        numbers: np.ndarray,
        tokenizer,
        fmt: FileFormat,
    ):
        self.name, self._rows, self.positions, self.numbers = name, rows, positions, numbers
        self._tokenizer, self._fmt = tokenizer, fmt

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        position = int(self.positions[i])
        messages, targets, solution = row_messages(self._rows[position], self._fmt)
        text, tokens = render(messages, self._tokenizer, self._fmt)
        # the row number makes two identical rows two prompts (uids are unique, minirl.types)
        number = int(self.numbers[i])
        uid = stable_hash("file", self.name, messages, targets.get("answer", ""), number)
        meta = {**targets, "solution": solution, "row": number}
        return Prompt(uid, self.name, text, tokens, meta)


def scan(
    path,
    tokenizer,
    fmt: FileFormat = FileFormat(),
    *,
    name: str | None = None,
    test_fraction: float | None = None,
    max_logged: int = 20,
) -> tuple[dict[str, PromptFile], FileReport]:
    """Check every row of `path` once (streamed) -> the good rows as PromptFiles and a report.
    With `test_fraction`, rows are split by a hash of their content into {"train", "test"};
    without, all good rows are {"all"}. Raises ValueError if the file has no good row."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise ValueError(f"{path}: unknown dataset format {path.suffix!r}; use one of {FORMATS}")
    if not path.is_file():
        raise FileNotFoundError(f"no dataset file at {path}")
    name = name or path.stem
    report = FileReport(os.fspath(path))
    rows = _jsonl_rows(path) if path.suffix == ".jsonl" else _parquet_rows(path)
    kept: dict[str, tuple[array, array]] = {}  # split -> (positions, row numbers), compact
    for number, (position, row) in enumerate(rows, start=1):
        report.num_rows = number
        try:
            obj = _decode_line(row) if path.suffix == ".jsonl" else row
            messages, _, _ = row_messages(obj, fmt)
            check_prompt_length(messages, tokenizer, fmt)
            _, tokens = render(messages, tokenizer, fmt)
            if fmt.max_prompt_tokens is not None and len(tokens) > fmt.max_prompt_tokens:
                raise ValueError(
                    f"prompt of {len(tokens)} tokens is longer than "
                    f"{fmt.max_prompt_tokens} (engine.cache_len - data.max_new_tokens)"
                )
        except ValueError as e:
            report.bad.append((number, str(e)))
            if report.num_bad <= max_logged:
                log.warning("%s row %d skipped: %s", path, number, e)
            continue
        # The split hashes the row as written (not its formatting: a new instruction or system
        # prompt must not move problems between train and test).
        content = json.dumps(obj, sort_keys=True, default=str)
        split = "all" if test_fraction is None else split_of(name, content, test_fraction)
        positions, numbers = kept.setdefault(split, (array("q"), array("q")))
        positions.append(position)
        numbers.append(number)
    report.num_good = sum(len(p) for p, _ in kept.values())
    if report.num_bad:
        log.warning("%s", report.summary())
    if not report.num_good:
        raise ValueError(_none_usable(path, report))
    reader = _Rows(path)
    files = {
        split: PromptFile(
            name, reader, np.frombuffer(p, np.int64), np.frombuffer(n, np.int64), tokenizer, fmt
        )
        for split, (p, n) in kept.items()
    }
    return files, report


def _none_usable(path: Path, report: FileReport) -> str:
    """One line saying why no row is usable (the report itself was logged above)."""
    reasons = {why for _, why in report.bad}
    if len(reasons) == 1 and report.num_bad > 1:  # one cause (a template, a field name): once
        return f"no usable rows in {path}: all {report.num_bad} rows: {reasons.pop()}"
    if not report.bad:
        return f"no usable rows in {path}: it holds no rows"
    number, why = report.bad[0]
    return f"no usable rows in {path} ({report.num_bad} bad, the first shown); row {number}: {why}"


# ------------------------------------------------------------------------------- the task


class FileTask:
    """A Task (minirl/data/task_api.py) over dataset files: `train` and `test` PromptFiles, the
    verifier it was given, and a completion budget. `FileTask.load` reads the files."""

    def __init__(
        self,
        name: str,
        train: PromptFile,
        test: PromptFile,
        verifier,
        max_new_tokens: int,
        config: FileFormat = FileFormat(),
        reports=None,
    ):
        self.name, self.train, self.test, self.verifier = name, train, test, verifier
        self.max_new_tokens, self.config, self.reports = max_new_tokens, config, reports or {}

    @classmethod
    def load(
        cls,
        train_path,
        tokenizer,
        verifier,
        *,
        eval_path=None,
        test_fraction: float = 0.05,
        max_new_tokens: int = 256,
        name: str | None = None,
        **format_fields,
    ) -> FileTask:
        """Read `train_path` (and `eval_path`, else hold out a content-hash split of it)."""
        fmt = FileFormat(**format_fields)
        name = name or Path(train_path).stem
        if eval_path:
            train, train_report = _only(scan(train_path, tokenizer, fmt, name=name))
            test, test_report = _only(scan(eval_path, tokenizer, fmt, name=name))
            reports = {"train": train_report, "test": test_report}
        else:
            files, report = scan(train_path, tokenizer, fmt, name=name, test_fraction=test_fraction)
            for split in ("train", "test"):
                if split not in files:
                    raise ValueError(
                        f"{train_path}: the content-hash split left no {split} rows "
                        f"(test_fraction={test_fraction}); pass --eval-data"
                    )
            train, test, reports = files["train"], files["test"], {"train": report}
        return cls(name, train, test, verifier, max_new_tokens, fmt, reports)

    def prompt(self, index: int, split: str = "train") -> Prompt:
        rows = {"train": self.train, "test": self.test}[split]
        return rows[index % len(rows)]

    def demonstration(self, prompt: Prompt, sample: int = 0) -> str:
        """The row's worked solution (for a supervised warm start)."""
        if prompt.meta.get("solution") is None:
            raise ValueError(
                f"{self.name} row {prompt.meta.get('row')} has no worked solution to "
                "train on (a warm start needs one; set sft.steps=0)"
            )
        return prompt.meta["solution"]


def _only(found: tuple[dict[str, PromptFile], FileReport]) -> tuple[PromptFile, FileReport]:
    files, report = found
    return files["all"], report
