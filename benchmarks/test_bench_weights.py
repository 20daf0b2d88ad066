"""Benchmarks: weight store and checkpoints against copying/writing/reading the same raw bytes.

Run (1.5-2 minutes):
    python -m pytest benchmarks/test_bench_weights.py -q -s

Each test alternates the baselines and minirl's operation round by round (the baselines run in
pytest-benchmark's untimed `setup`), and reports `ratio = baseline median / minirl median`
(1.0 = as fast as the baseline; the target is >= 0.5 of the raw figure), for wall time and for
CPU time (`time.process_time`: all threads), with the load average. Absolute times on this
shared machine are noisy; compare the ratios. On a saturated machine wall time follows CPU time.

  store put+get      vs  np.copy of one contiguous float32 array with the same bytes
  checkpoint save    vs  "raw": writing those bytes as one file + fsync;
                         "raw+sha256": the same plus a sha256 of the bytes (a checkpoint hashes
                         every byte, fsyncs each file and directory, renames, prunes old ones)
  checkpoint restore vs  "raw": readinto of one raw file into a fresh array; "raw+sha256": the
                         same plus a sha256 of it (a restore verifies every byte).
                         "warm" = files in the page cache; "cold" = evicted with
                         posix_fadvise(DONTNEED) before every round, as after a preemption.

sha256 costs ~0.55 s of CPU per GB here (1.8 GB/s) and a page-cache read ~0.1 s, so a
verified warm restore cannot reach half the raw read's speed on 2 cores even when they are free
(see docs/weights.md, "Speed"); "raw+sha256" shows how close it gets to that bound.

Parameter sets are random numpy pytrees with the shapes of a Llama-style decoder (the model
module is not needed): "tiny" ~3.2M and "mid" ~25M float32 parameters. A checkpoint holds the
parameters plus two AdamW moments of the same shapes (3x the parameter bytes).
"""

from __future__ import annotations

import gc
import hashlib
import os
import time

import numpy as np
import pytest

from minirl.store.checkpoints import CheckpointManager
from minirl.store.weights import InMemoryWeightStore

SIZES = {  # vocab, width D, layers L, heads H, kv heads K, head width Dh, MLP width F
    "tiny": dict(vocab=256, d=256, layers=4, heads=4, kv_heads=2, dh=64, ffn=768),
    "mid": dict(vocab=512, d=512, layers=8, heads=8, kv_heads=4, dh=64, ffn=1536),
}


