"""The prompt mixture: weights, counter-based draws, epochs of finite lists, save/restore."""

import json

import numpy as np
import pytest

from minirl.data import Mixture
from minirl.data.task_api import stable_hash
from minirl.tasks import get_task
from minirl.types import Prompt


def fixed_prompts(name, n):
    return [
        Prompt(uid=1000 + i, task=name, text=f"{i}", tokens=np.array([1], np.int32))
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def datasets():
    return {
        "countdown": get_task("countdown"),
        "fixture": get_task("fixture"),
        "list": fixed_prompts("list", 7),
    }


def uids(prompts):
    return [p.uid for p in prompts]


def test_draw_i_depends_only_on_seed_and_i_not_on_batch_sizes(datasets):
    a = Mixture(datasets, {"countdown": 1, "fixture": 2, "list": 1}, seed=3)
    b = Mixture(datasets, {"countdown": 1, "fixture": 2, "list": 1}, seed=3)
    one_go = uids(a.next_prompts(60))
    pieces = []
    for n in (1, 0, 7, 13, 2, 37):
        pieces += uids(b.next_prompts(n))
    assert one_go == pieces
    assert a.state() == b.state()
    c = Mixture(datasets, {"countdown": 1, "fixture": 2, "list": 1}, seed=4)
    assert uids(c.next_prompts(60)) != one_go


def test_state_save_restore_reproduces_the_stream(datasets):
    weights = {"countdown": 0.5, "fixture": 0.3, "list": 0.2}
    run = Mixture(datasets, weights, seed=11)
    run.next_prompts(23)
    state = json.loads(json.dumps(run.state()))  # what a snapshot stores
    expected = uids(run.next_prompts(40))

    resumed = Mixture.restore(datasets, state)
    assert uids(resumed.next_prompts(40)) == expected
    fresh = Mixture(datasets, weights, seed=11)
    fresh.load_state(state)
    assert uids(fresh.next_prompts(40)) == expected
    assert len(json.dumps(state)) < 400  # small


def test_state_contents_by_hand():
    m = Mixture({"a": fixed_prompts("a", 3)}, seed=5)
    m.next_prompts(4)
    assert m.state() == {
        "version": 1,
        "seed": 5,
        "split": "train",
        "shuffle": True,
        "weights": {"a": 1.0},
        "position": 4,
        "counters": {"a": 4},
    }


def test_load_state_refuses_a_different_mixture(datasets):
    state = Mixture(datasets, seed=1).state()
    with pytest.raises(ValueError, match="seed"):
        Mixture(datasets, seed=2).load_state(state)
    with pytest.raises(ValueError, match="weights"):
        Mixture(datasets, {"countdown": 2, "fixture": 1, "list": 1}, seed=1).load_state(state)
    with pytest.raises(ValueError, match="datasets"):
        Mixture({"countdown": datasets["countdown"]}, seed=1).load_state(state)
    bad = dict(state, position=5)
    with pytest.raises(ValueError, match="add up"):
        Mixture(datasets, seed=1).load_state(bad)


def test_weights_are_respected(datasets):
    m = Mixture(datasets, {"countdown": 0.6, "fixture": 0.3, "list": 0.1}, seed=0)
    m.next_prompts(4000)
    freq = {k: v / 4000 for k, v in m.counters.items()}
    assert abs(freq["countdown"] - 0.6) < 0.03
    assert abs(freq["fixture"] - 0.3) < 0.03
    assert abs(freq["list"] - 0.1) < 0.02
    zero = Mixture(datasets, {"countdown": 1, "fixture": 0, "list": 0}, seed=0)
    assert {p.task for p in zero.next_prompts(50)} == {"countdown"}


def test_task_prompts_follow_the_per_dataset_counter():
    task = get_task("fixture")
    m = Mixture({"fixture": task}, seed=0, split="test")
    assert uids(m.next_prompts(5)) == [task.prompt(i, "test").uid for i in range(5)]


def test_finite_lists_cycle_in_reshuffled_epochs():
    data = fixed_prompts("list", 7)
    m = Mixture({"list": data}, seed=2)
    epochs = [m.next_prompts(7) for _ in range(3)]
    for e, issued in enumerate(epochs):
        # each prompt exactly once per epoch; from epoch 1 on under a uid of its own
        assert sorted(p.text for p in issued) == sorted(p.text for p in data)
        assert sorted(uids(issued)) == sorted(
            u if e == 0 else stable_hash("epoch", u, e) for u in uids(data)
        )
    texts = [[p.text for p in e] for e in epochs]
    assert texts[0] != texts[1] or texts[1] != texts[2]  # fresh order per epoch
    assert len(set(uids(epochs[0] + epochs[1] + epochs[2]))) == 21  # unique over the run
    assert m.epochs() == {"list": 3.0}
    ordered = Mixture({"list": data}, seed=2, shuffle=False)
    assert uids(ordered.next_prompts(9)) == uids(data) + [
        stable_hash("epoch", p.uid, 1) for p in data[:2]
    ]


def test_bad_arguments():
    data = {"a": fixed_prompts("a", 2)}
    with pytest.raises(ValueError, match="exactly the datasets"):
        Mixture(data, {"b": 1.0})
    with pytest.raises(ValueError, match="at least one weight"):
        Mixture(data, {"a": 0.0})
    with pytest.raises(ValueError, match="finite"):
        Mixture(data, {"a": float("nan")})
    with pytest.raises(ValueError, match="empty list"):
        Mixture({"a": []})
    with pytest.raises(ValueError, match="split"):
        Mixture(data, split="valid")
