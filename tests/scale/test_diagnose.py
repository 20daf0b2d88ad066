"""scale/diagnose.py: the "sharding" row of minirl's mismatch table (RLAX's "divergent
parallelism"), measured on 4 fake CPU devices in a subprocess (the devices must be configured
before JAX starts), and its clear errors in-process (one device).

What must hold: on one device exact mode is 0 (the "exact" rows); the trainer's recompute on an
FSDP mesh and the engine's decode on a tensor-parallel mesh disagree by fp32 rounding noise
(> 0, < 1e-5) in fast mode — the collectives reduce in their own order — and not at all in exact
mode, whose fixed tree is cut at shard boundaries (issue #45; tests/scale/test_exact_layouts.py
checks every layout pair).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minirl.diagnose import EXTRA_SOURCES, diagnose
from minirl.run.presets import make_config
from scale.mesh import MeshConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def table():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    cmd = [
        sys.executable,
        "-m",
        "scale.diagnose",
        "--cpu-devices",
        "4",
        "--fast",
        "--json",
        "--sources",
        "exact,sharding",
    ]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=900)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return {r["compares"].split(":")[0]: r for r in json.loads(done.stdout)}


@pytest.mark.slow  # ~30 s cold: the sharded diagnose table; tests/scale/test_exact_layouts.py keeps the layouts bitwise in the default lane
def test_sharding_rows_measure_divergent_parallelism(table):
    exact_one_device = table["fp32 decode exact vs fp32 recompute exact"]
    assert exact_one_device["max"] == 0.0 and exact_one_device["tokens"] > 0
    for name in ("divergent", "exact"):  # TP decode vs FSDP recompute, fast and exact mode
        row = table[name]
        assert row["source"] == "sharding" and row["tokens"] == exact_one_device["tokens"]
        assert "TP tensor=4" in row["compares"] and "FSDP fsdp=2,tensor=2" in row["compares"]
    assert 0.0 < table["divergent"]["mean"] <= table["divergent"]["max"] < 1e-5, table
    assert table["exact"]["max"] == 0.0 and table["exact"]["expect_zero"], table["exact"]


def test_sharding_needs_several_devices_and_is_opt_in():
    from scale.diagnose import register

    cfg = make_config("fixture")
    with pytest.raises(ValueError, match="python -m scale.diagnose"):  # minirl alone: a hint
        diagnose(cfg, sources=["sharding"])
    register()
    try:
        with pytest.raises(ValueError, match=">= 2 devices.*--cpu-devices"):
            diagnose(cfg, prompts=1, samples=1, sources=["sharding"], fast=True)
    finally:
        del EXTRA_SOURCES["sharding"]


def test_mesh_config_parse():
    assert MeshConfig.parse("fsdp=2,tensor=2") == MeshConfig(fsdp=2, tensor=2)
    assert (
        MeshConfig.parse("tensor=-1") == MeshConfig(tensor=-1)
        and MeshConfig.parse("") == MeshConfig()
    )
    for bad in ("model=2", "fsdp=two", "fsdp"):
        with pytest.raises(ValueError, match="axis=size"):
            MeshConfig.parse(bad)
