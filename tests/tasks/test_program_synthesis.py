"""Program synthesis: the hidden tests live in the repository by sha, and candidates are judged
by the real sandboxed code verifier (correct -> 1, wrong -> 0, hostile -> 0)."""

import pytest

from minirl.modeling.tokenizer import CharTokenizer
from minirl.tasks import get_task
from minirl.tasks.program_synthesis import apply, render
from minirl.verifiers import TestRepository


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return TestRepository(tmp_path_factory.mktemp("ps-repo"))


@pytest.fixture(scope="module")
def task(repo):
    return get_task("program_synthesis", repository=repo)


def test_render_and_apply():
    assert render("linear", 2, -3) == "2*x-3"
    assert render("linear", 1, 0) == "x"
    assert render("quadratic", 1, 4) == "x*x+4"
    assert render("quadratic", 3, -1) == "3*x*x-1"
    assert apply("quadratic", 3, -1, -2) == 11


def test_prompt_text_and_hidden_tests_by_reference(task, repo):
    p = task.prompt(3, "test")
    examples = p.meta["examples"]
    assert p.text == " ".join(f"f({x})={y}" for x, y in examples) + " -> f(x)="
    stored = repo.get_json(p.meta["tests"])  # the sha resolves to the hidden test file
    (case,) = stored["cases"]
    xs = [int(t) for t in case["input"].split()]
    ys = [int(t) for t in case["output"].split()]
    assert xs[:3] == [x for x, _ in examples]  # visible points first, then hidden ones
    assert len(xs) == 3 + 6 and len(set(xs)) == len(xs)
    reference = p.meta["reference"]
    assert ys == [eval(reference, {"x": x}) for x in xs]  # test-only check of the data
    assert str(examples) not in p.meta["tests"]  # only the sha travels with the prompt


def test_sandboxed_verdicts(task, make_rollout):
    p = task.prompt(0, "test")
    ref = p.meta["reference"]
    texts = [
        ref,  # correct
        f" {ref} \n",  # surrounding whitespace is fine
        f"({ref})*2/2",  # float output compared as floats
        "x",  # wrong
        "x//0",  # runtime error in the sandbox
        "x+",  # syntax error in the sandbox
        "__import__('os').system('rm -rf /')",  # rejected before the sandbox
        "x\nimport os",
        "",
    ]
    scores = task.verifier.score([make_rollout(p, t) for t in texts])
    rewards = [s.reward for s in scores]
    assert rewards == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert scores[0].reason == "accepted (1/1 tests)"
    assert scores[3].reason.startswith("wrong answer")
    assert "ZeroDivisionError" in scores[4].reason
    assert scores[6].reason.startswith("characters outside the expression grammar")
    assert scores[7].reason == "not a single-line expression"
    assert scores[8].reason == "empty completion"


def test_hostile_code_reaches_the_sandbox_and_scores_zero(repo, make_rollout):
    task = get_task("program_synthesis", repository=repo, charset_check=False)
    p = task.prompt(0, "test")
    texts = [
        "__import__('os').system('echo pwned')",
        "open('/etc/passwd').read()",
        f"[{p.meta['reference']} for _ in iter(int, 1)]",  # infinite loop
        f"__import__('sys').exit(0) or {p.meta['reference']}",  # exits before printing
    ]
    scores = task.verifier.score([make_rollout(p, t) for t in texts])
    assert [s.reward for s in scores] == [0.0] * 4
    assert "time limit" in scores[2].reason or "memory limit" in scores[2].reason


def test_demonstrations_fit_the_first_example_only(task, make_rollout):
    """Demos are in the grammar and agree with the first visible example; they are right only
    when the guessed shape is right (measured pass@1 of the demo policy: ~0.10)."""
    hits = 0
    for i in range(60):
        p = task.prompt(i, "test")
        demo = task.demonstration(p)
        CharTokenizer().encode(demo, bos=False, eos=True)
        (x1, y1), *_ = p.meta["examples"]
        assert eval(demo, {"x": x1}) == y1  # test-only evaluation of our own output
        hits += all(
            eval(demo, {"x": x}) == eval(p.meta["reference"], {"x": x}) for x in range(-30, 31)
        )
    assert 0 < hits < 20  # ~6 of 60 expected
    # two demos that agree with the data: one right, one wrong, judged by the sandbox
    p = task.prompt(0, "test")
    wrong = next(d for s in range(50) if (d := task.demonstration(p, s)) != p.meta["reference"])
    scores = task.verifier.score([make_rollout(p, p.meta["reference"]), make_rollout(p, wrong)])
    assert [s.reward for s in scores] == [1.0, 0.0]
