"""What a run starts from: its tokenizer, task and first weights, built once at the edge.

    tokenizer = load_tokenizer(cfg)     the model directory's (tokenizer.json, chat template, every
                                        EOS id in generation_config.json), else the character one
    task = make_task(cfg, tokenizer)    a built-in task, or the dataset files in cfg.data
                                        (task.name=file), prompts encoded by `tokenizer`
    params = initial_params(cfg, seed)  the model directory's weights (minirl/hf/model_files.py) or a random init
    teacher_model(cfg, tokenizer)       on-policy distillation: the knobs agree, the teacher's shapes,
                                        its tokenizer the student's (before any weights are read)
    make_teacher(cfg, teacher_cfg)      the teacher itself (weights read where it will live)

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

from minirl.config import FILE_TASK, DataConfig, RunConfig
from minirl.configlib import ConfigError
from minirl.inference.engine import Engine
from minirl.modeling import lora
from minirl.modeling.tokenizer import CharTokenizer


def make_engine(cfg, tokenizer, task=None, slot_layout=None):
    """The rollout engine of a run: `cfg.engine`, its EOS ids (engine.eos_ids, or the
    tokenizer's when that is empty), sampling keyed by rl.seed. With episodes (`task.tools`,
    `task.env` or `task.agent`) it is wrapped by `episode_runner` (the same interface), and its
    turns also end after a tool call's closing tag where the call format has one; `task` is the
    run's (built from cfg when None, e.g. inside an engine process). `slot_layout`: where the
    engine's slot rows live (`Engine`'s hook: None is one device; scale/ passes a mesh's)."""
    ecfg = (
        cfg.engine
        if cfg.engine.eos_ids
        else dataclasses.replace(cfg.engine, eos_ids=tuple(tokenizer.eos_ids))
    )
    if not cfg.task.episodes:
        return Engine(cfg.model, ecfg, seed=cfg.rl.seed, slot_layout=slot_layout)
    stops = tuple(dict.fromkeys(ecfg.stop_sequences + _tool_stops(cfg, tokenizer)))
    ecfg = dataclasses.replace(ecfg, stop_sequences=stops)
    engine = Engine(cfg.model, ecfg, seed=cfg.rl.seed, slot_layout=slot_layout)
    return episode_runner(cfg, tokenizer, engine, task)


def episode_runner(cfg, tokenizer, engine, task=None):
    """Multi-turn episodes over `engine` (an Engine, or the warm start's ScriptedEngine): an
    `EpisodeRunner` with the built-in tools' environment (task.tools) or yours (task.env, each
    call time-limited by task.timeout), or an `AgentRunner` running your agent (task.agent)
    against the OpenAI-compatible endpoint. All scored as they end."""
    from minirl.envs import EpisodeConfig, EpisodeRunner, ToolTaskEnv, Turns

    task = task if task is not None else make_task(cfg, tokenizer)
    t = cfg.task
    if t.agent:
        from minirl.agents import AgentConfig, AgentRunner, load_agent

        config = AgentConfig(max_turns=t.max_turns, timeout=t.timeout)
        return AgentRunner(engine, load_agent(t.agent), Turns(tokenizer), task, config)
    episodes = EpisodeConfig(max_turns=t.max_turns, timeout=t.timeout if t.env else 0.0)
    if t.env:
        from minirl.envs.user_env import FileEnvs

        make_env = FileEnvs(t.env)
    else:
        tools = make_tools(cfg)
        make_env = lambda: ToolTaskEnv(task, tools)  # noqa: E731
    return EpisodeRunner(engine, make_env, Turns(tokenizer), episodes)


def _tool_stops(cfg, tokenizer) -> tuple:
    """Stop sequences that end a turn after a tool call: the built-in tools' closing tags, or
    those of the tools your environment's class declares when the template knows no tool
    calling (minirl's `tags` format); an agent's tools are per request (minirl/agents/)."""
    from minirl.envs import Turns, stop_sequences, tool_calls

    if cfg.task.tools:
        return stop_sequences(make_tools(cfg), tokenizer)
    if not cfg.task.env:
        return ()
    from minirl.envs.user_env import load_env

    tools = getattr(load_env(cfg.task.env), "tools", None)
    tools = tools if isinstance(tools, list) else None
    try:
        return tool_calls.stop_sequences(Turns(tokenizer).format, tools, tokenizer)
    except ValueError as e:  # a tool name the tokenizer cannot write (its closing tag ends a turn)
        raise ConfigError(f"--env {cfg.task.env!r}: a tool's closing tag: {e}") from None


