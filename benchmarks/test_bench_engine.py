"""Benchmark: the rollout engine's decode throughput against baselines measured in the same run.

Run (~5 minutes on a quiet machine, ~13 under heavy sharing; a third of it compiles):
    OMP_WAIT_POLICY=PASSIVE python -m pytest benchmarks/test_bench_engine.py -q -s

Models: the `tiny` (~3.2M parameters) and `small` (~25M) presets, random weights, float32.
Workload for the throughput rows: `slots` prompts of P=32 random tokens, N=32 new tokens each
(no EOS, so every request is exactly N long), temperature 1, no top-k/top-p.

  engine     `Engine.generate` after a warm-up on the same shapes (compiles excluded)
  recompute  (a) no KV cache: a jitted full forward over the padded [slots, P + N] buffer for
             every new token (the same sampling); timed for 8 tokens, reported per token
  static     (b) static batching on a long-tailed workload: the engine fed one batch of `slots`
             requests at a time, waiting for the longest before the next batch, against the
             same requests submitted at once (continuous batching). Lengths: 16-48 prompt
             tokens, max_new ~ lognormal(median 24, sigma 1) clipped to [4, 192]
  hf         (c) `transformers` LlamaForCausalLM.generate, torch CPU eager, the same weights
             (written with minirl.hf.model_files.save_hf, logits checked), do_sample, top_k=0, 2 threads,
             OMP_WAIT_POLICY=PASSIVE
  peak       (d) the best of 3 jitted [2048, 2048] @ [2048, 2048] float32 matmuls, measured
             before and after each row (the larger is used: a conservative fraction)
  exact      the engine with exact=True on the same workload, 16 slots or fewer (its cost as a
             ratio; exact dense layers are ~5x slower per call, so it is slow)
  paged      the engine with the paged cache on the same workload (its cost as a ratio, and
             the KV memory it held against the contiguous cache)

Decode FLOPs per token: 2 x parameters (the tied LM head counted once) + attention
4 x L x H x Dh x (attended positions). Nothing about time is asserted: the machine is shared,
so each row prints ratios taken within the row.
"""

from __future__ import annotations

import os
import tempfile
import time

os.environ.setdefault(
    "OMP_WAIT_POLICY", "PASSIVE"
)  # before torch is imported (docs/benchmarking.md)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

from minirl.inference.engine import Engine, EngineConfig, Request  # noqa: E402
from minirl.modeling.model import ModelConfig, init_model  # noqa: E402
from minirl.types import Prompt  # noqa: E402

P, N, RECOMPUTE_STEPS = 32, 32, 8
ROWS = [("tiny", 1), ("tiny", 16), ("tiny", 64), ("small", 1), ("small", 16), ("small", 64)]

_matmul = jax.jit(lambda x, y: x @ y)


