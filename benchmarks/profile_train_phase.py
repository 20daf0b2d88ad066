"""Where the train phase of issue #40's work goes: minirl's parts next to torch's at one shape,
in float32 and in bf16 mixed precision, interleaved in one process.

    python benchmarks/trl_side_by_side.py --size 25m --rounds 0 --dir /tmp/work   # files only
    python benchmarks/profile_train_phase.py /tmp/work [--rows 32 --length 128 --rounds 3]

On the Hugging Face directory DIR/model (the side-by-side benchmark's 25M Qwen2), at one
micro-batch shape [rows, length]: float32 [2048, 2048] matmul rates (XLA, torch; bf16 too);
forward + backward of the summed target log-probs and the forward alone, for

  minirl f32    `logprobs` under `jax.jit`, model.dtype float32
  minirl bf16   the same with model.dtype bfloat16 over float32 weights (bf16 matmuls with
                float32 sums, float32 log-softmax; the gradient is float32)
  torch f32     transformers' model in eager torch, `torch.set_num_threads(2)`
  torch bf16    the same under `torch.autocast("cpu", torch.bfloat16)` (TRL's `bf16=True`)

each timed once per round, the rounds alternating the order, the median of the rounds kept;
and an AdamW update of every parameter (minirl's compiled update with the accumulator copy it
donates; `torch.optim.AdamW`). Prints one JSON line. torch runs in its users' default
environment (no OMP_WAIT_POLICY): set it yourself to see its effect.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def _time(fn) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def minirl_parts(cfg, params, tokens, targets) -> dict:
    """name -> a callable that runs the part once (compiled on the first call)."""
    from minirl.modeling.sampling import Sampling
    from minirl.training import optimizer
    from minirl.training.forward import ForwardSpec, logprobs

    parts = {}
    for dtype in ("float32", "bfloat16"):
        spec = ForwardSpec(dataclasses.replace(cfg, dtype=dtype), Sampling(), "none")
        logp = lambda p, a, b, spec=spec: logprobs(spec, p, a, b, remat=True)
        grad = jax.jit(jax.grad(lambda p, a, b, logp=logp: logp(p, a, b).sum()))
        forward = jax.jit(logp)
        name = "f32" if dtype == "float32" else "bf16"
        parts[f"minirl {name} grad"] = lambda g=grad: g(params, tokens, targets)
        parts[f"minirl {name} forward"] = lambda f=forward: f(params, tokens, targets)
    init, apply = optimizer.compiled(optimizer.AdamW(0.9, 0.95, 1e-8, 0.0, 1.0))[:2]
    state, zeros = [init(params)], jax.tree.map(jnp.zeros_like, params)

    def update():
        acc = (jax.tree.map(jnp.copy, zeros), jnp.float32(0))
        out = apply(acc, state[0], params, jnp.float32(1.0), jnp.float32(1e-5))
        state[0] = out[1]
        return out[0]

    parts["minirl adamw"] = update
    for name, dtype in (("f32", jnp.float32), ("bf16", jnp.bfloat16)):
        a = jnp.ones((2048, 2048), dtype)
        mm = jax.jit(lambda x: jnp.dot(x, x, preferred_element_type=jnp.float32))
        parts[f"xla {name} matmul"] = lambda mm=mm, a=a: mm(a)
    return parts


def torch_parts(path, tokens, targets) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    x, y = torch.tensor(tokens, dtype=torch.long), torch.tensor(targets, dtype=torch.long)
    logp = lambda: torch.log_softmax(model(x).logits.float(), -1).gather(-1, y[..., None])

    def grad(bf16: bool):
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            out = logp().sum()
        out.backward()

    def forward(bf16: bool):
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            logp()

    adamw = torch.optim.AdamW(model.parameters(), lr=1e-5)
    a32, a16 = torch.ones(2048, 2048), torch.ones(2048, 2048, dtype=torch.bfloat16)
    return {
        "torch f32 grad": lambda: grad(False),
        "torch bf16 grad": lambda: grad(True),
        "torch f32 forward": lambda: forward(False),
        "torch bf16 forward": lambda: forward(True),
        "torch adamw": adamw.step,
        "torch f32 matmul": lambda: a32 @ a32,
        "torch bf16 matmul": lambda: a16 @ a16,
    }


def profile(parts: dict, rounds: int) -> dict:
    """Each part once per round after a warm-up, the order reversed every other round; the
    median seconds per part (matmuls: GFLOP/s)."""
    for fn in parts.values():
        _time(fn)
    times = {name: [] for name in parts}
    for r in range(rounds):
        for name in list(parts)[:: 1 if r % 2 == 0 else -1]:
            times[name].append(_time(parts[name]))
    out = {}
    for name, ts in times.items():
        s = statistics.median(ts)
        out[name] = 2 * 2048**3 / s / 1e9 if name.endswith("matmul") else s
    return out


def main(argv=None) -> int:
    from minirl.hf.model_files import load_hf

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="the side-by-side workload directory (DIR/model)")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-torch", action="store_true", help="minirl's parts only")
    args = p.parse_args(argv)
    cfg, model = load_hf(f"{args.dir}/model")
    params = jax.tree.map(jnp.asarray, nnx.to_pure_dict(nnx.split(model)[1]))
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, cfg.vocab_size - 10, (args.rows, args.length)).astype(np.int32)
    targets = np.roll(tokens, -1, axis=1)
    parts = minirl_parts(cfg, params, tokens, targets)
    if not args.no_torch:
        parts |= torch_parts(f"{args.dir}/model", tokens, targets)
    out = {"shape": [args.rows, args.length], **profile(parts, args.rounds)}
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
