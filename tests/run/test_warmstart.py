"""The warm start is cached by what determines it, and only by that."""

from minirl.modeling.tokenizer import CharTokenizer
from minirl.run.presets import make_config
from minirl.run.warmstart import warm_start
from minirl.store.trees import assert_trees_equal
from minirl.tasks import get_task


def test_rl_only_trainer_knobs_share_one_cached_warm_start(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIRL_CACHE", str(tmp_path))
    tokenizer, task = CharTokenizer(), get_task("fixture")

    def start(*overrides):
        cfg = make_config("fixture", ["sft.steps=2", *overrides])
        return warm_start(cfg, tokenizer, task, progress=False, log=lambda *a: None)

    params, report = start()
    assert not report["cached"] and report["steps"] == 2
    again, report = start(
        "trainer.num_minibatches=4",
        "trainer.ppo_epochs=2",
        "trainer.seed=3",
        "trainer.learning_rate=1e-5",
    )  # RL-only knobs, and the RL learning rate
    assert report["cached"]
    assert_trees_equal(again, params)
    _, report = start("trainer.max_grad_norm=0.5")  # changes an SFT step: a new warm start
    assert not report["cached"]
