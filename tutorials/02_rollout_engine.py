# %% [markdown]
"""Lesson 02 — the rollout engine: continuous batching, sampling, behaviour log-probs, versions.

    python tutorials/02_rollout_engine.py            # full mode (a few minutes on 2 CPU cores)
    python tutorials/02_rollout_engine.py --fast     # fast mode (about 20 s; what CI runs)

Writes `static_vs_continuous.png` and `results.json` into `--out` (default
`runs/tutorials/02_rollout_engine`). Uses `minirl/inference/engine.py` (with `minirl/inference/scheduler.py` and
`minirl/modeling/sampling.py`) and `minirl/training/trainer.py` for the recompute. Mirrors, in miniature: AReaL
Fig. 6 and §4 ("without interruptible generation, the controller must wait for the longest
response"). Here the cost of waiting for the longest response is measured inside one engine:
static batching against continuous batching (Orca, vLLM) on long-tailed lengths.


THE IDEA
--------
The rollout engine turns prompts into completions, which is where an RL step spends most of
its time. It decodes B sequences together: each decode step runs the model once on B new tokens
(one per SLOT) and appends one token to each. Completion lengths in reasoning tasks are LONG-
TAILED: on minirl's arithmetic task (scratchpad addition) the median completion has 35 tokens and
the longest 262 (docs/tasks.md).

  static batching      take B requests, decode until ALL of them are done, take the next B.
                       A batch lives as long as its longest member. Finished slots sit idle
                       and are still computed, because the step's shape is fixed.
  continuous batching  the moment a sequence finishes, its slot is refilled from the queue
                       (a prefill for the newcomer, then it joins the shared decode steps).
                       Slots stay busy until the queue runs dry.

A decode step costs about the same however many slots hold a live sequence, so the gain is the
ratio of slot-steps wasted. It is largest when lengths are most skewed.

Three more things the engine records for RL, all shown below:

  sampling     token c of sample s of prompt u is drawn with the key fold_in(seed, u, s, c): a
               pure function of ids, never of the slot, batch or timing. In exact mode the same
               request therefore gives the same tokens alone or in a crowd.
  log mu       each token's behaviour log-prob, from the very logits it was sampled from (with
               temperature, top-k and top-p applied). The trainer recomputes log pi for the same
               tokens with a full forward; in exact mode the two are bitwise equal (lesson 01).
  versions     each token carries the weight version that produced it. `load_weights` in the
               middle of a rollout means later tokens carry the new version, and staleness is
               measured in versions (lessons 06, 07 and 09).

The engine is PASSIVE: `submit(requests)`, `step() -> finished rollouts`, `load_weights(v, p)`,
`interrupt(policy)`. It never fetches work or weights on its own. `generate(requests)` is just
submit and step until done.

WHAT THE SCRIPT DOES
--------------------
1. Makes a long-tailed workload: arithmetic-task prompts, each with a token budget equal to the
   length of its reference solution. A randomly initialised model with EOS switched off writes
   exactly its budget, so the lengths are the task's real lengths and nothing depends on what
   the model writes. This lesson measures scheduling, not quality.
2. Runs it with static batching (`generate` on B requests at a time) and with continuous
   batching (`generate` on everything at once), after a warm-up that compiles every shape.
   Prints tokens/s for both, their ratio, and the number of decode calls (the same on any
   machine).
3. Checks that the engine's behaviour log-probs equal the trainer's recomputation (exact mode:
   bitwise), and that a request sampled alone gives the same tokens as inside the batch.
4. Loads new weights while rollouts are in flight and prints the per-token versions.
5. Plots busy slots per decode call and the throughput of both schedules.

Expected output (full mode, measured)
-------------------------------------
Measured on 2026-11-22 with `python tutorials/02_rollout_engine.py` on a shared virtual machine
with 2 cores (nproc = 2), under load from other jobs (load average 6-7), with the engine of
commit 36a58e5 ("engine snapshot, in progress"). It took 71 s of wall time and 63 s of CPU time
(user + sys). The figure is figures/02_rollout_engine.png.

The result reproduces: continuous batching generated the same 11,302 tokens 1.81x faster than
static batching. The machine-independent part is the number of decode calls: 2.58x fewer,
because static batches kept on average 10 of 32 slots busy and continuous batching 26. The
time ratio is smaller than the call ratio because continuous batching pays for more, smaller
prefill calls (newcomers trickle in one or two at a time) and decodes more live slots per call.
An earlier run on the same machine, with the engine before its cache windows (decode attending
over only the occupied prefix of the cache), measured 2.40x. AReaL reports a 12-17% gain from
interruptible generation (its Fig. 6). That gain is about the same waste, but across a whole
RL system rather than inside one engine.

    mode: full   jax 0.10.2   model 3.17M parameters   32 slots

    Step 1. 256 requests, completion lengths: median 34, p90 84, max 217, total 11302 tokens

    Step 2. the same requests, two schedules (warm: compiled shapes before timing {'prefill': 8, 'decode': 4}, compiled during timing {'prefill': 0, 'decode': 0})
      schedule     seconds  tokens/s  decode calls  busy slots (mean)
      static           9.2      1234           147               10.2
      continuous       5.1      2238            57               26.2
      -> continuous / static = 1.81x tokens/s   (decode calls static / continuous = 2.58x, the machine-independent part)

    Step 3. behaviour log-probs vs the trainer's recompute (16 rollouts, same weights)
      default numerics: max |log mu - log pi| = 3.338e-06 over 425 tokens   bitwise equal: False
      exact   numerics: max |log mu - log pi| = 0.000e+00 over 425 tokens   bitwise equal: True
      exact   numerics: request 1 sampled alone == inside the batch (tokens and log-probs): True

    Step 4. load_weights(1, ...) while 4 rollouts are in flight (no interrupt)
      rollout 0 versions: 17 tokens of version 0, 23 tokens of version 1   oldest_version = 0

    wrote runs/tutorials/02_rollout_engine/static_vs_continuous.png and runs/tutorials/02_rollout_engine/results.json
"""

