"""The roofline of a decode step and a prefill, from rates measured in the same run (issue #20).

A step cannot be faster than the larger of two times:

    memory time   bytes it must move / the same-run copy rate (a jitted copy of a 1 GiB array:
                  read + write bytes per second)
    compute time  its FLOPs / the same-run matmul rate AT ITS SHAPE: a jitted chain of the
                  model's own matmuls (q, k, v, o, gate, up, down per layer, then the LM head)
                  on an [M, D] activation, M = the rows the step feeds (slots for decode, rows x
                  T for a prefill), fresh weights of the same dtype

    limit = max(memory time, compute time)        efficiency = limit / measured time (<= 1)

Bytes of a decode step: every weight matrix once (the embedding table only for the rows looked
up; the LM head whole) + the KV cache read over the context + written for the new position.
FLOPs of a decode step: slots x (2 x (non-embedding params + V x D) + 4 x L x H x Dh x context).
A prefill of R rows x T tokens: R T x 2 x (non-embedding params) + the LM head on R rows + the
attention, and the weights once. Nothing here times the engine: that is the benchmark's job.
The byte and FLOP counts are the simulator's (minirl/sim/costs.py): one cost model for both.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from minirl.model import ModelConfig
from minirl.sim.costs import attention_flops, kv_bytes, matrices, weight_bytes


def best_time(fn, repeats: int = 3) -> float:
    """Best wall time of `fn()` (results blocked on) over `repeats` calls, after one warm-up."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return min(times)


def copy_rate(nbytes: int = 2**30, repeats: int = 3) -> float:
    """Bytes moved per second (read + write) by a jitted in-place update of an `nbytes` array
    (donated: no fresh output pages to fault in, so it measures memory traffic alone)."""
    bump = jax.jit(lambda a: a + 1.0, donate_argnums=0)
    x = bump(jnp.zeros(nbytes // 4, jnp.float32)).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        x = bump(x).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def matmul_chain_time(cfg: ModelConfig, rows: int, dtype, head: bool = True) -> tuple[float, float]:
    """(seconds, FLOPs) of the model's matmuls (with the LM head, or without: `head`) on an
    [rows, D] activation, all in one jitted call: the hardware's rate for exactly these shapes."""
    rng = np.random.default_rng(0)
    shapes = matrices(cfg) if head else matrices(cfg)[:-1]
    weights = [jnp.asarray(rng.standard_normal(s, np.float32) * 0.02, dtype) for s in shapes]
    x = jnp.asarray(rng.standard_normal((rows, cfg.dim), np.float32), dtype)

    @jax.jit
    def chain(h, weights):
        keep = jnp.zeros((), jnp.float32)  # k and v stay live through this
        for layer in range(cfg.num_layers):
            wq, wk, wv, wo, wg, wu, wd = weights[7 * layer : 7 * layer + 7]
            keep = keep + (h @ wk).sum() + (h @ wv).sum()
            h = h + (h @ wq) @ wo
            h = h + ((h @ wg) * (h @ wu)) @ wd
        return (h @ weights[-1]).sum() + keep if head else h.sum() + keep

    flops = 2.0 * rows * sum(a * b for a, b in shapes)
    return best_time(lambda: chain(x, weights)), flops


def decode_limit(cfg: ModelConfig, slots: int, context: float, copy: float, dtype) -> dict:
    """The roofline of one decode step of `slots` rows at mean `context` positions (`copy`:
    the same-run copy rate, bytes/s)."""
    item = jnp.dtype(dtype).itemsize
    chain_s, chain_flops = matmul_chain_time(cfg, slots, dtype)
    flops = chain_flops + attention_flops(cfg, slots, context)
    moved = weight_bytes(cfg, item, slots) + kv_bytes(cfg, slots * (context + 1), item)
    return _limit(moved / copy, chain_s, chain_flops, flops)


def prefill_limit(cfg: ModelConfig, rows: int, length: int, copy: float, dtype) -> dict:
    """The roofline of one prefill of `rows` x `length` tokens (the LM head on the last only)."""
    item = jnp.dtype(dtype).itemsize
    chain_s, chain_flops = matmul_chain_time(cfg, rows * length, dtype, head=False)
    head_flops = 2.0 * rows * cfg.dim * cfg.vocab_size
    flops = chain_flops + head_flops + attention_flops(cfg, rows * length, length / 2)
    moved = weight_bytes(cfg, item, rows * length) + kv_bytes(cfg, rows * length, item)
    return _limit(moved / copy, chain_s, chain_flops, flops)


def _limit(memory_s: float, chain_s: float, chain_flops: float, flops: float) -> dict:
    """The larger of the memory time and `flops` at the chain's own rate for this shape."""
    compute_s = chain_s * flops / chain_flops
    return {
        "memory_s": memory_s,
        "compute_s": compute_s,
        "limit_s": max(memory_s, compute_s),
        "bound": "memory" if memory_s >= compute_s else "compute",
        "chain_gflops": chain_flops / chain_s / 1e9,
    }
