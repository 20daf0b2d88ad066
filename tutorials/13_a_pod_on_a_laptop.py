# %% [markdown]
r"""Lesson 13 — a pod on a laptop: the real controller on simulated parts and virtual time.

    python tutorials/13_a_pod_on_a_laptop.py            # full mode (a few CPU minutes)
    python tutorials/13_a_pod_on_a_laptop.py --fast     # fast mode (seconds; what CI runs)

Writes `engine_devices_sweep.png` and `results.json` into `--out` (default
`runs/tutorials/13_a_pod_on_a_laptop`). Uses `minirl/sim/` and `minirl plan` (read
`docs/sim.md` next). Mirrors: AReaL §6.2 / Fig. 4 (async vs sync on long-tailed lengths), RLAX
Fig. 4 (stale-16 vs stale-32), PipelineRL's in-flight lag — their economics, not their learning.


THE IDEA
--------
The papers' headline numbers live on hundreds of chips: where does the time go, and what do j,
k and eta buy there? minirl's controller only ever talks to its parts through futures and reads
time through a clock it is given. So the SAME controller can drive parts that do no work at
all, only take the time a cost model says, on a clock that is a number:

  cost model   a decode step moves the weights and the KV cache once and does 2 x params
               FLOPs per row: time = max(bytes / HBM bandwidth, FLOPs / peak) / efficiency.
               A train step is 8 x params x tokens / (devices x peak x MFU) (forward, backward
               and the recompute of log pi_prox). Datasheet numbers for v5e, v5p, H100.
  the engine   replicas that keep their requests in minirl's real scheduler (queue, slots,
               finish rule, requeue on a discard) and "decode" a length drawn per request
  the loop     lockstep: Controller.step itself. async: the rollout thread's and trainer
               thread's loops as events, calling the controller's own bound checks

Nothing is trained, so a simulated hour of a 512-chip job takes seconds. What is real is every
decision: which groups a step takes, what goes stale, when a replica reloads.

WHAT THE SCRIPT DOES
--------------------
1. One decode step of a 7B model on a v5p chip, by hand: bytes, FLOPs, which roof binds.
2. The scheduler on virtual time: two requests, one slot vs two, against the hand count.
3. AReaL's regime: a 7B model, 32k context, long-tailed lengths, sync (all GPUs generate, then
   all train) against async (3/4 generate, 1/4 train, eta = 4), same GPU count.
4. RLAX Fig. 4's knob, at a quarter of its numbers so a short run sees several reloads:
   (j, k) = (4, 4) vs (4, 8) for a 32B model on v5p (experiments/sim_papers.py runs (16, 16)
   vs (16, 32) on v5p-512 + v5p-512).
5. The planner: `minirl plan`'s sweep over engine devices (where more chips stop helping).

Expected output (full mode, measured)
-------------------------------------
Measured on 2026-11-25 with `python tutorials/13_a_pod_on_a_laptop.py` on a virtual machine with
2 cores (nproc = 2), alone (load average 0.1-0.9). It took 87 s of wall time and 87 s of CPU
time (user + sys; the simulator is one Python thread). The figure is
`tutorials/figures/13_a_pod_on_a_laptop.png`.

    Step 1. one decode step of a 7B model on one v5p chip, 64 rows at context 4k
      bytes: weights 14.1 GB + KV cache 15.0 GB -> 10.6 ms at 2765 GB/s
      FLOPs: 1.01 T -> 2.2 ms at 459 TFLOP/s
      memory-bound: 15.1 ms per step at efficiency 0.7

    Step 2. two requests (5 and 9 tokens), every engine call costs 1 s, chunks of 4
      1 slot(s): 5 s (by hand: prefill + 1 chunk, prefill + 2 chunks = 5)
      2 slot(s): 3 s (by hand: one prefill + 2 chunks = 3)

    Step 3. AReaL's regime: 7B, 32k context, 128 prompts x 16, 64 H100s
      sync    538.7 s/step     28000 trained tokens/s  engine busy 0.93  trainer busy 0.07
      async   271.2 s/step     55422 trained tokens/s  engine busy 0.56  trainer busy 0.53
      async / sync throughput: 1.98x (AReaL reports up to 2.77x)

    Step 4. RLAX Fig. 4's knob at a quarter of its numbers: (j, k) = (4, 4) vs (4, 8), 32B on v5p, 64 engine + 64 trainer chips, 24 steps
      k = 4:  207.2 s/step, 39% of generated tokens thrown away (too stale for k), trainer busy 0.38
      k = 8:  113.4 s/step, 13% of generated tokens thrown away (too stale for k), trainer busy 0.70
      k = 2j / k = j step time: 0.55 (RLAX, stale-32 / stale-16: 45 / 75 = 0.60)

    Step 5. the planner: minirl plan --model qwen2.5-7b --device v5p --scheduler async --staleness 1,2,1 --prompts 64 --steps 10 --sweep engine-devices=1,2,4,8,16,32
         1 engine chips:   21.8 steps/hour, engine busy 1.00
         2 engine chips:   27.4 steps/hour, engine busy 0.97
         4 engine chips:   30.2 steps/hour, engine busy 0.97
         8 engine chips:   32.2 steps/hour, engine busy 0.92
        16 engine chips:   32.5 steps/hour, engine busy 0.83
        32 engine chips:   32.4 steps/hour, engine busy 0.54

    wrote runs/tutorials/13_a_pod_on_a_laptop/engine_devices_sweep.png and runs/tutorials/13_a_pod_on_a_laptop/results.json

Reading it. Step 1: at 64 rows a 7B decode step moves 29 GB and does 1 TFLOP; the v5p's
bandwidth binds, 5x ahead of its FLOPs, so a step costs ~15 ms whatever the batch up to far more
rows — the reason engines batch. Step 2 is the scheduler's own arithmetic on a clock you can
count. Step 3 is AReaL's argument in numbers: a synchronous step waits for the batch's longest
completion (near 31k tokens here) while the trainer idles 93% of the time, and all 64 GPUs
cannot make one sequence decode faster; giving 3/4 of the GPUs to a free-running engine and 1/4
to the trainer doubles the trained tokens per second (1.98x; AReaL reports up to 2.77x with its
own lengths and systems work). Step 4 is RLAX Fig. 4's mechanism: with k = j every reload makes
the data still in flight too old to train on (39% of generated tokens thrown away) and the
trainer waits for fresh batches; k = 2j accepts them and the step takes 0.55 of the time (RLAX:
0.60). Step 5: past ~8 engine chips the steps per hour stop growing while the engine idles more
— a batch cannot finish before its longest completions, however many chips decode them.
experiments/sim_papers.py runs the papers' own sizes (AReaL at 32-128 GPUs, RLAX's (16, 16) vs
(16, 32) on 1,024 v5p chips, PipelineRL's lag shares); docs/sim.md has the numbers, and how
closely the simulator predicts real minirl runs on this machine (11 of 13 settings within 9%,
the other two within 17%).
"""

