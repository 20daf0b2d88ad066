"""The `minirl` command: train, sft, eval, export, plot, samples, plan, diagnose, config.

    minirl train                              the built-in default (countdown, 0.75M-parameter model, ~5 min)
    minirl train --model DIR --data train.jsonl [--eval-data test.jsonl] [--verifier math]
                                              your own Hugging Face model directory and dataset file
    minirl train --preset arithmetic --set rl.steps=50 --set engine.temperature=0.8
    minirl train --resume runs/countdown      continue a run from its last checkpoint
    minirl sft                                only the warm start (cached for `train`)
    minirl eval RUN_DIR                       held-out pass@1 / pass@k of a run's last checkpoint
    minirl export RUN_DIR --out DIR           a run's weights as a Hugging Face checkpoint directory
                                              (--adapter: a LoRA run's PEFT adapter directory)
    minirl plot RUN_DIR [RUN_DIR ...]         dashboard PNGs (several runs: one comparison plot)
    minirl samples RUN_DIR [--step N] [--worst|--best]
                                              what the model wrote, its reward and why
    minirl plan --model qwen2.5-7b --device v5p
                                              what a cluster would do with a model (simulated)
    minirl diagnose [--fast]                  training-inference mismatch per source, as a table
    minirl config [--preset NAME]             every knob, its default and what it means

Every command validates its input first: an unknown key, a bad value, a missing or damaged
file, a run directory in use or a full disk is a one-line error that says what to change;
`--debug` shows the traceback as well. Anything else is a bug in minirl, and prints its
traceback.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from minirl.configlib import ConfigError, describe, to_dict
from minirl.run.config_args import (
    add_config_arguments,
    config_from_args,
    train_config_and_dir,
)
from minirl.run.run_dir import load_config
from minirl.training.host_memory import share_arenas


def cmd_train(args) -> int:
    from minirl.run.runner import Run, summary_json

    cfg, run_dir = train_config_and_dir(args)  # a new run, or --resume RUN_DIR
    summary = Run(cfg, run_dir, progress=not args.quiet).train(resume=True, force=args.force)
    print(summary_json(run_dir, summary))
    print(f"dashboard: {_plot(run_dir)}")
    return 0


def cmd_sft(args) -> int:
    from minirl.run.runner import Run
    from minirl.run.warmstart import warm_start

    cfg = config_from_args(args)
    run = Run(cfg, "unused", progress=not args.quiet)
    params, report = warm_start(cfg, run.tokenizer, run.task, progress=not args.quiet)
    result = run.evaluate(run.engine(0, params))
    print(json.dumps({"warm_start": report, "heldout": result}, indent=2, default=str))
    return 0


def cmd_eval(args) -> int:
    from minirl.run.runner import Run
    from minirl.store.checkpoints import CheckpointManager

    cfg = load_config(args.run_dir)
    ckpt = CheckpointManager(args.run_dir).restore(opt_state=False)  # the weights alone
    if ckpt is None:
        raise ConfigError(f"{args.run_dir} has no checkpoint to evaluate")
    run = Run(cfg, args.run_dir, progress=False)
    print(
        json.dumps(
            {"step": ckpt.step, **run.evaluate(run.engine(ckpt.step, ckpt.params))}, indent=2
        )
    )
    return 0


def cmd_export(args) -> int:
    from minirl.run.export import export_run

    out = export_run(
        args.run_dir,
        args.out,
        step=args.step,
        dtype=args.dtype,
        force=args.force,
        adapter=args.adapter,
    )
    if args.adapter:
        print(f"wrote {out} (load it with peft.PeftModel.from_pretrained(base_model, DIR))")
    else:
        print(f"wrote {out} (load it with transformers.AutoModelForCausalLM.from_pretrained)")
    return 0


def _plot(run_dir) -> str:
    from minirl.plots import plot_all

    return str(plot_all(run_dir)[0])


def cmd_plot(args) -> int:
    from minirl.plots import plot_all, plot_compare

    if len(args.run_dirs) == 1:
        for path in plot_all(args.run_dirs[0]):
            print(path)
    else:
        print(plot_compare(args.run_dirs, x=args.x, y=args.y, out=args.out))
    return 0


def cmd_samples(args) -> int:
    from minirl.measure.metrics_log import read_metrics
    from minirl.run.tracking import SAMPLES_FILE

    if not Path(args.run_dir).is_dir():
        raise ConfigError(f"{args.run_dir} is not a run directory")
    rows = [
        r
        for r in read_metrics(args.run_dir, SAMPLES_FILE)
        if _number(r.get("step"), int) is not None
    ]
    if not rows:
        raise ConfigError(
            f"{Path(args.run_dir) / SAMPLES_FILE} holds no samples (they are written "
            "every log.samples_every steps)"
        )
    ranked = args.worst or args.best
    if args.step is not None:
        rows = [r for r in rows if r["step"] == args.step]
        if not rows:
            raise ConfigError(
                f"no samples at step {args.step} (steps with samples: every log.samples_every)"
            )
    elif not ranked:
        rows = [r for r in rows if r["step"] == rows[-1]["step"]]
    if ranked:  # samples without a numeric reward last, either way
        sign = -1.0 if args.best else 1.0
        rewards = [_number(r.get("reward")) for r in rows]
        order = sorted(
            range(len(rows)), key=lambda i: (rewards[i] is None, sign * (rewards[i] or 0))
        )
        rows = [rows[i] for i in order]
    for r in rows[: args.n]:
        print(
            f"── step {r['step']} · prompt {r.get('uid')} sample {r.get('sample')} · reward "
            f"{r.get('reward')} ({r.get('reason')}) · {r.get('length')} tokens, "
            f"{r.get('finish')} · versions {r.get('oldest_version')}..{r.get('newest_version')}, "
            f"lag {r.get('lag')}"
        )
        print(f"prompt:\n{r.get('prompt', '')}\ncompletion:\n{r.get('completion', '')}\n")
    return 0


def _number(value, kind=(int, float)):
    """`value` if it is a number of `kind` (not a bool), else None: a line of samples.jsonl
    edited by hand, or written by another program, may hold anything."""
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def _at_least_one(text: str) -> int:
    """-n: a count of samples to print (argparse's type)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return n


def cmd_config(args) -> int:
    from minirl.config import RunConfig

    values = to_dict(config_from_args(args))
    for key, _, meaning in describe(RunConfig):  # every knob, dict-valued ones included
        value = values
        for part in key.split("."):
            value = value[part]
        print(f"{key:32s} {json.dumps(value):24s} {meaning}")
    return 0


def _add_output_commands(sub) -> None:
    """The commands that read a finished (or running) run directory: export, plot, samples."""
    p = sub.add_parser(
        "export",
        help="write a run's weights as a Hugging Face checkpoint directory",
        description="Write a checkpoint of RUN_DIR as a Hugging Face directory "
        "(config.json, model.safetensors, generation_config.json, tokenizer "
        "files) that transformers and vLLM load.",
    )
    p.add_argument("run_dir")
    p.add_argument("--out", required=True, metavar="DIR", help="the directory to write")
    p.add_argument("--step", type=int, help="which checkpoint (default: the latest)")
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        help="weights' dtype in the files (default: the run's, float32)",
    )
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.add_argument(
        "--adapter",
        action="store_true",
        help="a LoRA run's adapters as a PEFT directory (adapter_config.json, "
        "adapter_model.safetensors; a built-in run's base in DIR/base)",
    )
    p.set_defaults(fn=cmd_export)

    p = sub.add_parser("plot", help="write a run's PNG dashboard, or compare several runs")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--x", default="step", choices=["step", "time"], help="comparison x axis")
    p.add_argument("--y", default="reward/mean", help="comparison metric (a metrics.jsonl key)")
    p.add_argument("--out", help="comparison PNG path")
    p.set_defaults(fn=cmd_plot)

    p = sub.add_parser(
        "samples",
        help="print sample completions of a run: text, reward, reason",
        description="Print the rollouts a run kept in samples.jsonl (every "
        "log.samples_every steps): prompt, completion, reward and the "
        "verifier's reason, length, weight versions, lag. Default: the "
        "latest step's.",
    )
    p.add_argument("run_dir")
    p.add_argument("--step", type=int, help="the samples of this step")
    order = p.add_mutually_exclusive_group()
    order.add_argument(
        "--worst", action="store_true", help="lowest reward first (all steps, or --step's)"
    )
    order.add_argument("--best", action="store_true", help="highest reward first")
    p.add_argument("-n", type=_at_least_one, default=8, help="at most this many (default 8)")
    p.set_defaults(fn=cmd_samples)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minirl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "train",
        help="warm start (cached), evaluate, RL, evaluate; writes a run directory",
        description="Train with RL. Without arguments: the built-in countdown default, "
        "about 5 minutes on a 2-core CPU. `minirl config` lists every knob.",
    )
    add_config_arguments(p)
    p.add_argument("--run-dir", help="where to write the run (default: runs/<task>)")
    p.add_argument(
        "--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint"
    )
    p.add_argument("--force", action="store_true", help="continue a run even if its config changed")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(fn=cmd_train)

    from minirl.sim.plan import add_plan_parser

    add_plan_parser(sub)

    p = sub.add_parser(
        "sft",
        help="run (or load from cache) the supervised warm start and evaluate it",
        description="The warm start `minirl train` begins with, alone: supervised steps on the "
        "task's demonstrations (cached, so `minirl train` with the same config reuses them), "
        "then its held-out pass@1 / pass@k, printed as JSON. Writes no run directory.",
    )
    add_config_arguments(p)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(fn=cmd_sft)

    p = sub.add_parser(
        "eval",
        help="held-out pass@1 / pass@k of a run's latest checkpoint",
        description="Evaluate the latest checkpoint of RUN_DIR on the held-out split, with the "
        "run's own config (eval.prompts x eval.samples), and print the step and the numbers as "
        "JSON.",
    )
    p.add_argument("run_dir")
    p.set_defaults(fn=cmd_eval)

    _add_output_commands(sub)

    from minirl.diagnose import add_diagnose_parser

    add_diagnose_parser(sub)  # minirl diagnose: |Δlogp| per mismatch source (minirl/diagnose/)

    p = sub.add_parser("config", help="print every knob with its value and meaning")
    add_config_arguments(p)
    p.set_defaults(fn=cmd_config)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    from minirl.store.hashed_files import CorruptCheckpointError

    return (ConfigError, ValueError, OSError, CorruptCheckpointError)


def _dash_values(argv: list[str]) -> list[str]:
    """`--staleness -1,0,0` as `--staleness=-1,0,0`. argparse takes a word that starts with
    "-" (and is not a plain number) for an option, and says only "expected one argument"; no
    option of minirl starts with "-" and a digit, so such a word is the value before it, and
    that value's own check says what is wrong with it."""
    out: list[str] = []
    for word in argv:
        if out and re.match(r"-[\d.]", word) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def main(argv=None) -> int:
    share_arenas()  # before XLA starts its threads: they reuse what the others free
    argv = _dash_values(list(sys.argv[1:] if argv is None else argv))
    debug = "--debug" in argv  # anywhere on the line: `minirl train ... --debug` works too
    parser = build_parser()
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show the Python traceback of an error, not only its message",
    )
    args = parser.parse_args([a for a in argv if a != "--debug"])
    try:
        return args.fn(args)
    except _user_errors() as e:
        if debug:
            raise
        print(f"minirl {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"minirl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
