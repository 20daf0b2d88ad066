"""The learning loop end to end: it learns, it resumes exactly, it never publishes bad weights."""

import dataclasses
import json

import numpy as np
import pytest

from minirl.config import EvalConfig, RLConfig, SFTConfig, TaskSpec
from minirl.configlib import ConfigError
from minirl.control.controller import Counters
from minirl.measure.metrics_log import read_metrics
from minirl.run.presets import make_config
from minirl.run.run_dir import checkpoint_due, open_run_dir
from minirl.run.runner import Run
from minirl.store.trees import assert_trees_equal
from minirl.types import Score


def fixture_cfg(**rl):
    cfg = make_config("fixture")
    return dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, **rl))


def quiet_run(cfg, run_dir):
    return Run(cfg, run_dir, log=lambda *a: None, progress=False)


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("fixture")
    summary = quiet_run(fixture_cfg(steps=20), run_dir).train()
    return run_dir, summary


def test_reward_goes_up_on_the_fixture_task(learned):
    _, summary = learned
    # A random tiny model picks an even/odd digit by chance (~0.1 held-out pass@1 with the
    # whole 67-token vocabulary); 20 GRPO steps of 8 prompts x 4 samples lift it well above.
    assert summary["before"]["pass@1"] < 0.2
    assert summary["after"]["pass@1"] > summary["before"]["pass@1"] + 0.15


def test_run_directory_contents(learned):
    run_dir, _ = learned
    for name in ("config.json", "meta.json", "metrics.jsonl", "summary.json"):
        assert (run_dir / name).exists(), name
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 20
    rec = json.loads(lines[-1])
    for key in (
        "reward/mean",
        "train/loss",
        "time/generate",
        "time/train",
        "mismatch/p95_abs_dlogp",
        "count/groups_trained",
        "version",
    ):
        assert key in rec, key
    assert rec["version"] == 20 and rec["count/groups_trained"] == 20 * 8
    assert 0 < rec["engine/decode_tokens"] <= rec["engine/slot_steps"]  # slot occupancy <= 1
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["seed"] == 0 and "jax" in meta["versions"]


def test_resume_is_bitwise_exact(tmp_path):
    """6 steps straight == 4 steps, stop, resume to 6 (checkpoints every 2 steps)."""
    full = quiet_run(fixture_cfg(steps=6, checkpoint_every=2), tmp_path / "full")
    full.train()
    part = tmp_path / "part"
    quiet_run(fixture_cfg(steps=4, checkpoint_every=2), part).train()
    quiet_run(fixture_cfg(steps=6, checkpoint_every=2), part).train()
    from minirl.store.checkpoints import CheckpointManager

    a = CheckpointManager(tmp_path / "full").restore()
    b = CheckpointManager(part).restore()
    assert a.step == b.step == 6
    assert_trees_equal(b.params, a.params)
    assert_trees_equal(b.opt_state, a.opt_state)
    ma = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(x) for x in (part / "metrics.jsonl").read_text().splitlines()]
    for x, y in zip(ma, mb, strict=True):
        assert x["reward/mean"] == y["reward/mean"] and x["train/loss"] == y["train/loss"]


def test_checkpoint_due_by_hand():
    cfg = fixture_cfg(steps=5, checkpoint_every=2)
    due = lambda steps, engine_version=None, async_=False: checkpoint_due(
        cfg,
        Counters(
            version=steps,
            engine_version=steps if engine_version is None else engine_version,
            steps=steps,
        ),
        async_,
    )
    assert [due(s) for s in range(1, 6)] == [False, True, False, True, True]  # every 2, the last
    assert not due(4, engine_version=3)  # lockstep: only where the engine holds the version
    assert due(4, engine_version=3, async_=True)


