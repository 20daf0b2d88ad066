"""Side by side with Hugging Face TRL and Google's Tunix: the same GRPO work, one library at a time
(issues #40 and #46).

    python benchmarks/trl_side_by_side.py --size 25m --rounds 3 --steps 8 --tunix-python \
        VENV/bin/python --variants minirl,minirl-f32,trl,trl-defaults,tunix,tunix-bf16
    python benchmarks/trl_side_by_side.py --size 0.5b --rounds 2 --steps 3 ...  # Qwen2.5-0.5B shape
    python benchmarks/trl_side_by_side.py --size tiny --rounds 1 --steps 3      # a smoke run

The work (issue #40's): a random Qwen2 saved as a Hugging Face directory with transformers
(`--size 25m`: D 512, 8 layers, 8 heads, 4 KV heads, F 1536; `0.5b`: Qwen2.5-0.5B's shape, D 896,
24 layers, 14 heads, 2 KV heads, F 4864, 151,936 vocabulary rows, tied embeddings; `tiny`: D 64,
2 layers), a byte-level BPE tokenizer of 300 tokens trained here, 40 GSM8K-style rows (`#### 42`
answers) generated here; nothing is downloaded. GRPO with the Dr. GRPO loss, 8 prompts x 8
samples per step, at most 64 new tokens, temperature 1 (no top-k / top-p), learning rate 1e-5
constant, one optimizer step per batch, no KL term, no evaluation inside the timed steps.

Variants (`--variants`, comma separated, run in this order inside every round):
  minirl            `minirl train --model DIR --data FILE --verifier math` with the work above, in
                    minirl's defaults for a user's model (derived: the engine's slots and cache;
                    bf16 mixed precision, engine and trainer, where the CPU multiplies bf16
                    natively, minirl/run/precision.py; shared prompts in the trainer)
  minirl-f32        the same with model.dtype=float32
  minirl-tuned      the same with the engine sized by hand (64 slots, a 128-position cache, one
                    prefill bucket): issue #40's configuration
  trl               `trl.GRPOTrainer` with GRPOConfig(num_generations=8,
                    per_device_train_batch_size=64, max_completion_length=64, temperature=1,
                    top_k=0, top_p=1, learning_rate=1e-5 constant, beta=0, num_iterations=1,
                    loss_type="dr_grpo", scale_rewards="none", gradient_checkpointing=False,
                    bf16=False, use_vllm=False): TRL in float32
  trl-defaults      TRL with only the work's batch shape, lengths and learning rate set; the rest
                    TRL's defaults (loss "dapo", group-scaled rewards, gradient checkpointing, bf16
                    autocast)
  tunix             `google-tunix` 0.1.7's DrGRPOLearner (benchmarks/tunix_child.py says how it is
                    set up), in its own environment (`--tunix-python`, made by
                    benchmarks/setup_tunix.sh, so it cannot move minirl's pins)
  tunix-bf16        the same with the weights loaded in bfloat16 and computed in it (AdamW's
                    moments follow), as Tunix's own examples load models

Each variant runs in its own fresh Python process, one after the other, the round's order
alternating (forward in odd rounds, backward in even ones), so every library sees the same
machine state within a round; a run that fails (Tunix in float32 at 0.5B on a 24 GiB machine is
killed for memory) is logged and tabled as failed, the others go on, and the command exits 1.
Each runs in its users' default environment: no thread-policy variable is set for any of them
(torch: `torch.set_num_threads(2)`, what TRL's own CPU training would use on this 2-core
machine; JAX: both cores). The 0.5B shape trains TRL in micro-batches of 16 rows (gradient
accumulation 4) and Tunix in micro-batches of 2 prompts, to fit memory (Tunix in float32 still
outgrows 24 GiB there: benchmarks/tunix_child.py); minirl uses its own token budget.
`--tunix-env NAME=VALUE` adds a variable to the Tunix runs' environment alone (a diagnosis, e.g.
glibc's MALLOC_ARENA_MAX=1; the machine line records it); none by default.

What is measured, per library, per step (the first step, which compiles / warms up, is reported
apart and left out of the means):
  s/step            the whole step: generate, score, train, publish
  generation s      minirl: the engine's generate time (`time/generate`); TRL: `_generate`
                    (tokenize + `model.generate`); Tunix: `RLCluster.generate`
  train phase s     s/step - generation s (the same definition for all: scoring, the trainer's
                    forwards and backward, the optimizer, the library's own overhead)
  tokens/s          completion tokens generated per step / s per step (EOS included)
  peak RSS GB       the library's process's peak resident memory over the whole run, loading
                    and compiles included (Linux: VmHWM of /proc/self/status, read as it ends)
The printed ratios are each minirl variant over each other library within the same round
(tokens/s: > 1 = minirl faster; s/step: their s / minirl s, > 1 = minirl faster). The first
lines say which machine ran it (CPU model, flags, versions). The machine is a shared 2-core
CPU: absolute seconds vary from round to round, ratios less.

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
    "0.5b": dict(  # Qwen2.5-0.5B's shape (its config.json), random weights
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        rope_theta=1000000.0,
        max_position_embeddings=2048,
    ),
}
MINIRL = ("minirl", "minirl-f32", "minirl-tuned")
PEERS = ("trl", "trl-defaults", "tunix", "tunix-bf16")
VARIANTS = MINIRL + PEERS
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


def minirl_argv(directory: Path, run_dir: Path, work: dict, variant: str = "minirl") -> list[str]:
    """The `minirl train` command line of the work for a minirl variant (module docstring)."""
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
    if variant == "minirl-f32":
        sets.append("model.dtype=float32")
    if variant == "minirl-tuned":
        slots = work["prompts"] * work["group"]
        sets += [f"engine.slots={slots}", "engine.cache_len=128", "engine.prefill_buckets=[64]"]
    argv = ["train", "--quiet", "--model", str(directory / "model")]
    argv += ["--data", str(directory / "train.jsonl"), "--verifier", "math"]
    argv += ["--eval-data", str(directory / "test.jsonl")]
    argv += ["--run-dir", str(run_dir)]
    for s in sets:
        argv += ["--set", s]
    return argv


def run_minirl(directory: Path, work: dict, variant: str) -> dict:
    """`minirl train` in this process (the driver starts it in a fresh one); per-step timings
    from its metrics.jsonl."""
    from minirl.cli import main

    run_dir = Path(tempfile.mkdtemp(prefix="minirl-", dir=directory))
    if main(minirl_argv(directory, run_dir, work, variant)) != 0:
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

    torch.set_num_threads(min(2, os.cpu_count() or 1))
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
        per_device_train_batch_size=work["prompts"]
        * work["group"]
        // work.get("trl_accumulate", 1),
        gradient_accumulation_steps=work.get("trl_accumulate", 1),
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
    directory: Path,
    variant: str,
    work: dict,
    minirl_root=ROOT,
    timeout: float = 3600,
    tunix_python: str | None = None,
    tunix_env: dict | None = None,
) -> dict:
    """One variant in a fresh Python process, in its users' default environment (minirl
    imported from `minirl_root`: another checkout gives a before/after; Tunix run by
    `tunix_python`, its own environment's interpreter, with `tunix_env` added to its
    environment, none by default); its per-step timings."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(minirl_root), env.get("PYTHONPATH", "")])
    code = (
        f"import json, sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); "
        "import trl_side_by_side as b; "
        f"print({RESULT!r} + json.dumps(b.child({str(directory)!r}, {variant!r}, {work!r})))"
    )
    argv = [sys.executable, "-c", code]
    if variant.startswith("tunix"):
        if not tunix_python:
            raise ValueError("the tunix variants need --tunix-python (benchmarks/setup_tunix.sh)")
        env.pop("PYTHONPATH")  # its own environment: nothing of minirl's
        env.update(tunix_env or {})
        script = str(ROOT / "benchmarks" / "tunix_child.py")
        argv = [tunix_python, script, str(directory), json.dumps(work)]
        argv += ["bf16"] if variant == "tunix-bf16" else []
    out = subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=directory, timeout=timeout
    )
    lines = [x for x in out.stdout.splitlines() if x.startswith(RESULT)]
    if out.returncode != 0 or not lines:
        why = f"exit {out.returncode}"
        if out.returncode == -9:  # what the kernel's OOM killer sends
            why += ", killed: out of memory?"
        raise RuntimeError(f"{variant} failed ({why}):\n{out.stderr[-4000:]}")
    return json.loads(lines[-1][len(RESULT) :])