# %%
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from matplotlib.figure import Figure

from minirl.inference.engine import Engine, EngineConfig, Request
from minirl.modeling.model import ModelConfig, init_model
from minirl.modeling.sampling import Sampling
from minirl.modeling.tokenizer import CharTokenizer
from minirl.tasks import get_task
from minirl.training.batching import make_batch
from minirl.training.trainer import Trainer, TrainerConfig
from minirl.types import Score

TOKENIZER = CharTokenizer()
FULL = dict(
    model=ModelConfig.preset("tiny", vocab_size=TOKENIZER.vocab_size),
    requests=256,
    slots=32,
    cache_len=384,  # prompt + completion; the longest of these 256 needs 274
    checks=16,
)
FAST = dict(
    model=ModelConfig(
        vocab_size=TOKENIZER.vocab_size,
        dim=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        mlp_dim=128,
    ),
    requests=64,
    slots=16,
    cache_len=256,  # the longest of these 64 needs 140
    checks=4,
)


# %%
def engine_config(slots: int, cache_len: int, exact: bool = False) -> EngineConfig:
    return EngineConfig(
        slots=slots,
        cache_len=cache_len,
        prefill_buckets=(32, 64, 128),
        prefill_rows=8,
        decode_chunk=8,
        temperature=1.0,
        eos_ids=(),
        exact=exact,
    )


# %%
def workload(n: int):
    """n arithmetic prompts; each request's budget = its reference solution's length (+ EOS)."""
    task = get_task("arithmetic")
    prompts = [task.prompt(i, "train") for i in range(n)]
    budgets = [len(TOKENIZER.encode(task.demonstration(p), bos=False, eos=True)) for p in prompts]
    return [
        Request(p, 0, max_new_tokens=b) for p, b in zip(prompts, budgets, strict=True)
    ], np.array(budgets)


# %%
def run(engine: Engine, batches: list[list[Request]]):
    """Generate every batch in turn (each one to completion), stepping by hand so we can count
    busy slots. Returns (rollouts, seconds, slots that held a sequence in each step)."""
    rollouts, busy = [], []
    t0 = time.perf_counter()
    for batch in batches:
        engine.submit(batch)
        while engine.num_active or engine.num_queued:
            finished = engine.step()
            rollouts += finished
            busy.append(engine.num_active + len(finished))  # slots that worked in this step
    return rollouts, time.perf_counter() - t0, busy


