"""Side by side with Hugging Face TRL: the same GRPO work, one library at a time (issue #40).

    python benchmarks/trl_side_by_side.py --size 25m --rounds 3            # the figure (~20 min)
    python benchmarks/trl_side_by_side.py --size tiny --rounds 1           # a smoke run (~1 min)
    python benchmarks/trl_side_by_side.py --variants minirl-defaults,trl-defaults

The work (the issue's): a random Qwen2 saved as a Hugging Face directory with transformers
(`--size 25m`: D 512, 8 layers, 8 heads, 4 KV heads, F 1536; `tiny`: D 64, 2 layers), a byte-level
BPE tokenizer of 300 tokens trained here, 40 GSM8K-style rows (`#### 42` answers) generated here;
nothing is downloaded. GRPO with the Dr. GRPO loss, 8 prompts x 8 samples per step, at most 64 new
tokens, temperature 1 (no top-k / top-p), learning rate 1e-5 constant, one optimizer step per
batch, no KL term, 12 steps, no evaluation inside the timed steps.

Variants (`--variants`, comma separated, run in this order inside every round):
  minirl            `minirl train --model DIR --data FILE --verifier math` with the work above and
                    the engine sized for it (64 slots, a 128-position cache, one prefill bucket)
  trl               `trl.GRPOTrainer` with GRPOConfig(num_generations=8,
                    per_device_train_batch_size=64, max_completion_length=64, temperature=1,
                    top_k=0, top_p=1, learning_rate=1e-5 constant, beta=0, num_iterations=1,
                    loss_type="dr_grpo", scale_rewards="none", gradient_checkpointing=False,
                    bf16=False, use_vllm=False)
  minirl-defaults   minirl with its own defaults for a user's model (engine slots and cache unset)
  trl-defaults      TRL with only the work's batch shape, lengths and learning rate set; the rest
                    TRL's defaults (loss "dapo", group-scaled rewards, gradient checkpointing, bf16)

Each variant runs in its own fresh Python process, one after the other, the round's order
alternating (minirl first in odd rounds, TRL first in even ones), so both libraries see the same
machine state within a round. torch runs with `torch.set_num_threads(2)` and
`OMP_WAIT_POLICY=PASSIVE` (the documented practice for torch on a shared CPU: spinning OpenMP
threads collapse small matmuls when another process holds the cores); JAX uses both cores.

What is measured, per library, per step (the first step, which compiles / warms up, is reported
apart and left out of the means):
  s/step            the whole step: generate, score, train, publish
  generation s      minirl: the engine's generate time (`time/generate`); TRL: `_generate`
                    (tokenize + `model.generate`)
  train phase s     s/step - generation s (the same definition for both: scoring, the trainer's
                    forwards and backward, the optimizer, the library's own overhead)
  tokens/s          completion tokens generated per step / s per step (EOS included)
The printed ratios are minirl over TRL within the same round (tokens/s: > 1 = minirl faster;
s/step: TRL s / minirl s, > 1 = minirl faster), and their median over rounds. The machine is a
shared 2-core CPU: absolute seconds vary from round to round, ratios less.

The driver's functions are what tests/test_bench_side_by_side.py runs end to end on `tiny`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORK = dict(steps=12, prompts=8, group=8, new_tokens=64, lr=1e-5, rows=40)
SIZES = {  # transformers Qwen2Config sizes
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=2048,  # room for minirl's default 512-position cache
    ),
    "25m": dict(
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=1536,
        max_position_embeddings=2048,
    ),
}
VARIANTS = ("minirl", "trl", "minirl-defaults", "trl-defaults")
RESULT = "SIDE-BY-SIDE-RESULT "


# ---- the workload -------------------------------------------------------------------------------


def make_workload(directory, size: str = "25m", rows: int = WORK["rows"]) -> Path:
    """A random Qwen2 of `size` with a 300-token BPE tokenizer in DIR/model, `rows` GSM8K-style
    rows in DIR/train.jsonl and 4 in DIR/test.jsonl (fixed seeds: the same files every time)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from hf_tiny import make_model_dir

    directory = Path(directory)
    # the chat template's own text is in the tokenizer's training data, so a prompt (template,
    # default system message, question) is ~45 tokens: 64 new tokens fit a 128-position cache
    template = ["<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"]
    model = make_model_dir(
        directory / "model", dims=SIZES[size], vocab_size=300, extra_text=tuple(template * 400)
    )
    names, things = ["Tom", "Ana", "Li", "Sam"], ["apples", "books", "coins", "pens"]
    lines = []
    for i in range(rows + 4):
        a, b = 3 + 7 * i % 41, 2 + 5 * i % 23
        name, thing = names[i % len(names)], things[i % len(things)]
        question = f"{name} has {a} {thing}, buys {b}. How many?"
        answer = f"{a} + {b} = {a + b}.\n#### {a + b}"
        lines.append(json.dumps({"question": question, "answer": answer}))
    (directory / "train.jsonl").write_text("\n".join(lines[:rows]) + "\n")
    (directory / "test.jsonl").write_text("\n".join(lines[rows:]) + "\n")
    return model


