"""What a run starts from: its tokenizer, task and first weights, built once at the edge.

    tokenizer = load_tokenizer(cfg)     the model directory's (tokenizer.json, chat template, every
                                        EOS id in generation_config.json), else the character one
    task = make_task(cfg, tokenizer)    a built-in task, or the dataset files in cfg.data
                                        (task.name=file), prompts encoded by `tokenizer`
    params = initial_params(cfg, seed)  the model directory's weights (minirl/hf/model_files.py) or a random init

Everything after these three sees a `ModelConfig`, params, a `Task` and a tokenizer, exactly as
for the built-in presets (docs/design.md: "a user's model and data enter at the edges"). No part of
minirl builds its own tokenizer: the runner calls `load_tokenizer` and hands the result on.

`describe_inputs(cfg)` is what the run directory's meta.json records about them (the model
directory's config.json hash, each dataset file's size and sha256), so a run says exactly what it
was trained on.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path

from minirl.config import FILE_TASK, RunConfig
from minirl.configlib import ConfigError
from minirl.inference.engine import Engine
from minirl.modeling import lora
from minirl.modeling.tokenizer import CharTokenizer


def make_engine(cfg, tokenizer, task=None):
    """The rollout engine of a run: `cfg.engine`, its EOS ids (engine.eos_ids, or the
    tokenizer's when that is empty), sampling keyed by rl.seed. With `task.tools` it is an
    `EpisodeRunner` over that engine (the same interface; multi-turn episodes, each scored by
    its environment), whose turns also end after a tool call's closing tag; `task` is the run's
    (built from cfg when None, e.g. inside an engine process)."""
    ecfg = (
        cfg.engine
        if cfg.engine.eos_ids
        else dataclasses.replace(cfg.engine, eos_ids=tuple(tokenizer.eos_ids))
    )
    if not cfg.task.tools:
        return Engine(cfg.model, ecfg, seed=cfg.rl.seed)
    from minirl.envs import EpisodeConfig, EpisodeRunner, ToolTaskEnv, Turns, stop_sequences

    tools = make_tools(cfg)
    task = task if task is not None else make_task(cfg, tokenizer)
    stops = tuple(dict.fromkeys(ecfg.stop_sequences + stop_sequences(tools, tokenizer)))
    engine = Engine(cfg.model, dataclasses.replace(ecfg, stop_sequences=stops), seed=cfg.rl.seed)
    episodes = EpisodeConfig(max_turns=cfg.task.max_turns)
    return EpisodeRunner(engine, lambda: ToolTaskEnv(task, tools), Turns(tokenizer), episodes)


def make_tools(cfg) -> list:
    """The tools named in `task.tools` (minirl/envs/), one of each per process (the Python
    tool holds a sandbox worker: every engine and warm start of a run shares it)."""
    return [_tool(name) for name in cfg.task.tools]


@functools.cache
def _tool(name: str):
    from minirl.envs import Calculator, PythonTool

    return {"calc": Calculator, "py": PythonTool}[name]()


def load_tokenizer(cfg: RunConfig):
    """The run's tokenizer: the model directory's, or the built-in tasks' character tokenizer."""
    if not cfg.model.path:
        return CharTokenizer()
    from minirl.hf.hf_tokenizer import HFTokenizer
    from minirl.hf.model_files import read_token_ids

    return HFTokenizer.from_dir(cfg.model.path, extra_eos_ids=read_token_ids(cfg.model.path).eos)


def make_verifier(cfg: RunConfig):
    """The verifier of the run's task (built on its own, e.g. inside a verifier process); with
    `task.tools` the episodes arrive scored by their environments (`EpisodeScores`)."""
    if cfg.task.tools:
        from minirl.envs import EpisodeScores

        return EpisodeScores()
    if cfg.task.name != FILE_TASK:
        from minirl.tasks import get_task

        return get_task(cfg.task.name, **cfg.task.args).verifier
    from minirl.verifiers.registry import dataset_verifier

    return dataset_verifier(cfg.data.verifier, cfg.data.format_reward)


def make_task(cfg: RunConfig, tokenizer):
    """A built-in task, or the dataset files named in cfg.data (read and checked here)."""
    if cfg.task.name != FILE_TASK:
        from minirl.tasks import get_task

        return get_task(cfg.task.name, tokenizer=tokenizer, **cfg.task.args)
    from minirl.tasks.files import FileTask
    from minirl.verifiers.registry import dataset_verifier, row_targets

    d = cfg.data
    return FileTask.load(
        d.train,
        tokenizer,
        dataset_verifier(d.verifier, d.format_reward),
        eval_path=d.eval or None,
        test_fraction=d.test_fraction,
        max_new_tokens=d.max_new_tokens,
        prompt_key=d.prompt_key,
        answer_key=d.answer_key,
        messages_key=d.messages_key,
        system_prompt=d.system_prompt,
        instruction=d.instruction,
        use_chat_template=d.chat_template,
        chat_template_kwargs=d.chat_template_kwargs,
        max_prompt_tokens=cfg.engine.cache_len - d.max_new_tokens,
        targets=row_targets(d.verifier),
    )


def train_prompts(task):
    """What the prompt mixture draws from: a file task's training rows (a finite list, read in
    shuffled epochs), or a built-in task itself (prompts by index, endless)."""
    return getattr(task, "train", task)


def initial_params(cfg: RunConfig, seed: int) -> dict:
    """The first weights as a pure dict: the model directory's, or a seed-`seed` random init;
    the base model's, without LoRA adapters (`minirl.modeling.lora.add_adapters` adds them)."""
    from flax import nnx

    if not cfg.model.path:
        from minirl.modeling.model import init_model

        return nnx.to_pure_dict(nnx.split(init_model(lora.base_config(cfg.model), seed=seed))[1])
    from minirl.hf.model_files import load_hf

    # read at the storage dtype: bf16 compute over float32 weights keeps the checkpoint's bits
    loaded, model = load_hf(cfg.model.path, dtype=cfg.model.param_dtype)
    return checked_params(cfg, loaded, nnx.to_pure_dict(nnx.split(model)[1]))


def checked_params(cfg: RunConfig, loaded, params: dict) -> dict:
    """A checkpoint's params as this run uses them: its config (`loaded`) must still be the run's
    model (a directory edited since the run started is refused), cast to the run's storage dtype.
    The params may be host arrays or sharded ones (scale.mesh.load_checkpoint)."""
    mine = dataclasses.replace(
        lora.base_config(cfg.model), path="", dtype=loaded.dtype, param_dtype=loaded.param_dtype
    )
    if dataclasses.replace(loaded, path="") != mine:
        raise ConfigError(
            f"{cfg.model.path} no longer matches this run's model config (was the "
            "directory changed since the run started?)"
        )
    if cfg.model.param_dtype != loaded.param_dtype:
        import jax

        params = jax.tree.map(lambda a: a.astype(cfg.model.storage_dtype), params)
    return params


def describe_inputs(cfg: RunConfig) -> dict:
    """For meta.json: what the model directory and dataset files were, by content."""
    from minirl.verifiers.registry import row_targets

    out = {}
    if cfg.model.path:
        config = Path(cfg.model.path) / "config.json"
        out["model"] = {"path": cfg.model.path, "config_sha256": _sha256(config)}
    if cfg.task.name == FILE_TASK:
        files = {"train": cfg.data.train, "eval": cfg.data.eval}
        out["data"] = {
            split: {"path": p, "bytes": Path(p).stat().st_size, "sha256": _sha256(p)}
            for split, p in files.items()
            if p
        }
        if row_targets(cfg.data.verifier) == "row":  # your reward function's file, by content
            path = cfg.data.verifier.rpartition(":")[0]
            out["verifier"] = {"spec": cfg.data.verifier, "sha256": _sha256(path)}
    return out


def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
