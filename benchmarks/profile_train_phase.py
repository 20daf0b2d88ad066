"""Where the train phase of issue #40's work goes: minirl's parts next to torch's at one shape.

    python benchmarks/trl_side_by_side.py --size 25m --rounds 0 --dir /tmp/work   # files only
    python benchmarks/profile_train_phase.py /tmp/work [--rows 32 --length 128]

On the Hugging Face directory DIR/model (the side-by-side benchmark's 25M Qwen2), at one
micro-batch shape [rows, length], both in this process one after the other, best of 2 after a
warm-up: float32 [2048, 2048] matmul rate (XLA, torch); forward + backward of the summed target
log-probs and the forward alone (minirl's `logprobs` under `jax.jit`; transformers'
model in eager torch with `torch.set_num_threads(2)`); an AdamW update of every parameter
(minirl's compiled update, the accumulator copy it donates included; `torch.optim.AdamW`); and
copying the gradient tree, the order of the step's own host/device traffic. Prints one JSON line.
Run torch with OMP_WAIT_POLICY=PASSIVE on a shared machine (BENCHMARKING practice).
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def _best(fn, n: int = 2) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return min(times)


def profile_minirl(cfg, params, tokens, targets) -> dict:
    from minirl.modeling.sampling import Sampling
    from minirl.training import optimizer
    from minirl.training.forward import ForwardSpec, logprobs

    spec = ForwardSpec(cfg, Sampling(), "none")
    logp = lambda p, a, b: logprobs(spec, p, a, b, remat=False)
    grad = jax.jit(jax.grad(lambda p, a, b: logp(p, a, b).sum()))
    forward = jax.jit(logp)
    init, apply = optimizer.compiled(optimizer.AdamW(0.9, 0.95, 1e-8, 0.0, 1.0))[:2]
    state, zeros = [init(params)], jax.tree.map(jnp.zeros_like, params)

    def update():
        acc = (jax.tree.map(jnp.copy, zeros), jnp.float32(0))
        out = apply(acc, state[0], params, jnp.float32(1.0), jnp.float32(1e-5))
        state[0] = out[1]
        return out[0]

    a = jnp.ones((2048, 2048), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    return {
        "matmul_gflops": 2 * 2048**3 / _best(lambda: matmul(a)) / 1e9,
        "grad_s": _best(lambda: grad(params, tokens, targets)),
        "forward_s": _best(lambda: forward(params, tokens, targets)),
        "adamw_s": _best(update),
        "grad_tree_copy_s": _best(lambda: jax.tree.map(jnp.copy, zeros)),
    }


def profile_torch(path, tokens, targets) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    x, y = torch.tensor(tokens, dtype=torch.long), torch.tensor(targets, dtype=torch.long)
    logp = lambda: torch.log_softmax(model(x).logits.float(), -1).gather(-1, y[..., None])

    def forward():
        with torch.no_grad():
            logp()

    adamw = torch.optim.AdamW(model.parameters(), lr=1e-5)
    a = torch.ones(2048, 2048)
    return {
        "matmul_gflops": 2 * 2048**3 / _best(lambda: a @ a) / 1e9,
        "grad_s": _best(lambda: logp().sum().backward()),
        "forward_s": _best(forward),
        "adamw_s": _best(adamw.step),
    }


def main(argv=None) -> int:
    from minirl.hf.model_files import load_hf

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", help="the side-by-side workload directory (DIR/model)")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--length", type=int, default=128)
    args = p.parse_args(argv)
    cfg, model = load_hf(f"{args.dir}/model")
    params = jax.tree.map(jnp.asarray, nnx.to_pure_dict(nnx.split(model)[1]))
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, cfg.vocab_size - 10, (args.rows, args.length)).astype(np.int32)
    targets = np.roll(tokens, -1, axis=1)
    out = {
        "shape": [args.rows, args.length],
        "minirl": profile_minirl(cfg, params, tokens, targets),
        "torch": profile_torch(f"{args.dir}/model", tokens, targets),
    }
    print(json.dumps(out, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
