"""How every command takes a RunConfig — the `minirl` CLI, `python -m scale.launch`, the
experiments: `--preset NAME`, `--set KEY=VALUE` (repeatable), `--staleness NAME`, `--model
DIR` / `--data FILE` / `--eval-data FILE` / `--verifier NAME` for your own model and data,
`--teacher DIR` for a model to distil from, and `--env FILE.py:Class` / `--agent FILE.py:solve`
for your own environment or agent.

    add_config_arguments(parser)                # the flags
    cfg = config_from_args(args)                # preset -> staleness -> your files -> --set
    cfg, run_dir = train_config_and_dir(args)   # a training command's, with its run directory
                                                # (or --resume RUN_DIR's own config)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from minirl.config import DEFAULT_PRESET, FILE_TASK
from minirl.configlib import ConfigError, override
from minirl.run.derived import keep_recorded
from minirl.run.presets import PRESETS, STALENESS, make_config


def add_config_arguments(
    p: argparse.ArgumentParser, *, staleness: bool = True, preset_help: str | None = None
) -> None:
    """How every command that builds a RunConfig takes it: --preset NAME, --set KEY=VALUE
    (repeatable) and, with `staleness`, --staleness NAME. `config_from_args` builds it."""
    p.add_argument(
        "--preset",
        default=None,
        choices=sorted(PRESETS),
        help=preset_help or f"starting configuration (default: {DEFAULT_PRESET})",
    )
    if staleness:
        p.add_argument(
            "--staleness",
            choices=sorted(STALENESS),
            help="RLAX staleness preset, sets rl.reload_every / rl.max_lag / rl.eta: "
            + "; ".join(f"{k}={v}" for k, v in STALENESS.items()),
        )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one knob, e.g. --set rl.steps=50 (repeatable; "
        "`minirl config` lists every key)",
    )
    _add_input_arguments(p)
    _add_user_code_arguments(p)


def _add_input_arguments(p: argparse.ArgumentParser) -> None:
    """--model, --teacher, --data, --eval-data and --verifier: your own model and data."""
    p.add_argument(
        "--model",
        metavar="DIR",
        help="start from a Hugging Face checkpoint directory (config.json, *.safetensors, "
        "tokenizer.json; sets model.path; the default preset is then `custom`)",
    )
    p.add_argument(
        "--teacher",
        metavar="DIR",
        help="on-policy distillation: a frozen teacher scores every sampled token and its "
        "per-token log-prob is the signal (docs/distillation.md). A Hugging Face directory with "
        "the student's tokenizer, or a model preset name (random weights, for tests). Sets "
        "rl.teacher, and rl.loss=distill unless --set names rl.loss or rl.distill_coef "
        "(e.g. --set rl.loss=grpo --set rl.distill_coef=0.5 mixes it with the reward)",
    )
    p.add_argument(
        "--data",
        metavar="FILE",
        help="train on a .jsonl or .parquet file of problems (sets task.name=file and "
        "data.train; its fields: data.prompt_key, data.answer_key)",
    )
    p.add_argument(
        "--eval-data",
        metavar="FILE",
        help="held-out problems (data.eval); without it, a content-hash split of --data",
    )
    p.add_argument(
        "--verifier",
        metavar="NAME",
        help="how completions of --data are scored (data.verifier): math (the default; minirl's "
        "own answer extraction and comparison), math_verify (the math-verify library, in a pool "
        "of worker processes), code (the rows' tests, docs/verifiers.md), "
        "path/to/file.py:function (your own reward function of the completion and the row) or "
        "rm:DIR (a reward model's score of the conversation: a Hugging Face "
        "*ForSequenceClassification checkpoint with num_labels=1, run in JAX)",
    )


def _add_user_code_arguments(p: argparse.ArgumentParser) -> None:
    """--env and --agent: your own environment or agent, from a file."""
    p.add_argument(
        "--env",
        metavar="FILE.py:CLASS",
        help="multi-turn episodes in your own environment (task.env): a class with "
        "reset(row) -> first message(s) and step(turn) -> (observation, reward, done, info); "
        "a fresh instance per episode (docs/multiturn.md)",
    )
    p.add_argument(
        "--agent",
        metavar="FILE.py:FUNCTION",
        help="episodes run by your own agent (task.agent): an async function of (client, row), "
        "where client is an openai.AsyncOpenAI pointed at minirl's OpenAI-compatible endpoint "
        "over the rollout engine; it returns the reward, or the final answer for the task's "
        "verifier (docs/multiturn.md; needs the `agent` extra)",
    )


def _file_spec(spec: str) -> str:
    """path/to/file.py:name and rm:DIR with the path made absolute (anything else as given:
    the config check names what is wrong)."""
    from minirl.verifiers.registry import REWARD_MODEL, reward_model_dir

    if reward_model_dir(spec):
        return f"{REWARD_MODEL}{Path(reward_model_dir(spec)).resolve()}"
    path, sep, name = spec.rpartition(":")
    return f"{Path(path).resolve()}:{name}" if sep and path.endswith(".py") else spec


def input_overrides(args) -> list[str]:
    """--model / --data / --eval-data / --verifier / --env / --agent as the overrides they
    stand for (paths made absolute, so a run directory resumes from anywhere)."""
    out = []
    if args.model:
        out.append(f"model.path={Path(args.model).resolve()}")
    if args.data:
        out += [f"data.train={Path(args.data).resolve()}", "task.name=file"]
    if args.eval_data:
        out.append(f"data.eval={Path(args.eval_data).resolve()}")
    if args.verifier:
        out.append(f"data.verifier={_file_spec(args.verifier)}")
    for key in ("env", "agent"):
        if getattr(args, key, None):
            out.append(f"task.{key}={_file_spec(getattr(args, key))}")
    return out


def teacher_overrides(args) -> list[str]:
    """--teacher as overrides: rl.teacher (a directory made absolute, else a preset name as
    given), and rl.loss=distill unless --set chooses the loss or the teacher's weight."""
    teacher = getattr(args, "teacher", None)
    if not teacher:
        return []
    out = [f"rl.teacher={Path(teacher).resolve() if Path(teacher).exists() else teacher}"]
    chosen = {item.partition("=")[0].strip() for item in args.overrides}
    if not chosen & {"rl.loss", "rl.distill_coef"}:
        out.append("rl.loss=distill")
    return out


