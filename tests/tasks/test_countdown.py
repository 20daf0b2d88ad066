"""Countdown: safe verifier hand cases, targets, demonstrations (format only)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minirl.modeling.tokenizer import CharTokenizer
from minirl.tasks import get_task
from minirl.tasks.countdown import Countdown, CountdownConfig, evaluate, render
from minirl.types import Prompt


def problem(numbers, target, use_all=True):
    meta = {"numbers": numbers, "target": target, "use_all": use_all}
    return Prompt(uid=1, task="countdown", text="", tokens=np.zeros(1, np.int32), meta=meta)


@pytest.mark.parametrize(
    "text, reward, reason",
    [
        ("3*5+7", 1.0, "correct"),
        (" (5 * 3) + 7 \n", 1.0, "correct"),
        ("7+3*5", 1.0, "correct"),
        ("(3+5)*7", 0.0, "wrong value 56 (target 22)"),
        ("3*5+8", 0.0, "uses 8, which is not given"),
        ("3*5+5+7-5", 0.0, "uses 5 more often than given"),
        ("3*5", 0.0, "does not use every number (missing [7])"),
        ("7/(5-5)+3", 0.0, "uses 5 more often than given"),
        ("3/5+7", 0.0, "wrong value 38/5 (target 22)"),
        ("", 0.0, "empty completion"),
        ("3*5+7)", 0.0, "malformed: unexpected ')' at 5"),
        ("3*5+", 0.0, "malformed: expected a number or '(' but found end of text"),
        ("-3*5+7", 0.0, "malformed: expected a number or '(' but found '-' at 0"),
        ("3**5+7", 0.0, "malformed: expected a number or '(' but found '*' at 2"),
        ("9**9**9**9", 0.0, "malformed: expected a number or '(' but found '*' at 2"),
        ("3^5+7", 0.0, "malformed: unexpected '^' at 1"),
        ("__import__('os')", 0.0, "malformed: expected a number or '(' but found '_' at 0"),
        ("3*5+7 ####", 0.0, "malformed: unexpected '#' at 6"),
        ("3*5+7" + " " * 200, 1.0, "correct"),  # trailing whitespace is stripped
        ("(" * 200 + "3" + ")" * 200, 0.0, "too long (401 > 128 characters)"),
        ("(" * 40 + "3*5+7" + ")" * 40, 0.0, "malformed: parentheses nested too deeply"),
        ("٣*5+7", 0.0, "malformed: expected a number or '(' but found '٣' at 0"),
    ],
)
def test_verifier_hand_cases(make_rollout, text, reward, reason):
    task = Countdown()
    (score,) = task.verifier.score([make_rollout(problem([3, 5, 7], 22), text)])
    assert (score.reward, score.reason) == (reward, reason)


def test_division_by_zero_and_exact_division(make_rollout):
    v = Countdown().verifier
    s0, s1, s2 = v.score(
        [
            make_rollout(problem([4, 4, 2], 2), "2/(4-4)"),
            make_rollout(problem([7, 2, 2], 7), "7/2*2"),  # exact rationals: 7/2*2 == 7
            make_rollout(problem([7, 2, 2], 2), "7/2/2"),
        ]
    )
    assert (s0.reward, s0.reason) == (0.0, "division by zero")
    assert (s1.reward, s1.reason) == (1.0, "correct")
    assert (s2.reward, s2.reason) == (0.0, "wrong value 7/4 (target 2)")


def test_at_most_once_rule_and_repeated_numbers(make_rollout):
    v = Countdown().verifier
    at_most = problem([3, 5, 7], 15, use_all=False)
    repeated = problem([3, 3, 5], 45, use_all=True)
    scores = v.score(
        [
            make_rollout(at_most, "3*5"),  # subset allowed
            make_rollout(at_most, "3*5*5"),  # still at most once
            make_rollout(repeated, "3*3*5"),  # two 3s given, two used
            make_rollout(repeated, "3*5*3*3"),
        ]
    )
    assert [s.reward for s in scores] == [1.0, 0.0, 1.0, 0.0]


def test_format_reward_is_partial_credit_only_for_valid_expressions(make_rollout):
    task = get_task("countdown", format_reward=0.1)
    p = problem([3, 5, 7], 22)
    rewards = [
        s.reward for s in task.verifier.score([make_rollout(p, t) for t in ("3+5+7", "3+5", "3+")])
    ]
    assert rewards == [0.1, 0.0, 0.0]


def test_render_uses_only_needed_parentheses():
    assert render(("*", ("+", 3, 5), 7)) == "(3+5)*7"
    assert render(("+", ("*", 3, 5), 7)) == "3*5+7"
    assert render(("-", 9, ("-", 4, 1))) == "9-(4-1)"
    assert render(("-", ("-", 9, 4), 1)) == "9-4-1"
    assert render(("/", 8, ("*", 2, 2))) == "8/(2*2)"
    assert render(("+", 1, ("+", 2, 3))) == "1+2+3"


def test_prompts_are_solvable_and_reference_scores_one(make_rollout):
    task = Countdown()
    prompts = [task.prompt(i, split) for split in ("train", "test") for i in range(100)]
    for p in prompts:
        numbers, target = p.meta["numbers"], p.meta["target"]
        assert p.text == " ".join(map(str, numbers)) + f" -> {target}:"
        assert 3 <= len(numbers) <= 4 and all(1 <= n <= 9 for n in numbers)
        assert 1 <= target <= 99
    scores = task.verifier.score([make_rollout(p, p.meta["reference"]) for p in prompts])
    assert all(s.reward == 1.0 for s in scores)


def test_demonstrations_are_format_only(make_rollout):
    """Demos are valid expressions over the given numbers, each used once — and they hit the
    target only sometimes: the reward has something left to teach."""
    task, tok = Countdown(), CharTokenizer()
    rewards, reasons = [], set()
    for i in range(200):
        p = task.prompt(i, "test")
        demo = task.demonstration(p)
        assert demo == task.demonstration(p)  # deterministic
        tok.encode(demo, bos=False, eos=True)
        (s,) = task.verifier.score([make_rollout(p, demo)])
        rewards.append(s.reward)
        reasons.add(s.reason.split(" ")[0])
        assert len(demo) + 1 <= task.max_new_tokens
    assert reasons <= {"correct", "wrong"}  # never malformed, never a wrong number
    assert 0.02 < np.mean(rewards) < 0.3  # measured: ~0.08 (pass@1 of the demo policy)


def test_pass_at_8_of_demo_policy_is_well_above_pass_at_1(make_rollout):
    task = Countdown()
    p1, p8 = [], []
    for i in range(40):
        p = task.prompt(i, "test")
        hits = [
            task.verifier.score([make_rollout(p, task.demonstration(p, s))])[0].reward
            for s in range(8)
        ]
        p1.append(hits[0])
        p8.append(max(hits))
    assert np.mean(p8) > np.mean(p1) + 0.15  # measured on 300 prompts: 0.44 vs 0.08


def test_evaluate_tree():
    assert evaluate(("-", ("*", 3, 5), ("/", 7, 2))) == 23 / 2
    assert evaluate(("/", 1, ("-", 2, 2))) is None


def test_config_validation():
    with pytest.raises(ValueError, match="ops"):
        CountdownConfig(ops="+^")
    with pytest.raises(ValueError, match="min_numbers"):
        CountdownConfig(min_numbers=5, max_numbers=4)
    assert dataclasses.replace(CountdownConfig(), ops="+-*/").ops == "+-*/"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789+-*/() ^x#\n.", max_size=60))
def test_verifier_never_errors_on_random_text(make_rollout, text):
    (s,) = Countdown().verifier.score([make_rollout(problem([3, 5, 7], 22), text)])
    assert 0.0 <= s.reward <= 1.0 and not s.reason.startswith("verifier error")
