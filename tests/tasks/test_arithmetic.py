"""Arithmetic with a scratchpad: hand-worked scratchpads, the verifier, long-tailed lengths."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minirl.modeling.tokenizer import CharTokenizer
from minirl.tasks import get_task
from minirl.tasks.arithmetic import Arithmetic, ArithmeticConfig, scratchpad
from minirl.types import Prompt


def test_scratchpad_by_hand():
    # 12 + 345 = 357, 357 + 6 = 363; every number least-significant digit first.
    assert scratchpad([12, 345, 6]) == "21+543=753\n753+6=363\n#### 363"
    assert scratchpad([12, 345, 6], reverse_digits=False) == "12+345=357\n357+6=363\n#### 363"
    assert scratchpad([95, 7]) == "59+7=201\n#### 201"  # 95 + 7 = 102
    assert scratchpad([5]) == "#### 5"


def problem(answer, reverse=True):
    meta = {"answer": str(answer), "reverse_digits": reverse, "operands": []}
    return Prompt(uid=2, task="arithmetic", text="", tokens=np.zeros(1, np.int32), meta=meta)


@pytest.mark.parametrize(
    "text, reward, reason",
    [
        ("59+7=201\n#### 201", 1.0, "correct"),
        ("#### 201", 1.0, "correct"),  # the scratchpad is not checked, only the answer
        ("59+7=999\n#### 201", 1.0, "correct"),
        ("#### 201\n", 1.0, "correct"),
        ("####201", 1.0, "correct"),
        ("#### 102", 0.0, "wrong answer"),  # left-to-right digits when reversed is expected
        ("#### 2010", 1.0, "correct"),  # integer compare: 0102 == 102 (a leading zero)
        ("#### 20", 0.0, "wrong answer"),
        ("59+7=201", 0.0, "no '####' answer marker"),
        ("#### 201 and more", 0.0, "text after the answer"),
        ("#### ", 0.0, "empty answer"),
        ("#### -201", 0.0, "answer is not a non-negative integer: '-201'"),
        ("#### 2" + "0" * 100, 0.0, "answer is not a non-negative integer: '20000000000000000000'"),
        ("#### 999\n#### 201", 1.0, "correct"),  # the LAST marker counts
        ("", 0.0, "no '####' answer marker"),
    ],
)
def test_verifier_hand_cases(make_rollout, text, reward, reason):
    (s,) = Arithmetic().verifier.score([make_rollout(problem(102), text)])
    assert (s.reward, s.reason) == (reward, reason)


def test_verifier_reads_normal_order_when_not_reversed(make_rollout):
    v = Arithmetic().verifier
    scores = v.score(
        [make_rollout(problem(102, reverse=False), t) for t in ("#### 102", "#### 201")]
    )
    assert [s.reward for s in scores] == [1.0, 0.0]


def test_prompts_and_demonstrations_score_one(make_rollout):
    task, tok = Arithmetic(), CharTokenizer()
    for split in ("train", "test"):
        prompts = [task.prompt(i, split) for i in range(200)]
        for p in prompts:
            ops = p.meta["operands"]
            assert p.text == "+".join(map(str, ops)) + "="
            assert int(p.meta["answer"]) == sum(ops)
            assert 2 <= len(ops) <= 20 and all(1 <= x <= 999 for x in ops)
            demo = task.demonstration(p)
            assert len(tok.encode(demo, bos=False, eos=True)) <= task.max_new_tokens
        scores = task.verifier.score([make_rollout(p, task.demonstration(p)) for p in prompts])
        assert [s.reward for s in scores] == [1.0] * len(prompts)


def test_completion_lengths_are_long_tailed():
    """Lengths (demo + EOS) over 2000 train prompts: from a dozen tokens to a few hundred, with
    the tail far above the median. Measured: min 13, p50 35, p95 114, max 258 (docs/tasks.md)."""
    task = Arithmetic()
    lengths = np.array([len(task.demonstration(task.prompt(i))) + 1 for i in range(2000)])
    p50, p95 = np.percentile(lengths, [50, 95])
    assert lengths.min() <= 15
    assert 25 <= p50 <= 50
    assert p95 >= 2.5 * p50
    assert lengths.max() >= 200
    assert lengths.max() <= task.max_new_tokens
    mean = lengths.mean()
    assert ((lengths - mean) ** 3).mean() / lengths.std() ** 3 > 1.5  # right-skewed


def test_max_new_tokens_is_the_longest_possible_demo():
    task = get_task("arithmetic", max_operands=3, max_digits=2)
    # worst case 99+99+99: "99+99=891\n891+99=792\n#### 792" is 9+1+10+1+8 = 29 chars, + EOS
    assert task.max_new_tokens == 30


def test_operand_count_distribution_follows_config():
    task = get_task("arithmetic", continue_prob=0.0)
    assert {len(task.prompt(i).meta["operands"]) for i in range(50)} == {2}
    with pytest.raises(ValueError, match="continue_prob"):
        ArithmeticConfig(continue_prob=1.0)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789#+= \n-x", max_size=40))
def test_verifier_never_errors_on_random_text(make_rollout, text):
    (s,) = Arithmetic().verifier.score([make_rollout(problem(102), text)])
    assert s.reward in (0.0, 1.0) and not s.reason.startswith("verifier error")
