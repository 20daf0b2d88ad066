"""RL against the honest control: does the reward teach what the demonstrations cannot?

The experiment (issue #7). On countdown the only demonstrations that honestly exist are random
well-formed expressions over the given numbers that IGNORE the target (docs/tasks.md): they
teach the format, not how to hit the target. From one shared warm-start base (supervised on those
demonstrations, cached), for each seed we spend the same wall-clock budget T two ways:

  RL    the default `minirl train` loop (minirl.controller.Controller, the config's loss), for T
        seconds of training;
  SFT   more supervised training on the same kind of demonstrations (fresh ones, never seen by
        the warm start), same optimiser and learning rate as the warm start, for T seconds.

Both arms are evaluated on the held-out test split (pass@1 over `eval.samples` samples of
`eval.prompts` prompts, the same prompts and sampling keys for every evaluation) every
`--eval-every` seconds of training. The evaluation itself is not charged to the budget: the clock
stops while it runs. Compilation is charged (each arm pays its own, as a user would).

The claim is met when, for every seed, RL's final held-out pass@1 is at least the BASE model's
pass@8 (RL turned "sometimes right in 8 tries" into "right at the first try"), and above the SFT
control's final pass@1.

How to read the plot (`rl_vs_sft.png`): x = seconds of training (evaluation excluded), y =
held-out pass@1. Solid lines are RL, dashed lines SFT, one colour per seed. The dotted
horizontal line is the base model's pass@1, the dash-dot line its pass@8 (the target). SFT
should stay near the base (it can only learn the format better); RL should climb past pass@8.

    PYTHONPATH=. python experiments/rl_vs_sft.py                       # 3 seeds, default config
    PYTHONPATH=. python experiments/rl_vs_sft.py --seeds 0 --budget 60 --set rl.loss=grpo

Writes `<out>/rl_vs_sft.json` (every number), `<out>/rl_vs_sft.png`, and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from minirl.batching import make_batch
from minirl.config import make_config
from minirl.controller import Controller
from minirl.data.mixture import Mixture
from minirl.losses import get_preset
from minirl.runner import Run
from minirl.trainer import Trainer
from minirl.warmstart import demonstration_rollouts, warm_start
from minirl.weights import InMemoryWeightStore
from minirl.workers import InProcessWorker

# The warm start read demonstrations of train prompts 0 .. sft.steps * batch_size - 1; the SFT
# control reads from here on, so every demonstration it sees is new to the model.
SFT_CONTROL_OFFSET = 10_000_000


class Clock:
    """Training seconds: wall-clock time with the evaluations taken out."""

    def __init__(self):
        self.spent, self._t0 = 0.0, None

    def start(self):
        self._t0 = time.perf_counter()

    def stop(self):
        self.spent += time.perf_counter() - self._t0
        self._t0 = None

    def now(self) -> float:
        return self.spent + (time.perf_counter() - self._t0 if self._t0 is not None else 0.0)


def _loop(step, evaluate, budget: float, eval_every: float) -> list[dict]:
    """Call `step()` until `budget` training seconds are spent, evaluating at 0 and every
    `eval_every` seconds (and once at the end). Returns the curve [{t, steps, **eval}]."""
    clock, steps = Clock(), 0
    curve = [{"t": 0.0, "steps": 0, **evaluate()}]
    next_eval = eval_every
    clock.start()
    while clock.now() < budget:
        step()
        steps += 1
        if clock.now() >= next_eval and clock.now() < budget:
            clock.stop()
            curve.append({"t": clock.spent, "steps": steps, **evaluate()})
            print(f"    t={clock.spent:6.1f}s step {steps:4d}  pass@1 {curve[-1]['pass@1']:.3f}", flush=True)
            next_eval += eval_every
            clock.start()
    clock.stop()
    curve.append({"t": clock.spent, "steps": steps, **evaluate()})
    print(f"    t={clock.spent:6.1f}s step {steps:4d}  pass@1 {curve[-1]['pass@1']:.3f}  (final)", flush=True)
    return curve


def run_rl(run: Run, base, budget: float, eval_every: float) -> list[dict]:
    """The `minirl train` loop (as minirl.runner.Run.train builds it) for `budget` seconds."""
    cfg = run.cfg
    engine = run.engine(0, base)
    trainer = Trainer(cfg.model, base, get_preset(cfg.rl.loss), cfg.trainer_config())
    store = InMemoryWeightStore(keep=max(4, cfg.rl.reload_every + 2))
    controller = Controller(cfg, engine=InProcessWorker(engine), trainer=InProcessWorker(trainer),
                            verifier=InProcessWorker(run.task.verifier), store=store,
                            mixture=Mixture({run.task.name: run.task}, seed=cfg.rl.seed),
                            tokenizer=run.tokenizer, max_new_tokens=run.task.max_new_tokens)
    store.put(0, trainer.params(host=True))
    rewards = []

    def step():
        rewards.append(controller.step()["reward/mean"])

    def evaluate():
        engine.load_weights(controller.counters.version, trainer.params())
        return run.evaluate(engine)

    curve = _loop(step, evaluate, budget, eval_every)
    curve[-1]["train_reward"] = rewards
    return curve


def run_sft(run: Run, base, budget: float, eval_every: float) -> list[dict]:
    """Supervised training on fresh format-only demonstrations, the warm start's optimiser."""
    cfg = run.cfg
    trainer_cfg = dataclasses.replace(cfg.trainer_config(), learning_rate=cfg.sft.learning_rate)
    trainer = Trainer(cfg.model, base, None, trainer_cfg)
    engine = run.engine(0, base)
    bs, start = cfg.sft.batch_size, SFT_CONTROL_OFFSET * (cfg.rl.seed + 1)
    losses = []

    def step():
        demos = demonstration_rollouts(run.task, run.tokenizer, start + len(losses) * bs, bs,
                                       seed=cfg.rl.seed + 1)
        losses.append(trainer.sft_step(make_batch(demos, run.tokenizer.pad_id))["loss"])

    def evaluate():
        engine.load_weights(len(losses), trainer.params())
        return run.evaluate(engine)

    curve = _loop(step, evaluate, budget, eval_every)
    curve[-1]["train_loss"] = losses
    return curve


