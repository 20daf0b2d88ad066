"""Benchmark: TensorStoreWeightStore publish / read against raw file I/O of the same bytes.

Run (about a minute on a quiet machine):
    python -m pytest benchmarks/test_bench_tensorstore.py -q -s

Each test alternates the baselines and the store round by round (baselines run in
pytest-benchmark's untimed `setup`, see benchmarks/test_bench_weights.py `run`) and reports
`ratio = baseline median / store median` (1.0 = as fast as raw I/O).

  publish (put), fsync      vs  "raw, 1 file": all bytes in one file + fsync;
                                "raw, per leaf": one file per array leaf, each fsynced, plus a
                                small manifest file (what the store writes, minus zarr/chunking)
  publish (put), no fsync   vs  the same two, without fsync (page cache only)
  read (get), warm cache    vs  readinto fresh arrays from the per-leaf files

The store writes zarr v3 chunks of `chunk_bytes` (8 MB) through TensorStore's `file` kvstore
and a JSON manifest last; `get` opens every array from the manifest's metadata and reads all
chunks concurrently. Parameter sets are the Llama-shaped random float32 trees of the weights
benchmark: "tiny" ~3.2M and "mid" ~25M parameters.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from test_bench_weights import SIZES, llama_like, nbytes, run

from scale.tensorstore_weights import TensorStoreWeightStore


def leaves(tree) -> list[np.ndarray]:
    if isinstance(tree, dict):
        return [x for k in sorted(tree) for x in leaves(tree[k])]
    if isinstance(tree, list | tuple):
        return [x for v in tree for x in leaves(v)]
    return [tree]


@pytest.fixture(scope="module", params=list(SIZES))
def params(request):
    return request.param, llama_like(**SIZES[request.param])


def write_raw(directory, arrays, fsync: bool, one_file: bool) -> None:
    os.makedirs(directory, exist_ok=True)
    groups = [arrays] if one_file else [[a] for a in arrays]
    for i, group in enumerate(groups):
        with open(os.path.join(directory, f"{i:05d}.bin"), "wb", buffering=0) as f:
            for a in group:
                f.write(a.reshape(-1).view(np.uint8))
            if fsync:
                os.fsync(f.fileno())
    if not one_file:
        with open(os.path.join(directory, "manifest.json"), "w") as f:
            json.dump([list(a.shape) for a in arrays], f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())


def read_raw(directory, arrays) -> list[np.ndarray]:
    out = []
    for i, a in enumerate(arrays):
        fresh = np.empty_like(a)
        with open(os.path.join(directory, f"{i:05d}.bin"), "rb", buffering=0) as f:
            f.readinto(fresh.reshape(-1).view(np.uint8))
        out.append(fresh)
    return out


@pytest.mark.parametrize("fsync", [True, False], ids=["fsync", "no-fsync"])
def test_publish(benchmark, params, tmp_path, fsync):
    size, p = params
    arrays = leaves(p)
    store = TensorStoreWeightStore(tmp_path / "store", keep=2, file_sync=fsync)
    versions = iter(range(10**9))
    baselines = {
        "raw, 1 file": lambda: write_raw(tmp_path / "one", arrays, fsync, one_file=True),
        "raw, per leaf": lambda: write_raw(tmp_path / "leaf", arrays, fsync, one_file=False),
    }
    label = f"publish, {'fsync' if fsync else 'no fsync'} [{size}, {nbytes(p) / 1e6:.0f} MB]"
    run(benchmark, label, lambda: store.put(next(versions), p), baselines, 4)
    store.flush()


def test_read(benchmark, params, tmp_path):
    size, p = params
    arrays = leaves(p)
    store = TensorStoreWeightStore(tmp_path / "store", keep=1)
    store.put(0, p)
    write_raw(tmp_path / "leaf", arrays, fsync=True, one_file=False)
    baselines = {"raw readinto": lambda: read_raw(tmp_path / "leaf", arrays)}
    label = f"read, warm [{size}, {nbytes(p) / 1e6:.0f} MB]"
    run(benchmark, label, lambda: store.get(0), baselines, 8)
