"""Benchmark: what exact mode costs on a device mesh (issue #45), beside what it costs on one device.

    python -m pytest benchmarks/test_bench_exact_mesh.py -q -s     # ~3 min quiet, ~8 loaded

The measuring runs in a child process (this file run as a script) on 4 fake CPU devices
(`--xla_force_host_platform_device_count=4`, set before JAX starts), which share this machine's
cores. Model: the `tiny` preset (3.2M parameters), float32, random weights.

  decode  `Engine.generate` of 16 requests x 32 new tokens after 16-token prompts (16 slots,
          chunks of 8, temperature 1), best of 2 timed runs after a warm-up: tokens/s with
          exact=True over exact=False, on one device and with the weights on a tensor=4 mesh
          (`scale.mesh.tensor_parallel()`)
  train   `Trainer.train_step` (GRPO) on one batch of 16 rollouts x 64 tokens, best of 3 after a
          warm-up step: seconds per step, and steps/s exact over fast, on one device and on an
          fsdp=2,tensor=2 mesh
          (`fsdp()`, rows split over fsdp by `MeshRows`)

Each ratio is taken within the child, fast and exact interleaved per layout (BENCHMARKING rules);
`mesh_over_one_device` says what the fake mesh itself costs here (4 devices on 2 cores: < 1).
Nothing about time is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

SLOTS, NEW, ROWS, LENGTH = 16, 32, 16, 64


def _decode_rate(cfg, params, exact: bool) -> float:
    from roofline import PROMPT, decode_requests

    from minirl.inference.engine import Engine, EngineConfig

    config = EngineConfig(
        slots=SLOTS,
        cache_len=64,
        prefill_buckets=(PROMPT,),
        prefill_rows=8,
        decode_chunk=8,
        exact=exact,
    )
    engine = Engine(cfg, config)
    engine.load_weights(0, params)
    engine.generate(decode_requests(cfg, SLOTS, NEW, seed=1))  # compiles
    times = []
    for seed in (2, 3):
        requests = decode_requests(cfg, SLOTS, NEW, seed=seed)
        t0 = time.perf_counter()
        engine.generate(requests)
        times.append(time.perf_counter() - t0)
    return SLOTS * NEW / min(times)


def _train_rate(cfg, params, exact: bool, rows=None) -> float:
    from roofline import train_batch

    from minirl.losses import get_preset
    from minirl.modeling.sampling import Sampling
    from minirl.training.trainer import Trainer, TrainerConfig

    trainer = Trainer(
        cfg,
        params,
        get_preset("grpo"),
        TrainerConfig(learning_rate=1e-6, micro_batch_tokens=ROWS * LENGTH),
        row_layout=rows,
        sampling=Sampling(exact=exact),
    )
    batch = train_batch(ROWS, LENGTH, vocab=cfg.vocab_size)
    trainer.train_step(batch)  # compiles
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        trainer.train_step(batch)
        times.append(time.perf_counter() - t0)
    return 1.0 / min(times)


def measure() -> dict:
    """The child's work (4 fake devices already configured): every rate and ratio."""
    import jax
    import numpy as np
    from flax import nnx

    from minirl.modeling.model import ModelConfig, init_model
    from scale import mesh as mesh_lib

    cfg = ModelConfig.preset("tiny")
    params = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.split(init_model(cfg, seed=0))[1]))
    tp = mesh_lib.make_mesh(mesh_lib.MeshConfig(tensor=4))
    fs = mesh_lib.make_mesh(mesh_lib.MeshConfig(fsdp=2, tensor=2))
    layouts = {
        "decode": {
            "one device": lambda exact: _decode_rate(cfg, params, exact),
            "tensor=4": lambda exact: _decode_rate(
                cfg, mesh_lib.place_params(params, tp, mesh_lib.tensor_parallel()), exact
            ),
        },
        "train": {
            "one device": lambda exact: _train_rate(cfg, params, exact),
            "fsdp=2,tensor=2": lambda exact: _train_rate(
                cfg,
                mesh_lib.place_params(params, fs, mesh_lib.fsdp()),
                exact,
                mesh_lib.MeshRows(fs, mesh_lib.fsdp()),
            ),
        },
    }
    out = {"devices": jax.device_count(), "load_before": os.getloadavg()[0]}
    for kind, by_layout in layouts.items():
        rows = {}
        for layout, rate in by_layout.items():
            fast, exact = rate(False), rate(True)
            unit = "tokens_per_s" if kind == "decode" else "steps_per_s"
            rows[layout] = {
                f"fast_{unit}": float(f"{fast:.4g}"),
                f"exact_{unit}": float(f"{exact:.4g}"),
            }
            rows[layout]["exact_over_fast"] = round(exact / fast, 4)
        one, mesh = rows.values()
        fast = next(k for k in one if k.startswith("fast_"))
        mesh["mesh_over_one_device"] = round(mesh[fast] / one[fast], 3)
        out[kind] = rows
    out["load_after"] = os.getloadavg()[0]
    return out


def test_exact_mode_cost_on_a_mesh(benchmark, tmp_path):
    out = tmp_path / "exact_mesh.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    here = Path(__file__).resolve().parent
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=f"{here.parent}{os.pathsep}{here}")
    benchmark.pedantic(
        lambda: subprocess.run(
            [sys.executable, __file__, str(out)], env=env, check=True, timeout=3600
        ),
        rounds=1,
        iterations=1,
    )
    result = json.loads(out.read_text())
    benchmark.extra_info.update(result)
    print(f"\n[exact mode on a mesh, tiny, 4 fake CPU devices] {json.dumps(result)}")


if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    )
    os.environ["JAX_PLATFORMS"] = "cpu"
    sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).parent)]
    Path(sys.argv[1]).write_text(json.dumps(measure(), indent=1))
