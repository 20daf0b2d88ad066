"""Does training-inference mismatch hurt REINFORCE at this scale? (issue #9, item 5; VeXact §3.2, §4.2)

Three arms, run from ONE shared warm-start base with the same seeds, the same prompts and the same
sampling keys, for the same number of on-policy steps:

  mismatch   rl.loss=token_reinforce, engine.dtype=bfloat16, trainer fp32. The engine samples from
             its bf16 policy mu, the trainer's gradient assumes the samples came from its fp32
             pi: with no correction the estimator is biased by the mismatch (VeXact's vLLM arm).
  exact      rl.loss=token_reinforce, engine.exact=true (fp32 on both sides): mu == pi bit for bit,
             the zero-mismatch reference (VeXact's VeXact arm).
  tis_mis    rl.loss=token_reinforce_tis_mis, engine.dtype=bfloat16: the same mismatch, with the
             remedies of VeXact §4.2 — IS weight min(c, 2) with c = pi_prox / mu, tokens with c
             outside [0.5, 5] and sequences with |mean log c| > 0.01 rejected.
  fp32       (optional, --arms) rl.loss=token_reinforce with the default fast fp32 engine: the
             mismatch every default run has (rounding noise only).

Every arm logs the controller's per-step metrics (reward, mismatch/*, train/* incl. the loss's
zero-centred contributions and rejection fractions) to <out>/<arm>_s<seed>/metrics.jsonl. The
final policy of every arm is evaluated on held-out prompts by the SAME evaluator (the default
fast fp32 engine), so the arms are compared as deployed models, not through their own engines.

    PYTHONPATH=. python experiments/mismatch.py                       # 3 arms x 3 seeds, 40 steps
    PYTHONPATH=. python experiments/mismatch.py --seeds 0 --steps 5   # a quick look
    PYTHONPATH=. python experiments/mismatch.py --preset countdown_hard --arms mismatch fp32 tis_mis

The default task is the `fixture` preset (answer a digit of the prompt number's parity; a
78k-parameter model from random init): every arm, exact mode included, fits the budget there.
On countdown_hard (3.2M parameters, warm-started) an exact-mode training step cost 67-110 s against
1.5-2.5 s for the fast trainer (load ~9 on 2 cores), so the exact arm does not fit a few minutes.

Writes <out>/mismatch.json (every number), <out>/mismatch.png (rewards and diagnostics side by
side), <out>/mismatch_minirl.png (minirl.plots.plot_mismatch of the arms), and prints a table.
Results and how to read them: docs/mismatch.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from minirl.control.controller import Controller
from minirl.control.workers import InProcessWorker
from minirl.data.mixture import Mixture
from minirl.losses import make_objective
from minirl.measure.metrics_log import MetricsWriter, format_table, read_metrics
from minirl.plots import plot_mismatch
from minirl.run.config_args import add_config_arguments, config_from_args
from minirl.run.loop import run_steps
from minirl.run.runner import Run
from minirl.run.warmstart import warm_start
from minirl.store.weights import InMemoryWeightStore
from minirl.training.trainer import Trainer

ARMS = {
    "mismatch": ["rl.loss=token_reinforce", "engine.dtype=bfloat16"],
    "exact": ["rl.loss=token_reinforce", "engine.exact=true"],
    "tis_mis": ["rl.loss=token_reinforce_tis_mis", "engine.dtype=bfloat16"],
    "fp32": ["rl.loss=token_reinforce"],
}
# The budget: 16 prompts x 8 samples per step, a held-out evaluation of 64 prompts x 4 samples.
BUDGET = ["rl.prompts_per_step=16", "rl.group_size=8", "eval.prompts=64", "eval.samples=4"]
TABLE = (  # the summary printed at the end: (title, key of a run's results, format)
    ("run", "name", "{}"),
    ("reward first", "reward_first", "{:.3f}"),
    ("reward last", "reward_last", "{:.3f}"),
    ("held-out p@1", "pass@1", "{:.3f}"),
    ("|dlogp| mean", "dlogp_mean", "{:.2e}"),
    ("|dlogp| max", "dlogp_max", "{:.2e}"),
    ("Fig5 w/o", "fig5_without_recompute", "{:.2e}"),
    ("Fig5 with", "fig5_with_recompute", "{:.2e}"),
    ("rej seq", "rejected_sequence_fraction", "{:.3f}"),
    ("z+", "zero_centred_pos", "{:.4f}"),
    ("z-", "zero_centred_neg", "{:.4f}"),
    ("=exact", "steps_equal_to_exact", "{:.0f}"),
    ("sec", "seconds", "{:.0f}"),
)


def run_arm(arm: str, cfg, base, evaluator: Run, run_dir: Path, steps: int) -> dict:
    """`steps` RL steps of `cfg` from `base` (the loop of minirl.run.runner.Run.train, without its
    warm start: every arm starts from the same weights), then the held-out evaluation."""
    run = Run(cfg, run_dir, progress=False, log=lambda *a: None)
    engine = run.engine(0, base)
    loss = make_objective(cfg.rl.loss, cfg.rl.behaviour_cap, cfg.rl.kl_coef)
    trainer = Trainer(
        cfg.model, base, loss, cfg.trainer_config(), sampling=cfg.engine.sampling.scoring
    )
    store = InMemoryWeightStore(keep=max(4, cfg.rl.reload_every + 2))
    controller = Controller(
        cfg,
        engine=InProcessWorker(engine),
        trainer=InProcessWorker(trainer),
        verifier=InProcessWorker(run.task.verifier),
        store=store,
        mixture=Mixture({run.task.name: run.task}, seed=cfg.rl.seed),
        tokenizer=run.tokenizer,
        max_new_tokens=run.task.max_new_tokens,
        log=lambda *a: None,
    )
    store.put(0, trainer.params(host=True))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    t0 = time.perf_counter()
    with MetricsWriter(run_dir) as writer:

        def on_step(m: dict) -> None:
            writer.write(m, step=controller.counters.steps)
            print(
                f"    {arm:9s} step {controller.counters.steps:3d}  reward {m['reward/mean']:.3f}  "
                f"|dlogp| mean {m['mismatch/mean_abs_dlogp']:.2e}  {m['time/step']:.1f}s",
                flush=True,
            )

        run_steps(controller, steps, on_step)  # minirl train's step loop
    seconds = time.perf_counter() - t0
    after = evaluator.evaluate(evaluator.engine(steps, trainer.params(host=True)))
    return {"seconds": seconds, "after": after, "skipped_steps": controller.counters.skipped_steps}


def summarize(records: list[dict]) -> dict:
    """The numbers docs/mismatch.md reports for one run."""
    col = lambda k: np.array(
        [r.get(k, np.nan) if r.get(k) is not None else np.nan for r in records]
    )
    reward = col("reward/mean")
    k = max(1, len(reward) // 4)
    return {
        "reward_first": float(np.nanmean(reward[:k])),
        "reward_last": float(np.nanmean(reward[-k:])),
        "reward_mean": float(np.nanmean(reward)),
        "dlogp_mean": float(np.nanmean(col("mismatch/mean_abs_dlogp"))),
        "dlogp_p95_over_steps": float(np.nanpercentile(col("mismatch/mean_abs_dlogp"), 95)),
        "dlogp_max": float(np.nanmax(col("mismatch/max_abs_dlogp"))),
        # RLAX Fig. 5's summary: p95 over steps of the first update's mean |log pi - log pi_old|
        "fig5_with_recompute": float(
            np.nanpercentile(col("train/dlogp_recompute/mean_abs_dlogp"), 95)
        ),
        "fig5_without_recompute": float(
            np.nanpercentile(col("train/dlogp_no_recompute/mean_abs_dlogp"), 95)
        ),
        "kl_k3_mean": float(np.nanmean(col("mismatch/kl_k3"))),
        "rejected_token_fraction": float(np.nanmean(col("train/rejected_token_fraction"))),
        "rejected_sequence_fraction": float(np.nanmean(col("train/rejected_sequence_fraction"))),
        "zero_centred_pos": float(np.nanmean(col("train/zero_centred_pos"))),
        "zero_centred_neg": float(np.nanmean(col("train/zero_centred_neg"))),
        "grad_norm_max": float(np.nanmax(col("train/grad_norm"))),
    }


def plot(results: dict, out: Path, path: Path) -> None:
    from matplotlib.figure import Figure

    panels = [
        ("reward/mean", "training reward (mean of the batch)", False),
        ("mismatch/mean_abs_dlogp", "|log π_prox − log μ| per token, mean (0 not drawn)", True),
        ("train/zero_centred_pos", "Σ A·(c−1) over A>0 tokens (VeXact Eq. 5)", False),
        ("train/zero_centred_neg", "Σ A·(c−1) over A<0 tokens", False),
        ("train/rejected_sequence_fraction", "sequences rejected (tis_mis)", False),
        ("train/grad_norm", "gradient norm", False),
    ]
    fig = Figure(figsize=(12, 9), layout="constrained")
    axes = fig.subplots(3, 2).ravel()
    for ax, (key, title, logy) in zip(axes, panels, strict=True):
        for i, arm in enumerate(results["arms"]):
            for j, seed in enumerate(results["seeds"]):
                records = read_metrics(out / f"{arm}_s{seed}")
                xs = np.array([r["step"] for r in records if r.get(key) is not None])
                ys = np.array([r[key] for r in records if r.get(key) is not None])
                if logy:
                    xs, ys = xs[ys > 0], ys[ys > 0]
                ax.plot(
                    xs,
                    ys,
                    color=f"C{i}",
                    ls=("-", "--", ":")[j % 3],
                    lw=1.2,
                    label=f"{arm} seed {seed}",
                )
        if logy:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"REINFORCE under training-inference mismatch ({results['task']}, "
        f"{results['steps']} steps, load {results['load'][0]:.1f} at start)",
        fontsize=10,
    )
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_config_arguments(p, staleness=False, preset_help="task preset (default: fixture)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=40, help="RL steps per arm")
    p.add_argument(
        "--arms", nargs="+", default=["mismatch", "exact", "tis_mis"], choices=list(ARMS)
    )
    p.add_argument("--out", default="experiments/results/mismatch")
    args = p.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {
        "command": " ".join(
            ["python experiments/mismatch.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "load": os.getloadavg(),
        "arms": args.arms,
        "seeds": args.seeds,
        "steps": args.steps,
        "runs": {},
    }
    t_start = time.perf_counter()
    for seed in args.seeds:
        base_cfg = config_from_args(args, "fixture", [*BUDGET, f"rl.seed={seed}"])
        evaluator = Run(base_cfg, out / "unused", progress=False, log=lambda *a: None)
        base, _ = warm_start(base_cfg, evaluator.tokenizer, evaluator.task, progress=False)
        results["task"] = base_cfg.task.name
        results.setdefault("base", {})[str(seed)] = evaluator.evaluate(evaluator.engine(0, base))
        print(f"seed {seed}: base {results['base'][str(seed)]}", flush=True)
        for arm in args.arms:
            cfg = config_from_args(args, "fixture", [*BUDGET, *ARMS[arm], f"rl.seed={seed}"])
            run_dir = out / f"{arm}_s{seed}"
            r = run_arm(arm, cfg, base, evaluator, run_dir, args.steps)
            r.update(summarize(read_metrics(run_dir)), config=ARMS[arm])
            results["runs"][f"{arm}_s{seed}"] = r
            (out / "mismatch.json").write_text(json.dumps(results, indent=1, default=str))
        if "exact" in args.arms:  # paired: same prompts and sampling keys as the exact arm
            exact = [m["reward/mean"] for m in read_metrics(out / f"exact_s{seed}")]
            for arm in args.arms:
                mine = [m["reward/mean"] for m in read_metrics(out / f"{arm}_s{seed}")]
                same = sum(x == y for x, y in zip(mine, exact, strict=True))  # batch reward
                results["runs"][f"{arm}_s{seed}"]["steps_equal_to_exact"] = same
    results["seconds"] = time.perf_counter() - t_start
    results["load_end"] = os.getloadavg()
    (out / "mismatch.json").write_text(json.dumps(results, indent=1, default=str))
    plot(results, out, out / "mismatch.png")
    runs = [out / f"{a}_s{s}" for a in args.arms for s in args.seeds]
    plot_mismatch(
        runs,
        labels=[f"{a} s{s}" for a in args.arms for s in args.seeds],
        out=out / "mismatch_minirl.png",
    )

    rows = [
        {"name": name, "pass@1": r["after"]["pass@1"], **r} for name, r in results["runs"].items()
    ]
    print("\n" + format_table(rows, TABLE))
    base = ", ".join(f"s{s} {b['pass@1']:.3f}" for s, b in results["base"].items())
    print(f"base held-out pass@1: {base}")
    print(
        f"total {results['seconds']:.0f}s, load {results['load'][0]:.1f} -> {results['load_end'][0]:.1f}"
    )
    print(f"{out / 'mismatch.json'}\n{out / 'mismatch.png'}\n{out / 'mismatch_minirl.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
