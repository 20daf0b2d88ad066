# %% [markdown]
"""Lesson 15 — mixture of experts: routing the engine and the trainer agree on, replay, exact mode.

    python tutorials/15_mixture_of_experts.py            # full mode (minutes, 2 cores)
    python tutorials/15_mixture_of_experts.py --fast     # fast mode (CI)

Writes `moe.png` and `results.json` into `--out` (default `runs/tutorials/15_mixture_of_experts`);
the runs are under `--out/<arm>_seed<N>`. Uses `minirl/modeling/moe.py` (the MoE layer, its
routing record), the trainer's `trainer.routing=free|replay` (minirl/training/forward.py), the
per-step `routing/*` metrics (minirl/training/routing.py) and `minirl train`. Read `docs/moe.md`
next. Mirrors, in miniature: RLAX §5.1 (the experts chosen by the rollout side and the training
side differ: "routing alignment"), R3 (arXiv 2510.11370: replay the inference-time routing in the
trainer) and VeXact's zero-mismatch engine, whose collapse experiment runs on Qwen3-30B-A3B.


THE IDEA
--------
A mixture-of-experts (MoE) layer replaces one MLP by E smaller ones, the experts, and a router:
for each token it takes the softmax of x @ router over the E experts and sends the token to the
k most probable ones, adding their outputs weighted by those probabilities (the gates). Only k of
E experts run per token, so a model can store many parameters and spend few per token.

The top-k is a DISCRETE choice made from continuous numbers. Lesson 08 showed that the engine
and the trainer compute the same logits with rounding differences: ~1e-7 in fp32, ~1e-2 with a
bf16 engine. In a dense model that moves log p by about as much. In an MoE model, when two
experts' router probabilities are closer than the rounding, the engine and the trainer can pick
DIFFERENT experts for the same token in the same weights, and the token's output then comes from a
different sub-network: |log π − log μ| jumps from rounding size to whatever two experts disagree
by. RLAX (§5.1) singles out MoE models when it discusses mismatch: the set of activated experts
can differ significantly between the old and the new policy, and it plans routing alignment.

Two remedies, both in minirl:

  replay  (R3) the engine records, per token and MoE layer, the k experts it ran (a uint8 array
          on the rollout); with `trainer.routing=replay` the trainer's recompute and training
          forward send every token to exactly those experts. The gates are still recomputed from
          the trainer's own router, at those experts, so the router keeps its gradient. What
          replay removes is the routing part of the mismatch; the rest of the rounding (bf16
          activations) stays.
  exact   `engine.exact=true` (VeXact): engine and trainer run the same fixed-order reductions,
          so the router probabilities, and with them the chosen experts, are the same; ties
          broken by one rule (the lower expert index wins). Nothing is left to disagree:
          |Δ log p| is 0 at every step (docs/moe.md, "Exact mode across experts").

The per-step metrics show it (docs/moe.md): `train/routing/disagreement` is the share of tokens
whose top-k SET differs between the engine's record and the trainer's own routers in at least one
MoE layer; `mismatch/mean_abs_dlogp` is lesson 08's |log π − log μ|.

WHAT THE SCRIPT DOES
--------------------
The model: the fixture preset's (dim 64, 2 layers) made an MoE from nothing: every MLP replaced by
8 experts, 2 per token, each 64 wide (`--set model.expert_dim=64 --set model.num_experts=8`). The
task: the fixture's 2-token parity task (lessons 05 and 08 use it too). No warm start.

1. The anatomy of one batch: the untrained model, a bf16 engine, one batch of rollouts; the fp32
   trainer scores the same tokens with its routers free and with the engine's routes replayed. For
   each completion token: did the routing flip (top-k sets differ in some layer), and |Δ log p|
   with free routing and with replay. Checks that replay runs the engine's experts on 100% of the
   positions.
2. RL: on-policy REINFORCE (`token_reinforce`, one update per batch: any Δ is mismatch, not
   staleness) three ways, from the same initial weights, prompts and sampling keys:
     free    engine.dtype=bfloat16, trainer in fp32, routers free (the baseline)
     replay  the same, with trainer.routing=replay (R3)
     exact   engine.exact=true (fp32 engine, fixed-order reductions on both sides)
   3 seeds in full mode (1 in fast). Prints routing disagreement and |Δ log p| per step.
3. Held-out pass@1 of every final policy by ONE fp32 evaluator, and the summary.
4. The claims that must hold, checked; and what does not show at this scale, said plainly.
5. The figure: disagreement and |Δ log p| per step (mean over seeds), reward, and step 1's anatomy.

Expected output (full mode, measured)
-------------------------------------
Measured on 2026-11-26 with `python tutorials/15_mixture_of_experts.py --out OUT` at c203af8 (the
exact-mode fix for MoE merged; the claim printed there as `exact_run_mismatch_below_fp32_rounding`
is now `exact_run_bitwise_every_step`, the same check made strict) on a shared virtual machine
with 2 cores (nproc = 2), under load from other jobs (load average 5.8 at the start, 7.1 at the
end), JAX's compilation cache partly warm. It took 833 s of wall time and 325 s of CPU time (user
+ sys); most of it is the exact arm (712 s: exact decode and exact training compile for every
shape, and each exact step is slow). The figure is figures/15_mixture_of_experts.png.

    mode: full   cores: 2   load average: 5.8

    Step 1. the anatomy of one batch (64 prompts x 8, untrained MoE, bf16 engine vs fp32 trainer; 9 s)
      positions whose top-k set flipped in some layer: 0.79% of 3033; completion tokens flipped: 16 of 1017
      trainer runs the engine's experts: free 97.92%, replay 100.00% of the positions
      mean |Δ log p|                agreeing tokens  flipped tokens        all        max
      trainer routing = free               8.06e-03        2.78e-01   1.23e-02   1.23e+00
      trainer routing = replay             8.06e-03        7.22e-03   8.04e-03   3.78e-02

    Step 2. 3 arms x 3 seed(s) x 30 steps: minirl train --preset fixture --set model.expert_dim=64 --set model.num_experts=8 --set model.experts_per_token=2 --set rl.loss=token_reinforce --set rl.group_size=8 --set eval.prompts=64 --set eval.samples=4 --set rl.prompts_per_step=16 --set <the arm's overrides>
      free    --set engine.dtype=bfloat16 --set trainer.routing=free   (59 s)
      replay  --set engine.dtype=bfloat16 --set trainer.routing=replay   (49 s)
      exact   --set engine.exact=true --set trainer.routing=free   (712 s)

      step   free disagree replay disagree  exact disagree     free |Δ|   replay |Δ|    exact |Δ|
         1          0.0044          0.0044          0.0000     1.28e-02     7.49e-03     0.00e+00
         2          0.0369          0.0294          0.0000     1.81e-02     8.40e-03     0.00e+00
         3          0.0114          0.0365          0.0000     1.02e-02     6.64e-03     0.00e+00
         4          0.0254          0.0149          0.0000     7.03e-03     5.57e-03     0.00e+00
         5          0.0111          0.0204          0.0000     6.90e-03     4.85e-03     0.00e+00
         6          0.0641          0.0041          0.0000     4.61e-03     4.07e-03     0.00e+00
         7          0.0035          0.0217          0.0000     3.41e-03     3.86e-03     0.00e+00
         8          0.0035          0.0100          0.0000     3.83e-03     3.63e-03     0.00e+00
         (steps 9-26 left out here; every step is in OUT/<arm>_seed<N>/metrics.jsonl)
        27          0.0035          0.0284          0.0000     1.66e-03     2.91e-03     0.00e+00
        28          0.0000          0.0358          0.0000     1.42e-03     6.35e-03     0.00e+00
        29          0.0105          0.0035          0.0000     1.08e-03     1.41e-03     0.00e+00
        30          0.0070          0.0175          0.0000     7.49e-04     2.69e-03     0.00e+00

    Step 3. summary (means over 3 seed(s); held-out pass@1 by one fp32 evaluator; before RL: 0.086)
      arm      disagree mean disagree max  mean |Δ|  reward top expert  held-out p@1 per seed
      free            0.0104       0.1868   3.6e-03   0.482      0.440  0.613 0.652 0.648  (mean 0.638)
      replay          0.0149       0.1875   3.4e-03   0.478      0.467  0.527 0.652 0.648  (mean 0.609)
      exact           0.0000       0.0000   0.0e+00   0.482      0.456  0.598 0.648 0.648  (mean 0.632)

    Step 4. the claims, checked
      bf16_engine_flips_some_routes                True
      replay_runs_the_engine_experts_everywhere    True
      replay_shrinks_dlogp_on_flipped_tokens       True
      exact_run_zero_disagreement_every_step       True
      exact_run_bitwise_every_step                 True
      bf16_runs_mismatch_above_1e-4                True
      collapse under routing mismatch? held-out pass@1 free 0.638 vs replay 0.609 vs exact 0.632 (free - exact +0.007)

    wrote OUT/moe.png and OUT/results.json
    wall 833 s, CPU 325 s, load average 5.8 -> 7.1
"""

