"""RL with a calculator against RL without it: the same task, model, warm start and RL budget.

The experiment of issue #23. The task is the built-in scratchpad addition (`arithmetic`) with
its answers written the usual way, most significant digit first (`reverse_digits=False`), which
a small model learns poorly on its own (minirl/tasks/arithmetic.py). The two arms differ only in
what an episode may do:

  no tool   one turn: the model writes the scratchpad and `#### sum`; the task's verifier scores
            it (an episode of one turn, minirl/envs/tool_task.py with no tools)
  calc      the model may call `<calc>expression</calc>` (minirl/envs/calculator.py); the
            output comes back as an observation (`\\n= 363\\n`, masked from the loss), and the
            next turn answers `#### sum`; at most `--max-turns` turns

Each arm, for each seed: a supervised warm start of `--sft-steps` steps on demonstrations of
its own kind (no tool: the task's scratchpad; calc: one call with the whole sum, then the
answer), then `--rl-steps` GRPO steps through the real Controller, EpisodeRunner and Trainer
(lockstep), the same prompts per step and group size. Held-out pass@1 (`--eval-prompts` test
prompts x `--eval-samples` samples, sampled at the RL temperature) before and after RL.

The claim holds for a seed when the calculator arm's pass@1 after RL is above the no-tool arm's.

    python experiments/tools.py --seeds 0 1 2                # the measurement (~20 min, 2 cores)
    python experiments/tools.py --fast --out /tmp/tools      # a smoke test (~1 min)

Writes `<out>/tools.json` (every number) and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from minirl.control.controller import Controller
from minirl.control.workers import InProcessWorker
from minirl.data.mixture import Mixture
from minirl.envs import (
    Calculator,
    EpisodeConfig,
    EpisodeRunner,
    EpisodeScores,
    ToolTaskEnv,
    Turns,
    demonstration_episode,
    stop_sequences,
)
from minirl.inference.engine import Engine, EngineConfig, Request
from minirl.losses import get_preset
from minirl.modeling.tokenizer import CharTokenizer
from minirl.run.loop import run_steps
from minirl.run.presets import make_config
from minirl.run.starting_point import initial_params
from minirl.store.weights import InMemoryWeightStore
from minirl.tasks.arithmetic import Arithmetic, ArithmeticConfig
from minirl.training.batching import make_batch
from minirl.training.trainer import Trainer

ARMS = ("no tool", "calc")
PER_TURN = 64  # max_new_tokens of a turn


def setup(arm: str, args):
    """(run config, task, tools, engine config) of one arm."""
    task = Arithmetic(ArithmeticConfig(max_operands=args.max_operands, reverse_digits=False))
    tools = [Calculator()] if arm == "calc" else []
    tok = CharTokenizer()
    cfg = make_config("arithmetic")
    engine = EngineConfig(
        slots=32,
        cache_len=160,
        prefill_buckets=(32, 64),
        prefill_rows=8,
        eos_ids=tok.eos_ids,
        stop_sequences=stop_sequences(tools, tok),
    )
    rl = dataclasses.replace(cfg.rl, prompts_per_step=args.prompts, group_size=args.group)
    return dataclasses.replace(cfg, engine=engine, rl=rl), task, tools, tok


def warm_start(cfg, task, tools, turns: Turns, args, seed: int) -> dict:
    """`--sft-steps` supervised steps on the arm's demonstrations from a seed-`seed` init."""
    trainer_cfg = dataclasses.replace(
        cfg.trainer,
        learning_rate=cfg.sft.learning_rate,
        schedule="cosine",
        warmup_steps=min(20, args.sft_steps // 10),
        total_steps=args.sft_steps,
    )
    trainer = Trainer(cfg.model, initial_params(cfg, seed=seed), None, trainer_cfg)
    for step in range(args.sft_steps):
        start = (seed * args.sft_steps + step) * args.sft_batch
        prompts = [task.prompt(i, "train") for i in range(start, start + args.sft_batch)]
        demos = [demonstration_episode(task, p, turns, tools) for p in prompts]
        trainer.sft_step(make_batch(demos, turns.tokenizer.pad_id))
    return trainer.params(host=True)


def episodes(cfg, task, tools, turns, args, seed: int, params, version: int = 0) -> EpisodeRunner:
    engine = Engine(cfg.model, cfg.engine, seed=seed)
    engine.load_weights(version, params)
    config = EpisodeConfig(max_turns=args.max_turns)
    return EpisodeRunner(engine, lambda: ToolTaskEnv(task, tools), turns, config)


def evaluate(cfg, task, tools, turns, args, seed: int, params) -> dict[str, float]:
    """Held-out pass@1 (mean reward over samples) and how often the calculator was called."""
    runner = episodes(cfg, task, tools, turns, args, seed, params)
    prompts = [task.prompt(i, "test") for i in range(args.eval_prompts)]
    out = runner.generate(
        [Request(p, g, PER_TURN) for p in prompts for g in range(args.eval_samples)]
    )
    calls = [r.text.count("</calc>") for r in out]
    return {"pass@1": float(np.mean([r.score.reward for r in out])), "calls": float(np.mean(calls))}


def rl(cfg, task, tools, turns, args, seed: int, params) -> dict:
    """`--rl-steps` GRPO steps through the Controller; the final params."""
    cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, seed=seed))
    trainer = Trainer(
        cfg.model, params, get_preset("grpo"), cfg.trainer, sampling=cfg.engine.sampling
    )
    ctl = Controller(
        cfg,
        engine=InProcessWorker(episodes(cfg, task, tools, turns, args, seed, params)),
        trainer=InProcessWorker(trainer),
        verifier=InProcessWorker(EpisodeScores()),
        store=InMemoryWeightStore(keep=4),
        mixture=Mixture({task.name: task}, seed=seed),
        tokenizer=turns.tokenizer,
        max_new_tokens=PER_TURN,
        log=lambda *_: None,
    )
    ctl.store.put(0, ctl.params())
    rewards = []
    run_steps(ctl, args.rl_steps, lambda m: rewards.append(m["reward/mean"]))  # minirl train's loop
    return ctl.params(), rewards


