"""Properties every built-in task must have: determinism, stable uids, disjoint splits,
encodable prompts and demonstrations, the registry, and routing scores by task name."""

import numpy as np
import pytest

from minirl.data import Task, TaskRouter
from minirl.data.task_api import split_of, stable_hash, stream
from minirl.modeling.tokenizer import CharTokenizer
from minirl.tasks import get_task, list_tasks
from minirl.types import Score

TOK = CharTokenizer()


@pytest.fixture(scope="module")
def all_tasks(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("tests-repo"))
    return {
        name: get_task(name, repository=repo) if name == "program_synthesis" else get_task(name)
        for name in list_tasks()
    }


def test_registry_lists_the_built_in_tasks():
    assert list_tasks() == ["arithmetic", "countdown", "fixture", "program_synthesis"]


def test_unknown_task_or_option_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown task 'gsm9k'; registered tasks: arithmetic"):
        get_task("gsm9k")
    with pytest.raises(ValueError, match=r"no option\(s\) \['max_nums'\]; options: .*max_numbers"):
        get_task("countdown", max_nums=5)
    with pytest.raises(ValueError, match="split"):
        get_task("fixture").prompt(0, "validation")
    with pytest.raises(ValueError, match="non-negative int"):
        get_task("fixture").prompt(-1)


@pytest.mark.parametrize("name", list_tasks())
def test_prompts_are_deterministic_by_index(all_tasks, name):
    task = all_tasks[name]
    assert isinstance(task, Task)
    for split in ("train", "test"):
        for i in (0, 1, 17, 10**12):
            a, b = task.prompt(i, split), task.prompt(i, split)
            assert (a.uid, a.text, a.meta) == (b.uid, b.text, b.meta)
            assert np.array_equal(a.tokens, b.tokens)
    # a fresh task object (as in another process) gives the same prompts
    fresh = (
        get_task(name, repository=task.repository)
        if name == "program_synthesis"
        else get_task(name)
    )
    assert [fresh.prompt(i).text for i in range(20)] == [task.prompt(i).text for i in range(20)]


@pytest.mark.parametrize("name", list_tasks())
def test_uids_are_unique_63_bit_and_tokens_encode_the_text(all_tasks, name):
    task = all_tasks[name]
    prompts = [task.prompt(i, s) for s in ("train", "test") for i in range(100)]
    uids = [p.uid for p in prompts]
    assert len(set(uids)) == len(uids)
    assert all(0 <= u < 2**63 for u in uids)
    for p in prompts:
        assert p.task == name
        assert p.tokens.dtype == np.int32 and p.tokens[0] == TOK.bos_id
        assert np.array_equal(p.tokens, TOK.encode(p.text))
    # different config -> different uids for the same index
    if name == "countdown":
        assert get_task("countdown", max_target=50).prompt(0).uid != task.prompt(0).uid


@pytest.mark.parametrize("name", list_tasks())
def test_train_and_test_are_disjoint_by_content(all_tasks, name):
    task = all_tasks[name]
    content = {
        "countdown": lambda p: (tuple(sorted(p.meta["numbers"])), p.meta["target"]),
        "arithmetic": lambda p: tuple(p.meta["operands"]),
        "fixture": lambda p: p.meta["value"],
        "program_synthesis": lambda p: p.meta["reference"],  # the hidden function
    }[name]
    n = 150 if name == "program_synthesis" else 400
    train = {content(task.prompt(i, "train")) for i in range(n)}
    test = {content(task.prompt(i, "test")) for i in range(n)}
    assert train and test and not train & test
    assert len(test) > 10  # the held-out split is not degenerate


@pytest.mark.parametrize("name", list_tasks())
def test_demonstrations_encode_and_fit_max_new_tokens(all_tasks, name):
    task = all_tasks[name]
    for i in range(50):
        p = task.prompt(i, "test")
        demo = task.demonstration(p)
        assert demo == task.demonstration(p)  # deterministic
        ids = TOK.encode(demo, bos=False, eos=True)  # raises if a character is not encodable
        assert 1 <= len(ids) <= task.max_new_tokens


def test_split_of_respects_the_fraction():
    tests = sum(split_of("t", i, 0.1) == "test" for i in range(20_000))
    assert 1800 < tests < 2200


def test_stable_hash_and_streams_are_pure_functions():
    assert stable_hash("a", 1) == stable_hash("a", 1) != stable_hash("a", 2)
    assert stable_hash("a", 1) != stable_hash(["a", 1])  # structure is part of the key
    assert stream("k", 3).integers(1 << 30) == stream("k", 3).integers(1 << 30)
    assert stream("k", 3).integers(1 << 30) != stream("k", 4).integers(1 << 30)


def test_router_scores_a_mixed_batch_in_order(all_tasks, make_rollout):
    cd, fx = all_tasks["countdown"], all_tasks["fixture"]
    p_cd, p_fx = cd.prompt(0), fx.prompt(0)
    rollouts = [
        make_rollout(p_fx, fx.demonstration(p_fx)),
        make_rollout(p_cd, p_cd.meta["reference"]),
        make_rollout(p_fx, "x"),
        make_rollout(p_cd, "1+"),
    ]
    router = TaskRouter.for_tasks([cd, fx])
    assert [s.reward for s in router.score(rollouts)] == [1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match=r"no verifier for task\(s\) \['countdown'\]"):
        TaskRouter({"fixture": fx.verifier}).score(rollouts)


def test_a_verifier_bug_becomes_a_zero_reward_not_a_crash(make_rollout):
    class Broken:
        def score(self, rollouts):
            from minirl.data.verifier_api import safe_scores

            return safe_scores(lambda r: 1 / 0, rollouts)

    p = get_task("fixture").prompt(0)
    assert Broken().score([make_rollout(p, "1")]) == [
        Score(0.0, "verifier error: ZeroDivisionError: division by zero")
    ]