def child(directory: str, variant: str, work: dict) -> dict:
    """One minirl or TRL variant's timings and its process's peak resident memory (GB)."""
    from minirl.run.memory import peak_rss_gb

    directory = Path(directory)
    if variant in MINIRL:
        timings = run_minirl(directory, work, variant)
    else:
        timings = run_trl(directory, work, defaults=variant == "trl-defaults")
    return timings | {"peak_rss_gb": peak_rss_gb()}


def machine() -> dict:
    """What ran the benchmark: the CPU (model, cores, the flags that decide the matmul kernels)
    and the libraries' versions in this environment."""
    import platform
    from importlib import metadata

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    first = lambda key: next(
        (x.split(":", 1)[1].strip() for x in info.splitlines() if x.startswith(key)), ""
    )
    flags = set(first("flags").split())
    wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "avx512_fp16")
    versions = {}
    for name in ("jax", "jaxlib", "flax", "torch", "transformers", "trl"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return {
        "cpu": first("model name") or platform.processor(),
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "siblings_per_core": f"{first('siblings')}/{first('cpu cores')}",
        "flags": [f for f in wanted if f in flags],
        "versions": versions,
    }


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
        "peak_rss_gb": timings.get("peak_rss_gb"),  # the child process's, whole run (VmHWM)
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
    directory,
    variants,
    rounds: int,
    work: dict,
    minirl_root=ROOT,
    log=print,
    tunix_python=None,
    tunix_env=None,
) -> list[dict]:
    """`rounds` rounds of every variant, the order alternating; per round the summaries and the
    ratios of each minirl variant to each other library's variant. A run that fails (killed for
    memory, a library's error) is logged with its error's tail and recorded as
    `{"failed": why}`; the other variants go on."""
    out = []
    for r in range(rounds):
        order = list(variants) if r % 2 == 0 else list(variants)[::-1]
        got = {}
        for v in order:
            try:
                timings = run_child(
                    Path(directory),
                    v,
                    work,
                    minirl_root,
                    tunix_python=tunix_python,
                    tunix_env=tunix_env,
                )
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                got[v] = {"failed": str(e).splitlines()[0].rstrip(":")}
                log(f"round {r + 1} {v}: {e}")
                continue
            got[v] = summarize(timings)
            shown = {k: x if x is None else round(x, 3) for k, x in got[v].items()}
            log(f"round {r + 1} {v}: " + json.dumps(shown))
        row = {"round": r + 1, **got}
        for mine in (v for v in variants if v in MINIRL):
            for theirs in (v for v in variants if v in PEERS):
                failed = "failed" in got[mine] or "failed" in got[theirs]
                row[f"{mine} / {theirs}"] = None if failed else ratios(got[mine], got[theirs])
        out.append(row)
    return out