def test_a_fresh_start_drops_metrics_of_an_attempt_that_never_checkpointed(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    with pytest.raises(ConfigError, match="already holds a run"):
        open_run_dir(fixture_cfg(), tmp_path, resume=False)
    _, restored = open_run_dir(fixture_cfg(), tmp_path, resume=True)
    assert restored is None and read_metrics(tmp_path) == []  # those steps run again
    assert json.loads((tmp_path / "config.json").read_text())["config"]["task"]["name"] == "fixture"


def test_async_run_keeps_its_bounds_times_its_parts_and_evaluates(tmp_path):
    """The async scheduler: every batch within k, the rollout thread's time accounted for, and
    in-run evaluation on a fresh engine (the rollout thread owns the training engine)."""
    k, steps = 3, 6
    cfg = fixture_cfg(steps=steps, scheduler="async", max_lag=k, eta=2)
    cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, every=3))
    summary = quiet_run(cfg, tmp_path).train()
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    assert all(
        r["lag/mean"] <= k - 1 for r in recs
    )  # lag/mean counts versions behind, 0 = on-policy
    assert [r["step"] for r in recs if "eval/pass@1" in r] == [3, 6]
    last = recs[-1]
    parts = sum(last[f"engine/{p}_seconds"] for p in ("busy", "verify", "reload", "idle"))
    span = last["wall_time"] - recs[0]["wall_time"]  # the thread ran at least this long
    assert last["engine/busy_seconds"] > 0 and 0.5 * span <= parts <= summary["rl_seconds"]
    work = {k: sum(r[f"engine/{k}"] for r in recs) for k in ("decode_tokens", "slot_steps")}
    assert 0 < work["decode_tokens"] <= work["slot_steps"]  # per-step counts, summed over the run
    assert summary["counters"]["groups_trained"] == steps * 8


def test_resume_with_another_config_is_refused(tmp_path):
    quiet_run(fixture_cfg(steps=2, checkpoint_every=1), tmp_path).train()
    other = fixture_cfg(steps=3, checkpoint_every=1, loss="dr_grpo")
    with pytest.raises(ConfigError, match="another configuration"):
        quiet_run(other, tmp_path).train()


def test_nonfinite_step_publishes_nothing(tmp_path, monkeypatch):
    from minirl.training import trainer as trainer_mod

    cfg = fixture_cfg(steps=1)
    run = quiet_run(cfg, tmp_path)
    original = trainer_mod.Trainer.train_step_with_prox

    def poisoned(self, batch, prox_logp=None, on_policy=False):
        # A weight that went non-finite (an overflow in the forward) makes the gradient nan; the
        # losses themselves map nan log-ratios to 0, so the weights are the way to inject it.
        import jax

        self._params = jax.tree.map(lambda x: x.at[(0,) * x.ndim].set(np.nan), self._params)
        return original(self, batch, prox_logp, on_policy)

    monkeypatch.setattr(trainer_mod.Trainer, "train_step_with_prox", poisoned)
    summary = run.train()
    rec = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert rec["published"] == 0.0 and rec["version"] == 0
    assert rec["count/skipped_steps"] == 1
    assert summary["counters"]["version"] == 0


def test_dapo_preset_filters_groups_with_equal_rewards(tmp_path):
    # DAPO's dynamic sampling belongs to its preset: rl.loss=dapo filters without
    # rl.dynamic_filter. The random fixture model succeeds ~10% of the time, so most groups of 4
    # are all-zero and get dropped; every group trained on has mixed rewards.
    summary = quiet_run(fixture_cfg(steps=2, loss="dapo"), tmp_path).train()
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert summary["counters"]["groups_filtered"] > 0
    assert all(r["reward/mixed_groups"] == 1.0 for r in recs)
    assert summary["counters"]["groups_trained"] == 2 * 8


class NothingRight:
    """A verifier under which every group's rewards are equal (all 0)."""

    def score(self, rollouts):
        return [Score(0.0, "wrong") for _ in rollouts]


@pytest.mark.parametrize("scheduler", ["lockstep", "async"])
def test_a_filter_that_drops_every_group_is_a_clear_error_in_both_schedulers(tmp_path, scheduler):
    """DAPO on a task the model never (or always) solves: lockstep raised a RuntimeError (a
    traceback from `minirl train`); async waited 600 s for a batch, then blamed a stuck rollout
    thread. Both now stop with the same ValueError (a one-line error) after 32 batches' worth of
    dropped groups."""
    cfg = make_config(
        "fixture",
        [f"rl.scheduler={scheduler}", "rl.loss=dapo", "rl.prompts_per_step=2", "rl.group_size=2"]
        + ["rl.steps=1", "eval.prompts=2", "eval.samples=1"],
    )
    run = quiet_run(cfg, tmp_path)
    run.verifier = NothingRight()
    with pytest.raises(ValueError, match="dropped 64 groups and could not fill a batch"):
        run.train()