def config_from_args(args, default_preset: str | None = None, extra: list[str] = ()):
    """The RunConfig of `add_config_arguments`' flags: the preset (or `default_preset`, or
    minirl's default), the staleness preset, then `extra` overrides, then the --set ones."""
    inputs = input_overrides(args)
    own = args.model or args.data or args.eval_data or args.verifier  # your model or data
    preset = args.preset or default_preset or ("custom" if own else DEFAULT_PRESET)
    overrides = [*extra, *inputs, *teacher_overrides(args), *args.overrides]
    return make_config(preset, overrides, getattr(args, "staleness", None))


def train_config_and_dir(args):
    """(RunConfig, run directory) of a training command (`minirl train`, `scale.launch ray`),
    every run-level decision made before anything is built. A new run: `config_from_args`, in
    --run-dir or `default_run_dir`; run again on a directory that has a config.json, the values
    derived when it started stay (minirl/run/derived.py `keep_recorded`). With --resume DIR: the
    run directory's own config.json, changed only by --set."""
    from minirl.run.run_dir import load_config  # the run directory's module is heavier

    if not getattr(args, "resume", None):
        cfg = config_from_args(args)
        run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(cfg)
        if (run_dir / "config.json").exists():
            cfg = keep_recorded(cfg, load_config(run_dir), args.overrides)
        return cfg, run_dir
    run_dir = Path(args.resume)
    if not (run_dir / "config.json").exists():
        raise ConfigError(f"--resume {run_dir}: no config.json there (not a minirl run directory)")
    if args.staleness or args.preset or input_overrides(args) or teacher_overrides(args):
        raise ConfigError(
            "--resume continues with the run's own config.json; use --set for changes "
            "(e.g. --set rl.steps=400)"
        )
    cfg = load_config(run_dir)
    for item in args.overrides:
        cfg = override(cfg, item)
    return cfg, run_dir


def default_run_dir(cfg) -> Path:
    """runs/<task>, or runs/<dataset file's stem> for your own data."""
    if cfg.task.name == FILE_TASK:
        return Path("runs") / Path(cfg.data.train).stem
    return Path("runs") / cfg.task.name
