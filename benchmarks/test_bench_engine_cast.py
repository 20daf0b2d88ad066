"""Benchmark: what it costs that the engine holds its cast weights only while work is in flight
(docs/engine.md, "Memory between calls"), each figure against a baseline in the same run.

  cast      seconds of one cast of Qwen2.5-0.5B-shaped float32 weights (zeros) for a bf16
            engine (`minirl.inference.decoding.cast_params`: what each `generate` pays), median
            of 5 after one that compiles, beside the same weights' one float32 read (a sum)
  generate  `Engine.generate` of 8 prompts x 8 samples x 64 new tokens on the 25M shape of
            benchmarks/trl_side_by_side.py, bf16, random weights: JAX weights kept as given
            (cast at each `generate`) ÷ numpy weights cast at the load, 7 alternating rounds,
            the median of the per-round ratios
  head      the compiled decode's and prefill's scratch (`memory_analysis()`) at the
            Qwen2.5-0.5B shape, bf16 over a float32 embedding, 8 slots: the tied head laid out
            once per work (`decoding.work_params`, the model run untied) ÷ read from the
            embedding at every call (the tied model); shapes only, nothing runs

Run: `python -m pytest benchmarks/test_bench_engine_cast.py -q -s` (~2 min, ~4 GB). Nothing
about time is asserted: each row prints its figures and their ratio.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from minirl.inference import decoding
from minirl.inference.cache_layout import ContiguousLayout
from minirl.inference.decoding import cast_params
from minirl.inference.engine import Engine, EngineConfig, Request
from minirl.modeling.model import abstract_model, init_model
from minirl.modeling.model_config import PRESETS
from minirl.types import Prompt

SHAPE_25M = dataclasses.replace(PRESETS["small"], vocab_size=320, max_seq_len=256)  # the 25M work


def _seconds(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        out.append(time.perf_counter() - t0)
    return out


def test_cast_seconds_at_the_half_billion_shape():
    cfg = dataclasses.replace(PRESETS["qwen2.5-0.5b"], dtype="float32", param_dtype="float32")
    params = jax.tree.map(lambda t: jnp.zeros(t.shape, jnp.float32), abstract_model(cfg)[1])
    bf16 = dataclasses.replace(cfg, dtype="bfloat16", param_dtype="bfloat16")
    cast = _seconds(lambda: cast_params(params, bf16), 6)[1:]
    total = jax.jit(lambda p: sum(jnp.sum(x) for x in jax.tree.leaves(p)))
    read = _seconds(lambda: total(params), 6)[1:]
    n = sum(x.size for x in jax.tree.leaves(params))
    print(
        f"\ncast of {n / 1e6:.0f}M float32 weights to bf16: median {np.median(cast):.3f} s "
        f"(runs {', '.join(f'{t:.3f}' for t in cast)}); one float32 read {np.median(read):.3f} s; "
        f"ratio {np.median(cast) / np.median(read):.2f}x"
    )


def test_generate_with_weights_kept_against_cast_at_the_load():
    params = jax.jit(lambda: nnx.to_pure_dict(nnx.split(init_model(SHAPE_25M, seed=0))[1]))()
    config = EngineConfig(
        slots=64, cache_len=128, prefill_buckets=(64,), temperature=1.0, dtype="bfloat16"
    )
    rng = np.random.default_rng(0)
    prompts = [Prompt(i, "t", "", rng.integers(3, 300, 40).astype(np.int32)) for i in range(8)]
    requests = [Request(p, s, 64) for p in prompts for s in range(8)]
    kept, at_load = Engine(SHAPE_25M, config), Engine(SHAPE_25M, config)
    kept.load_weights(0, params)
    at_load.load_weights(0, jax.tree.map(np.asarray, params))
    for engine in (kept, at_load):
        engine.generate(requests)  # compiles
    times = {"kept": [], "at_load": []}
    for r in range(7):
        order = (("kept", kept), ("at_load", at_load))
        for name, engine in order if r % 2 else order[::-1]:
            times[name] += _seconds(lambda e=engine: e.generate(requests), 1)
    ratios = [a / b for a, b in zip(times["kept"], times["at_load"], strict=True)]
    print(
        f"\ngenerate, weights kept (cast per call) / cast at the load: median "
        f"{np.median(ratios):.3f} (rounds {', '.join(f'{x:.2f}' for x in ratios)}); "
        f"medians {np.median(times['kept']):.3f} s / {np.median(times['at_load']):.3f} s"
    )


def test_scratch_with_the_tied_head_laid_out_against_read_at_every_call():
    cfg = dataclasses.replace(PRESETS["qwen2.5-0.5b"], dtype="bfloat16", param_dtype="bfloat16")
    engine_cfg = EngineConfig(slots=8, cache_len=256, dtype="bfloat16")
    shapes = jax.eval_shape(lambda p: decoding.work_params(p, cfg), abstract_model(cfg)[1])
    shapes["embed"] = jax.ShapeDtypeStruct(shapes["embed"].shape, jnp.float32)  # the trainer's
    tied = {k: v for k, v in shapes.items() if k != "lm_head"}
    cache = jax.eval_shape(ContiguousLayout(cfg, engine_cfg).empty)
    slots, ids = np.zeros(8, np.int32), np.zeros((8, 3), np.uint32)
    prompts = (np.zeros((4, 64), np.int32), np.ones(4, np.int32), slots, np.arange(8))
    scratch = {}
    untied = dataclasses.replace(cfg, tie_embeddings=False)  # what a bf16 engine runs
    for name, model, params in (("laid out", untied, shapes), ("tied", cfg, tied)):
        fns = decoding.compiled(decoding.Settings(model, engine_cfg.sampling, 8, ContiguousLayout))
        decode = fns.decode.lower(
            params, cache, slots, slots, ids, slots + 8, np.uint32(0), width=128
        )
        prefill = fns.prefill.lower(params, cache, *prompts, ids, slots, np.uint32(0))
        scratch[name] = [
            f.compile().memory_analysis().temp_size_in_bytes / 1e9 for f in (decode, prefill)
        ]
    (d, p), (d0, p0) = scratch["laid out"], scratch["tied"]
    print(
        f"\nscratch, tied head laid out / read at every call: decode {d:.3f} / {d0:.3f} GB "
        f"({d / d0:.3f}x), prefill {p:.3f} / {p0:.3f} GB ({p / p0:.3f}x)"
    )
