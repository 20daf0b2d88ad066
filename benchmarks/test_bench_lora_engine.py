"""Benchmark: a LoRA run's rollout engine, adapters applied unmerged (x W + (x A) B alpha/r at
every projection) against merged once per reload (W + A B alpha/r, then the plain model).

Run (~2 minutes on a quiet machine):
    OMP_WAIT_POLICY=PASSIVE python -m pytest benchmarks/test_bench_lora_engine.py -q -s

Models: `tiny` and `small`, random weights, float32, rank 16 on every projection (q, k, v, o,
gate, up, down), random nonzero B. Workload as benchmarks/test_bench_engine.py: `slots` prompts
of 32 tokens, 32 new tokens each. Each row prints tokens/s of both arms (best of 3 after a
warm-up, measured in the same row) and the merge's own time (`lora.merge`, once per reload).
Nothing about time is asserted (a shared machine): the ratio is the figure. Its verdict (merged
within the noise of unmerged) is why the engine applies adapters unmerged in both modes; the
merged arm is `lora.merge` (the export's) and the plain model (docs/lora.md, "Engine").
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks.test_bench_engine import engine_rate  # noqa: E402
from minirl.modeling import lora  # noqa: E402
from minirl.modeling.model import ModelConfig, init_model  # noqa: E402


def _adapted_params(cfg):
    params = nnx.to_pure_dict(nnx.split(init_model(cfg, seed=0))[1])
    rng = np.random.default_rng(0)
    return jax.tree_util.tree_map_with_path(
        lambda path, x: (
            np.asarray(rng.normal(size=x.shape) * 0.01, np.float32)
            if str(path[-1].key).endswith("_lora_b")
            else x
        ),
        params,
    )


@pytest.mark.parametrize("preset, slots", [("tiny", 16), ("tiny", 64), ("small", 16)])
def test_lora_engine_merged_vs_unmerged(preset, slots):
    cfg = ModelConfig.preset(preset, lora_rank=16)
    params = _adapted_params(cfg)
    t0 = time.perf_counter()
    merged = jax.block_until_ready(lora.merge(params, cfg))
    merge_s = time.perf_counter() - t0
    unmerged_rate, _ = engine_rate(cfg, params, slots, uid0=0)
    merged_rate, _ = engine_rate(lora.base_config(cfg), merged, slots, uid0=0)
    print(
        f"\n{preset} slots={slots}: unmerged {unmerged_rate:.0f} tok/s, merged "
        f"{merged_rate:.0f} tok/s (merged/unmerged {merged_rate / unmerged_rate:.2f}x); "
        f"merge {merge_s * 1e3:.1f} ms per reload"
    )
