"""CheckpointManager: atomic saves, retention, corruption fallback, templates, background saves,
and a real crash (SIGKILL of a process mid-save)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from minirl.store import checkpoints
from minirl.store.checkpoints import (
    FILES,
    CheckpointManager,
    CheckpointSaveError,
    CorruptCheckpointError,
)
from minirl.store.trees import TreeMismatchError, assert_trees_equal, flatten_tree

BF16 = ml_dtypes.bfloat16
REPO = Path(__file__).resolve().parents[2]


def params_for(step: int) -> dict:
    """Parameters whose every element is determined by `step` (exact in bf16 for step < 256)."""
    return {
        "embed": np.full((16, 8), step, np.float32),  # [V, D]
        "layers": [{"w": np.full((8, 8), step, BF16), "b": np.full(8, -step, np.float32)}],
    }


def save_steps(mgr: CheckpointManager, steps) -> None:
    for s in steps:
        mgr.save(s, params_for(s), (np.full(3, s, np.float32),), {"step": s})


@pytest.fixture(scope="module")
def adam():
    """bf16/f32 parameters and an AdamW state with non-zero moments (numpy-made: no compiles)."""
    rng = np.random.default_rng(0)
    params = {
        "embed": jnp.asarray(rng.standard_normal((16, 8)).astype(BF16)),
        "layers": [{"w": jnp.asarray(rng.standard_normal((8, 8)).astype(np.float32))}],
    }
    adam_state, *rest = optax.adamw(1e-2).init(params)
    noise = lambda x: jnp.asarray(rng.standard_normal(x.shape).astype(x.dtype))
    adam_state = adam_state._replace(
        count=jnp.asarray(3, jnp.int32),
        mu=jax.tree_util.tree_map(noise, adam_state.mu),
        nu=jax.tree_util.tree_map(noise, adam_state.nu),
    )
    return params, (adam_state, *rest)


# -- round trip -----------------------------------------------------------------------------


def test_round_trip_with_optax_state_bf16_and_controller_state(tmp_path, adam):
    params, opt_state = adam
    rng = np.random.default_rng(7)
    rng.random(3)
    controller = {"step": 12, "rng": rng.bit_generator.state, "consumed": np.arange(4)}
    mgr = CheckpointManager(tmp_path, keep=2)
    path = mgr.save(12, params, opt_state, controller)
    assert path == tmp_path / "checkpoints" / "step_00000012"

    ckpt = mgr.restore(template=(params, opt_state))
    assert ckpt.step == 12
    assert ckpt.params["embed"].flags.writeable  # fresh arrays, not read-only
    host = jax.tree_util.tree_map(np.asarray, (params, opt_state))
    assert_trees_equal((ckpt.params, ckpt.opt_state), host)  # bf16 bit-exact, namedtuples back
    assert ckpt.params["embed"].dtype == BF16
    assert type(ckpt.opt_state[0]).__name__ == "ScaleByAdamState"
    restored_rng = np.random.default_rng()
    restored_rng.bit_generator.state = ckpt.controller_state["rng"]  # 128-bit ints survive
    assert restored_rng.random() == rng.random()

    plain = mgr.restore()  # no template: same leaves, namedtuples as dicts
    assert set(plain.opt_state[0]) == {"count", "mu", "nu"}
    stored, expected = flatten_tree(plain.opt_state), flatten_tree(host[1])
    moments = ["embed", "layers/0/w"]
    assert (
        list(stored)
        == list(expected)
        == ["0/count"] + [f"0/{m}/{p}" for m in ("mu", "nu") for p in moments]
    )
    assert_trees_equal(list(stored.values()), list(expected.values()))


@pytest.mark.parametrize("chunk_bytes", [None, 256])
def test_restore_hands_each_array_to_place_as_it_is_read(tmp_path, monkeypatch, adam, chunk_bytes):
    """`place` gets every array of the weights and optimizer state (not the controller's), each
    in its own buffer, and the tree holds what it returns: no host buffer outlives the restore,
    so a checkpoint moved onto a device is never in host memory whole."""
    import gc
    import weakref

    if chunk_bytes:  # a chunk's hash waits for arrays read after it
        monkeypatch.setattr(checkpoints, "CHUNK_BYTES", chunk_bytes)
    params, opt_state = adam
    mgr = CheckpointManager(tmp_path)
    mgr.save(5, params, opt_state, {"consumed": np.arange(4)})
    given, placed = [], []

    def place(a):
        assert a.base is None  # owns its buffer: not a view that keeps a whole file alive
        given.append(weakref.ref(a))
        placed.append(jnp.asarray(a))
        return placed[-1]

    ckpt = mgr.restore(template=(params, opt_state), place=place)
    leaves = jax.tree.leaves((ckpt.params, ckpt.opt_state))
    assert len(given) == len(leaves) == 7 and all(
        x is y for x, y in zip(leaves, placed, strict=True)
    )
    assert isinstance(ckpt.controller_state["consumed"], np.ndarray)
    host = jax.tree.map(np.asarray, (params, opt_state))
    assert_trees_equal(jax.tree.map(np.asarray, (ckpt.params, ckpt.opt_state)), host)
    gc.collect()
    assert not any(ref() is not None for ref in given)


def test_restore_without_the_optimizer_state_reads_none_of_it(tmp_path, adam):
    params, opt_state = adam
    mgr = CheckpointManager(tmp_path)
    path = mgr.save(5, params, opt_state, {"step": 5})
    flip(path / "opt_state.tree", -3)  # damaged, and never read
    ckpt = mgr.restore(template=(params, None), opt_state=False)
    assert ckpt.opt_state is None and ckpt.controller_state == {"step": 5}
    assert_trees_equal(ckpt.params, jax.tree.map(np.asarray, params))
    with pytest.raises(CorruptCheckpointError, match="opt_state.tree fails its sha256"):
        mgr.restore()


@pytest.mark.parametrize("chunk_bytes", [None, 256])
def test_manifest_records_size_and_a_sha256_per_chunk(tmp_path, monkeypatch, chunk_bytes):
    if chunk_bytes:
        monkeypatch.setattr(checkpoints, "CHUNK_BYTES", chunk_bytes)
    chunk_bytes = checkpoints.CHUNK_BYTES
    mgr = CheckpointManager(tmp_path)
    path = mgr.save(3, params_for(3))
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format"] == 2 and manifest["step"] == 3
    assert manifest["chunk_bytes"] == chunk_bytes
    assert set(manifest["files"]) == set(FILES)
    n_chunks = []
    for name, entry in manifest["files"].items():
        data = (path / name).read_bytes()
        pieces = [data[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes)]
        assert entry == {
            "size": len(data),
            "sha256": [hashlib.sha256(piece).hexdigest() for piece in pieces],
        }
        n_chunks.append(len(pieces))
    # params.tree: 16*8*4 + 8*8*2 + 8*4 data bytes plus the header -> 4 chunks of 256 bytes
    assert n_chunks[0] == (1 if chunk_bytes > 10**6 else 4)
    assert sorted(p.name for p in path.iterdir()) == sorted([*FILES, "manifest.json"])


def test_format_1_manifests_one_sha256_per_file_still_restore(tmp_path):
    """Checkpoints written before the per-chunk manifest (format 1) restore and are checked."""
    mgr = CheckpointManager(tmp_path, keep=3)
    save_steps(mgr, [1, 2])
    for step in (1, 2):
        files = {
            name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            for name in FILES
            for data in [(mgr.path(step) / name).read_bytes()]
        }
        old = {"format": 1, "step": step, "files": files}
        (mgr.path(step) / "manifest.json").write_text(json.dumps(old))
    assert_trees_equal(mgr.restore().params, params_for(2))
    flip(mgr.path(2) / "params.tree", -3)
    with pytest.raises(CorruptCheckpointError, match=r"params.tree fails its sha256 check"):
        mgr.restore(step=2)
    assert mgr.restore().step == 1


def test_empty_run_directory(tmp_path):
    mgr = CheckpointManager(tmp_path / "never-created")
    assert mgr.restore() is None
    assert mgr.latest_step() is None and mgr.all_steps() == []
    assert not (tmp_path / "never-created").exists()  # nothing touched the disk


def test_keeps_the_last_k(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=3)
    save_steps(mgr, [0, 1, 2, 5, 9])
    assert mgr.all_steps() == [2, 5, 9] and mgr.latest_step() == 9
    assert mgr.restore().step == 9
    assert mgr.restore(step=2).params["embed"][0, 0] == 2.0
    with pytest.raises(FileNotFoundError, match=r"step 1 .*have \[2, 5, 9\]"):
        mgr.restore(step=1)


def test_resaving_a_step_replaces_it_and_drops_newer_ones(tmp_path, caplog):
    mgr = CheckpointManager(tmp_path, keep=5)
    save_steps(mgr, [1, 2, 3])
    mgr.save(2, params_for(20))  # resumed from 1: step 2 again, then 3 is a stale future
    assert "discards the newer checkpoints [3]" in caplog.text
    assert mgr.all_steps() == [1, 2]
    assert mgr.restore().params["embed"][0, 0] == 20.0


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_arguments(tmp_path, bad):
    with pytest.raises(ValueError, match="step"):
        CheckpointManager(tmp_path).save(bad, params_for(1))
    with pytest.raises(ValueError, match="keep"):
        CheckpointManager(tmp_path, keep=bad if bad != 1.5 else 0)
    with pytest.raises(TypeError, match="controller_state must be a dict"):
        CheckpointManager(tmp_path).save(1, params_for(1), None, [1, 2])
    with pytest.raises(TypeError, match="pair"):
        CheckpointManager(tmp_path).restore(template=params_for(1))


# -- templates ------------------------------------------------------------------------------


def test_restoring_into_a_different_model_names_the_parameter_and_shapes(tmp_path, adam):
    params, opt_state = adam
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, params, opt_state)
    wider = {**params, "embed": jnp.zeros((16, 12), jnp.bfloat16)}
    with pytest.raises(TreeMismatchError, match=r"step_00000001.*'embed'.*\(16, 8\).*\(16, 12\)"):
        mgr.restore(template=(wider, None))
    wrong_opt = optax.adamw(1e-2).init(wider)
    with pytest.raises(TreeMismatchError, match=r"optimizer-state leaf '0/mu/embed'"):
        mgr.restore(template=(None, wrong_opt))
    with pytest.raises(TreeMismatchError, match=r"missing, first 'layers/0/b'"):
        mgr.restore(template=({**params, "layers": [{"w": 0, "b": 0}]}, None))


# -- corruption -----------------------------------------------------------------------------


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


CORRUPTIONS = {
    "truncated file": (lambda d: os.truncate(d / "params.tree", 300), "truncated"),
    "flipped data byte": (lambda d: flip(d / "params.tree", -3), "sha256"),
    "flipped header byte": (lambda d: flip(d / "opt_state.tree", 30), "opt_state.tree"),
    "grown file": (lambda d: open(d / "params.tree", "ab").write(b"\0"), "manifest says"),
    "missing manifest": (lambda d: (d / "manifest.json").unlink(), "manifest.json is missing"),
    "missing file": (lambda d: (d / "controller_state.tree").unlink(), "is missing"),
    "manifest not json": (lambda d: (d / "manifest.json").write_text("{oops"), "not valid JSON"),
    "manifest of another step": (
        lambda d: (d / "manifest.json").write_text(
            (d.parent / "step_00000001" / "manifest.json").read_text()
        ),
        "manifest for step 2",
    ),
    "manifest lacks a chunk's sha256": (
        lambda d: edit_manifest(d, lambda m: m["files"]["params.tree"]["sha256"].pop()),
        "manifest for step 2",
    ),
}


def edit_manifest(ckpt: Path, edit) -> None:
    manifest = json.loads((ckpt / "manifest.json").read_text())
    edit(manifest)
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("chunk_bytes", [None, 256])
@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_damaged_checkpoint_is_reported_and_the_previous_one_used(
    tmp_path, caplog, monkeypatch, kind, chunk_bytes
):
    if chunk_bytes:  # several sha256 chunks per file
        monkeypatch.setattr(checkpoints, "CHUNK_BYTES", chunk_bytes)
    damage, reason = CORRUPTIONS[kind]
    mgr = CheckpointManager(tmp_path, keep=3)
    save_steps(mgr, [1, 2])
    damage(mgr.path(2))
    with caplog.at_level(logging.WARNING, logger="minirl.store.checkpoints"):
        ckpt = mgr.restore()
    assert ckpt.step == 1
    assert_trees_equal(ckpt.params, params_for(1))
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "step_00000002" in record.getMessage() and reason in record.getMessage()
    with pytest.raises(CorruptCheckpointError, match=reason):
        mgr.restore(step=2)  # asking for exactly this one: no fallback


def test_a_flipped_byte_is_located_to_its_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoints, "CHUNK_BYTES", 256)
    mgr = CheckpointManager(tmp_path, keep=3)
    save_steps(mgr, [1, 2])
    flip(mgr.path(2) / "params.tree", 600)  # inside the "embed" array's bytes
    with pytest.raises(
        CorruptCheckpointError, match=r"params.tree fails its sha256 check in bytes 512\.\.768 "
    ):
        mgr.restore(step=2)
    assert mgr.restore().step == 1


def test_all_checkpoints_damaged_is_an_error_not_a_fresh_start(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=3)
    save_steps(mgr, [1, 2])
    (mgr.path(1) / "manifest.json").unlink()
    flip(mgr.path(2) / "params.tree", -1)
    with pytest.raises(CorruptCheckpointError, match=r"step 2: .*sha256.*; step 1: .*missing"):
        mgr.restore()


# -- interrupted saves ------------------------------------------------------------------------


def test_a_failed_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    mgr = CheckpointManager(tmp_path)
    save_steps(mgr, [1])

    def no_rename(*_):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "rename", no_rename)
    with pytest.raises(OSError, match="disk gone"):
        mgr.save(2, params_for(2))
    monkeypatch.undo()
    assert mgr.all_steps() == [1]
    assert [p.name for p in mgr.directory.iterdir()] == ["step_00000001"]  # temp removed
    assert mgr.restore().step == 1


def test_leftover_temp_directories_are_ignored_then_cleaned(tmp_path):
    mgr = CheckpointManager(tmp_path)
    save_steps(mgr, [1])
    partial = mgr.directory / ".tmp-step_00000002-dead"
    partial.mkdir()
    (partial / "params.tree").write_bytes(b"half of a file")
    assert mgr.all_steps() == [1] and mgr.restore().step == 1
    save_steps(mgr, [2])
    assert not partial.exists()
    assert sorted(p.name for p in mgr.directory.iterdir()) == ["step_00000001", "step_00000002"]


CHILD = """
import sys
import ml_dtypes, numpy as np
from minirl.store.checkpoints import CheckpointManager

mgr = CheckpointManager(sys.argv[1], keep=2)
step = (mgr.latest_step() or 0) + 1
print("ready", flush=True)
while True:
    params = {"w": np.full((1024, 1024), step, np.float32),
              "b": np.full((512, 512), step % 200, ml_dtypes.bfloat16)}
    opt_state = (np.full((1024, 1024), step + 0.5, np.float32),)
    mgr.save(step, params, opt_state, {"step": step})
    print("saved", step, flush=True)
    step += 1
"""


def test_sigkill_at_any_moment_of_a_save_leaves_a_restorable_checkpoint(tmp_path):
    """A real process saving ~9 MB checkpoints in a loop is killed with SIGKILL at random
    moments; after each kill the newest complete checkpoint must restore, intact."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    mgr = CheckpointManager(tmp_path, keep=2)
    completed, mid_save = 0, 0
    for delay in np.random.default_rng(2024).uniform(0.0, 0.35, size=6):
        first = (mgr.latest_step() or 0) + 1  # where the child starts
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env
        )
        try:
            assert child.stdout.readline().strip() == "ready"
            time.sleep(delay)
        finally:
            child.send_signal(signal.SIGKILL)
            out, _ = child.communicate(timeout=30)
        lines = [line.split() for line in out.splitlines()]  # a kill may tear the last one
        saved = [int(w[1]) for w in lines if w[:1] == ["saved"] and w[1:2] and w[1].isdigit()]
        assert saved == list(range(first, first + len(saved)))
        completed += len(saved)
        leftovers = mgr.directory.iterdir() if mgr.directory.exists() else []
        mid_save += any(p.name.startswith((".tmp-", ".trash-")) for p in leftovers)

        ckpt = mgr.restore()
        reported = saved[-1] if saved else first - 1  # the last save the child finished
        if ckpt is None:  # only possible if no save ever finished
            assert reported == 0
            continue
        assert reported <= ckpt.step <= reported + 1  # + 1: killed between rename and print
        s = ckpt.step
        assert np.all(ckpt.params["w"] == s) and ckpt.params["w"].shape == (1024, 1024)
        assert ckpt.params["b"].dtype == BF16 and np.all(ckpt.params["b"] == s % 200)
        assert np.all(ckpt.opt_state[0] == s + 0.5) and ckpt.controller_state == {"step": s}
    print(f"{mid_save} of 6 kills landed inside a save; {completed} saves completed")
    assert completed >= 3, "the child never got going"
    assert mid_save >= 1, "no kill landed inside a save; the test proved nothing"


