"""The named run presets (`minirl train --preset NAME`) and staleness presets (`--staleness`).

Each preset is a complete `RunConfig` (minirl/config.py) for one job, with the reason for its
values next to them; docs/results.md has the measurements behind the default. `make_config`
applies a preset, then a staleness preset, then `--set` overrides.
"""

from __future__ import annotations

import dataclasses

from minirl.config import (
    DEFAULT_PRESET,
    FILE_TASK,
    VOCAB,
    EvalConfig,
    RLConfig,
    RunConfig,
    SFTConfig,
    TaskSpec,
)
from minirl.configlib import ConfigError, override
from minirl.inference.engine import EngineConfig
from minirl.modeling.model_config import ModelConfig
from minirl.run.derived import derive_for_model, resolve_model
from minirl.training.trainer import TrainerConfig


def _countdown() -> RunConfig:
    # The default `minirl train` (why each value: docs/results.md). Countdown with three
    # numbers and + - only, a 0.75M-parameter model, a short warm start (a base that still
    # miscopies numbers: pass@1 well below pass@8), then GRPO for 5 minutes (or rl.steps).
    return RunConfig(
        task=TaskSpec(
            "countdown", {"min_numbers": 3, "max_numbers": 3, "ops": "+-", "format_reward": 0.1}
        ),
        model=ModelConfig(
            vocab_size=VOCAB,
            dim=128,
            num_layers=3,
            num_heads=4,
            num_kv_heads=2,
            head_dim=32,
            mlp_dim=512,
        ),
        trainer=TrainerConfig(
            learning_rate=5e-4,
            schedule="cosine",
            total_steps=300,
            num_minibatches=4,
            bucket_minimum=8,
        ),
        rl=RLConfig(steps=600, time_budget=300.0, checkpoint_every=50),
        sft=SFTConfig(steps=40),
    )


def _countdown_hard() -> RunConfig:
    # The first default (3-4 numbers, + - *, the 3.2M-parameter `tiny` model, lr 1e-4, 300
    # warm-start steps). Kept because earlier measurements (docs/mismatch.md, docs/trainer.md,
    # tutorial 08) were taken on it; GRPO did not lift its pass@1 in 5 minutes (docs/results.md).
    return RunConfig(rl=RLConfig(time_budget=300.0))


def _arithmetic() -> RunConfig:
    # The long-tailed scratchpad task with one-digit operands: completions of 13 to 165 tokens
    # (median 25), a prompt with N operands needing N - 1 scratchpad lines. Measured here: 200
    # warm-start steps give held-out pass@1 0.45 / pass@8 0.92 (partial success, room for RL);
    # 300 steps give 0.90 (no room); with the task's default 1-3 digit operands 300 steps gave
    # pass@1 0.00 (no reward signal at all).
    return RunConfig(
        task=TaskSpec("arithmetic", {"max_digits": 1}),
        engine=EngineConfig(
            slots=64, cache_len=224, prefill_buckets=(32, 64, 128), prefill_rows=16
        ),
        sft=SFTConfig(steps=200),
    )


def _program_synthesis() -> RunConfig:
    # Prompts carry three examples (up to ~40 characters) and the completion up to 24 tokens.
    return RunConfig(
        task=TaskSpec("program_synthesis"),
        engine=EngineConfig(slots=64, cache_len=96, prefill_buckets=(32, 64), prefill_rows=16),
    )


def _fixture() -> RunConfig:
    # Seconds-long runs for tests: a 2-token task on a very small model.
    return RunConfig(
        task=TaskSpec("fixture"),
        model=ModelConfig(
            vocab_size=VOCAB,
            dim=64,
            num_layers=2,
            num_heads=2,
            num_kv_heads=1,
            head_dim=32,
            mlp_dim=128,
        ),
        engine=EngineConfig(
            slots=32, cache_len=32, prefill_buckets=(16,), prefill_rows=8, decode_chunk=4
        ),
        trainer=TrainerConfig(learning_rate=3e-3),
        rl=RLConfig(steps=20, prompts_per_step=8, group_size=4, checkpoint_every=5),
        sft=SFTConfig(steps=0),
        eval=EvalConfig(prompts=32, samples=4),
    )


def _custom() -> RunConfig:
    # Your own model and dataset (`minirl train --model DIR --data FILE`): model.path, task=file
    # and data.train are set by the command line. A pretrained model needs no warm start.
    # Sampling at temperature 1 with 8 samples per prompt; the learning rate suits a model that
    # already solves some problems (tune it with --set trainer.learning_rate=...). With
    # model.path, the completion budget, cache, slots and evaluation size below are only the
    # starting point: minirl/run/derived.py fits them to the model and the work unless set.
    return RunConfig(
        task=TaskSpec(FILE_TASK),
        engine=EngineConfig(
            slots=32, cache_len=512, prefill_buckets=(64, 128, 256), prefill_rows=8, decode_chunk=8
        ),
        # bucket_minimum 8: rows of 65-128 positions pad to a multiple of 16, not 32 (issue #40)
        trainer=TrainerConfig(
            learning_rate=1e-5, schedule="cosine", total_steps=200, bucket_minimum=8
        ),
        rl=RLConfig(steps=200, prompts_per_step=16, checkpoint_every=10, export_hf=True),
        sft=SFTConfig(steps=0),
        eval=EvalConfig(prompts=128, samples=8),
    )


PRESETS = {
    "countdown": _countdown,
    "countdown_hard": _countdown_hard,
    "arithmetic": _arithmetic,
    "program_synthesis": _program_synthesis,
    "fixture": _fixture,
    "custom": _custom,
}

# Staleness presets (RLAX §3.1): (reload_every j, max_lag k, eta).
STALENESS = {
    "on_policy": dict(reload_every=1, max_lag=1, eta=0),
    "one_step_off": dict(reload_every=1, max_lag=2, eta=1),
    "bounded": dict(reload_every=4, max_lag=8, eta=4),
    "off_policy": dict(reload_every=1, max_lag=0, eta=8),
}


def make_config(
    preset: str = DEFAULT_PRESET, overrides: list[str] = (), staleness: str | None = None
) -> RunConfig:
    """A preset, then a staleness preset, then `--set key=value` overrides, in that order
    (`minirl train`'s order: minirl/run/config_args.py); with your own model and data, the knobs
    not set that follow from them (minirl/run/derived.py)."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    cfg = PRESETS[preset]()
    if staleness is not None:
        if staleness not in STALENESS:
            raise ConfigError(
                f"unknown staleness preset {staleness!r}; known: {', '.join(STALENESS)}"
            )
        cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, **STALENESS[staleness]))
    for item in overrides:
        cfg = override(cfg, item)
    return derive_for_model(resolve_model(cfg, overrides), overrides).check()
