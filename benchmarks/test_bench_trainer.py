"""Benchmark: the trainer's train step against the float32 matmul peak measured in the same run.

Run (about two minutes on a quiet machine, plus ~1 minute of compiles; 5 to 15 minutes on a busy one):
    python -m pytest benchmarks/test_bench_trainer.py -q -s

Model: the `small` preset (~25M parameters: D=512, L=8, H=8, K=4, F=1536, V=512). Batch: 8 rows
x 256 positions (2048 tokens, one micro-batch at the default token budget), loss "dapo" (no KL
term, so no reference forward inside the step).

Each of `ROUNDS` rounds times, back to back (the machine is shared; its state changes, so every
ratio is taken within a round and the median over rounds is reported):

  peak        best of 3 jitted [2048, 2048] @ [2048, 2048] float32 matmuls, before and after the
              round's timings (the larger is used: a conservative fraction)
  sustained   a chain of the same matmuls with the step's FLOP count in one jitted call: as long
              as the step, so exposed to the same contention when the machine is busy
  raw grad    jax.grad of the plain model's summed token log-probs, jitted — the floor for the
              step (same forward/backward, no loss, no optimizer, no trainer code)
  step        `trainer.train_step(batch, prox_logp)` as the controller calls it (log pi_prox
              recomputed beforehand): forward + backward + loss + AdamW update, for each remat
              policy ("none", "dots", "nothing")
  recompute   `trainer.recompute_logprobs(batch)`: forward only

FLOP counts (docs/benchmarking.md): a training step = tokens x (6 x non-embedding params + 12 L D T);
a forward = tokens x (2 x non-embedding params + 4 L D T). The LM head, norms, softmaxes and the
optimizer are not counted, so the fractions understate the work done.

Printed (and stored in extra_info): step fraction of peak (target >= 0.40), recompute fraction
of peak, step time / raw-grad time (the trainer's own overhead), and each remat policy's time
relative to "none". Nothing about time is asserted.

Also printed, as a second opinion on a shared machine: the step's CPU-time fraction, i.e. its
FLOPs per CPU-second of this process over the peak matmul's FLOPs per CPU-second. Other jobs
stretch wall-clock time but hardly the CPU time a computation needs, so this number moves less
with the load; it says nothing about how well the step keeps both cores busy (the wall-clock
fraction does), so it is an upper bound for the headline number on a quiet machine.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from minirl.losses import get_preset
from minirl.modeling.model import ModelConfig, init_model, token_logprobs
from minirl.training.trainer import Trainer, TrainerConfig
from minirl.types import Batch

ROUNDS = 5
ROWS, LENGTH, PROMPT = 8, 256, 32
REMATS = ("none", "dots", "nothing")


def _time(fn) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def _cpu_time(fn) -> float:
    """CPU seconds of this process (all its threads) spent in `fn()`."""
    t0 = time.process_time()
    jax.block_until_ready(fn())
    return time.process_time() - t0


def matmul_peak(n: int = 2048, repeats: int = 3, clock=_time) -> float:
    """Best float32 matmul FLOP/s of a jitted [n, n] @ [n, n] (per CPU-second with
    clock=_cpu_time)."""
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n), np.float32))
    _matmul(a, a).block_until_ready()
    return 2 * n**3 / min(clock(lambda: _matmul(a, a)) for _ in range(repeats))


_matmul = jax.jit(lambda x, y: x @ y)


@jax.jit
def _matmul_chain(x, w, count):
    """`count` dependent [n, n] @ [n, n] matmuls in one call (rescaled to stay finite)."""
    return jax.lax.fori_loop(0, count, lambda i, x: (x @ w) * (1.0 / x.shape[0]), x)


def sustained_matmul_rate(flops: float, n: int = 2048) -> float:
    """FLOP/s of a matmul-only workload with about `flops` FLOPs (so about as long as the step
    it is compared with, and exposed to the same contention on a shared machine)."""
    a = jnp.asarray(np.random.default_rng(1).standard_normal((n, n), np.float32))
    count = max(1, round(flops / (2 * n**3)))
    _matmul_chain(a, a, 1).block_until_ready()
    return count * 2 * n**3 / _time(lambda: _matmul_chain(a, a, count))


def random_batch(cfg: ModelConfig, rows: int = ROWS, length: int = LENGTH, seed: int = 0) -> Batch:
    """`rows` rows of `length` positions: a PROMPT-token prompt, the rest completion; groups of 4."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, cfg.vocab_size, (rows, length)).astype(np.int32)
    targets = np.roll(tokens, -1, axis=1)
    mask = np.zeros((rows, length), np.float32)
    mask[:, PROMPT - 1 :] = 1.0
    behaviour = np.where(
        mask > 0, -np.log(cfg.vocab_size) + 0.1 * rng.standard_normal((rows, length)), 0.0
    )
    groups = np.repeat(np.arange(rows // 4), 4)
    return Batch(
        tokens,
        targets,
        mask,
        behaviour.astype(np.float32),
        np.zeros((rows, length), np.int32),
        rng.standard_normal(rows).astype(np.float32),
        groups.astype(np.int32),
        groups.astype(np.int64),
    )


def step_flops(cfg: ModelConfig, tokens: int, length: int) -> float:
    return tokens * (6 * cfg.num_params(embeddings=False) + 12 * cfg.num_layers * cfg.dim * length)


def forward_flops(cfg: ModelConfig, tokens: int, length: int) -> float:
    return tokens * (2 * cfg.num_params(embeddings=False) + 4 * cfg.num_layers * cfg.dim * length)


@pytest.fixture(scope="module")
def setup():
    cfg = ModelConfig.preset("small")
    params = nnx.to_pure_dict(nnx.split(init_model(cfg, seed=0))[1])
    return cfg, params, random_batch(cfg)


def test_train_step_fraction_of_matmul_peak(benchmark, setup):
    cfg, params, batch = setup
    tokens, targets = jnp.asarray(batch.tokens), jnp.asarray(batch.targets)
    abstract = nnx.split(nnx.eval_shape(lambda: init_model(cfg)))[0]

    @jax.jit
    def raw_grad(p):
        return jax.grad(lambda q: token_logprobs(nnx.merge(abstract, q)(tokens), targets).sum())(p)

    trainers = {}
    for remat in REMATS:
        trainer = Trainer(cfg, params, get_preset("dapo"), TrainerConfig(remat=remat))
        prox = trainer.recompute_logprobs(batch)
        trainer.train_step(batch, prox)  # compile
        trainers[remat] = (trainer, prox)
    raw_grad(params)  # compile

    n_tok = batch.tokens.size
    rows = []
    for _ in range(ROUNDS):
        peak, cpu_peak = matmul_peak(), matmul_peak(clock=_cpu_time)
        t = {
            remat: _time(lambda tr=tr, p=p: tr.train_step(batch, p))
            for remat, (tr, p) in trainers.items()
        }
        step_cpu = _cpu_time(lambda: trainers["none"][0].train_step(batch, trainers["none"][1]))
        t["raw"] = _time(lambda: raw_grad(params))
        t["recompute"] = _time(lambda: trainers["none"][0].recompute_logprobs(batch))
        sustained = sustained_matmul_rate(step_flops(cfg, n_tok, LENGTH))
        peak = max(peak, matmul_peak())
        rows.append(
            {
                "peak_gflops": peak / 1e9,
                "step_s": t["none"],
                "step_fraction": step_flops(cfg, n_tok, LENGTH) / t["none"] / peak,
                "step_fraction_of_sustained": step_flops(cfg, n_tok, LENGTH)
                / t["none"]
                / sustained,
                "step_cpu_fraction": step_flops(cfg, n_tok, LENGTH) / step_cpu / cpu_peak,
                "raw_grad_fraction": step_flops(cfg, n_tok, LENGTH) / t["raw"] / peak,
                "recompute_fraction": forward_flops(cfg, n_tok, LENGTH) / t["recompute"] / peak,
                "step_over_raw_grad": t["none"] / t["raw"],
                "remat_dots_ratio": t["dots"] / t["none"],
                "remat_nothing_ratio": t["nothing"] / t["none"],
            }
        )
        print("\nround: " + "  ".join(f"{k} {v:.2f}" for k, v in rows[-1].items()), end="")
    median = {k: float(np.median([r[k] for r in rows])) for k in rows[0]}
    median["load_average"] = os.getloadavg()[0]
    best = max(r["step_fraction"] for r in rows)
    benchmark.extra_info.update(median, step_fraction_best=best)
    print(f"\n\n{n_tok} tokens/step, small preset, medians over {ROUNDS} rounds:")
    print(
        f"  train step  {median['step_s']:.2f} s = {median['step_fraction']:.2f} of the float32 matmul peak "
        f"({median['peak_gflops']:.0f} GFLOP/s; best round {best:.2f}; target >= 0.40)"
    )
    print(
        f"  CPU-time fraction (FLOPs per CPU-second vs the matmul's): "
        f"{median['step_cpu_fraction']:.2f}; load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"  raw jax.grad of the model: {median['raw_grad_fraction']:.2f} of peak; "
        f"step / raw grad = {median['step_over_raw_grad']:.2f}x"
    )
    print(f"  recompute (forward): {median['recompute_fraction']:.2f} of peak")
    print(
        f"  remat time vs none: dots {median['remat_dots_ratio']:.2f}x, nothing {median['remat_nothing_ratio']:.2f}x"
    )
    trainer, prox = trainers["none"]
    benchmark.pedantic(lambda: trainer.train_step(batch, prox), rounds=1, iterations=1)