# %%
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from minirl.cli import build_parser
from minirl.inference.engine_config import EngineConfig
from minirl.inference.scheduler import Request
from minirl.modeling.model import ModelConfig
from minirl.sim.costs import (
    DEVICES,
    SHAPES,
    Costs,
    Device,
    attention_flops,
    kv_bytes,
    matmul_params,
    weight_bytes,
)
from minirl.sim.parts import SimEngine, VirtualClock
from minirl.sim.plan import knobs_of, make_setup
from minirl.sim.run import cluster, simulate
from minirl.sim.workload import Lengths
from minirl.types import Prompt

LONG_TAIL = "lognormal:8.6,0.8"  # median 5.4k tokens, a long right tail (capped below)


# %%
def step1_roofline() -> dict:
    print("Step 1. one decode step of a 7B model on one v5p chip, 64 rows at context 4k")
    m, dev = SHAPES["qwen2.5-7b"], DEVICES["v5p"]
    rows, context = 64, 4096
    weights = weight_bytes(m, 2, rows)
    kv = kv_bytes(m, rows * (context + 1), 2)
    flops = 2.0 * rows * matmul_params(m) + attention_flops(m, rows, context)
    memory_s, compute_s = (weights + kv) / dev.hbm_bytes_per_s, flops / dev.peak_flops
    print(
        f"  bytes: weights {weights / 1e9:.1f} GB + KV cache {kv / 1e9:.1f} GB -> "
        f"{memory_s * 1e3:.1f} ms at {dev.hbm_bytes_per_s / 1e9:.0f} GB/s"
    )
    print(
        f"  FLOPs: {flops / 1e12:.2f} T -> {compute_s * 1e3:.1f} ms at "
        f"{dev.peak_flops / 1e12:.0f} TFLOP/s"
    )
    bound = "memory" if memory_s > compute_s else "compute"
    print(
        f"  {bound}-bound: {max(memory_s, compute_s) / dev.decode_eff * 1e3:.1f} ms per step "
        f"at efficiency {dev.decode_eff}"
    )
    model_step = Costs(m, dev).decode_chunk(rows, context, 1)
    return {"memory_s": memory_s, "compute_s": compute_s, "bound": bound, "step_s": model_step}


