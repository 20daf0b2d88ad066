"""Does `minirl train --agent` learn? A tool-using agent written with the openai SDK, GRPO, 3 seeds.

The experiment of issue #47: `experiments/calc_agent.py` (the real `openai` client, a `calc` tool
it runs itself) on the built-in scratchpad addition with answers written most significant digit
first (`reverse_digits=False`, up to 4 operands of one digit), the `arithmetic` preset's model.
Each seed is one `minirl train --preset arithmetic --agent experiments/calc_agent.py:solve` run
(minirl/run/runner.py `Run`, the command's own path): a short warm start on demonstrations the
agent lays out itself (one calc call with the whole sum, the tool's output, `#### sum`), held-out
pass@1 before RL, `--rl-steps` GRPO steps on agent episodes through the OpenAI-compatible
endpoint, held-out pass@1 after. The claim holds for a seed when pass@1 after RL is above before.

    python experiments/agent.py --seeds 0 1 2           # the measurement
    python experiments/agent.py --fast --out /tmp/agent  # a smoke test

Writes `<out>/agent.json` (every number) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from minirl.run.presets import make_config
from minirl.run.runner import Run

AGENT = Path(__file__).resolve().parent / "calc_agent.py"


def run_seed(seed: int, args) -> dict:
    sets = [
        f"task.agent={AGENT}:solve",
        f'task.args={{"max_digits": 1, "max_operands": {args.max_operands}, "reverse_digits": false}}',
        f"rl.seed={seed}",
        f"sft.seed={seed}",
        f"sft.steps={args.sft_steps}",
        f"rl.steps={args.rl_steps}",
        f"rl.prompts_per_step={args.prompts}",
        f"rl.group_size={args.group}",
        f"rl.checkpoint_every={args.rl_steps}",
        f"eval.prompts={args.eval_prompts}",
        f"eval.samples={args.eval_samples}",
        f"trainer.learning_rate={args.lr}",
        "task.max_turns=3",
    ]
    cfg = make_config("arithmetic", sets)
    t0 = time.perf_counter()
    summary = Run(cfg, args.out / f"seed{seed}", log=lambda *a: None, progress=False).train(
        resume=False
    )
    seconds = time.perf_counter() - t0
    before, after = summary["before"], summary["after"]
    print(
        f"  seed {seed}: pass@1 {before['pass@1']:.3f} -> {after['pass@1']:.3f}, turns {before['turns']:.2f} -> {after['turns']:.2f} ({seconds:.0f}s)",
        flush=True,
    )
    return {"before": before, "after": after, "seconds": seconds}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--sft-steps", type=int, default=60)
    p.add_argument("--lr", type=float, default=3e-4, help="the RL learning rate")
    p.add_argument("--rl-steps", type=int, default=40)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-operands", type=int, default=4)
    p.add_argument("--eval-prompts", type=int, default=128)
    p.add_argument("--eval-samples", type=int, default=4)
    p.add_argument("--fast", action="store_true", help="a smoke test: tiny budgets, one seed")
    p.add_argument("--out", type=Path, default=Path("runs/experiments/agent"))
    args = p.parse_args(argv)
    if args.fast:
        args.seeds, args.sft_steps, args.rl_steps, args.eval_prompts = [0], 5, 2, 8
        args.prompts, args.group = 4, 4
    results = {"args": {k: str(v) for k, v in vars(args).items()}, "seeds": {}}
    for seed in args.seeds:
        results["seeds"][seed] = run_seed(seed, args)
    rows = [(s, r["before"]["pass@1"], r["after"]["pass@1"]) for s, r in results["seeds"].items()]
    results["claim_holds"] = {s: after > before for s, before, after in rows}
    print("\nseed  held-out pass@1 before RL  after RL  up")
    for s, before, after in rows:
        print(f"{s:4d}  {before:24.3f}  {after:8.3f}  {after > before}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "agent.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