# %%
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import time
from pathlib import Path

import numpy as np
from flax import nnx
from matplotlib.figure import Figure

from minirl.data.mixture import Mixture
from minirl.inference.engine import Engine, Request
from minirl.measure.metrics_log import read_metrics
from minirl.modeling.model import init_model
from minirl.modeling.tokenizer import CharTokenizer
from minirl.run.presets import make_config
from minirl.run.runner import Run
from minirl.store.checkpoints import CheckpointManager
from minirl.tasks import get_task
from minirl.training.batching import make_batch
from minirl.training.forward import ForwardSpec, routing_fn
from minirl.training.routing import differs
from minirl.types import Score

# %% [markdown]
# The settings.


# %%
MOE = ["model.expert_dim=64", "model.num_experts=8", "model.experts_per_token=2"]
ARMS = {
    "free": ["engine.dtype=bfloat16", "trainer.routing=free"],
    "replay": ["engine.dtype=bfloat16", "trainer.routing=replay"],
    "exact": ["engine.exact=true", "trainer.routing=free"],
}
COMMON = ["rl.loss=token_reinforce", "rl.group_size=8", "eval.prompts=64", "eval.samples=4"]
FULL = dict(seeds=3, steps=30, prompts_per_step=16, anatomy_prompts=64)
FAST = dict(seeds=1, steps=3, prompts_per_step=8, anatomy_prompts=32)
COLORS = {"free": "tab:red", "replay": "tab:orange", "exact": "tab:blue"}