def check_user_code(cfg) -> None:
    """Your environment class or agent function (task.env, task.agent) loaded and checked now,
    before any model work: a missing file, class or function, or a wrong signature, is one
    ConfigError line."""
    try:
        if cfg.task.env:
            from minirl.envs.user_env import load_env

            load_env(cfg.task.env)
        if cfg.task.agent:
            from minirl.agents import load_agent

            load_agent(cfg.task.agent)
    except ValueError as e:
        raise ConfigError(str(e)) from None


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
    `task.tools`, `task.env` or `task.agent` the episodes arrive scored (`EpisodeScores`)."""
    if cfg.task.episodes:
        from minirl.envs import EpisodeScores

        return EpisodeScores()
    if cfg.task.name != FILE_TASK:
        from minirl.tasks import get_task

        return get_task(cfg.task.name, **cfg.task.args).verifier
    return file_verifier(cfg)


def file_verifier(cfg: RunConfig):
    """`data.verifier`, the verifier of a dataset file's rows: a registered one or your reward
    function (minirl/verifiers/registry.py), or a reward model "rm:DIR" built here, where the
    run's verifier lives (minirl/hf/reward_model.py; in the run's compute dtype): a directory it
    cannot use is one ConfigError line, before any training."""
    from minirl.verifiers.registry import dataset_verifier, reward_model_dir

    d = cfg.data
    if cfg.task.env and d.verifier != DataConfig.verifier:
        raise ConfigError(
            f"data.verifier={d.verifier} does nothing with task.env: your environment's rewards "
            "score the episodes (leave --verifier out)"
        )
    if not reward_model_dir(d.verifier):
        return dataset_verifier(d.verifier, d.format_reward)
    if d.format_reward:
        raise ConfigError(
            "data.format_reward rewards a well-formed wrong answer, which a reward model does not "
            "extract: leave it 0 with data.verifier=rm:DIR"
        )
    from minirl.hf.reward_model import RewardModel

    try:
        return RewardModel(reward_model_dir(d.verifier), dtype=cfg.model.dtype)
    except (ValueError, OSError) as e:
        raise ConfigError(f"data.verifier={d.verifier}: {e}") from None


def make_task(cfg: RunConfig, tokenizer):
    """A built-in task, or the dataset files named in cfg.data (read and checked here). With
    task.env or task.agent each prompt carries its row (`meta["fields"]`) for your code; with
    task.env the rows need no gold answer (your environment scores)."""
    if cfg.task.name != FILE_TASK:
        from minirl.tasks import get_task

        return get_task(cfg.task.name, tokenizer=tokenizer, **cfg.task.args)
    from minirl.tasks.files import FileTask
    from minirl.verifiers.registry import row_targets

    d = cfg.data
    if d.max_new_tokens >= cfg.engine.cache_len:
        raise ConfigError(
            f"data.max_new_tokens={d.max_new_tokens} leaves no room for a prompt in "
            f"engine.cache_len={cfg.engine.cache_len} (a prompt and its completion share the "
            "cache): raise engine.cache_len or lower data.max_new_tokens"
        )
    return FileTask.load(
        d.train,
        tokenizer,
        file_verifier(cfg),
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
        targets="row" if cfg.task.env else row_targets(d.verifier),
        with_row=bool(cfg.task.env or cfg.task.agent),
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


def check_teacher(rl) -> None:
    """The distillation knobs agree: a loss with a teacher term has rl.teacher, and rl.teacher,
    rl.distill_coef and rl.distill_discount each change something (ConfigError otherwise)."""
    from minirl.losses import get_preset, make_objective

    preset = get_preset(rl.loss)
    uses = preset.needs_teacher or bool(rl.distill_coef)
    if preset.needs_teacher and rl.distill_coef == 0:
        raise ConfigError(f"rl.distill_coef=0 leaves rl.loss={rl.loss} nothing to learn from")
    if uses and not rl.teacher:
        why = f"rl.loss={rl.loss}" if preset.needs_teacher else f"rl.distill_coef={rl.distill_coef}"
        raise ConfigError(f"{why} needs a teacher: --teacher DIR (rl.teacher)")
    if rl.teacher and not uses:
        raise ConfigError(
            f"rl.teacher is set but rl.loss={rl.loss} does not use it: use rl.loss=distill, or "
            "rl.distill_coef > 0 to add the teacher's signal to the reward's"
        )
    if rl.distill_discount and not uses:
        raise ConfigError("rl.distill_discount does nothing without a teacher term")
    if uses:
        try:  # e.g. a sequence-level loss (reinforce) with rl.distill_coef
            make_objective(rl.loss, 0, None, 0.0, rl.distill_coef, rl.distill_discount)
        except ValueError as e:
            raise ConfigError(f"rl.distill_coef={rl.distill_coef}: {e}") from None


def teacher_model(cfg: RunConfig, tokenizer):
    """The teacher's ModelConfig (None without rl.teacher), or a ConfigError saying what does not
    fit. A directory: its config.json gives the shapes (the compute dtype is the student's) and its
    tokenizer must have the student's vocabulary, token for token (the teacher scores the
    student's token ids). A model preset name: those shapes with the student's vocabulary size."""
    from minirl.modeling.model_config import PRESETS, ModelConfig

    check_teacher(cfg.rl)
    name = cfg.rl.teacher
    if not name:
        return None
    if Path(name).is_dir():
        from minirl.hf.hf_config import read_model_config
        from minirl.hf.hf_tokenizer import HFTokenizer

        try:
            theirs = HFTokenizer.from_dir(name).vocabulary()
        except (ImportError, OSError, ValueError) as e:  # ImportError: no 'hf' extra
            raise ConfigError(f"teacher {name}: no usable tokenizer ({e})") from None
        _same_vocabulary(name, theirs, tokenizer.vocabulary())
        model_cfg = read_model_config(name, dtype=cfg.model.dtype)
    elif name in PRESETS:
        model_cfg = ModelConfig.preset(
            name,
            vocab_size=cfg.model.vocab_size,
            dtype=cfg.model.dtype,
            param_dtype=cfg.model.dtype,
        )
    else:
        raise ConfigError(
            f"rl.teacher={name!r} is neither a directory nor a model preset ({', '.join(PRESETS)})"
        )
    if model_cfg.vocab_size < cfg.model.vocab_size:  # it must score any id the student samples
        raise ConfigError(
            f"teacher {name}: its model has {model_cfg.vocab_size} token ids, fewer than the "
            f"student's {cfg.model.vocab_size}"
        )
    if model_cfg.max_seq_len < cfg.engine.cache_len:
        raise ConfigError(
            f"teacher {name}: it serves {model_cfg.max_seq_len} positions, fewer than the rows it "
            f"must score (engine.cache_len={cfg.engine.cache_len})"
        )
    return model_cfg


def _same_vocabulary(name: str, theirs: dict, ours: dict) -> None:
    """ConfigError, in one line, unless two vocabularies map every token string to one id."""
    if theirs == ours:
        return
    differ = sorted(set(theirs.items()) ^ set(ours.items()), key=lambda kv: kv[1])
    raise ConfigError(
        f"teacher {name}: its tokenizer's vocabulary differs from the student's ({len(theirs)} vs "
        f"{len(ours)} tokens; first difference: {differ[0][0]!r} -> {differ[0][1]}): the teacher "
        "must read the student's token ids, so both need the same tokenizer"
    )


def make_teacher(cfg: RunConfig, model_cfg):
    """The run's distillation teacher, its weights read here (call it where the teacher lives:
    this process, a worker process, a Ray actor): a `Trainer` without a loss, whose
    `recompute_logprobs(batch)` is the teacher's log pi_T of the batch's targets, scored as the
    trainer recomputes log pi_prox (its forward, micro-batches and the engine's `Sampling`
    scoring spec; exact mode: the engine's bits on these weights) on weights that never change
    (no optimizer state, no gradient). A mixture-of-experts teacher routes freely. A preset's
    weights are a seed-0 random init."""
    from flax import nnx

    from minirl.training.trainer import Trainer

    if Path(cfg.rl.teacher).is_dir():
        from minirl.hf.model_files import load_hf

        model = load_hf(cfg.rl.teacher, dtype=model_cfg.dtype)[1]
    else:
        from minirl.modeling.model import init_model

        model = init_model(model_cfg, seed=0)
    params = nnx.to_pure_dict(nnx.split(model)[1])
    trainer_cfg = dataclasses.replace(cfg.trainer_config(), routing="free")
    return Trainer(model_cfg, params, None, trainer_cfg, sampling=cfg.engine.sampling.scoring)


def describe_inputs(cfg: RunConfig) -> dict:
    """For meta.json: what the model directories and dataset files were, by content. A model
    directory (--model, --teacher, a reward model) by its config.json alone: hashing its weights
    would read the whole checkpoint at every start and resume (docs/your_own_model.md)."""
    from minirl.verifiers.registry import reward_model_dir, row_targets

    out = {}
    if cfg.model.path:
        config = Path(cfg.model.path) / "config.json"
        out["model"] = {"path": cfg.model.path, "config_sha256": _sha256(config)}
    if cfg.rl.teacher and Path(cfg.rl.teacher).is_dir():
        config = Path(cfg.rl.teacher) / "config.json"
        out["teacher"] = {"path": cfg.rl.teacher, "config_sha256": _sha256(config)}
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
        if reward_model_dir(cfg.data.verifier):  # a reward model's config.json, by content
            config = Path(reward_model_dir(cfg.data.verifier)) / "config.json"
            out["verifier"] = {"spec": cfg.data.verifier, "config_sha256": _sha256(config)}
    for key in ("env", "agent"):  # your environment's or agent's file, by content
        spec = getattr(cfg.task, key)
        if spec:
            out[key] = {"spec": spec, "sha256": _sha256(spec.rpartition(":")[0])}
    return out


def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