def run_arm(arm: str, args, seed: int) -> dict:
    cfg, task, tools, tok = setup(arm, args)
    turns = Turns(tok)
    t0 = time.perf_counter()
    params = warm_start(cfg, task, tools, turns, args, seed)
    before = evaluate(cfg, task, tools, turns, args, seed, params)
    params, rewards = rl(cfg, task, tools, turns, args, seed, params)
    after = evaluate(cfg, task, tools, turns, args, seed, params)
    seconds = time.perf_counter() - t0
    print(f"  seed {seed} {arm:8s} before {before}  after {after}  ({seconds:.0f}s)", flush=True)
    return {"before": before, "after": after, "train_rewards": rewards, "seconds": seconds}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--sft-steps", type=int, default=200)
    p.add_argument("--sft-batch", type=int, default=64)
    p.add_argument("--rl-steps", type=int, default=30)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-operands", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--eval-prompts", type=int, default=64)
    p.add_argument("--eval-samples", type=int, default=4)
    p.add_argument("--fast", action="store_true", help="a smoke test: tiny budgets, one seed")
    p.add_argument("--out", type=Path, default=Path("runs/experiments/tools"))
    args = p.parse_args(argv)
    if args.fast:
        args.seeds, args.sft_steps, args.rl_steps, args.eval_prompts = [0], 20, 2, 8
    results = {"args": {k: str(v) for k, v in vars(args).items()}, "seeds": {}}
    for seed in args.seeds:
        results["seeds"][seed] = {arm: run_arm(arm, args, seed) for arm in ARMS}
    rows = [
        (s, r["calc"]["after"]["pass@1"], r["no tool"]["after"]["pass@1"])
        for s, r in results["seeds"].items()
    ]
    results["claim_holds"] = {s: calc > none for s, calc, none in rows}
    print("\nseed  pass@1 after RL: calc  no tool  claim")
    for s, calc, none in rows:
        print(f"{s:4d}  {calc:22.3f}  {none:7.3f}  {calc > none}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tools.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
