"""Your own task's rows (issue #34): code problems that carry their tests (HumanEval/MBPP asserts,
APPS/CodeContests stdin/stdout) and a reward function of your own (`file.py:function`), scored
in-process and through a pool. The problems are tiny ones written for these tests; each row's
canonical solution must pass and a wrong one fail. End-to-end runs: tests/test_your_own_task.py."""

import json
import math
import textwrap

import numpy as np
import pytest

from minirl.modeling.tokenizer import CharTokenizer
from minirl.tasks.files import FileFormat, scan
from minirl.types import Score
from minirl.verifiers import (
    CodeVerifier,
    PoolConfig,
    RewardFunction,
    VerifierPool,
    extract_code,
    get_verifier,
)
from minirl.verifiers.code_verifier import assert_program

CODE_ROWS = FileFormat(use_chat_template=False, targets="tests")

# HumanEval style: the prompt is the function's head, the completion continues its body.
HUMANEVAL = [
    {
        "prompt": "def add(a, b):\n    '''the sum of a and b'''\n",
        "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-4, 4) == 0\n",
        "entry_point": "add",
        "wrong": "    return a - b\n",
    },
    {
        "prompt": "def is_even(n):\n    '''true when n is even'''\n",
        "canonical_solution": "    return n % 2 == 0\n",
        "test": "def check(candidate):\n    assert candidate(4)\n    assert not candidate(7)\n",
        "entry_point": "is_even",
        "wrong": "    return n % 2 == 1\n",
    },
    {
        "prompt": "def reverse_words(s):\n    '''the words of s in reverse order'''\n",
        "canonical_solution": "    return ' '.join(s.split()[::-1])\n",
        "test": "def check(candidate):\n    assert candidate('a bc d') == 'd bc a'\n",
        "entry_point": "reverse_words",
        "wrong": "    return s[::-1]\n",
    },
    {  # MBPP style: a task in words, asserts that call the function by name
        "text": "write a function max_of_three(a, b, c) that returns the largest",
        "test_list": ["assert max_of_three(1, 5, 3) == 5", "assert max_of_three(-1, -5, -3) == -1"],
        "solution": "```python\ndef max_of_three(a, b, c):\n    return max(a, b, c)\n```",
        "wrong": "```python\ndef max_of_three(a, b, c):\n    return a\n```",
    },
]

STDIN = [
    {
        "question": "read two numbers and print their sum",
        "inputs": ["1 2\n", "5 7\n"],
        "outputs": ["3\n", "12\n"],
    },
    {"question": "print the double of n", "test_cases": [{"input": "3\n", "output": "6\n"}]},
    {"question": "print n squared", "test_cases": {"input": ["4\n"], "output": ["16\n"]}},
    {  # APPS: input_output as a JSON string
        "question": "print n minus one",
        "input_output": json.dumps({"inputs": ["10\n", "1\n"], "outputs": ["9\n", "0\n"]}),
    },
    {  # CodeContests: public, private and generated tests are all run
        "description": "print the length of a line",
        "public_tests": {"input": ["abc\n"], "output": ["3\n"]},
        "private_tests": {"input": ["hello\n"], "output": ["5\n"]},
    },
]
STDIN_RIGHT = [
    "a, b = map(int, input().split())\nprint(a + b)",
    "print(2 * int(input()))",
    "```python\nn = int(input())\nprint(n * n)\n```",
    "print(int(input()) - 1)",
    "print(len(input()))",
]
STDIN_WRONG = ["print(3)", "print(7)", "print(15)", "print(9)", "print(3)"]


def _write(path, rows):
    path.write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "wrong"}) + "\n" for r in rows)
    )
    return path


def _prompts(path, rows, fmt=CODE_ROWS):
    files, report = scan(_write(path, rows), CharTokenizer(), fmt)
    return files["all"], report


def _rollout(prompt, text):
    from minirl.types import Rollout

    zeros = np.zeros(1, np.int32)
    return Rollout(prompt, 0, zeros, np.zeros(1, np.float32), zeros, "eos", text=text)