# ---- one library, in a child process ------------------------------------------------------------


def minirl_argv(directory: Path, run_dir: Path, work: dict, tuned: bool) -> list[str]:
    """The `minirl train` command line of the work (`tuned`: the engine sized for it)."""
    sets = [
        f"rl.steps={work['steps']}",
        f"rl.prompts_per_step={work['prompts']}",
        f"rl.group_size={work['group']}",
        f"data.max_new_tokens={work['new_tokens']}",
        "engine.temperature=1.0",
        "engine.top_k=0",
        "engine.top_p=1.0",
        f"trainer.learning_rate={work['lr']}",
        "trainer.schedule=constant",
        "trainer.num_minibatches=1",
        "trainer.ppo_epochs=1",
        "rl.loss=dr_grpo",
        "eval.prompts=2",  # evaluation runs before and after the steps, never inside them
        "eval.samples=1",
        "sft.steps=0",
    ]
    if tuned:
        slots = work["prompts"] * work["group"]
        sets += [f"engine.slots={slots}", "engine.cache_len=128", "engine.prefill_buckets=[64]"]
    argv = ["train", "--quiet", "--model", str(directory / "model")]
    argv += ["--data", str(directory / "train.jsonl"), "--verifier", "math"]
    argv += ["--eval-data", str(directory / "test.jsonl")]
    argv += ["--run-dir", str(run_dir)]
    for s in sets:
        argv += ["--set", s]
    return argv


def run_minirl(directory: Path, work: dict, tuned: bool) -> dict:
    """`minirl train` in this process (the driver starts it in a fresh one); per-step timings
    from its metrics.jsonl."""
    from minirl.cli import main

    run_dir = Path(tempfile.mkdtemp(prefix="minirl-", dir=directory))
    if main(minirl_argv(directory, run_dir, work, tuned)) != 0:
        raise RuntimeError("minirl train failed")
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "step_s": [s["time/step"] for s in steps],
        "generate_s": [s["time/generate"] for s in steps],
        "tokens": [s["generate/tokens"] for s in steps],
        "trainer_s": [s["time/train"] for s in steps],  # the trainer's call alone
        "padded_tokens": [s["train/padded_tokens"] for s in steps],
        "recompute_s": [s["train/time_recompute_s"] for s in steps],
    }


def _reward(completions, answer, **_):
    """1 when the last `#### N` (or else the last number) of the completion equals the row's."""
    import re

    out = []
    for completion, want in zip(completions, answer, strict=True):
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        marked = re.findall(r"####\s*(-?[\d,]+)", text)
        numbers = marked or re.findall(r"-?\d+", text)
        got = numbers[-1].replace(",", "") if numbers else None
        out.append(float(got == want.split("####")[-1].strip()))
    return out


