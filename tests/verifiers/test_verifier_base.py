"""The Verifier protocol, the CallableVerifier adapter and the registry."""

import pytest

from minirl.configlib import ConfigError
from minirl.types import Score
from minirl.verifiers import (
    CallableVerifier,
    CodeVerifier,
    MathVerifier,
    RewardFunction,
    Verifier,
    as_score,
    dataset_verifier,
    get_verifier,
    register_verifier,
    row_targets,
    verifier_names,
)


def test_callable_verifier_accepts_shorthands_and_contains_errors(make_rollout):
    def fn(text, meta):
        if text == "boom":
            raise ValueError("cannot parse")
        if text == "bad type":
            return "yes"
        return {"bool": True, "float": 0.25, "score": Score(0.5, "half")}[text]

    verifier = CallableVerifier(fn, name="mine")
    assert isinstance(verifier, Verifier)
    scores = verifier.score(
        [make_rollout(t) for t in ["bool", "float", "score", "boom", "bad type"]]
    )
    assert scores[:3] == [Score(1.0, "correct"), Score(0.25, ""), Score(0.5, "half")]
    assert scores[3] == Score(0.0, "verifier error in mine: ValueError: cannot parse")
    assert scores[4].reward == 0.0 and "TypeError" in scores[4].reason


def test_meta_is_a_copy(make_rollout):
    def mutate(text, meta):
        meta["answer"] = "changed"
        return True

    rollout = make_rollout("x", {"answer": "1"})
    CallableVerifier(mutate).score([rollout])
    assert rollout.prompt.meta == {"answer": "1"}


def test_as_score():
    assert as_score(False) == Score(0.0, "wrong answer")
    assert as_score(1) == Score(1.0, "")
    with pytest.raises(TypeError):
        as_score(None)


def test_registry(tmp_path):
    assert {"math", "code"} <= set(verifier_names())
    math = get_verifier("math", rel_tol=1e-3)
    assert isinstance(math, MathVerifier) and math.config.rel_tol == 1e-3
    code = get_verifier("code", repository=tmp_path / "repo", language="cpp")
    assert isinstance(code, CodeVerifier) and code.config.language == "cpp"
    rows_only = get_verifier("code")  # no repository: judges the tests rows carry (meta "cases")
    assert isinstance(rows_only, CodeVerifier) and rows_only.repository is None
    with pytest.raises(KeyError, match="unknown verifier"):
        get_verifier("chess")
    with pytest.raises(ValueError, match="already registered"):
        register_verifier("math", lambda: None)


def test_dataset_verifier_and_row_targets(tmp_path, make_rollout):
    # data.verifier as `minirl train --data FILE --verifier NAME` builds it, and what rows need
    shaped = dataset_verifier("math", format_reward=0.25)
    assert isinstance(shaped, MathVerifier) and shaped.config.format_reward == 0.25
    assert dataset_verifier("math").config.format_reward == 0.0
    (tmp_path / "mine.py").write_text("def score(text, row):\n    return len(text) / 4\n")
    spec = f"{tmp_path / 'mine.py'}:score"
    mine = dataset_verifier(spec)
    assert isinstance(mine, RewardFunction) and mine.score([make_rollout("abc")])[0].reward == 0.75
    with pytest.raises(ConfigError, match="data.verifier='chess'"):
        dataset_verifier("chess")
    assert [row_targets(n) for n in ("code", spec, "math", "math_verify")] == [
        "tests",
        "row",
        "answer",
        "answer",
    ]
