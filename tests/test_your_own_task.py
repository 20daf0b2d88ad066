"""Your own task from the command line (issue #34): `minirl train --data FILE --verifier code` on
rows that carry their tests, and `--verifier my_reward.py:score`, 2 RL steps each on the fixture
model (character tokenizer, so the rows use its alphabet). The verdicts themselves are tested in
tests/verifiers/test_verifier_rows.py; here: the run works end to end and its rewards are the
verifier's."""

import json

import pytest

from minirl import cli

# The fixture preset's shapes (16-token prompt bucket, 32-token cache), 8-token completions.
SETS = [
    "rl.steps=2",
    "data.max_new_tokens=8",
    "eval.prompts=4",
    "eval.samples=2",
    "log.samples_every=1",
]
ROWS = [  # prompts of at most 15 characters (+ BOS = the 16-token bucket)
    {
        "prompt": "def add(a, b):\n",
        "test": "def check(f):\n    assert f(1, 2) == 3\n",
        "entry_point": "add",
    },
    {
        "prompt": "def neg(a):\n",
        "test": "def check(f):\n    assert f(2) == -2\n",
        "entry_point": "neg",
    },
    {
        "prompt": "def one():\n",
        "test": "def check(f):\n    assert f() == 1\n",
        "entry_point": "one",
    },
    {"question": "print a+b", "inputs": ["1 2\n"], "outputs": ["3\n"], "answer": "3"},
]


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def _train(rows, run_dir, verifier):
    argv = ["train", "--preset", "fixture", "--data", str(rows), "--eval-data", str(rows)]
    argv += ["--verifier", verifier, "--run-dir", str(run_dir), "--quiet"]
    return cli.main(argv + [a for s in SETS for a in ("--set", s)])


def _samples(run_dir):
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_train_on_code_rows_with_the_code_verifier(rows, tmp_path):
    run_dir = tmp_path / "run"
    assert _train(rows, run_dir, "code") == 0
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    samples = _samples(run_dir)
    verdicts = ("accepted", "wrong answer", "runtime error", "time limit", "no python code")
    assert samples and all(s["reason"].startswith(verdicts) for s in samples), samples[:3]
    assert json.loads((run_dir / "summary.json").read_text())["after"]["pass@1"] >= 0


@pytest.mark.slow
def test_train_with_a_reward_function_of_your_own(rows, tmp_path):
    reward = tmp_path / "my_reward.py"
    reward.write_text("def score(completion, row):\n    return 0.25 * completion.count('a')\n")
    run_dir = tmp_path / "run"
    assert _train(rows, run_dir, f"{reward}:score") == 0
    samples = _samples(run_dir)
    assert samples and all(s["reward"] == 0.25 * s["completion"].count("a") for s in samples)
    assert any(s["reward"] > 0 for s in samples)
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["inputs"]["verifier"]["spec"] == f"{reward}:score"


def test_a_reward_function_that_is_not_there_is_a_one_line_error(rows, tmp_path, capsys):
    (tmp_path / "r.py").write_text("def other(completion, row):\n    return 1\n")
    for spec, message in [("nope.py:score", "no file"), ("r.py:score", "no function 'score'")]:
        code = cli.main(
            [
                "train",
                "--data",
                str(rows),
                "--verifier",
                str(tmp_path / spec),
                "--run-dir",
                str(tmp_path / "run"),
            ]
        )
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1, err