def test_extract_code_keeps_a_continuation_as_written():
    """docs/verifiers.md: without fences the whole text is the code. A HumanEval completion
    continues a function body, so its indentation is code (it used to be stripped)."""
    assert extract_code("    return a + b\n") == "    return a + b\n"
    assert extract_code("```python\n\n    return 1\n\n```") == "    return 1"
    assert extract_code("  \n") is None


def test_assert_based_rows_pass_their_canonical_solution_and_fail_a_wrong_one(tmp_path):
    prompts, report = _prompts(tmp_path / "he.jsonl", HUMANEVAL)
    assert report.num_good == 4 and report.num_bad == 0
    assert prompts[0].text.startswith("def add(a, b):") and prompts[0].meta["entry_point"] == "add"
    verifier = CodeVerifier()  # no repository: the rows carry their tests
    right = [_rollout(p, p.meta["solution"]) for p in prompts]
    wrong = [_rollout(p, row["wrong"]) for p, row in zip(prompts, HUMANEVAL, strict=True)]
    scores = verifier.score(right + wrong)
    assert [s.reward for s in scores] == [1.0] * 4 + [0.0] * 4, [s.reason for s in scores]
    assert scores[0].reason == "accepted (1/1 tests)"
    assert scores[4].reason.startswith("runtime error") and "AssertionError" in scores[4].reason
    add = prompts[0]
    tricks = {  # text -> reward: what the program prints is its own business; skipping is not
        "    print('debug', a)\n    return a + b\n": 1.0,
        "```python\ndef add(a, b):\n    return a + b\n\nprint(add(2, 2))\n```": 1.0,
        "    import sys\n    sys.exit(0)\n": 0.0,
        "    return a + b\nimport os\nos._exit(0)\n": 0.0,
        "    return a + b\ncheck = lambda f: None\n": 1.0,  # the row's check comes later
    }
    got = verifier.score([_rollout(add, text) for text in tricks])
    assert [s.reward for s in got] == list(tricks.values()), [s.reason for s in got]


def test_the_assert_program_is_prefix_completion_tests_check(tmp_path):
    meta = {"code_prefix": "def f():\n", "test_code": "def check(g):\n    assert g()\n"}
    program, marker = assert_program("    return 1\n", {**meta, "entry_point": "f"}, False)
    assert program.startswith("def f():\n    return 1\n\n\ndef check(g):\n    assert g()\n\n")
    assert "\ncheck(f)\n" in program and program.rstrip().endswith(f"\\n{marker}\\n')")
    other, other_marker = assert_program("    return 2\n", {**meta, "entry_point": "f"}, False)
    assert other_marker != marker  # the last line depends on the whole program


def test_stdin_rows_pass_their_solutions_and_bad_rows_say_why(tmp_path):
    bad = [
        {
            "question": "apps call-based",
            "input_output": {"fn_name": "f", "inputs": [], "outputs": []},
        },
        {"question": "no tests at all"},
        {"question": "uneven", "inputs": ["1\n"], "outputs": []},
        {"question": "empty", "test_cases": []},
    ]
    prompts, report = _prompts(tmp_path / "io.jsonl", STDIN + bad)
    assert report.num_good == 5
    reasons = [why for _, why in report.bad]
    assert "fn_name" in reasons[0] and reasons[1].startswith("no tests")
    assert "1 inputs but 0 outputs" in reasons[2] and "empty" in reasons[3]
    assert [len(p.meta["cases"]) for p in prompts] == [2, 1, 1, 2, 2]
    assert prompts[4].text.startswith("print the length")  # CodeContests' "description"
    verifier = CodeVerifier()
    scores = verifier.score(
        [_rollout(p, t) for p, t in zip(prompts, STDIN_RIGHT, strict=True)]
        + [_rollout(p, t) for p, t in zip(prompts, STDIN_WRONG, strict=True)]
    )
    assert [s.reward for s in scores] == [1.0] * 5 + [0.0] * 5, [s.reason for s in scores]
    assert scores[0].reason == "accepted (2/2 tests)"


