"""The papers' economics on the simulator (issue #17, item 4): settings as close to theirs as
their text states, everything else said here. Nothing is trained; minirl/sim/ runs the real
controller's decisions on virtual time.

    PYTHONPATH=. python experiments/sim_papers.py [--fast]   # ~10 min (fast: ~1 min)

areal      AReaL §6.2 / Fig. 4: sync vs async with the same number of H100-class GPUs
           (their H800s: same dense bf16 peak and HBM bandwidth class), a 7B model, 128
           prompts x 16 samples, 32k context (prompt <= 1k), long-tailed lengths. Sync: every
           GPU generates, then every GPU trains (lockstep, j = k = 1). Async: 3/4 of the GPUs
           generate, 1/4 train, eta = 4 (their max staleness 4), in-flight requests continued
           with new weights (interruptible).
areal_int  AReaL Fig. 6: generation throughput with interruptible generation (reload mid-
           request, continue) against without (a replica due for new weights finishes its
           requests first), 7B, 4 nodes (32 GPUs).
rlax       RLAX Fig. 4: QwQ-32B shape (= Qwen2.5-32B's), 16k context, v5p-512 trainer and
           v5p-512 inference, (j, k) = (16, 16) vs (16, 32), 48 steps (three reloads); generation
           may run k batches ahead; 128 prompts x 16 per step (the batch is not in its text).
pipeline   PipelineRL (limits study): Qwen2-0.5B-class model, GSM8k-like short completions, the
           share of trained tokens at each lag for max_lag in {1, 8, 64, 256}, in-flight
           weight updates every version (j = 1, continue).

Lengths are log-normal (parameters below; the papers give histograms, not parameters), and
the efficiencies are the device defaults of minirl/sim/costs.py (decode 0.7 of the roofline,
MFU 0.4). Output: experiments/results/sim/papers.json and one PNG per study.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from minirl.sim.run import cluster, simulate

REASONING = "lognormal:8.6,0.8"  # median 5.4k tokens, mean ~7.5k, capped at 31k
SHORT = "lognormal:5.3,0.5"  # median 200 tokens (GSM8k-style answers)


def areal(steps: int, sizes, prompts: int) -> dict:
    out = {}
    for gpus in sizes:
        common = dict(
            model="qwen2.5-7b",
            device="h100",
            prompts=prompts,
            group=16,
            max_new=31 * 1024,
            lengths=REASONING,
        )
        sync = simulate(cluster(engine_devices=gpus, trainer_devices=gpus, **common), steps)
        run = cluster(
            engine_devices=gpus * 3 // 4,
            trainer_devices=gpus // 4,
            scheduler="async",
            eta=4,
            max_lag=5,
            reload_policy="continue",
            **common,
        )
        asyn = simulate(run, steps)
        out[gpus] = {
            "sync_tokens_per_s": sync["trained_tokens_per_s"],
            "async_tokens_per_s": asyn["trained_tokens_per_s"],
            "speedup": asyn["trained_tokens_per_s"] / sync["trained_tokens_per_s"],
            "sync_busy": sync["busy"],
            "async_busy": asyn["busy"],
        }
        print(
            f"areal {gpus:4d} GPUs: sync {sync['trained_tokens_per_s']:8.0f} tok/s, async "
            f"{asyn['trained_tokens_per_s']:8.0f} tok/s: {out[gpus]['speedup']:.2f}x",
            flush=True,
        )
    return out


def areal_interruptible(steps: int, prompts: int) -> dict:
    out = {}
    for wait in (False, True):
        run = cluster(
            "qwen2.5-7b",
            "h100",
            24,
            8,
            prompts,
            16,
            31 * 1024,
            REASONING,
            scheduler="async",
            eta=4,
            max_lag=5,
            reload_policy="continue",
        )
        trace = simulate(dataclasses.replace(run, wait_for_in_flight=wait), steps)
        name = "wait" if wait else "interrupt"
        out[name] = {
            "generated_tokens_per_s": trace["generated_tokens"] / trace["seconds"],
            "trained_tokens_per_s": trace["trained_tokens_per_s"],
        }
    out["gain"] = out["interrupt"]["generated_tokens_per_s"] / out["wait"]["generated_tokens_per_s"]
    print(f"areal interruptible: generation {out['gain']:.2f}x the waiting engine's", flush=True)
    return out


def rlax(steps: int, engine: int) -> dict:
    out = {}
    for k in (16, 32):
        run = cluster(
            "qwen2.5-32b",
            "v5p",
            engine,
            512,
            128,
            16,
            15 * 1024,
            REASONING,
            scheduler="async",
            reload_every=16,
            max_lag=k,
            eta=k,
            reload_policy="continue",
        )
        t0 = time.perf_counter()
        trace = simulate(run, steps)
        out[f"stale-{k}"] = {
            "simulated_s": trace["seconds"],
            "wall_s": time.perf_counter() - t0,  # what simulating it took here
            "seconds_per_step": trace["seconds_per_step"],
            "wasted_share": trace["wasted_tokens"] / max(trace["generated_tokens"], 1),
            "busy": trace["busy"],
        }
        print(
            f"rlax stale-{k}: {trace['seconds_per_step']:.1f} s/step, wasted "
            f"{out[f'stale-{k}']['wasted_share']:.2f}; {trace['seconds']:.0f} simulated s took "
            f"{out[f'stale-{k}']['wall_s']:.0f} s here",
            flush=True,
        )
    return out


def pipeline(steps: int) -> dict:
    out = {}
    for k in (1, 8, 64, 256):
        run = cluster(
            "qwen2.5-0.5b",
            "h100",
            4,
            4,
            32,
            8,
            1024,
            SHORT,
            slots=256,
            prompt_len=128,
            scheduler="async",
            max_lag=k,
            eta=k - 1 if k > 1 else 0,
            reload_policy="continue",
        )
        trace = simulate(run, steps)
        hist = trace["lag_histogram"]
        out[f"max_lag={k}"] = {
            "lag_share": [n / max(sum(hist), 1) for n in hist],
            "seconds_per_step": trace["seconds_per_step"],
        }
        print(
            f"pipeline max_lag {k:3d}: {trace['seconds_per_step']:.2f} s/step, token lag "
            f"shares {[round(x, 3) for x in out[f'max_lag={k}']['lag_share'][:6]]}",
            flush=True,
        )
    return out


def plots(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    sizes = list(results["areal"])
    for arm in ("sync", "async"):
        ax.plot(sizes, [results["areal"][n][f"{arm}_tokens_per_s"] for n in sizes], "o-", label=arm)
    ax.set_xlabel("GPUs (H100-class)")
    ax.set_ylabel("trained tokens / s (simulated)")
    ax.set_title("AReaL Fig. 4 setting: 7B, 32k context", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "areal_sync_vs_async.png", dpi=120)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    names = list(results["rlax"])
    ax.bar(names, [results["rlax"][n]["seconds_per_step"] for n in names])
    ax.set_ylabel("seconds per step (simulated)")
    ax.set_title("RLAX Fig. 4 setting: 32B, v5p-512 + v5p-512, j = 16", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "rlax_stale16_vs_stale32.png", dpi=120)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, row in results["pipeline"].items():
        ax.plot(range(len(row["lag_share"])), row["lag_share"], "o-", label=name)
    ax.set_xscale("symlog")
    ax.set_xlabel("token lag (versions)")
    ax.set_ylabel("share of trained tokens")
    ax.set_title("PipelineRL setting: 0.5B, in-flight updates", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "pipelinerl_lag.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="fewer steps and sizes (a smoke run)")
    parser.add_argument("--out", type=Path, default=Path("experiments/results/sim"))
    args = parser.parse_args()
    steps = 4 if args.fast else 12
    prompts = 16 if args.fast else 128  # AReaL's batch: 128 prompts x 16 samples
    results = {
        "areal": areal(steps, (32,) if args.fast else (32, 64, 128), prompts),
        "areal_interruptible": areal_interruptible(steps, prompts),
        "rlax": rlax(steps if args.fast else 48, 128 if args.fast else 512),
        "pipeline": pipeline(steps if args.fast else 40),
        "steps": steps,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / ("papers_fast.json" if args.fast else "papers.json")).write_text(
        json.dumps(results, indent=1, default=str)
    )
    plots(results, args.out)


if __name__ == "__main__":
    main()