# %%
def step2_schedule() -> dict:
    print("\nStep 2. two requests (5 and 9 tokens), every engine call costs 1 s, chunks of 4")
    toy = ModelConfig(
        vocab_size=4, dim=2, num_layers=1, num_heads=1, num_kv_heads=1, head_dim=2, mlp_dim=2
    )
    costs = Costs(toy, Device("1 s per call", 1e30, 1e30, 1e30, 1e30, call_s=1.0))
    out = {}
    for slots in (1, 2):
        clock = VirtualClock()
        cfg = EngineConfig(
            slots=slots, cache_len=64, prefill_buckets=(8,), prefill_rows=2, decode_chunk=4
        )
        table = {(0, 0): 5, (1, 0): 9}
        engine = SimEngine(cfg, costs, Lengths("fixed", (1,), table=table), clock)
        prompts = [Prompt(u, "t", "", np.ones(3, np.int32)) for u in (0, 1)]
        engine.generate([Request(p, 0, 16) for p in prompts])
        out[slots] = clock()
        print(
            f"  {slots} slot(s): {clock():.0f} s (by hand: "
            f"{'prefill + 1 chunk, prefill + 2 chunks = 5' if slots == 1 else 'one prefill + 2 chunks = 3'})"
        )
    return out


# %%
def step3_areal(args) -> dict:
    gpus = args.gpus
    print(f"\nStep 3. AReaL's regime: 7B, 32k context, {args.prompts} prompts x 16, {gpus} H100s")
    common = ("qwen2.5-7b", "h100")
    sync = simulate(
        cluster(*common, gpus, gpus, args.prompts, 16, 31 * 1024, LONG_TAIL), args.steps
    )
    run = cluster(
        *common,
        gpus * 3 // 4,
        gpus // 4,
        args.prompts,
        16,
        31 * 1024,
        LONG_TAIL,
        scheduler="async",
        eta=4,
        max_lag=5,
        reload_policy="continue",
    )
    asyn = simulate(run, args.steps)
    for name, t in (("sync ", sync), ("async", asyn)):
        print(
            f"  {name} {t['seconds_per_step']:7.1f} s/step  {t['trained_tokens_per_s']:8.0f} "
            f"trained tokens/s  engine busy {t['busy']['engine']:.2f}  trainer busy "
            f"{t['busy']['trainer']:.2f}"
        )
    speedup = asyn["trained_tokens_per_s"] / sync["trained_tokens_per_s"]
    print(f"  async / sync throughput: {speedup:.2f}x (AReaL reports up to 2.77x)")
    return {
        "sync": sync["trained_tokens_per_s"],
        "async": asyn["trained_tokens_per_s"],
        "speedup": speedup,
    }


