"""The roofline of a decode step and a prefill, from rates measured in the same run (issue #20).

A step cannot be faster than the larger of two times:

    memory time   bytes it must move / the same-run copy rate (a jitted copy of a 1 GiB array:
                  read + write bytes per second)
    compute time  its FLOPs / the same-run matmul rate AT ITS SHAPE: a jitted chain of the
                  model's own matmuls (q, k, v, o, gate, up, down per layer, then the LM head)
                  on an [M, D] activation, M = the rows the step feeds (slots for decode, rows x
                  T for a prefill), fresh weights in the model's compute dtype (the dtype its
                  matmuls run in; a bfloat16-stored model casts its weights to it)

    limit = max(memory time, compute time)        efficiency = limit / measured time (<= 1)

Bytes of a decode step: every weight matrix once (the embedding table only for the rows looked
up; the LM head whole) + the KV cache read over the context + written for the new position.
FLOPs of a decode step: slots x (2 x (non-embedding params + V x D) + 4 x L x H x Dh x context).
A prefill of R rows x T tokens: R T x 2 x (non-embedding params) + the LM head on R rows + the
attention, and the weights once. Weights count at the storage dtype's size, the KV cache at the
compute dtype's (the cache is kept in it). Nothing here times the engine: that is the benchmark's job.
The byte and FLOP counts are the simulator's (minirl/sim/costs.py): one cost model for both.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from minirl.inference.engine import Engine, EngineConfig, Request
from minirl.losses import get_preset
from minirl.modeling.model import ModelConfig, token_logprobs
from minirl.modeling.sampling import Sampling, sample_tokens
from minirl.sim.costs import attention_flops, kv_bytes, matrices, weight_bytes
from minirl.training.batching import make_batch
from minirl.training.trainer import Trainer, TrainerConfig
from minirl.types import Prompt, Rollout, Score


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


def matmul_rate(n: int, dtype, repeats: int = 3) -> float:
    """Best FLOP/s of a jitted [n, n] @ [n, n] matmul in `dtype`: the device's peak for the
    dtype as this run sees it (a large square product; accumulation in the dtype's default)."""
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n), np.float32), dtype)
    return 2.0 * n**3 / best_time(lambda: _square(a), repeats)


@jax.jit
def _square(a):
    return a @ a


def matmul_chain_time(cfg: ModelConfig, rows: int, head: bool = True) -> tuple[float, float]:
    """(seconds, FLOPs) of the model's matmuls (with the LM head, or without: `head`) on an
    [rows, D] activation, all in one jitted call: the hardware's rate for exactly these shapes.
    Weights and activation in `cfg`'s compute dtype."""
    rng = np.random.default_rng(0)
    shapes = matrices(cfg) if head else matrices(cfg)[:-1]
    dtype = cfg.compute_dtype
    weights = [jnp.asarray(rng.standard_normal(s, np.float32) * 0.02, dtype) for s in shapes]
    x = jnp.asarray(rng.standard_normal((rows, cfg.dim), np.float32), dtype)
    flops = 2.0 * rows * sum(a * b for a, b in shapes)
    return best_time(lambda: _chain(x, weights)), flops


@jax.jit
def _chain(h, weights):
    """q, k, v, o, gate, up, down per layer (7 matrices each), then the LM head if there is one
    more matrix. One jit for every call: the same shapes compile once (the limits are measured
    before and after each benchmark row)."""
    layers, head = divmod(len(weights), 7)
    keep = jnp.zeros((), jnp.float32)  # k and v stay live through this
    for layer in range(layers):
        wq, wk, wv, wo, wg, wu, wd = weights[7 * layer : 7 * layer + 7]
        keep = keep + (h @ wk).sum() + (h @ wv).sum()
        h = h + (h @ wq) @ wo
        h = h + ((h @ wg) * (h @ wu)) @ wd
    return (h @ weights[-1]).sum() + keep if head else h.sum() + keep


def _items(cfg: ModelConfig) -> tuple[int, int]:
    """Bytes per weight (storage dtype) and per cached key/value (compute dtype)."""
    return jnp.dtype(cfg.storage_dtype).itemsize, jnp.dtype(cfg.compute_dtype).itemsize


def decode_limit(cfg: ModelConfig, slots: int, context: float, copy: float) -> dict:
    """The roofline of one decode step of `slots` rows at mean `context` positions (`copy`:
    the same-run copy rate, bytes/s)."""
    weight, kv = _items(cfg)
    chain_s, chain_flops = matmul_chain_time(cfg, slots)
    flops = chain_flops + attention_flops(cfg, slots, context)
    moved = weight_bytes(cfg, weight, slots) + kv_bytes(cfg, slots * (context + 1), kv)
    return _limit(moved / copy, chain_s, chain_flops, flops)


def prefill_limit(cfg: ModelConfig, rows: int, length: int, copy: float) -> dict:
    """The roofline of one prefill of `rows` x `length` tokens (the LM head on the last only)."""
    weight, kv = _items(cfg)
    chain_s, chain_flops = matmul_chain_time(cfg, rows * length, head=False)
    head_flops = 2.0 * rows * cfg.dim * cfg.vocab_size
    flops = chain_flops + head_flops + attention_flops(cfg, rows * length, length / 2)
    moved = weight_bytes(cfg, weight, rows * length) + kv_bytes(cfg, rows * length, kv)
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


