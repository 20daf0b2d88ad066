"""Dynamic filtering (DAPO), fill_batch and pre-filtering, with hand-counted cases."""

import numpy as np
import pytest

from minirl.data import dynamic_filter, fill_batch, prefilter
from minirl.tasks import get_task


@pytest.fixture(scope="module")
def prompts():
    task = get_task("fixture")
    return [task.prompt(i) for i in range(6)]


def group(make_rollout, prompt, rewards):
    return [make_rollout(prompt, "", sample_index=i, reward=r) for i, r in enumerate(rewards)]


def test_dynamic_filter_drops_groups_with_equal_rewards(make_rollout, prompts):
    groups = [
        group(make_rollout, prompts[0], [0, 0, 0, 0]),  # all wrong: dropped
        group(make_rollout, prompts[1], [1, 0, 0, 1]),  # kept
        group(make_rollout, prompts[2], [1, 1, 1, 1]),  # all right: dropped
        group(make_rollout, prompts[3], [0.1, 0.1, 0.1, 0.2]),  # kept (partial credit differs)
        group(make_rollout, prompts[4], [0.5]),  # a single sample is never informative
    ]
    kept, dropped = dynamic_filter(groups)
    assert dropped == 3
    assert [g[0].prompt.uid for g in kept] == [prompts[1].uid, prompts[3].uid]


def test_dynamic_filter_rejects_unscored_or_empty_groups(make_rollout, prompts):
    with pytest.raises(ValueError, match="unscored samples \\[1\\]"):
        dynamic_filter([[make_rollout(prompts[0], "", 0, 1.0), make_rollout(prompts[0], "", 1)]])
    with pytest.raises(ValueError, match="empty group"):
        dynamic_filter([[]])


def test_fill_batch_samples_until_full_and_counts(make_rollout, prompts):
    # a scripted sampler: rounds yield [uninformative, informative] patterns
    script = iter(
        [
            [[0, 0], [1, 0], [1, 1]],  # round 1: 1 kept, 2 dropped
            [[0, 0], [0, 0]],  # round 2: 0 kept, 2 dropped
            [[0, 1], [1, 0], [0, 1]],  # round 3: 3 kept -> 4 total, one surplus
        ]
    )
    asked = []

    def sample_groups(k):
        asked.append(k)
        return [group(make_rollout, prompts[0], r) for r in next(script)]

    batch, surplus, stats = fill_batch(sample_groups, num_groups=3)
    assert asked == [3, 2, 2]
    assert len(batch) == 3 and len(surplus) == 1
    assert (stats.rounds, stats.sampled, stats.dropped, stats.full) == (3, 8, 4, True)


def test_fill_batch_gives_up_after_max_rounds(make_rollout, prompts):
    def hopeless(k):
        return [group(make_rollout, prompts[0], [1, 1]) for _ in range(k)]

    batch, surplus, stats = fill_batch(hopeless, num_groups=2, max_rounds=3)
    assert batch == [] and surplus == []
    assert (stats.rounds, stats.sampled, stats.dropped, stats.full) == (3, 6, 6, False)


def test_prefilter_keeps_partial_success(prompts):
    rates = {p.uid: r for p, r in zip(prompts, [0.0, 0.25, 1.0, 0.5, 0.875, 0.125], strict=True)}
    seen = []

    def pass_rate_fn(batch):
        seen.append(len(batch))
        return [rates[p.uid] for p in batch]

    kept, report = prefilter(prompts, pass_rate_fn)
    assert seen == [6]  # one batched call
    assert [p.uid for p in kept] == [prompts[i].uid for i in (1, 3, 4, 5)]
    assert (report.kept, report.too_hard, report.too_easy) == (4, 1, 1)

    kept, report = prefilter(prompts, pass_rate_fn, lo=0.125, hi=0.875)
    assert [p.uid for p in kept] == [prompts[i].uid for i in (1, 3)]
    assert (report.kept, report.too_hard, report.too_easy) == (2, 2, 2)


def test_prefilter_rejects_bad_rates(prompts):
    with pytest.raises(ValueError, match="NaN or out of range"):
        prefilter(prompts, lambda b: np.full(len(b), np.nan))
    with pytest.raises(ValueError, match="shape"):
        prefilter(prompts, lambda b: [0.5])
    with pytest.raises(ValueError, match="lo < hi"):
        prefilter(prompts, lambda b: [0.5] * len(b), lo=0.6, hi=0.5)
