"""JSONL loader: good lines become Prompts; bad lines are counted with line number and reason."""

import json
import logging

import pytest

from minirl.data import load_jsonl
from minirl.tokenizer import CharTokenizer


def write(tmp_path, lines: list[bytes | str], name="math.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else x.encode() for x in lines) + b"\n")
    return path


def test_good_and_malformed_lines(tmp_path, caplog):
    good = json.dumps({"question": "what is 2+3?", "answer": "2+3=5\n#### 5"})
    lines = [
        good,  # 1
        "{not json",  # 2
        "",  # 3
        json.dumps(["a", "list"]),  # 4
        json.dumps({"question": "q"}),  # 5
        json.dumps({"question": "q", "answer": "no marker"}),  # 6
        json.dumps({"question": "Big Q?", "answer": "#### 1"}),  # 7: upper case
        json.dumps({"question": "q", "answer": 7}),  # 8
        json.dumps({"question": "  ", "answer": "#### 1"}),  # 9
        json.dumps({"question": "q", "answer": "x ####  "}),  # 10
        b"\xff\xfe",  # 11
        json.dumps({"question": "sum 1,2?", "answer": "1+2=3 #### 3", "extra": 1}),  # 12
    ]
    with caplog.at_level(logging.WARNING, logger="minirl.data.jsonl"):
        prompts, report = load_jsonl(write(tmp_path, lines))
    assert (report.num_lines, report.num_good, report.num_bad) == (12, 2, 10)
    assert report.bad == [
        (2, "invalid JSON: Expecting property name enclosed in double quotes at column 2"),
        (3, "empty line"),
        (4, "expected a JSON object, got list"),
        (5, "missing key 'answer'"),
        (6, "'answer' has no final '#### <answer>'"),
        (7, "question: character 'B' is not in the tokenizer's alphabet"),
        (8, "'answer' is not a string"),
        (9, "empty 'question'"),
        (10, "empty final answer after '####' in 'answer'"),
        (11, "not valid UTF-8 (byte 0)"),
    ]
    assert "line 2 skipped" in caplog.text and "2 good, 10 bad of 12 lines" in caplog.text

    first, second = prompts
    assert first.task == "math" and first.text == "what is 2+3?\n"
    assert first.meta == {"answer": "5", "solution": "2+3=5\n#### 5", "line": 1}
    assert list(first.tokens) == list(CharTokenizer().encode("what is 2+3?\n"))
    assert second.meta["answer"] == "3" and second.meta["line"] == 12


def test_uids_are_stable_and_distinct(tmp_path):
    row = json.dumps({"question": "q", "answer": "#### 1"})
    path = write(tmp_path, [row, row, row])
    a, _ = load_jsonl(path)
    b, _ = load_jsonl(path)
    assert [p.uid for p in a] == [p.uid for p in b]
    assert len({p.uid for p in a}) == 3
    c, _ = load_jsonl(path, name="other")
    assert not {p.uid for p in a} & {p.uid for p in c}


def test_zero_good_lines_is_a_clear_error(tmp_path):
    path = write(tmp_path, ["{}", "oops"])
    with pytest.raises(ValueError, match=r"(?s)no usable lines.*line 1: missing key 'question'"):
        load_jsonl(path)


def test_options_keys_template_lowercase_crlf(tmp_path):
    row = json.dumps({"problem": "What Is 1+1?", "solution": "1+1=2\n#### 2"}) + "\r"
    path = write(tmp_path, [row])
    prompts, report = load_jsonl(
        path,
        name="gsm",
        question_key="problem",
        answer_key="solution",
        template="q: {question}\na:",
        lowercase=True,
    )
    assert report.num_bad == 0
    assert prompts[0].text == "q: what is 1+1?\na:" and prompts[0].task == "gsm"
    with pytest.raises(ValueError, match="template"):
        load_jsonl(path, template="no placeholder")