# %%
def warm_up(engine: Engine, requests: list[Request]) -> None:
    """Compile every shape the timed runs can use, so that timing measures running, not
    compiling: a prefill per (prompt-length bucket, row count), a decode per cache window."""
    c = engine.config
    by_bucket: dict[int, list[Request]] = {}
    for r in requests:
        bucket = min(b for b in c.buckets if b >= len(r.prompt.tokens))
        by_bucket.setdefault(bucket, []).append(r)
    rows = [1 << i for i in range(c.prefill_rows.bit_length()) if 1 << i <= c.prefill_rows]
    for group in by_bucket.values():
        for n in rows:  # n prompts of one bucket, admitted together: one prefill of n rows
            engine.generate([dataclasses.replace(r, max_new_tokens=1) for r in group[:n]])
    # Decode attends over the smallest cache window that holds every live sequence (64, 128,
    # ...): one sequence that grows to the full cache passes through every window.
    first = requests[0]
    longest = c.cache_len - len(first.prompt.tokens)
    engine.generate([dataclasses.replace(first, max_new_tokens=longest)])


# %%
def static_batches(requests, slots):
    return [requests[i : i + slots] for i in range(0, len(requests), slots)]


# %%
def plot(busy: dict, tput: dict, slots: int, path: Path) -> None:
    fig = Figure(figsize=(11, 4), layout="constrained")
    ax, bx = fig.subplots(1, 2, width_ratios=(3, 1))
    for name, color in (("static", "tab:orange"), ("continuous", "tab:blue")):
        ax.step(
            range(1, len(busy[name]) + 1),
            busy[name],
            where="post",
            color=color,
            label=f"{name}: {len(busy[name])} engine steps",
        )
    ax.axhline(slots, color="gray", lw=0.5, linestyle=":")
    ax.set_xlabel("engine step (one prefill of newcomers + one decode chunk)")
    ax.set_ylabel(f"slots holding a live sequence (of {slots})")
    ax.set_title(
        "static batches wait for their longest member; continuous batching refills slots",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    names = list(tput)
    bars = bx.bar(names, [tput[n] for n in names], color=["tab:orange", "tab:blue"])
    bx.bar_label(bars, fmt="%.0f")
    bx.set_ylabel("generated tokens / s")
    bx.set_title(f"continuous / static = {tput['continuous'] / tput['static']:.2f}x", fontsize=9)
    fig.savefig(path, dpi=110)


# %%
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="small model, fewer requests (CI)")
    parser.add_argument("--out", default="runs/tutorials/02_rollout_engine")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    s = FAST if args.fast else FULL
    cfg: ModelConfig = s["model"]
    slots = s["slots"]
    print(
        f"mode: {'fast' if args.fast else 'full'}   jax {jax.__version__}   model "
        f"{cfg.num_params() / 1e6:.2f}M parameters   {slots} slots"
    )

    # Step 1: the workload.
    requests, budgets = workload(s["requests"])
    print(
        f"\nStep 1. {len(requests)} requests, completion lengths: median {np.median(budgets):.0f}, "
        f"p90 {np.percentile(budgets, 90):.0f}, max {budgets.max()}, total {budgets.sum()} tokens"
    )
    params = nnx.to_pure_dict(nnx.split(init_model(cfg, seed=0))[1])
    engine = Engine(cfg, engine_config(slots, s["cache_len"]))
    engine.load_weights(0, params)

    # Step 2: static vs continuous, after a warm-up that compiles every shape.
    warm_up(engine, requests)
    compiled = engine.compile_counts()
    calls0 = engine.stats["decode_calls"]
    done_static, t_static, busy_static = run(engine, static_batches(requests, slots))
    calls_static = engine.stats["decode_calls"] - calls0
    done_cont, t_cont, busy_cont = run(engine, [requests])
    calls_cont = engine.stats["decode_calls"] - calls0 - calls_static
    tokens = int(budgets.sum())
    assert (
        sum(len(r.tokens) for r in done_static) == sum(len(r.tokens) for r in done_cont) == tokens
    )
    tput = {"static": tokens / t_static, "continuous": tokens / t_cont}
    ratio = tput["continuous"] / tput["static"]
    recompiled = {k: engine.compile_counts()[k] - compiled[k] for k in compiled}
    print(
        "\nStep 2. the same requests, two schedules (warm: compiled shapes before timing "
        f"{compiled}, compiled during timing {recompiled})"
    )
    print(
        f"  {'schedule':11s} {'seconds':>8s} {'tokens/s':>9s} {'decode calls':>13s} "
        f"{'busy slots (mean)':>18s}"
    )
    for name, secs, calls, busy in (
        ("static", t_static, calls_static, busy_static),
        ("continuous", t_cont, calls_cont, busy_cont),
    ):
        print(f"  {name:11s} {secs:8.1f} {tokens / secs:9.0f} {calls:13d} {np.mean(busy):18.1f}")
    print(
        f"  -> continuous / static = {ratio:.2f}x tokens/s   (decode calls static / continuous "
        f"= {calls_static / calls_cont:.2f}x, the machine-independent part)"
    )

    # Step 3: behaviour log-probs against the trainer's recompute, and sampling determinism.
    print(
        f"\nStep 3. behaviour log-probs vs the trainer's recompute ({s['checks']} rollouts, "
        "same weights)"
    )
    few = [
        dataclasses.replace(r, max_new_tokens=min(r.max_new_tokens, 48))
        for r in requests[: s["checks"]]
    ]
    checks = {}
    for exact in (False, True):
        eng = Engine(cfg, engine_config(slots, s["cache_len"], exact=exact))
        eng.load_weights(0, params)
        rollouts = eng.generate(few)
        for r in rollouts:
            r.score = Score(0.0)  # make_batch needs a score; the recompute ignores it
        batch = make_batch(rollouts, pad_id=TOKENIZER.pad_id)
        trainer = Trainer(cfg, params, None, TrainerConfig(), sampling=Sampling(1.0, exact=exact))
        recomputed = trainer.recompute_logprobs(batch)  # log pi  [B, T]
        mask = batch.mask > 0
        diff = np.abs(recomputed - batch.behaviour_logprobs)[mask]
        mode = "exact" if exact else "default"
        checks[mode] = {"max_abs_dlogp": float(diff.max()), "bitwise": bool((diff == 0).all())}
        print(
            f"  {mode:7s} numerics: max |log mu - log pi| = {diff.max():.3e} over {mask.sum()} tokens"
            f"   bitwise equal: {checks[mode]['bitwise']}"
        )
        if exact:
            alone = eng.generate(few[1:2])[0]  # the same request, alone in the engine
            same = np.array_equal(alone.tokens, rollouts[1].tokens) and np.array_equal(
                alone.logprobs, rollouts[1].logprobs
            )
            checks["alone_equals_in_batch"] = bool(same)
            print(
                f"  exact   numerics: request 1 sampled alone == inside the batch "
                f"(tokens and log-probs): {same}"
            )
    logprobs_ok = checks["exact"]["bitwise"] and checks["default"]["max_abs_dlogp"] < 1e-3

    # Step 4: weights change in flight; every token says which version wrote it.
    print("\nStep 4. load_weights(1, ...) while 4 rollouts are in flight (no interrupt)")
    newer = jax.tree_util.tree_map(lambda x: x * 1.01, params)
    eng = Engine(cfg, engine_config(slots, s["cache_len"]))
    eng.load_weights(0, params)
    eng.submit([dataclasses.replace(r, max_new_tokens=40) for r in requests[:4]])
    finished = eng.step() + eng.step()  # 2 engine steps = 2 decode chunks of 8 tokens
    eng.load_weights(1, newer)
    while eng.num_active or eng.num_queued:
        finished += eng.step()
    versions = finished[0].versions
    runs = [(int(v), int((versions == v).sum())) for v in np.unique(versions)]
    print(
        "  rollout 0 versions: "
        + ", ".join(f"{n} tokens of version {v}" for v, n in runs)
        + f"   oldest_version = {finished[0].oldest_version}"
    )

    plot(
        {"static": busy_static, "continuous": busy_cont},
        tput,
        slots,
        out / "static_vs_continuous.png",
    )
    (out / "results.json").write_text(
        json.dumps(
            {
                "mode": "fast" if args.fast else "full",
                "slots": slots,
                "requests": len(requests),
                "tokens": tokens,
                "seconds": {"static": t_static, "continuous": t_cont},
                "tokens_per_s": tput,
                "throughput_ratio": ratio,
                "decode_calls": {"static": calls_static, "continuous": calls_cont},
                "compiled_during_timing": recompiled,
                "logprob_checks": checks,
                "logprobs_match_trainer": logprobs_ok,
                "versions_of_rollout_0": runs,
            },
            indent=1,
        )
    )
    print(f"\nwrote {out / 'static_vs_continuous.png'} and {out / 'results.json'}")
    if not logprobs_ok or not checks["alone_equals_in_batch"]:
        raise SystemExit(
            "behaviour log-probs or sampling are not what this lesson claims: see above"
        )


# %%
if __name__ == "__main__":
    main()
