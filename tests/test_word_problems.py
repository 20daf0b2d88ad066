"""experiments/word_problems.py: GSM8K-like problems, deterministic, right by construction,
train and test disjoint by content, rows in the format minirl's dataset loader reads."""

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "word_problems", ROOT / "experiments" / "word_problems.py"
)
wp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wp)


def _check_arithmetic(row):
    """Every reasoning line is true, and the last result is the gold answer."""
    lines = row["answer"].split("\n")
    ops = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__, "/": int.__floordiv__}
    value = None
    for line in lines[:-1]:
        a, op, b, _, c = line.split()
        assert ops[op](int(a), int(b)) == int(c), line
        assert op != "/" or int(a) % int(b) == 0
        value = int(c)
    assert lines[-1] == f"#### {value}" and value >= 1
    assert row["solution_text"].endswith(f"\\boxed{{{value}}}.")
    numbers = re.findall(r"\d+", row["question"])
    assert all(n in lines[0] + lines[1] for n in numbers)  # every quantity is used


def test_problems_are_deterministic_and_right():
    rows = [wp.problem(0, "train", i) for i in range(300)]
    assert rows == [wp.problem(0, "train", i) for i in range(300)]
    assert rows != [wp.problem(1, "train", i) for i in range(300)]
    for row in rows:
        _check_arithmetic(row)
    kinds = {row["question"].split(".")[1][:12] for row in rows}
    assert len(kinds) > 5  # several templates and names


def test_files_are_disjoint_and_load_as_a_dataset(tmp_path):
    from hf_tiny import make_tokenizer_dir

    from minirl.hf.hf_tokenizer import HFTokenizer
    from minirl.tasks import FileTask
    from minirl.verifiers import get_verifier

    train = wp.write(tmp_path, "train", 400, seed=0)
    test = wp.write(tmp_path, "test", 40, seed=0)
    questions = {
        s: [json.loads(x)["question"] for x in p.read_text().splitlines()]
        for s, p in (("train", train), ("test", test))
    }
    assert len(set(questions["train"])) == 400 and len(set(questions["test"])) == 40
    assert not set(questions["train"]) & set(questions["test"])
    tokenizer = HFTokenizer.from_dir(make_tokenizer_dir(tmp_path / "tok"))
    task = FileTask.load(train, tokenizer, get_verifier("math"), eval_path=test)
    assert (len(task.train), len(task.test)) == (400, 40) and task.reports["train"].num_bad == 0
