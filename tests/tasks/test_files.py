"""Dataset files (minirl/tasks/files.py): JSONL and Parquet rows -> Prompts, bad rows counted.

A toy tokenizer stands in for a model's (bytes as ids, a ChatML-like template written in
Python), so these tests need no model files; tests/test_user_model.py runs a real one.
"""

import json
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from minirl.data import Mixture
from minirl.modeling.tokenizer import CharTokenizer
from minirl.tasks import FileTask
from minirl.tasks.files import FileFormat, gold_answer, scan
from minirl.verifiers import get_verifier


class ByteTokenizer:
    """ids = bytes + 1 (0 is BOS); a chat template that tags roles."""

    chat_template = "toy"
    bos_id, eos_id, pad_id, eos_ids = 0, 257, 258, (257,)

    def apply_chat_template(self, messages, add_generation_prompt=True):
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def encode(self, text, bos=True, eos=False):
        ids = [b + 1 for b in text.encode()]
        return np.asarray(([0] if bos else []) + ids + ([257] if eos else []), np.int32)


TOK = ByteTokenizer()
ROWS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "Simplify 2/4.", "answer": "It is \\boxed{\\frac{1}{2}}."},
    {"question": "What is 6 * 7?", "answer": 42},
    {"question": "Capital of France?", "answer": "Paris"},
    {
        "messages": [
            {"role": "user", "content": "What is 5 - 2?"},
            {"role": "assistant", "content": "5 - 2 = 3, so \\boxed{3}."},
        ]
    },
]


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def write_parquet(path, rows):
    table = pa.table(
        {
            "question": [r.get("question") for r in rows],
            "answer": [None if r.get("answer") is None else str(r["answer"]) for r in rows],
        }
    )
    pq.write_table(table, path)
    return path


def test_gold_answers():
    assert gold_answer("a\n#### 1,000 ", "answer") == ("1,000", "a\n#### 1,000")
    assert gold_answer("x #### 1 #### 2", "answer")[0] == "2"  # the LAST ####
    assert gold_answer("so \\boxed{\\frac{1}{\\sqrt{2}}} and \\boxed{7}", "a")[0] == "7"
    assert gold_answer("\\boxed{\\frac{1}{\\sqrt{2}}}", "a")[0] == "\\frac{1}{\\sqrt{2}}"
    assert gold_answer(3.5, "a") == ("3.5", None) and gold_answer(" 12 ", "a") == ("12", None)
    for bad, why in [
        ("", "missing, empty"),
        (True, "not a string"),
        ("x ####  ", "nothing after"),
        ("\\boxed{}", "empty"),
        ("word " * 30, "no final answer"),
        (float("nan"), "finite"),
    ]:
        with pytest.raises(ValueError, match=why):
            gold_answer(bad, "a")


def test_rows_become_prompts(tmp_path):
    files, report = scan(write_jsonl(tmp_path / "d.jsonl", ROWS), TOK)
    prompts = list(files["all"])
    assert report.num_rows == report.num_good == 5 and report.num_bad == 0
    assert [p.meta["answer"] for p in prompts] == ["7", "\\frac{1}{2}", "42", "Paris", "3"]
    assert [p.meta["row"] for p in prompts] == [1, 2, 3, 4, 5]
    assert (
        prompts[0].meta["solution"] == "3 + 4 = 7\n#### 7" and prompts[2].meta["solution"] is None
    )
    assert prompts[4].meta["solution"] == "5 - 2 = 3, so \\boxed{3}."  # the assistant turn
    assert prompts[4].text == "<user>What is 5 - 2?</user><assistant>"
    assert prompts[0].tokens[0] != 0  # the template's text is encoded without an extra BOS
    assert all(p.task == "d" for p in prompts)

    fmt = FileFormat(system_prompt="Be brief.", instruction=" Answer in \\boxed{}.")
    p = scan(tmp_path / "d.jsonl", TOK, fmt)[0]["all"][2]
    assert (
        p.text
        == "<system>Be brief.</system><user>What is 6 * 7? Answer in \\boxed{}.</user><assistant>"
    )
    raw = scan(tmp_path / "d.jsonl", TOK, FileFormat(use_chat_template=False))[0]["all"][2]
    assert raw.text == "What is 6 * 7?\n" and raw.tokens[0] == 0  # plain text gets BOS


def test_field_names_are_config(tmp_path):
    rows = [{"problem": "1+1?", "solution": "\\boxed{2}"}]
    path = write_jsonl(tmp_path / "math.jsonl", rows)
    with pytest.raises(ValueError, match="no prompt: 'question'"):
        scan(path, TOK)
    files, _ = scan(path, TOK, FileFormat(prompt_key="problem", answer_key="solution"))
    assert files["all"][0].meta["answer"] == "2"


