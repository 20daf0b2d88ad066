"""The distillation teacher of a run (minirl/run/starting_point.py): its knobs, its model, its bits.

The student (the `fixture` preset's model) samples rollouts with the real rollout engine in exact
mode at temperature 0.8; the teacher is `rl.teacher=tiny` (another shape, random weights), built
by `make_teacher` as a run builds it, with micro-batches small enough that the rows go through the
forward in several calls.

- Exact mode: the teacher's log-probs are the bits the engine's decode path gives on the
  teacher's weights (the teacher-forced replay minirl diagnose uses, itself bitwise the engine's
  numbers: tests/diagnose/test_mismatch.py).
- A teacher holding the student's own weights reproduces the engine's recorded behaviour
  log-probs bit for bit, so the reverse KL the loss sees is exactly 0.
- Fast mode agrees with the decode path to float32 rounding (slow lane: more compiles).
- The knobs that do not fit together are one-line ConfigErrors, before any weights are read.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
from flax import nnx

from minirl.configlib import ConfigError
from minirl.diagnose import decode_logprobs
from minirl.inference.engine import Engine
from minirl.inference.scheduler import Request
from minirl.modeling.model import init_model
from minirl.modeling.tokenizer import CharTokenizer
from minirl.run.presets import make_config
from minirl.run.starting_point import make_teacher, teacher_model
from minirl.tasks import get_task
from minirl.training.batching import make_batch
from minirl.training.trainer import Trainer
from minirl.types import Score

TOK = CharTokenizer()
RUN = ["rl.loss=distill", "rl.teacher=tiny", "engine.slots=8", "trainer.micro_batch_tokens=64"]


@functools.cache
def _setup(exact: bool):
    """(run config, student params, the teacher as a run builds it, its config, batch)."""
    cfg = make_config("fixture", [*RUN, f"engine.exact={exact}", "engine.temperature=0.8"])
    ecfg = dataclasses.replace(cfg.engine, eos_ids=TOK.eos_ids)
    student = nnx.to_pure_dict(nnx.split(init_model(cfg.model, seed=3))[1])
    engine = Engine(cfg.model, ecfg)
    engine.load_weights(0, student)
    task = get_task(cfg.task.name)
    prompts = [task.prompt(i, "train") for i in range(5)]
    rollouts = engine.generate(
        [Request(p, s, task.max_new_tokens) for p in prompts for s in range(3)]
    )
    for r in rollouts:
        r.score = Score(0.0)
    teacher_cfg = teacher_model(cfg, TOK)
    teacher = make_teacher(cfg, teacher_cfg)
    return cfg, student, teacher, teacher_cfg, make_batch(rollouts, TOK.pad_id, 8)


def _replay(cfg, model_cfg, params, batch):
    e = cfg.engine
    return decode_logprobs(
        model_cfg,
        params,
        batch,
        sampling=e.sampling,
        rows_per_call=8,
        cache_len=e.cache_len,
        buckets=e.buckets,
    )


@pytest.mark.gpu
def test_exact_teacher_scores_are_the_engine_decode_bits():
    cfg, _, teacher, teacher_cfg, batch = _setup(exact=True)
    assert teacher_cfg.dim == 256 and teacher_cfg.vocab_size == cfg.model.vocab_size  # `tiny`
    assert len(teacher._plan(batch)) > 1  # rows in several micro-batches
    got = teacher.recompute_logprobs(batch)
    want = _replay(cfg, teacher_cfg, teacher.params(), batch)
    assert batch.mask.sum() > 20 and (got[batch.mask > 0] < 0).all()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.gpu
def test_a_teacher_with_the_students_weights_scores_the_behaviour_logprobs_bitwise():
    cfg, student, _, _, batch = _setup(exact=True)
    same = Trainer(
        cfg.model, student, None, cfg.trainer_config(), sampling=cfg.engine.sampling.scoring
    )
    got = same.recompute_logprobs(batch)
    np.testing.assert_array_equal(got, np.where(batch.mask > 0, batch.behaviour_logprobs, 0.0))


@pytest.mark.slow
def test_fast_mode_teacher_agrees_with_the_decode_path_to_rounding():
    cfg, _, teacher, teacher_cfg, batch = _setup(exact=False)
    got = teacher.recompute_logprobs(batch)
    np.testing.assert_allclose(got, _replay(cfg, teacher_cfg, teacher.params(), batch), atol=2e-5)
    behaviour = np.where(batch.mask > 0, batch.behaviour_logprobs, 0)
    assert np.abs(got - behaviour).max() > 0.1  # another model


@pytest.mark.parametrize(
    "sets, match",
    [
        (["rl.loss=distill"], "rl.loss=distill needs a teacher: --teacher DIR"),
        (["rl.distill_coef=0.5"], "rl.distill_coef=0.5 needs a teacher"),
        (["rl.teacher=tiny"], "rl.teacher is set but rl.loss=grpo does not use it"),
        (["rl.loss=distill", "rl.teacher=tiny", "rl.distill_coef=0"], "nothing to learn from"),
        (["rl.distill_discount=0.5"], "rl.distill_discount does nothing without a teacher"),
        (["rl.loss=reinforce", "rl.teacher=tiny", "rl.distill_coef=1"], "is sequence-level"),
        (["rl.loss=distill", "rl.teacher=nope"], "neither a directory nor a model preset"),
        (["rl.loss=distill", "rl.teacher=tiny", "engine.cache_len=600"], "serves 512 positions"),
    ],
)
def test_knobs_that_do_not_fit_are_one_line_config_errors(sets, match):
    with pytest.raises(ConfigError, match=match) as e:
        teacher_model(make_config("fixture", sets), TOK)
    assert "\n" not in str(e.value)