def table(results: list[dict]) -> str:
    """A Markdown table: per round and pair, s/step of both, the four ratios and each
    process's peak resident memory."""
    head = (
        "| round | pair | minirl s/step | their s/step | their s / minirl s | tokens/s ratio "
        "| train phase ratio | generation ratio | peak RSS GB (minirl, theirs) |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    gb = lambda x: "?" if x is None else f"{x:.1f}"
    rows = []
    for res in results:
        for key, q in res.items():
            if " / " not in key:
                continue
            mine, theirs = key.split(" / ")
            if q is None:  # one of the two runs failed
                cells = [
                    res[v].get("failed") or f"{res[v]['s_per_step']:.2f}" for v in (mine, theirs)
                ]
                rows.append(f"| {res['round']} | {key} | {cells[0]} | {cells[1]} |" + " |" * 5)
                continue
            rows.append(
                f"| {res['round']} | {key} | {res[mine]['s_per_step']:.2f} "
                f"| {res[theirs]['s_per_step']:.2f} | {q['step']:.2f} | {q['tokens_per_s']:.2f} "
                f"| {q['train_phase']:.2f} | {q['generation']:.2f} "
                f"| {gb(res[mine].get('peak_rss_gb'))}, {gb(res[theirs].get('peak_rss_gb'))} |"
            )
    return "\n".join([head, *rows])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=tuple(SIZES), default="25m")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=WORK["steps"])
    p.add_argument("--variants", default="minirl,trl", help=f"of {', '.join(VARIANTS)}")
    p.add_argument("--dir", default=None, help="workload directory (default: a temporary one)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--minirl", default=str(ROOT), help="the minirl checkout to run (before/after)")
    p.add_argument(
        "--tunix-python",
        default=os.environ.get("TUNIX_PYTHON"),
        help="the Tunix environment's python (benchmarks/setup_tunix.sh; $TUNIX_PYTHON)",
    )
    p.add_argument(
        "--tunix-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the Tunix runs only, which its users would not set "
        "(e.g. MALLOC_ARENA_MAX=1); repeatable; printed on the machine line. Default: none",
    )
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if any(v.startswith("tunix") for v in variants) and not args.tunix_python:
        p.error("the tunix variants need --tunix-python (make it with benchmarks/setup_tunix.sh)")
    bad = [x for x in args.tunix_env if "=" not in x or not x.split("=", 1)[0].isidentifier()]
    if bad:
        p.error(f"--tunix-env takes NAME=VALUE, not {bad}")
    tunix_env = dict(x.split("=", 1) for x in args.tunix_env)
    directory = Path(args.dir or tempfile.mkdtemp(prefix="side-by-side-"))
    make_workload(directory, args.size)
    if args.rounds == 0:  # the workload files only (benchmarks/profile_train_phase.py reads them)
        print(directory)
        return 0
    work = dict(WORK, steps=args.steps)
    if args.size == "0.5b":
        work["trl_accumulate"] = 4  # TRL: 4 micro-batches of 16 rows (module docstring)
    host = machine() | ({"tunix_env": tunix_env} if tunix_env else {})
    print("machine: " + json.dumps(host))
    results = side_by_side(
        directory,
        variants,
        args.rounds,
        work,
        args.minirl,
        tunix_python=args.tunix_python,
        tunix_env=tunix_env,
    )
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": host, "rounds": results}, indent=2))
    failed = [
        f"round {res['round']} {v}" for res in results for v in variants if "failed" in res[v]
    ]
    if failed:  # the table and the JSON hold every run that finished; the exit status says this
        print("failed runs: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