def test_bad_rows_are_counted_with_row_numbers(tmp_path):
    lines = [
        ROWS[0],
        "{not json",
        "[1, 2]",
        {"question": "q"},
        {"question": "", "answer": "1"},
        {"question": 5, "answer": "1"},
        "",
        {"messages": [{"role": "user"}], "answer": "1"},
        {"messages": [{"role": "assistant", "content": "x \\boxed{1}"}]},
        {"question": "long " * 50, "answer": "1"},
        ROWS[2],
    ]
    path = write_jsonl(tmp_path / "bad.jsonl", lines)
    (tmp_path / "bad.jsonl").write_bytes(
        path.read_bytes() + b'{"question": "\xff", "answer": "1"}\n'
    )
    files, report = scan(path, TOK, FileFormat(max_prompt_tokens=120))
    assert report.num_rows == 12 and report.num_good == 2 and len(files["all"]) == 2
    reasons = dict(report.bad)
    assert sorted(reasons) == [2, 3, 4, 5, 6, 7, 8, 9, 10, 12]
    for row, why in [
        (2, "invalid JSON"),
        (3, "expected a JSON object, got list"),
        (4, "missing answer field 'answer'"),
        (5, "no prompt"),
        (6, "no prompt"),
        (7, "empty line"),
        (8, "'messages'[0] must be an object"),
        (9, "must end with a user message"),
        (10, "longer than 120"),
        (12, "not valid UTF-8"),
    ]:
        assert why in reasons[row], (row, reasons[row])
    assert [p.meta["row"] for p in files["all"]] == [1, 11]
    assert "row 2: invalid JSON" in report.summary()


class CountingTokenizer(ByteTokenizer):
    """ByteTokenizer that records the length of every text it encodes; a token is one byte,
    so it never stands for more than one character."""

    max_token_chars = 1

    def __init__(self):
        self.encoded = []

    def encode(self, text, bos=True, eos=False):
        self.encoded.append(len(text))
        return super().encode(text, bos, eos)


def test_a_huge_line_is_refused_by_its_length_before_it_is_tokenized(tmp_path):
    """Issue #34: a 50 MB line was tokenized whole (65 s) before it was skipped for length. A
    prompt with more characters than max_prompt_tokens tokens can cover is refused untokenized
    (here 5 MB; the bound is max_prompt_tokens x the longest token's characters x 2)."""
    huge = {"question": "x" * 5_000_000, "answer": "1"}
    just_fits = {"question": "y" * 80, "answer": "2"}  # tokenized, and within the budget
    tok = CountingTokenizer()
    files, report = scan(
        write_jsonl(tmp_path / "h.jsonl", [ROWS[0], huge, just_fits]),
        tok,
        FileFormat(max_prompt_tokens=120),
    )
    assert [n for n, _ in report.bad] == [2] and len(files["all"]) == 2
    assert "5000000 characters is longer than 120 tokens can be (at most 240" in report.bad[0][1]
    assert max(tok.encoded) < 1000  # the huge prompt never reached the tokenizer
    assert CharTokenizer().max_token_chars == 1


def test_empty_or_wholly_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="no usable rows in .*empty.jsonl"):
        scan(write_jsonl(tmp_path / "empty.jsonl", []), TOK)
    with pytest.raises(ValueError, match="row 1: invalid JSON"):
        scan(write_jsonl(tmp_path / "junk.jsonl", ["nope"]), TOK)
    with pytest.raises(ValueError, match="unknown dataset format '.csv'"):
        scan(tmp_path / "x.csv", TOK)
    (tmp_path / "text.parquet").write_text("not parquet")  # pyarrow's error named no file
    with pytest.raises(ValueError, match="text.parquet is not a readable Parquet file: .*magic"):
        scan(tmp_path / "text.parquet", TOK)
    whole = write_parquet(tmp_path / "cut.parquet", ROWS).read_bytes()
    (tmp_path / "cut.parquet").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match="cut.parquet is not a readable Parquet file"):
        scan(tmp_path / "cut.parquet", TOK)
    with pytest.raises(FileNotFoundError, match="no dataset file"):
        scan(tmp_path / "missing.jsonl", TOK)
    with pytest.raises(ValueError, match="row 1: character 'T' is not in the tokenizer's alphabet"):
        scan(write_jsonl(tmp_path / "caps.jsonl", ROWS[:1]), CharTokenizer())