# %%
def config(sets: list[str] = ()):
    """The fixture preset with the tiny MoE model, plus `sets`."""
    return make_config("fixture", [*MOE, *COMMON, *sets])


# %% [markdown]
# Step 1: the anatomy of one batch.


# %%
def anatomy(prompts: int, seed: int = 0) -> dict:
    """A bf16 engine samples `prompts` x 8 rollouts from the untrained MoE; the fp32 trainer
    scores the same tokens free and replayed. Per completion token: flipped routing, |Δ log p|."""
    cfg = config()
    params = nnx.to_pure_dict(nnx.split(init_model(cfg.model, seed=seed))[1])
    tokenizer, task = CharTokenizer(), get_task(cfg.task.name, **cfg.task.args)
    engine_cfg = dataclasses.replace(cfg.engine, dtype="bfloat16", eos_ids=tokenizer.eos_ids)
    engine = Engine(cfg.model, engine_cfg, seed=seed)
    engine.load_weights(0, params)
    chosen = Mixture({task.name: task}, seed=seed).next_prompts(prompts)
    rollouts = engine.generate(
        [Request(p, i, task.max_new_tokens) for p in chosen for i in range(8)]
    )
    for r in rollouts:
        r.score = Score(0.0, "not scored: only the tokens matter here")
    batch = make_batch(rollouts, tokenizer.pad_id)
    sampling = cfg.engine.sampling.scoring
    out = {}
    for routing in ("free", "replay"):
        fn = routing_fn(ForwardSpec(cfg.model, sampling, "none", routing))
        logp, ran, choice = (
            np.asarray(x) for x in fn(params, batch.tokens, batch.targets, batch.routes)
        )
        out[routing] = dict(logp=logp, ran=ran, choice=choice)
    mask, routes = batch.mask > 0, batch.routes.astype(np.int32)
    real = np.zeros_like(mask)  # every position a row reads: prompt and completion
    for i, r in enumerate(sorted(rollouts, key=lambda r: (r.prompt.uid, r.sample_index))):
        real[i, : len(r.prompt.tokens) + len(r.tokens) - 1] = True
    flipped = differs(routes, out["free"]["choice"]).any(-1)  # [B, T]
    dl = {k: np.abs(v["logp"] - batch.behaviour_logprobs)[mask] for k, v in out.items()}
    f = flipped[mask]
    mean = lambda x: float(np.mean(x)) if x.size else float("nan")  # noqa: E731
    return {
        "tokens": int(mask.sum()),
        "positions": int(real.sum()),
        "flipped_positions": float(flipped[real].mean()),
        "flipped_tokens": int(f.sum()),
        "replay_runs_engine_experts": float(
            np.mean(np.all(out["replay"]["ran"] == routes, axis=(-1, -2))[real])
        ),
        "free_runs_engine_experts": float(
            np.mean(np.all(out["free"]["ran"] == routes, axis=(-1, -2))[real])
        ),
        "dlogp": {
            "free_agreeing": mean(dl["free"][~f]),
            "free_flipped": mean(dl["free"][f]),
            "replay_agreeing": mean(dl["replay"][~f]),
            "replay_flipped": mean(dl["replay"][f]),
            "free_all": mean(dl["free"]),
            "replay_all": mean(dl["replay"]),
            "free_max": float(dl["free"].max()),
            "replay_max": float(dl["replay"].max()),
        },
    }