# -- background saves ---------------------------------------------------------------------------


def test_save_async_snapshots_now_and_writes_later(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=5, max_pending=2)
    params = params_for(1)
    mgr.save_async(1, params, None, {"step": 1})
    params["embed"][...] = 99.0  # the train step reuses its buffers at once
    mgr.save_async(2, params_for(2), None, {"step": 2})
    mgr.wait()
    assert mgr.all_steps() == [1, 2]
    assert_trees_equal(mgr.restore(step=1).params, params_for(1))
    mgr.save(3, params_for(3))  # a synchronous save after background ones keeps the order
    assert mgr.all_steps() == [1, 2, 3]
    mgr.close()
    assert mgr._thread is None


def test_save_async_blocks_when_max_pending_saves_wait(tmp_path, monkeypatch):
    mgr = CheckpointManager(tmp_path, keep=5, max_pending=1)
    gate, started = threading.Event(), threading.Event()
    real_write = mgr._write

    def slow_write(step, files):
        started.set()
        gate.wait(timeout=30)
        return real_write(step, files)

    monkeypatch.setattr(mgr, "_write", slow_write)
    mgr.save_async(1, params_for(1))  # being written (held at the gate)
    assert started.wait(timeout=30)
    mgr.save_async(2, params_for(2))  # waits in the queue: max_pending == 1
    third = threading.Thread(target=mgr.save_async, args=(3, params_for(3)))
    third.start()
    third.join(timeout=0.3)
    assert third.is_alive()  # blocked: the queue is full
    gate.set()
    third.join(timeout=30)
    mgr.close()
    assert mgr.all_steps() == [1, 2, 3]


def test_background_errors_surface_on_the_next_call(tmp_path):
    blocker = tmp_path / "run"
    blocker.write_text("a file where the run directory should be")
    mgr = CheckpointManager(blocker)
    mgr.save_async(1, params_for(1))  # returns at once; the write fails in the background
    with pytest.raises(CheckpointSaveError, match="background checkpoint save failed"):
        mgr.wait()
    mgr.wait()  # reported once
    blocker.unlink()
    mgr.save_async(2, params_for(2))
    mgr.close()
    assert mgr.all_steps() == [2]