def test_a_byte_order_mark_is_not_a_bad_row(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps(ROWS[0]) + "\n").encode())
    files, report = scan(path, TOK)
    assert report.num_bad == 0 and files["all"][0].meta["answer"] == "7"


def test_parquet_equals_jsonl(tmp_path):
    rows = ROWS[:4] + [{"question": None, "answer": "1"}]
    a, ra = scan(write_jsonl(tmp_path / "d.jsonl", rows), TOK)
    b, rb = scan(write_parquet(tmp_path / "d.parquet", rows), TOK)
    assert (ra.num_good, ra.bad[0][0]) == (rb.num_good, rb.bad[0][0]) == (4, 5)
    for x, y in zip(a["all"], b["all"], strict=True):
        assert (x.uid, x.text, x.meta) == (y.uid, y.text, y.meta)
        assert np.array_equal(x.tokens, y.tokens)


def test_content_hash_split_is_disjoint_stable_and_order_free(tmp_path):
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(400)]
    verifier = get_verifier("math")
    task = FileTask.load(write_jsonl(tmp_path / "d.jsonl", rows), TOK, verifier, test_fraction=0.1)
    train, test = {p.uid for p in task.train}, {p.uid for p in task.test}
    assert not train & test and len(train) + len(test) == 400
    assert 20 <= len(test) <= 60
    again = FileTask.load(
        write_jsonl(tmp_path / "r.jsonl", rows[::-1]), TOK, verifier, test_fraction=0.1, name="d"
    )
    # the same rows held out, whatever their order
    assert {p.text for p in again.test} == {p.text for p in task.test}
    assert task.prompt(len(task.test) + 1, "test").uid == task.test[1].uid
    # With an eval file, every good row of each file is used.
    ev = FileTask.load(
        tmp_path / "d.jsonl", TOK, verifier, eval_path=write_jsonl(tmp_path / "e.jsonl", rows[:7])
    )
    assert (len(ev.train), len(ev.test)) == (400, 7)
    with pytest.raises(ValueError, match="has no worked solution"):
        ev.demonstration(ev.train[0])


def test_mixture_over_a_file_resumes_exactly(tmp_path):
    rows = [{"question": f"q{i}?", "answer": "\\boxed{" + str(i) + "}"} for i in range(30)]
    task = FileTask.load(write_jsonl(tmp_path / "d.jsonl", rows), TOK, None, test_fraction=0.2)
    mix = Mixture({task.name: task.train}, seed=3)
    first = [p.uid for p in mix.next_prompts(17)]
    state = mix.state()
    rest = [p.uid for p in mix.next_prompts(40)]
    resumed = Mixture.restore({task.name: task.train}, json.loads(json.dumps(state)))
    assert [p.uid for p in resumed.next_prompts(40)] == rest
    # Epochs: every training row once per pass, in a fresh order each pass.
    n = len(task.train)
    stream = first + rest
    assert sorted(stream[:n]) == sorted(p.uid for p in task.train)
    assert task.demonstration(task.train[0]) == task.train[0].meta["solution"].strip()


def test_repeated_rows_and_a_file_shorter_than_a_batch_give_unique_prompts(tmp_path):
    """A careless file: the same problem twice, and fewer rows than a batch. Every prompt the
    mixture issues has its own uid (a uid keys the sampling draws; two equal uids in one batch
    were refused by make_batch, which ended a run on a launch test's data)."""
    rows = [ROWS[0], ROWS[2], ROWS[0]]
    task = FileTask.load(
        write_jsonl(tmp_path / "d.jsonl", rows),
        TOK,
        None,
        eval_path=write_jsonl(tmp_path / "e.jsonl", ROWS[3:4]),
    )
    assert len({p.uid for p in task.train}) == 3 and task.train[0].text == task.train[2].text
    issued = Mixture({task.name: task.train}, seed=0).next_prompts(8)  # 2 epochs and a bit
    assert len({p.uid for p in issued}) == 8
    assert sorted(p.meta["row"] for p in issued[:3]) == [1, 2, 3]


def test_loading_does_not_hold_the_file_in_python(tmp_path):
    path = tmp_path / "big.jsonl"
    row = {
        "question": "Ann has 12 pears and gets 30 more. How many pears? " * 4,
        "answer": "12 + 30 = 42\n#### 42",
    }
    line = (json.dumps(row) + "\n").encode()
    with open(path, "wb") as f:
        f.write(line * 40_000)  # ~10 MB
    tracemalloc.start()
    files, report = scan(path, TOK)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert report.num_good == 40_000
    assert peak < path.stat().st_size / 10  # positions and row numbers: 16 bytes a row
    assert files["all"][39_999].meta["row"] == 40_000