# %% [markdown]
# Steps 2-3: the runs and the summary.


# %%
def train_arm(arm: str, seed: int, s: dict, out: Path) -> list[dict]:
    """`minirl train --preset fixture --set <MoE> --set <arm>` for one seed; its metrics.jsonl."""
    sets = [*ARMS[arm], f"rl.steps={s['steps']}", f"rl.prompts_per_step={s['prompts_per_step']}"]
    run_dir = out / f"{arm}_seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = config([*sets, f"rl.seed={seed}"])
    Run(cfg, run_dir, log=lambda *a: None, progress=False).train()
    return read_metrics(run_dir)


# %%
def column(records: list[dict], key: str) -> np.ndarray:
    return np.array([np.nan if r.get(key) is None else r[key] for r in records], np.float64)


# %%
DISAGREE, DLOGP = "train/routing/disagreement", "mismatch/mean_abs_dlogp"


# %%
def summarise(runs: list[list[dict]], heldout: list[float]) -> dict:
    """One arm over its seeds: per-step means and the totals."""
    stack = lambda key: np.stack([column(r, key) for r in runs])  # noqa: E731  [seeds, steps]
    dis, dl, rw = stack(DISAGREE), stack(DLOGP), stack("reward/mean")
    return {
        "disagreement_per_step": np.mean(dis, 0).tolist(),
        "dlogp_per_step": np.mean(dl, 0).tolist(),
        "reward_per_step": np.mean(rw, 0).tolist(),
        "disagreement_mean": float(np.mean(dis)),
        "disagreement_max": float(np.max(dis)),
        "dlogp_mean": float(np.mean(dl)),
        "dlogp_max_per_step": np.max(stack("mismatch/max_abs_dlogp"), 0).tolist(),
        "reward_mean": float(np.mean(rw)),
        "expert_load_max": float(np.mean(stack("train/routing/expert_load_max")[:, -1])),
        "heldout_pass@1": heldout,
        "heldout_mean": float(np.mean(heldout)),
    }