@pytest.mark.parametrize("task", ["countdown", "arithmetic", "program_synthesis"])
def test_every_builtin_task_runs_end_to_end(tmp_path, task):
    base = make_config("fixture")
    cfg = dataclasses.replace(
        base,
        task=TaskSpec(task),
        engine=dataclasses.replace(
            base.engine, cache_len={"arithmetic": 320}.get(task, 96), prefill_buckets=(32, 64)
        ),
        model=dataclasses.replace(base.model, max_seq_len=320),
        rl=RLConfig(steps=2, prompts_per_step=4, group_size=2, checkpoint_every=1),
        sft=SFTConfig(steps=2, batch_size=8, cache=False),
        eval=EvalConfig(prompts=4, samples=2),
    )
    summary = quiet_run(cfg, tmp_path).train()
    assert summary["counters"]["steps"] == 2
    assert 0.0 <= summary["after"]["pass@1"] <= 1.0


def test_batch_order_decides_how_stale_the_data_eta_allows_is(tmp_path):
    """Lockstep with eta = 3: generation runs 3 batches ahead of training. Taking the freshest
    groups (RLAX) trains on data one version old and leaves the rest in the buffer; taking the
    oldest (AReaL) trains on data exactly eta versions old once the pipeline is full."""
    lags = {}
    for order in ("freshest", "oldest"):
        run_dir = tmp_path / order
        quiet_run(fixture_cfg(steps=7, eta=3, batch_order=order), run_dir).train()
        lags[order] = [r["lag/mean"] for r in read_metrics(run_dir)]
    assert lags["freshest"] == [0, 1, 1, 1, 1, 1, 1]
    assert lags["oldest"] == [0, 1, 2, 3, 3, 3, 3]
    with pytest.raises(ValueError, match="rl.batch_order must be one of"):
        fixture_cfg(batch_order="newest")


def test_stale_discards_do_not_shrink_the_run_ahead(tmp_path):
    """Lockstep, freshest first, eta = 3, k = 2: the older groups of each run-ahead go stale and
    are discarded every step. What eta bounds is the groups still to be trained on, so after
    every step exactly eta batches wait in the buffer (a discard is replaced, not lost for good)."""
    quiet_run(fixture_cfg(steps=6, eta=3, max_lag=2), tmp_path).train()
    records = read_metrics(tmp_path)
    waiting = [
        r["count/groups_produced"] - r["count/groups_stale"] - r["count/groups_trained"]
        for r in records
    ]
    assert waiting == [3 * 8] * 6
    assert records[-1]["count/groups_stale"] > 0  # the discards really happened
    assert max(r["lag/mean"] for r in records) <= 1  # versions behind; k = 2 means at most 1


def test_a_skipped_step_does_not_starve_the_next(tmp_path, monkeypatch):
    """eta = 0: a step whose update the non-finite guard skips consumed its batch; the next step
    generates a fresh one (the skipped groups do not count as still waiting)."""
    from minirl.training import trainer as trainer_mod

    original, calls = trainer_mod.Trainer.train_step_with_prox, []

    def poisoned_once(self, batch, prox_logp=None, on_policy=False):
        calls.append(1)
        if len(calls) > 1:
            return original(self, batch, prox_logp, on_policy)
        saved = self._params
        import jax

        self._params = jax.tree.map(lambda x: x.at[(0,) * x.ndim].set(np.nan), self._params)
        out = original(self, batch, prox_logp, on_policy)
        self._params = saved  # the guard kept the poisoned weights; restore the good ones
        return out

    monkeypatch.setattr(trainer_mod.Trainer, "train_step_with_prox", poisoned_once)
    summary = quiet_run(fixture_cfg(steps=3), tmp_path).train()
    records = read_metrics(tmp_path)
    assert [r["published"] for r in records] == [0.0, 1.0, 1.0]
    assert [r["count/groups_trained"] for r in records] == [8, 16, 24]
    assert summary["counters"]["skipped_steps"] == 1 and summary["counters"]["version"] == 2