def matmul_peak(n: int = 2048, repeats: int = 3) -> float:
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n), np.float32))
    _matmul(a, a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        _matmul(a, a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def decode_flops_per_token(cfg: ModelConfig, context: float) -> float:
    return 2 * cfg.num_params() + 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context


def graphdef(cfg: ModelConfig):
    return nnx.split(nnx.eval_shape(lambda: init_model(cfg)))[0]


def workload(cfg, n, uid0, prompt_len=P, new=N):
    rng = np.random.default_rng(uid0)
    return [
        Request(
            Prompt(
                uid0 + i, "bench", "", rng.integers(1, cfg.vocab_size, prompt_len).astype(np.int32)
            ),
            0,
            new,
        )
        for i in range(n)
    ]


def engine_config(slots, **overrides):
    return EngineConfig(
        slots=slots,
        cache_len=256,
        prefill_buckets=(32, 64),
        prefill_rows=8,
        decode_chunk=8,
        temperature=1.0,
        **overrides,
    )


def timed_generate(engine, reqs) -> tuple[float, int]:
    t0 = time.perf_counter()
    outs = engine.generate(reqs)
    return time.perf_counter() - t0, sum(len(o.tokens) for o in outs)


def engine_rate(cfg, params, slots, uid0, repeats=3, **overrides) -> tuple[float, Engine]:
    """Best of `repeats` timed runs after a warm-up on the same shapes (compiles excluded)."""
    e = Engine(cfg, engine_config(slots, **overrides))
    e.load_weights(0, params)
    e.generate(workload(cfg, slots, uid0))
    runs = [
        timed_generate(e, workload(cfg, slots, uid0 + 10_000 * (i + 1))) for i in range(repeats)
    ]
    return max(tokens / seconds for seconds, tokens in runs), e


def recompute_rate(cfg, params, slots) -> float:
    """(a) No KV cache: every token re-runs the whole padded prefix."""
    model = nnx.merge(graphdef(cfg), params)

    @jax.jit
    def step(buf, pos, key):
        logits = model(buf)  # [B, P + N, V]
        last = jax.lax.dynamic_index_in_dim(logits, pos - 1, axis=1, keepdims=False)
        tok = jax.random.categorical(key, last).astype(jnp.int32)
        return jax.lax.dynamic_update_index_in_dim(buf, tok, pos, axis=1)

    buf = jnp.asarray(
        np.random.default_rng(0).integers(1, cfg.vocab_size, (slots, P + N)), jnp.int32
    )
    step(buf, P, jax.random.key(0)).block_until_ready()
    t0 = time.perf_counter()
    for c in range(RECOMPUTE_STEPS):
        buf = step(buf, P + c, jax.random.key(c))
    buf.block_until_ready()
    return slots * RECOMPUTE_STEPS / (time.perf_counter() - t0)


def hf_rate(cfg, params, slots) -> float:
    """(c) transformers generate on the same weights (torch CPU, eager)."""
    import torch
    from transformers import LlamaForCausalLM

    from minirl.hf.model_files import save_hf

    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        save_hf(params, cfg, tmp, architecture="LlamaForCausalLM")
        hf = LlamaForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
    ids = np.random.default_rng(1).integers(1, cfg.vocab_size, (slots, P))
    with torch.no_grad():  # the same model? compare logits once
        ours = np.asarray(nnx.merge(graphdef(cfg), params)(jnp.asarray(ids[:1], jnp.int32)))
        theirs = hf(torch.tensor(ids[:1])).logits.numpy()
    assert np.abs(ours - theirs).max() < 1e-3, "HF model does not match minirl's"
    kwargs = dict(
        do_sample=True,
        top_k=0,
        temperature=1.0,
        max_new_tokens=N,
        min_new_tokens=N,
        pad_token_id=0,
        attention_mask=torch.ones(slots, P, dtype=torch.long),
    )
    with torch.no_grad():
        hf.generate(torch.tensor(ids), **{**kwargs, "max_new_tokens": 2, "min_new_tokens": 2})
        t0 = time.perf_counter()
        out = hf.generate(torch.tensor(ids), **kwargs)
        seconds = time.perf_counter() - t0
    return slots * (out.shape[1] - P) / seconds


@pytest.mark.parametrize("preset,slots", ROWS, ids=[f"{p}-{s}" for p, s in ROWS])
def test_decode_throughput(benchmark, preset, slots):
    cfg = ModelConfig.preset(preset)
    params = nnx.split(init_model(cfg, seed=0))[1]
    peak_before = matmul_peak()
    rate, engine = engine_rate(cfg, params, slots, uid0=1)
    benchmark.pedantic(
        lambda: timed_generate(engine, workload(cfg, slots, 20_000)), rounds=1, iterations=1
    )
    peak = max(peak_before, matmul_peak())
    fraction = rate * decode_flops_per_token(cfg, P + N / 2) / peak
    recompute = recompute_rate(cfg, params, slots)
    hf = hf_rate(cfg, params, slots)
    info = dict(
        tokens_per_s=round(rate),
        peak_gflops=round(peak / 1e9),
        fraction_of_peak=round(fraction, 3),
        vs_recompute=round(rate / recompute, 2),
        vs_hf=round(rate / hf, 2),
        hf_tokens_per_s=round(hf),
        recompute_tokens_per_s=round(recompute),
    )
    benchmark.extra_info.update(info)
    print(f"\n[engine {preset} slots={slots}] {info}")


@pytest.mark.parametrize("preset,slots", [("tiny", 16), ("small", 64)], ids=["tiny-16", "small-64"])
def test_continuous_vs_static_batching(benchmark, preset, slots):
    """(b) On a long-tailed length distribution static batching idles on the stragglers."""
    cfg = ModelConfig.preset(preset)
    params = nnx.split(init_model(cfg, seed=0))[1]
    rng = np.random.default_rng(5)
    reqs = []
    for i in range(4 * slots):
        plen = int(rng.integers(16, 49))
        new = int(np.clip(np.round(np.exp(rng.normal(np.log(24), 1.0))), 4, 192))
        reqs += workload(cfg, 1, 50_000 + i, prompt_len=plen, new=new)
    e = Engine(cfg, engine_config(slots))
    e.load_weights(0, params)
    e.generate(reqs)  # warm-up: every prefill and window shape both passes use
    calls = e.stats["decode_calls"]
    t_cont, tokens = benchmark.pedantic(lambda: timed_generate(e, reqs), rounds=1, iterations=1)
    busy = tokens / ((e.stats["decode_calls"] - calls) * slots * e.config.decode_chunk)
    t0 = time.perf_counter()
    for group in range(0, len(reqs), slots):
        e.generate(reqs[group : group + slots])
    t_static = time.perf_counter() - t0
    lengths = [r.max_new_tokens for r in reqs]
    info = dict(
        continuous_tokens_per_s=round(tokens / t_cont),
        static_tokens_per_s=round(tokens / t_static),
        continuous_over_static=round(t_static / t_cont, 2),
        continuous_slot_use=round(busy, 2),
        mean_new=round(float(np.mean(lengths)), 1),
        max_new=max(lengths),
    )
    benchmark.extra_info.update(info)
    print(f"\n[batching {preset} slots={slots}] {info}")


PAGED_ROWS = [("tiny", 16), ("small", 16), ("small", 64)]


@pytest.mark.parametrize("preset,slots", PAGED_ROWS, ids=[f"{p}-{s}" for p, s in PAGED_ROWS])
def test_exact_and_paged_cost(benchmark, preset, slots):
    """Exact mode's (<= 16 slots: it is slow) and the paged cache's throughput relative to the
    default engine, and the KV memory each held."""
    cfg = ModelConfig.preset(preset)
    params = nnx.split(init_model(cfg, seed=0))[1]
    fast, e_fast = engine_rate(cfg, params, slots, uid0=3)
    paged, e_paged = benchmark.pedantic(
        lambda: engine_rate(cfg, params, slots, uid0=3, paged=True), rounds=1, iterations=1
    )
    info = dict(fast_tokens_per_s=round(fast), paged_over_fast=round(paged / fast, 3))
    if slots <= 16:
        exact, _ = engine_rate(cfg, params, slots, uid0=3, repeats=1, exact=True)
        info["exact_over_fast"] = round(exact / fast, 3)
    mem_c, mem_p = e_fast.memory_stats(), e_paged.memory_stats()
    info["kv_contiguous_mb"] = round(mem_c["allocated"] / 2**20, 1)
    info["kv_paged_peak_used_mb"] = round(mem_p["peak_used"] / 2**20, 1)
    benchmark.extra_info.update(info)
    print(f"\n[exact/paged {preset} slots={slots}] {info}")
