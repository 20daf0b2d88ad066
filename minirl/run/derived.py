"""Knobs of a run on your own model that follow from the model and the work, unless you set them.

A preset cannot know a user's checkpoint: how many positions it has, or how much work a step
asks for. With `model.path` and a dataset file (`minirl train --model DIR --data FILE`),
`derive_for_model(cfg, overrides)` fills in, for every key NOT given as an override:

    data.max_new_tokens  the preset's budget, at most half the model's positions
    engine.cache_len     the longest prefill bucket (the longest prompt a run keeps) plus
                         data.max_new_tokens, rounded up to a multiple of 64, at most the
                         model's positions (max_seq_len)
    engine.slots         rl.prompts_per_step x rl.group_size (one step's rollouts decode
                         together), at most MAX_SLOTS
    eval.prompts         at most what keeps the two evaluations (before and after RL) from
                         generating more completions than the RL steps do; at least
                         MIN_EVAL_PROMPTS (a 2-step smoke run evaluates little, a long run fully)
    model.dtype          the compute dtype: bfloat16 where this machine multiplies bf16 natively
                         (an accelerator; a CPU with AVX512-BF16 or AMX-BF16), float32 elsewhere
                         (minirl/run/precision.py); the weights stay model.param_dtype
    engine.dtype         not derived (model.dtype's), but a run that recorded one resumes with it
    trainer.share_prompts  on where a group's samples share a prompt (rl.group_size > 1) on a
                         dense model without trainer.pack: each prompt runs once per micro-batch
                         (docs/trainer.md, "Shared prompts")
    trainer.remat        "nothing" (each block recomputed in the backward) for a model of
                         REMAT_FROM_PARAMS parameters or more: there it costs little and takes
                         GBs off the peak (docs/trainer.md, "Peak memory"); else the preset's

The results are ordinary values of the RunConfig, so the run directory's config.json records
them and a resumed run uses them as they were: `keep_recorded` takes them from there when the
same command runs again on the run directory (with, say, more rl.steps, which would otherwise
derive a larger evaluation than the one before RL). A key you set (`--set engine.slots=16`)
is kept.
"""

from __future__ import annotations

import dataclasses

from minirl.config import FILE_TASK, RunConfig
from minirl.configlib import ConfigError
from minirl.hf.hf_config import read_model_config
from minirl.modeling.model_config import ModelConfig
from minirl.run import precision

MAX_SLOTS = 64  # decode batch cap: past it a CPU step gains little and the KV cache grows
MIN_EVAL_PROMPTS = 8
CACHE_ROUND = 64
REMAT_FROM_PARAMS = 300_000_000  # measured: 0.5B 1.01-1.04x the step time, 25M 1.05-1.11x
DERIVED = (
    "data.max_new_tokens",
    "engine.cache_len",
    "engine.slots",
    "eval.prompts",
    "model.dtype",
    "engine.dtype",
    "trainer.remat",
    "trainer.share_prompts",
)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def derive_for_model(cfg, overrides=()):
    """`cfg` with the knobs above derived where `overrides` ("key=value" strings) set none;
    unchanged without model.path or without a dataset file (task.name=file)."""
    if not cfg.model.path or cfg.task.name != FILE_TASK:
        return cfg
    given = {item.split("=", 1)[0].strip() for item in overrides}
    positions, rl = cfg.model.max_seq_len, cfg.rl
    new, cache = cfg.data.max_new_tokens, cfg.engine.cache_len
    if "data.max_new_tokens" not in given:
        new = min(new, (cache if "engine.cache_len" in given else positions) // 2)
    if "engine.cache_len" not in given:
        if new >= positions:
            raise ConfigError(
                f"data.max_new_tokens={new} leaves no room for a prompt in the model's "
                f"{positions} positions (max_position_embeddings)"
            )
        longest_prompt = max(cfg.engine.prefill_buckets)
        cache = min(positions, _round_up(longest_prompt + new, CACHE_ROUND))
    slots = cfg.engine.slots
    if "engine.slots" not in given:
        slots = min(rl.prompts_per_step * rl.group_size, MAX_SLOTS)
    prompts = cfg.eval.prompts
    if "eval.prompts" not in given:
        rollouts = rl.steps * rl.prompts_per_step * rl.group_size
        prompts = min(prompts, max(MIN_EVAL_PROMPTS, rollouts // (2 * cfg.eval.samples)))
    dtype = cfg.model.dtype if "model.dtype" in given else precision.fastest_compute_dtype()
    remat = cfg.trainer.remat
    if "trainer.remat" not in given and cfg.model.num_params() >= REMAT_FROM_PARAMS:
        remat = "nothing"
    share = cfg.trainer.share_prompts
    if "trainer.share_prompts" not in given:
        share = rl.group_size > 1 and not cfg.model.num_experts and not cfg.trainer.pack
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, dtype=dtype),
        data=dataclasses.replace(cfg.data, max_new_tokens=new),
        engine=dataclasses.replace(cfg.engine, cache_len=cache, slots=slots),
        eval=dataclasses.replace(cfg.eval, prompts=prompts),
        trainer=dataclasses.replace(cfg.trainer, remat=remat, share_prompts=share),
    )


def keep_recorded(cfg, recorded, overrides=()):
    """`cfg` with each DERIVED key that `overrides` do not set taken from `recorded` (the
    config a run directory was started with), so a run continued by the same command keeps
    what was derived when it started (a directory of another model's run is left alone:
    its config differs anyway, which the run directory's check reports)."""
    if not cfg.model.path or cfg.task.name != FILE_TASK or recorded.model.path != cfg.model.path:
        return cfg
    given = {item.split("=", 1)[0].strip() for item in overrides}
    for key in DERIVED:
        if key not in given:
            section, name = key.split(".")
            part = dataclasses.replace(
                getattr(cfg, section), **{name: getattr(getattr(recorded, section), name)}
            )
            cfg = dataclasses.replace(cfg, **{section: part})
    return cfg


# What a model directory cannot override: its config.json fixes the shapes.
_FROM_MODEL_DIR = tuple(
    f.name
    for f in dataclasses.fields(ModelConfig)
    if f.name not in ("path", "dtype", "param_dtype") and not f.name.startswith("lora_")
)


def resolve_model(cfg: RunConfig, overrides: list[str] = ()) -> RunConfig:
    """With model.path set, the model's shapes come from DIR/config.json (minirl/hf/hf_config.py); only
    model.dtype / model.param_dtype stay yours (float32 master weights by default, see hf.py).
    Setting a shape too is refused: it would do nothing."""
    if not cfg.model.path:
        return cfg
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key.startswith("model.") and key[len("model.") :] in _FROM_MODEL_DIR:
            raise ConfigError(
                f"{key} comes from {cfg.model.path}/config.json; it cannot be set "
                "together with model.path"
            )
    shapes = read_model_config(cfg.model.path, dtype=cfg.model.dtype)
    lora = {
        f: getattr(cfg.model, f)
        for f in ("lora_rank", "lora_alpha", "lora_targets", "lora_dropout")
    }
    model = dataclasses.replace(
        shapes, path=cfg.model.path, param_dtype=cfg.model.param_dtype, **lora
    )
    return dataclasses.replace(cfg, model=model)