# %%
def step4_rlax(args) -> dict:
    print(
        "\nStep 4. RLAX Fig. 4's knob at a quarter of its numbers: (j, k) = (4, 4) vs (4, 8), "
        f"32B on v5p, {args.rlax_chips} engine + {args.rlax_chips} trainer chips, "
        f"{args.rlax_steps} steps"
    )
    out = {}
    for k in (4, 8):
        run = cluster(
            "qwen2.5-32b",
            "v5p",
            args.rlax_chips,
            args.rlax_chips,
            32,
            16,
            15 * 1024,
            LONG_TAIL,
            scheduler="async",
            reload_every=4,
            max_lag=k,
            eta=k,
            reload_policy="continue",
        )
        t = simulate(run, args.rlax_steps)
        waste = t["wasted_tokens"] / max(t["generated_tokens"], 1)
        out[k] = {"seconds_per_step": t["seconds_per_step"], "wasted_share": waste}
        print(
            f"  k = {k}: {t['seconds_per_step']:6.1f} s/step, {waste:.0%} of generated tokens "
            f"thrown away (too stale for k), trainer busy {t['busy']['trainer']:.2f}"
        )
    ratio = out[8]["seconds_per_step"] / out[4]["seconds_per_step"]
    print(f"  k = 2j / k = j step time: {ratio:.2f} (RLAX, stale-32 / stale-16: 45 / 75 = 0.60)")
    return out


# %%
def step5_plan(args, out: Path) -> dict:
    command = ["plan", "--model", "qwen2.5-7b", "--device", "v5p", "--scheduler", "async"]
    command += ["--staleness", "1,2,1", "--prompts", "64", "--steps", str(args.steps)]
    sweep = f"engine-devices={','.join(map(str, args.sweep))}"
    print(f"\nStep 5. the planner: minirl {' '.join(command)} --sweep {sweep}")
    plan_args = build_parser().parse_args(command)  # exactly what the command runs
    rows = []
    for n in args.sweep:
        setup = make_setup(plan_args, {**knobs_of(plan_args), "engine_devices": n})
        t = simulate(setup, args.steps)
        rows.append((n, t["steps_per_hour"], t["busy"]["engine"]))
        print(
            f"  {n:4d} engine chips: {t['steps_per_hour']:6.1f} steps/hour, engine busy "
            f"{t['busy']['engine']:.2f}"
        )
    plot(rows, out / "engine_devices_sweep.png")
    return {str(n): {"steps_per_hour": s, "engine_busy": b} for n, s, b in rows}


# %%
def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r[0] for r in rows], [r[1] for r in rows], "o-")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("engine chips (v5p)")
    ax.set_ylabel("steps / hour (simulated)")
    ax.set_title("7B, async eta = 1: more engine chips, until the straggler binds", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# %%
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="small settings (CI)")
    parser.add_argument("--out", default="runs/tutorials/13_a_pod_on_a_laptop")
    args = parser.parse_args()
    full = dict(steps=10, gpus=64, prompts=128, sweep=(1, 2, 4, 8, 16, 32))
    full |= dict(rlax_chips=64, rlax_steps=24)
    fast = dict(steps=3, gpus=32, prompts=32, sweep=(1, 4), rlax_chips=64, rlax_steps=12)
    vars(args).update(fast if args.fast else full)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    results = {
        "mode": "fast" if args.fast else "full",
        "roofline": step1_roofline(),
        "schedule": step2_schedule(),
        "areal": step3_areal(args),
        "rlax": step4_rlax(args),
        "plan": step5_plan(args, out),
    }
    results["seconds"] = {"wall": time.perf_counter() - t0, "cpu": time.process_time() - cpu0}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out / 'engine_devices_sweep.png'} and {out / 'results.json'}")
    if results["schedule"] != {1: 5.0, 2: 3.0}:
        raise SystemExit(f"the hand-counted schedule does not hold: {results['schedule']}")


# %%
if __name__ == "__main__":
    main()