def train_limit(cfg: ModelConfig, rows: int, length: int, copy: float) -> dict:
    """The roofline of one RL train step on `rows` x `length` tokens (one micro-batch): four
    forward-equivalents of FLOPs (the recompute of log pi_prox, the training forward, a backward
    of twice its cost) at the chain's rate for M = rows x length, then the AdamW update, which
    reads parameters, gradients and both moments and writes three of them (7 x the fp32
    parameter bytes) at the copy rate. The two phases run one after the other: the limit is
    their sum."""
    chain_s, chain_flops = matmul_chain_time(cfg, rows * length)
    forward = chain_flops + attention_flops(cfg, rows * length, length / 2)
    compute_s = chain_s * 4 * forward / chain_flops
    update_s = 7 * 4 * cfg.num_params() / copy
    return {
        "compute_s": compute_s,
        "update_s": update_s,
        "limit_s": compute_s + update_s,
        "flops": 4 * forward,
        "chain_gflops": chain_flops / chain_s / 1e9,
    }


def grpo_trainer(cfg: ModelConfig, params) -> Trainer:
    """The trainer the train-step rows time: GRPO, learning rate 1e-6, the default settings."""
    return Trainer(cfg, params, get_preset("grpo"), TrainerConfig(learning_rate=1e-6))


def train_batch(rows: int, length: int, seed: int = 0, vocab: int = 300):
    """A GRPO batch of `rows` rollouts of `length` tokens (16 of prompt), rewards 0 and 1; token
    ids in [3, min(300, vocab))."""
    rng = np.random.default_rng(seed)
    high = min(300, vocab)
    out = []
    for i in range(rows):
        prompt = Prompt(i // 2, "b", "", rng.integers(3, high, 16).astype(np.int32))
        c = length - 16
        tokens = rng.integers(3, high, c).astype(np.int32)
        behaviour = np.full(c, -1.0, np.float32)
        out.append(
            Rollout(
                prompt,
                i % 2,
                tokens,
                behaviour,
                np.zeros(c, np.int32),
                "length",
                score=Score(float(i % 2)),
            )
        )
    return make_batch(out, 0)


PROMPT = 16  # tokens of every decode request's prompt (one prefill bucket)


def decode_engine(cfg: ModelConfig, slots: int, params) -> Engine:
    """The engine the decode rows time: cache_len 64, one prefill bucket of 16 tokens, up to 8
    rows per prefill call, chunks of 8 decode steps, temperature 1, no top-k/top-p."""
    config = EngineConfig(
        slots=slots,
        cache_len=64,
        prefill_buckets=(PROMPT,),
        prefill_rows=min(slots, 8),
        decode_chunk=8,
        temperature=1.0,
    )
    engine = Engine(cfg, config)
    engine.load_weights(0, params)
    return engine


def decode_requests(cfg: ModelConfig, slots: int, new: int, seed: int) -> list[Request]:
    """`slots` requests of `new` tokens each after a random 16-token prompt (no EOS)."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(3, min(cfg.vocab_size, 30_000), (slots, PROMPT)).astype(np.int32)
    return [Request(Prompt(seed * 1000 + i, "b", "", p), 0, new) for i, p in enumerate(prompts)]


SHORT, LONG = 8, 40  # new tokens of the two timed runs whose difference is the decode step
CONTEXT = PROMPT + (SHORT + LONG) / 2  # mean cache positions a steady decode step attends over


def generate_time(engine: Engine, cfg: ModelConfig, slots: int, new: int) -> float:
    """Best of two timed `engine.generate` runs of `slots` requests of `new` tokens after a
    warm-up (compiles excluded), fresh prompts each time."""
    engine.generate(decode_requests(cfg, slots, new, seed=new))
    times = []
    for r in range(2):
        reqs = decode_requests(cfg, slots, new, seed=100 * new + r)
        t0 = time.perf_counter()
        engine.generate(reqs)
        times.append(time.perf_counter() - t0)
    return min(times)


def decode_step_time(engine: Engine, cfg: ModelConfig, slots: int) -> float:
    """The steady decode step: (time of LONG new tokens - time of SHORT) / (LONG - SHORT). The
    prefill and the first chunk cancel; what is left is a step at a mean context of CONTEXT."""
    long, short = (generate_time(engine, cfg, slots, n) for n in (LONG, SHORT))
    return (long - short) / (LONG - SHORT)


def sampling_time(cfg: ModelConfig, slots: int) -> float:
    """sample_tokens + the behaviour log-prob on [slots, V] float32 logits, jitted."""
    logits = jnp.asarray(np.random.default_rng(0).standard_normal((slots, cfg.vocab_size)))
    keys = jax.random.split(jax.random.key(0), slots)
    s = Sampling(temperature=1.0)

    @jax.jit
    def sample(keys, logits):
        tok = sample_tokens(keys, logits, s)
        return tok, token_logprobs(logits[:, None], tok[:, None], s)[:, 0]

    return best_time(lambda: sample(keys, logits))