def test_code_rows_in_a_pool_score_as_in_process_and_references_need_a_repository(tmp_path):
    prompts, _ = _prompts(tmp_path / "he.jsonl", HUMANEVAL[:2])
    rows = [_rollout(p, p.meta["solution"]) for p in prompts]
    rows += [_rollout(p, r["wrong"]) for p, r in zip(prompts, HUMANEVAL, strict=False)]
    by_reference = _rollout(prompts[0], "print(1)")
    by_reference.prompt.meta.clear()
    by_reference.prompt.meta["tests"] = "a" * 64
    expected = CodeVerifier().score(rows)
    with VerifierPool(get_verifier("code"), PoolConfig(workers=1)) as pool:
        assert pool.score(rows) == expected
        (no_repo,) = pool.score([by_reference])
    assert [s.reward for s in expected] == [1.0, 1.0, 0.0, 0.0]
    assert no_repo == Score(0.0, "test data: no repository here to read test references from")


REWARD_FILE = """
    import math
    import numpy as np
    from minirl.types import Score

    def score(completion, row):
        return float(row["answer"] in completion)

    def graded(completion, row):
        return Score(0.5, "half") if "half" in completion else completion == row["answer"]

    def broken(completion, row):
        return row["missing"]

    def nan(completion, row):
        return math.nan

    def text(completion, row):
        return "yes"

    def numpy(completion, row):
        return np.float32(0.25)
"""


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(textwrap.dedent(REWARD_FILE))
    return path


def test_a_reward_function_of_your_own_in_process_and_in_a_pool(tmp_path, reward_file):
    rows = [{"question": "say 7", "answer": "7", "extra": [1, 2]}, {"question": "x", "answer": "8"}]
    prompts, report = _prompts(
        tmp_path / "rows.jsonl", rows, FileFormat(targets="row", use_chat_template=False)
    )
    assert report.num_good == 2 and prompts[0].meta["fields"]["extra"] == [1, 2]
    rollouts = [
        _rollout(prompts[0], "it is 7"),
        _rollout(prompts[1], "half"),
        _rollout(prompts[1], "8"),
    ]
    expect = {
        "score": [(1.0, ""), (0.0, ""), (1.0, "")],
        "graded": [(0.0, "wrong answer"), (0.5, "half"), (1.0, "correct")],
        "broken": [(0.0, "reward function raised KeyError: 'missing'")] * 3,
        "nan": [(0.0, "reward function returned nan")] * 3,
        "text": [(0.0, "reward function returned str, not a number")] * 3,
        "numpy": [(0.25, "")] * 3,
    }
    for name, want in expect.items():
        verifier = get_verifier(f"{reward_file}:{name}")
        assert isinstance(verifier, RewardFunction)
        assert [(s.reward, s.reason) for s in verifier.score(rollouts)] == want, name
    with VerifierPool(RewardFunction(f"{reward_file}:graded"), PoolConfig(workers=1)) as pool:
        assert [(s.reward, s.reason) for s in pool.score(rollouts)] == expect["graded"]
    assert all(
        math.isfinite(s.reward) for s in RewardFunction(f"{reward_file}:nan").score(rollouts)
    )


def test_a_reward_function_that_cannot_load_is_one_clear_error(tmp_path, reward_file):
    (tmp_path / "broken.py").write_text("def score(:\n")
    (tmp_path / "exits.py").write_text("raise SystemExit(3)\n")
    for spec, message in [
        (f"{tmp_path}/nope.py:score", "no file"),
        (f"{reward_file}:absent", "has no function 'absent'"),
        (f"{tmp_path}/broken.py:score", "failed to load: SyntaxError"),
        (f"{tmp_path}/exits.py:score", "failed to load: SystemExit"),
    ]:
        with pytest.raises(ValueError, match=message) as info:
            RewardFunction(spec)
        assert "\n" not in str(info.value)