def plot(results: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.5))
    ax = fig.add_subplot()
    k = results["eval_samples"]
    for i, seed in enumerate(results["seeds"]):
        r, color = results["per_seed"][str(seed)], f"C{i}"
        for arm, style in (("rl", "-"), ("sft", "--")):
            if arm in r:
                ax.plot([p["t"] for p in r[arm]], [p["pass@1"] for p in r[arm]], style, color=color,
                        marker="o", ms=3, label=f"{arm.upper()} seed {seed}")
    base = results["per_seed"][str(results["seeds"][0])]["base"]
    ax.axhline(base["pass@1"], color="gray", ls=":", label=f"base pass@1 ({base['pass@1']:.3f})")
    ax.axhline(base[f"pass@{k}"], color="black", ls="-.", label=f"base pass@{k} ({base[f'pass@{k}']:.3f})")
    ax.set_xlabel("training seconds (evaluation excluded)")
    ax.set_ylabel("held-out pass@1")
    ax.set_title(f"RL vs SFT on format-only demonstrations ({results['task']})", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).print_png(str(path))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="countdown")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--budget", type=float, default=None, help="seconds per arm (default: rl.time_budget)")
    p.add_argument("--eval-every", type=float, default=None, help="seconds between evaluations (default: budget/6)")
    p.add_argument("--arms", nargs="+", default=["rl", "sft"], choices=["rl", "sft"])
    p.add_argument("--out", default="experiments/results")
    args = p.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"command": " ".join(["experiments/rl_vs_sft.py", *(argv or [])]), "seeds": args.seeds,
               "machine": platform.platform(), "cpus": os.cpu_count(), "per_seed": {}}
    for seed in args.seeds:
        cfg = make_config(args.preset, [*args.overrides, f"rl.seed={seed}"])
        budget = args.budget or cfg.rl.time_budget
        if not budget:
            raise SystemExit("no budget: pass --budget or set rl.time_budget")
        eval_every = args.eval_every or budget / 6
        run = Run(cfg, out / "unused", progress=False)
        base, _ = warm_start(cfg, run.tokenizer, run.task, progress=False)
        results.update(task=f"{cfg.task.name} {cfg.task.args}", eval_samples=cfg.eval.samples,
                       eval_prompts=cfg.eval.prompts, budget=budget, config=dataclasses.asdict(cfg))
        r = {"load_before": os.getloadavg()}
        r["base"] = run.evaluate(run.engine(0, base))
        print(f"seed {seed}: base {r['base']}", flush=True)
        for arm in args.arms:
            print(f"  {arm}", flush=True)
            r[arm] = (run_rl if arm == "rl" else run_sft)(run, base, budget, eval_every)
        r["load_after"] = os.getloadavg()
        results["per_seed"][str(seed)] = r
        (out / "rl_vs_sft.json").write_text(json.dumps(results, indent=1, default=str))
        plot(results, out / "rl_vs_sft.png")

    k = results["eval_samples"]
    print(f"\n{'seed':>4}  {'base p@1':>8}  {f'base p@{k}':>8}  {'RL p@1':>7}  {'SFT p@1':>7}  "
          f"{'RL steps':>8}  {'met':>4}  load (1-min avg before/after)")
    for seed in args.seeds:
        r = results["per_seed"][str(seed)]
        rl = r["rl"][-1] if "rl" in r else {"pass@1": np.nan, "steps": 0}
        sft = r["sft"][-1] if "sft" in r else {"pass@1": np.nan}
        met = rl["pass@1"] >= r["base"][f"pass@{k}"] and rl["pass@1"] > sft["pass@1"]
        print(f"{seed:>4}  {r['base']['pass@1']:8.3f}  {r['base'][f'pass@{k}']:8.3f}  {rl['pass@1']:7.3f}  "
              f"{sft['pass@1']:7.3f}  {rl['steps']:8d}  {'yes' if met else 'no':>4}  "
              f"{r['load_before'][0]:.1f}/{r['load_after'][0]:.1f}")
    print(f"\n{out / 'rl_vs_sft.json'}\n{out / 'rl_vs_sft.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