# %%
def plot(summary: dict, anat: dict, seeds: int, path: Path) -> None:
    fig = Figure(figsize=(13, 8.5), layout="constrained")
    (a, b), (c, d) = fig.subplots(2, 2)
    for arm, r in summary.items():
        steps = np.arange(1, len(r["reward_per_step"]) + 1)
        a.plot(steps, r["disagreement_per_step"], ".-", color=COLORS[arm], label=arm)
        dl = np.array(r["dlogp_per_step"])
        if np.all(dl == 0):
            b.plot([], [], color=COLORS[arm], label=f"{arm}: 0 at every step (not drawable on log)")
        else:
            b.semilogy(steps, dl, ".-", color=COLORS[arm], label=arm)
        c.plot(
            steps,
            r["reward_per_step"],
            ".-",
            color=COLORS[arm],
            label=f"{arm} (held-out pass@1 {r['heldout_mean']:.3f})",
        )
    a.set_title(
        "routing disagreement: tokens whose top-k set differs (engine vs trainer)", fontsize=10
    )
    b.set_title("mean |log π − log μ| per step", fontsize=10)
    c.set_title("batch reward (the arms share prompts and sampling keys)", fontsize=10)
    for ax in (a, b, c):
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    dl = anat["dlogp"]
    names = ["agreeing tokens", f"flipped tokens ({anat['flipped_tokens']})"]
    x = np.arange(2)
    floor = 1e-9
    d.bar(
        x - 0.2,
        [max(dl["free_agreeing"], floor), max(dl["free_flipped"], floor)],
        0.4,
        color=COLORS["free"],
        label="trainer's routers free",
    )
    d.bar(
        x + 0.2,
        [max(dl["replay_agreeing"], floor), max(dl["replay_flipped"], floor)],
        0.4,
        color=COLORS["replay"],
        label="engine's routes replayed",
    )
    d.set_yscale("log")
    d.set_xticks(x, names)
    d.set_title("step 1: mean |Δ log p| of one batch (bf16 engine, fp32 trainer)", fontsize=10)
    d.legend(fontsize=8)
    fig.suptitle(
        f"Mixture of experts in miniature (fixture task, 8 experts, k = 2, mean of {seeds} seed(s))"
    )
    fig.savefig(path, dpi=100)