def llama_like(vocab, d, layers, heads, kv_heads, dh, ffn, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    w = lambda *shape: rng.standard_normal(shape, dtype=np.float32)
    return {
        "embed": w(vocab, d),  # [V, D]
        "layers": [
            {
                "attn_norm": np.ones(d, np.float32),
                "q": w(d, heads * dh),  # [D, H*Dh]
                "k": w(d, kv_heads * dh),  # [D, K*Dh]
                "v": w(d, kv_heads * dh),
                "o": w(heads * dh, d),
                "mlp_norm": np.ones(d, np.float32),
                "gate": w(d, ffn),  # [D, F]
                "up": w(d, ffn),
                "down": w(ffn, d),
            }
            for _ in range(layers)
        ],
        "final_norm": np.ones(d, np.float32),
        "lm_head": w(d, vocab),  # [D, V]
    }


def nbytes(tree) -> int:
    if isinstance(tree, dict):
        return sum(nbytes(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return sum(nbytes(v) for v in tree)
    return tree.nbytes


@pytest.fixture(scope="module", params=list(SIZES))
def params(request):
    p = llama_like(**SIZES[request.param])
    return request.param, p


def drop_from_page_cache(path) -> None:
    for root, _, files in os.walk(path) if os.path.isdir(path) else [("", [], [path])]:
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def run(benchmark, name, ours, baselines, rounds, before_each=lambda: None):
    """Alternate the baselines (timed here, in pytest-benchmark's untimed setup) and ours (timed
    by pytest-benchmark) round by round; report baseline median / our median per baseline, for
    wall time and for CPU time (all threads of the process: `time.process_time`)."""
    times = {label: [] for label in baselines}
    cpu = {label: [] for label in ["minirl", *baselines]}

    def setup():
        for label, baseline in baselines.items():
            gc.collect()
            before_each()
            t, c = time.perf_counter(), time.process_time()
            baseline()
            times[label].append(time.perf_counter() - t)
            cpu[label].append(time.process_time() - c)
        gc.collect()
        before_each()

    def timed_ours():
        c = time.process_time()
        ours()
        cpu["minirl"].append(time.process_time() - c)

    benchmark.pedantic(timed_ours, setup=setup, rounds=rounds, iterations=1, warmup_rounds=1)
    ours_median = benchmark.stats.stats.median
    median_cpu = {label: float(np.median(ts[1:])) for label, ts in cpu.items()}  # [0]: warm-up
    line = f"\n{name} (load {os.getloadavg()[0]:.1f}): minirl {ours_median * 1e3:.1f} ms"
    cpu_line = f"  CPU time: minirl {median_cpu['minirl'] * 1e3:.1f} ms"
    for label, ts in times.items():
        base_median = float(np.median(ts[1:]))
        benchmark.extra_info[f"{label} median s"] = base_median
        benchmark.extra_info[f"ratio vs {label}"] = base_median / ours_median
        line += f" | {label} {base_median * 1e3:.1f} ms, ratio {base_median / ours_median:.2f}"
        cpu_ratio = median_cpu[label] / median_cpu["minirl"]
        cpu_line += f" | {label} {median_cpu[label] * 1e3:.1f} ms, ratio {cpu_ratio:.2f}"
    print(line + "\n" + cpu_line)


def test_store_put_get(benchmark, params):
    size, p = params
    flat = np.random.default_rng(1).standard_normal(nbytes(p) // 4, dtype=np.float32)
    store = InMemoryWeightStore(keep=2)
    versions = iter(range(10**9))

    def put_get():
        v = next(versions)
        store.put(v, p)
        return store.get(v)

    label = f"store put+get [{size}, {flat.nbytes / 1e6:.0f} MB]"
    run(benchmark, label, put_get, {"np.copy": flat.copy}, 15)


@pytest.fixture
def run_dir(tmp_path):
    return tmp_path  # on this machine /tmp is the same disk as the repo (check with `df`)


def checkpoint_payload(p):
    return p, (p, p), {"step": 0}  # params, AdamW-like (mu, nu) of the same shapes, controller


def test_checkpoint_save(benchmark, params, run_dir):
    size, p = params
    params_, opt_state, controller = checkpoint_payload(p)
    total = nbytes(params_) + nbytes(opt_state)
    raw = np.random.default_rng(2).integers(0, 255, total, dtype=np.uint8)
    mgr = CheckpointManager(run_dir / "run", keep=2)
    steps = iter(range(10**9))
    raw_path = run_dir / "raw.bin"

    def write_raw(sha256=False):
        with open(raw_path, "wb", buffering=0) as f:
            f.write(raw)
            if sha256:
                hashlib.sha256(raw).hexdigest()
            os.fsync(f.fileno())

    def save():
        mgr.save(next(steps), params_, opt_state, controller)

    baselines = {"raw": write_raw, "raw+sha256": lambda: write_raw(sha256=True)}
    run(benchmark, f"checkpoint save [{size}, {total / 1e6:.0f} MB]", save, baselines, 4)


@pytest.mark.parametrize("cache", ["warm", "cold"])
def test_checkpoint_restore(benchmark, params, run_dir, cache):
    size, p = params
    params_, opt_state, controller = checkpoint_payload(p)
    total = nbytes(params_) + nbytes(opt_state)
    mgr = CheckpointManager(run_dir / "run", keep=1)
    mgr.save(0, params_, opt_state, controller)
    raw_path = run_dir / "raw.bin"
    with open(raw_path, "wb") as f:
        f.write(np.random.default_rng(3).integers(0, 255, total, dtype=np.uint8))
        f.flush()
        os.fsync(f.fileno())

    def read_raw(sha256=False):
        out = np.empty(total, np.uint8)  # a restore allocates its arrays too
        with open(raw_path, "rb", buffering=0) as f:
            f.readinto(out)
        if sha256:
            hashlib.sha256(out).hexdigest()

    def drop():
        if cache == "cold":
            drop_from_page_cache(raw_path)
            drop_from_page_cache(mgr.path(0))

    def restore():
        return mgr.restore(step=0)

    label = f"checkpoint restore, {cache} [{size}, {total / 1e6:.0f} MB]"
    baselines = {"raw": read_raw, "raw+sha256": lambda: read_raw(sha256=True)}
    run(benchmark, label, restore, baselines, 5, before_each=drop)