def run_trl(directory: Path, work: dict, defaults: bool) -> dict:
    """`trl.GRPOTrainer` on the work in this process; per-step timings from a callback and a
    timed `_generate`."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(2)
    rows = [json.loads(x) for x in (directory / "train.jsonl").read_text().splitlines()]
    data = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": r["question"]}], "answer": r["answer"]}
            for r in rows
        ]
    )
    shape = dict(
        output_dir=str(directory / "trl-out"),
        num_generations=work["group"],
        per_device_train_batch_size=work["prompts"] * work["group"],
        max_completion_length=work["new_tokens"],
        learning_rate=work["lr"],
        max_steps=work["steps"],
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    if not defaults:
        shape |= dict(
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            lr_scheduler_type="constant",
            beta=0.0,
            num_iterations=1,
            loss_type="dr_grpo",
            scale_rewards="none",
            gradient_checkpointing=False,
            bf16=False,
            use_vllm=False,
        )
    times = {"generate": 0.0, "tokens": 0, "step": [], "gen": [], "tok": []}

    class Timed(GRPOTrainer):
        def _generate(self, prompts):
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            times["generate"] += time.perf_counter() - t0
            times["tokens"] += sum(len(ids) for ids in out[1])  # completion ids, EOS included
            return out

    class Steps(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            times["t0"], times["g0"], times["k0"] = (
                time.perf_counter(),
                times["generate"],
                times["tokens"],
            )

        def on_step_end(self, args, state, control, **kw):
            times["step"].append(time.perf_counter() - times["t0"])
            times["gen"].append(times["generate"] - times["g0"])
            times["tok"].append(times["tokens"] - times["k0"])

    path = str(directory / "model")
    trainer = Timed(
        model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        processing_class=AutoTokenizer.from_pretrained(path),
        reward_funcs=_reward,
        args=GRPOConfig(**shape),
        train_dataset=data,
        callbacks=[Steps()],
    )
    trainer.train()
    return {"step_s": times["step"], "generate_s": times["gen"], "tokens": times["tok"]}


def run_child(
    directory: Path, variant: str, work: dict, minirl_root=ROOT, timeout: float = 3600
) -> dict:
    """One variant in a fresh Python process (minirl imported from `minirl_root`: another
    checkout gives a before/after); its per-step timings."""
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(minirl_root), env.get("PYTHONPATH", "")])
    code = (
        f"import json, sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); "
        "import trl_side_by_side as b; "
        f"print({RESULT!r} + json.dumps(b.child({str(directory)!r}, {variant!r}, {work!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=directory,
        timeout=timeout,
    )
    lines = [x for x in out.stdout.splitlines() if x.startswith(RESULT)]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{variant} failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(lines[-1][len(RESULT) :])


def child(directory: str, variant: str, work: dict) -> dict:
    directory = Path(directory)
    if variant.startswith("minirl"):
        return run_minirl(directory, work, tuned=variant == "minirl")
    return run_trl(directory, work, defaults=variant == "trl-defaults")


# ---- the figures --------------------------------------------------------------------------------


def summarize(timings: dict) -> dict:
    """Steady-state means over the steps after the first (and the first step apart)."""
    steady = lambda key: timings[key][1:] or timings[key]
    mean = lambda xs: sum(xs) / len(xs)
    step, gen, tokens = mean(steady("step_s")), mean(steady("generate_s")), mean(steady("tokens"))
    return {
        "s_per_step": step,
        "generation_s": gen,
        "train_phase_s": step - gen,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / step,
        "generation_tokens_per_s": tokens / max(gen, 1e-9),
        "first_step_s": timings["step_s"][0],
        "s_per_step_all": mean(timings["step_s"]),  # with the first step
    }


def ratios(mine: dict, theirs: dict) -> dict:
    """minirl vs TRL, > 1 = minirl faster."""
    return {
        "step": theirs["s_per_step"] / mine["s_per_step"],
        "step_all": theirs["s_per_step_all"] / mine["s_per_step_all"],
        "tokens_per_s": mine["tokens_per_s"] / theirs["tokens_per_s"],
        "train_phase": theirs["train_phase_s"] / mine["train_phase_s"],
        "generation": theirs["generation_s"] / mine["generation_s"],
    }


def side_by_side(
    directory, variants, rounds: int, work: dict, minirl_root=ROOT, log=print
) -> list[dict]:
    """`rounds` rounds of every variant, the order alternating; per round the summaries and the
    ratios of each minirl variant to its TRL counterpart."""
    out = []
    for r in range(rounds):
        order = list(variants) if r % 2 == 0 else list(variants)[::-1]
        got = {}
        for v in order:
            got[v] = summarize(run_child(Path(directory), v, work, minirl_root))
            log(f"round {r + 1} {v}: " + json.dumps({k: round(x, 3) for k, x in got[v].items()}))
        row = {"round": r + 1, **got}
        for mine, theirs in (("minirl", "trl"), ("minirl-defaults", "trl-defaults")):
            if mine in got and theirs in got:
                row[f"{mine} / {theirs}"] = ratios(got[mine], got[theirs])
        out.append(row)
    return out


def table(results: list[dict]) -> str:
    """A Markdown table: per round and pair, s/step of both and the four ratios."""
    head = (
        "| round | pair | minirl s/step | TRL s/step | TRL s / minirl s | tokens/s ratio "
        "| train phase ratio | generation ratio |\n| --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    rows = []
    for res in results:
        for key, q in res.items():
            if " / " not in key:
                continue
            mine, theirs = key.split(" / ")
            rows.append(
                f"| {res['round']} | {key} | {res[mine]['s_per_step']:.2f} "
                f"| {res[theirs]['s_per_step']:.2f} | {q['step']:.2f} | {q['tokens_per_s']:.2f} "
                f"| {q['train_phase']:.2f} | {q['generation']:.2f} |"
            )
    return "\n".join([head, *rows])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=tuple(SIZES), default="25m")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=WORK["steps"])
    p.add_argument("--variants", default="minirl,trl")
    p.add_argument("--dir", default=None, help="workload directory (default: a temporary one)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--minirl", default=str(ROOT), help="the minirl checkout to run (before/after)")
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    directory = Path(args.dir or tempfile.mkdtemp(prefix="side-by-side-"))
    make_workload(directory, args.size)
    if args.rounds == 0:  # the workload files only (benchmarks/profile_train_phase.py reads them)
        print(directory)
        return 0
    work = dict(WORK, steps=args.steps)
    results = side_by_side(directory, variants, args.rounds, work, args.minirl)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