# %%
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="one seed, short runs (CI)")
    parser.add_argument("--out", default="runs/tutorials/15_mixture_of_experts")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    s = FAST if args.fast else FULL
    t0, load0 = time.perf_counter(), os.getloadavg()
    print(
        f"mode: {'fast' if args.fast else 'full'}   cores: {os.cpu_count()}   "
        f"load average: {load0[0]:.1f}"
    )

    # Step 1: one batch, token by token.
    t = time.perf_counter()
    anat = anatomy(s["anatomy_prompts"])
    dl = anat["dlogp"]
    print(
        f"\nStep 1. the anatomy of one batch ({s['anatomy_prompts']} prompts x 8, untrained MoE, "
        f"bf16 engine vs fp32 trainer; {time.perf_counter() - t:.0f} s)"
    )
    print(
        f"  positions whose top-k set flipped in some layer: {anat['flipped_positions']:.2%} of "
        f"{anat['positions']}; completion tokens flipped: {anat['flipped_tokens']} of {anat['tokens']}"
    )
    print(
        f"  trainer runs the engine's experts: free {anat['free_runs_engine_experts']:.2%}, "
        f"replay {anat['replay_runs_engine_experts']:.2%} of the positions"
    )
    print(
        f"  {'mean |Δ log p|':28s}{'agreeing tokens':>17s}{'flipped tokens':>16s}{'all':>11s}{'max':>11s}"
    )
    for k in ("free", "replay"):
        print(
            f"  {'trainer routing = ' + k:28s}{dl[k + '_agreeing']:17.2e}{dl[k + '_flipped']:16.2e}"
            f"{dl[k + '_all']:11.2e}{dl[k + '_max']:11.2e}"
        )

    # Step 2: the runs.
    print(
        f"\nStep 2. {len(ARMS)} arms x {s['seeds']} seed(s) x {s['steps']} steps: minirl train "
        f"--preset fixture --set {' --set '.join(MOE + COMMON)} --set rl.prompts_per_step="
        f"{s['prompts_per_step']} --set <the arm's overrides>"
    )
    runs, seconds = {a: [] for a in ARMS}, {a: 0.0 for a in ARMS}
    for seed in range(s["seeds"]):
        for arm in ARMS:
            t = time.perf_counter()
            runs[arm].append(train_arm(arm, seed, s, out))
            seconds[arm] += time.perf_counter() - t
    for arm in ARMS:
        print(f"  {arm:7s} --set {' --set '.join(ARMS[arm])}   ({seconds[arm]:.0f} s)")

    # Step 3: one evaluator for every final policy, and the summary.
    base = Run(
        config([f"rl.prompts_per_step={s['prompts_per_step']}"]),
        out / "eval",
        log=lambda *a: None,
        progress=False,
    )
    summary = {}
    for arm in ARMS:
        heldout = []
        for seed in range(s["seeds"]):
            ckpt = CheckpointManager(out / f"{arm}_seed{seed}").restore()
            heldout.append(base.evaluate(base.engine(ckpt.step, ckpt.params))["pass@1"])
        summary[arm] = summarise(runs[arm], heldout)
    print(
        f"\n  {'step':>4s}"
        + "".join(f"{a + ' disagree':>16s}" for a in ARMS)
        + "".join(f"{a + ' |Δ|':>13s}" for a in ARMS)
    )
    for i in range(s["steps"]):
        dis = "".join(f"{summary[a]['disagreement_per_step'][i]:16.4f}" for a in ARMS)
        dlg = "".join(f"{summary[a]['dlogp_per_step'][i]:13.2e}" for a in ARMS)
        print(f"  {i + 1:4d}{dis}{dlg}")
    before = json.loads((out / "exact_seed0" / "summary.json").read_text())["before"]["pass@1"]
    print(
        f"\nStep 3. summary (means over {s['seeds']} seed(s); held-out pass@1 by one fp32 "
        f"evaluator; before RL: {before:.3f})"
    )
    print(
        f"  {'arm':8s}{'disagree mean':>14s}{'disagree max':>13s}{'mean |Δ|':>10s}"
        f"{'reward':>8s}{'top expert':>11s}  held-out p@1 per seed"
    )
    for arm, r in summary.items():
        per_seed = " ".join(f"{x:.3f}" for x in r["heldout_pass@1"])
        print(
            f"  {arm:8s}{r['disagreement_mean']:14.4f}{r['disagreement_max']:13.4f}"
            f"{r['dlogp_mean']:10.1e}{r['reward_mean']:8.3f}{r['expert_load_max']:11.3f}  "
            f"{per_seed}  (mean {r['heldout_mean']:.3f})"
        )

    # Step 4: the claims.
    claims = {
        "bf16_engine_flips_some_routes": anat["flipped_tokens"] > 0,
        "replay_runs_the_engine_experts_everywhere": anat["replay_runs_engine_experts"] == 1.0,
        "replay_shrinks_dlogp_on_flipped_tokens": dl["replay_flipped"] < dl["free_flipped"],
        "exact_run_zero_disagreement_every_step": summary["exact"]["disagreement_max"] == 0.0,
        "exact_run_bitwise_every_step": max(summary["exact"]["dlogp_max_per_step"]) == 0.0,
        "bf16_runs_mismatch_above_1e-4": min(summary[a]["dlogp_mean"] for a in ("free", "replay"))
        > 1e-4,
    }
    print("\nStep 4. the claims, checked")
    for name, ok in claims.items():
        print(f"  {name:44s} {ok}")
    exact_max = max(summary["exact"]["dlogp_max_per_step"])
    gap = summary["free"]["heldout_mean"] - summary["exact"]["heldout_mean"]
    print(
        f"  collapse under routing mismatch? held-out pass@1 free {summary['free']['heldout_mean']:.3f}"
        f" vs replay {summary['replay']['heldout_mean']:.3f} vs exact "
        f"{summary['exact']['heldout_mean']:.3f} (free - exact {gap:+.3f})"
    )
    if not all(claims.values()):
        raise SystemExit(f"a claim of the lesson failed: {claims}")

    # Step 5: the figure.
    plot(summary, anat, s["seeds"], out / "moe.png")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    results = {
        "mode": "fast" if args.fast else "full",
        "settings": s,
        "model": MOE,
        "arms": ARMS,
        "anatomy": anat,
        "runs": summary,
        "seconds_per_arm": seconds,
        "claims": claims,
        "exact_bitwise": exact_max == 0.0,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "load_average": [load0, os.getloadavg()],
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out / 'moe.png'} and {out / 'results.json'}")
    print(
        f"wall {results['wall_s']:.0f} s, CPU {results['cpu_s']:.0f} s, load average "
        f"{load0[0]:.1f} -> {os.getloadavg()[0]:.1f}"
    )


# %%
if __name__ == "__main__":
    main()
