"""Persistent run checkpoints: atomic, checksummed, last K kept (RLAX §3.2, preemption).

RLAX survives preemption with "dual storage": workers read weights from the in-memory parameter
server (weights.py) while the run is continuously checkpointed to persistent storage, and after a
crash the controller reloads the newest snapshot and replays deterministically. This file is the
persistent half. One checkpoint holds everything a resume needs: the step, the parameters, the
optimizer state and the controller's snapshot (mixture position, RNG states, counters).

`CheckpointManager(run_dir, keep=3, max_pending=1)`: `save` or `save_async` (then `wait`,
`close`), and `restore(template=(params, opt_state), step=None)`, which returns None when there is
no checkpoint yet and skips a damaged one (with `logging.warning`) for the one before it. Trees
are written in the format of serialization.py, and their bytes by hashed_files.py (a sha256 per
8 MiB chunk, hashed on every core while the disk works; why per chunk: that file's docstring).

docs/weights.md, "Checkpoints", has the rest in full: the layout on disk, why a crash never leaves
a half checkpoint, how damage is detected on restore, templates (optax states), retention and
background saving; what is simplified on purpose is at the end of that page.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import re
import secrets
import shutil
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from minirl.store.hashed_files import (
    HASH_THREADS,
    CorruptCheckpointError,
    Serialized,
    fsync_dir,
    n_chunks,
    read_tree_file,
    write_file,
    write_file_bytes,
)
from minirl.store.serialization import to_buffer
from minirl.store.trees import TreeMismatchError, match_template

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 1: one sha256 per file (still read); 2: one per CHUNK_BYTES of a file
CHUNK_BYTES = 8 << 20  # a sha256 for each 8 MiB of a file, so chunks hash in parallel
MANIFEST = "manifest.json"
FILES = ("params.tree", "opt_state.tree", "controller_state.tree")
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointSaveError(RuntimeError):
    """A background save failed; raised by the next call to the manager."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    step: int
    params: Any
    opt_state: Any
    controller_state: dict


def _read_manifest(ckpt: Path, step: int) -> dict:
    """The manifest's file entries as {name: {"size", "chunk_bytes", "sha256": [hex, ...]}};
    a format-1 manifest (one sha256 per file) reads as files of a single chunk."""
    try:
        manifest = json.loads((ckpt / MANIFEST).read_text())
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{MANIFEST} is missing") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptCheckpointError(f"{MANIFEST} is not valid JSON: {e}") from e
    entries = {}
    try:
        ok = manifest["format"] in (1, FORMAT_VERSION) and manifest["step"] == step
        for name in FILES if ok else ():
            size, sha = manifest["files"][name]["size"], manifest["files"][name]["sha256"]
            if manifest["format"] == 1:
                chunk_bytes, sha = max(size, 1), [sha]
            else:
                chunk_bytes = manifest["chunk_bytes"]
            ok = ok and type(size) is int and size >= 0  # (type(): no bools)
            ok = ok and type(chunk_bytes) is int and chunk_bytes >= 1
            ok = ok and isinstance(sha, list) and len(sha) == n_chunks(size, chunk_bytes)
            entries[name] = {"size": size, "chunk_bytes": chunk_bytes, "sha256": sha}
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise CorruptCheckpointError(
            f"{MANIFEST} is not a valid format-{FORMAT_VERSION} (or -1) manifest for step {step}"
        )
    return entries


# ----------------------------------------------------------------------------------------------
# The manager


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"a checkpoint step must be an int >= 0, got {step!r}")
    return step


class CheckpointManager:
    """Saves and restores the checkpoints of one run under `run_dir/checkpoints`."""

    def __init__(self, run_dir: str | os.PathLike, keep: int = 3, max_pending: int = 1):
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}")
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be an int >= 1, got {max_pending!r}")
        self.directory = Path(run_dir) / "checkpoints"
        self.keep, self.max_pending = keep, max_pending
        self._write_lock = threading.Lock()  # one save touches the directory at a time
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._thread: threading.Thread | None = None  # started by the first save_async
        self._error: BaseException | None = None

    # -- what is on disk -------------------------------------------------------------------

    def path(self, step: int) -> Path:
        return self.directory / f"step_{step:08d}"

    def all_steps(self) -> list[int]:
        """Steps of the finished (renamed) checkpoints, oldest first (`restore` checks them)."""
        if not self.directory.is_dir():
            return []
        found = (_STEP_DIR.match(p.name) for p in self.directory.iterdir() if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m)

    def latest_step(self) -> int | None:
        return (self.all_steps() or [None])[-1]

    # -- saving ----------------------------------------------------------------------------

    def save(
        self, step: int, params: Any, opt_state: Any = None, controller_state: dict | None = None
    ) -> Path:
        """Write a checkpoint now (after any pending background saves); returns its directory."""
        files = self._payloads(step, params, opt_state, controller_state)
        self.wait()
        return self._write(step, files)

    def save_async(
        self, step: int, params: Any, opt_state: Any = None, controller_state: dict | None = None
    ) -> None:
        """Copy the trees to host bytes now and write them on the background thread. Blocks
        while `max_pending` saves (each holding its host copy) wait behind the one in progress."""
        self._raise_background_error()
        files = self._payloads(step, params, opt_state, controller_state)
        files = {name: Serialized(to_buffer(tree)) for name, tree in files.items()}  # host copy
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._worker, name="minirl-checkpoint-writer", daemon=True
            )
            self._thread.start()
        self._queue.put((step, files))  # blocks while max_pending saves are waiting

    def wait(self) -> None:
        """Block until every background save is on disk; raise the first background error."""
        if self._thread is not None:
            self._queue.join()
        self._raise_background_error()

    def close(self) -> None:
        """Flush pending saves and stop the background thread."""
        try:
            self.wait()
        finally:
            if self._thread is not None:
                self._queue.put(None)
                self._thread.join()
                self._thread = None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _payloads(self, step, params, opt_state, controller_state) -> dict[str, Any]:
        _check_step(step)
        controller_state = {} if controller_state is None else controller_state
        if not isinstance(controller_state, Mapping):
            raise TypeError(
                f"controller_state must be a dict, got {type(controller_state).__name__}"
            )
        return dict(zip(FILES, (params, opt_state, dict(controller_state)), strict=True))

    def _raise_background_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise CheckpointSaveError(f"a background checkpoint save failed: {error!r}") from error

    def _worker(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._write(*job)
            except BaseException as e:  # noqa: BLE001 - surfaced by the next call
                if self._error is None:
                    self._error = e
            finally:
                self._queue.task_done()

    def _write(self, step: int, files: dict[str, Any]) -> Path:
        with self._write_lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            for p in self.directory.iterdir():  # leftovers of saves a crash cut short
                if p.name.startswith((".tmp-", ".trash-")):
                    shutil.rmtree(p, ignore_errors=True)
            tmp = self.directory / f".tmp-step_{step:08d}-{secrets.token_hex(4)}"
            tmp.mkdir()
            try:
                with ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="minirl-sha256") as pool:
                    written = {
                        name: write_file(tmp / name, t, pool, CHUNK_BYTES)
                        for name, t in files.items()
                    }
                    entries = {
                        name: {"size": size, "sha256": hashes.hexdigests()}
                        for name, (size, hashes) in written.items()
                    }
                manifest = {
                    "format": FORMAT_VERSION,
                    "step": step,
                    "chunk_bytes": CHUNK_BYTES,
                    "files": entries,
                }
                write_file_bytes(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
                fsync_dir(tmp)
                final = self.path(step)
                if final.exists():  # the same step again, after a resume: replace it
                    self._delete(final)
                os.rename(tmp, final)  # the checkpoint exists from this instant on
                fsync_dir(self.directory)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            self._prune(step)
            return final

    def _delete(self, ckpt: Path) -> None:
        trash = self.directory / f".trash-{ckpt.name}-{os.getpid()}-{threading.get_ident()}"
        os.rename(ckpt, trash)  # gone for restore in one atomic step, then removed
        shutil.rmtree(trash, ignore_errors=True)

    def _prune(self, saved: int) -> None:
        steps = self.all_steps()
        newer = [s for s in steps if s > saved]
        if newer:  # the run was resumed from an earlier step: those belong to an abandoned past
            log.warning("saving step %d discards the newer checkpoints %s", saved, newer)
        older = [s for s in steps if s <= saved]
        for s in newer + older[: -self.keep]:
            self._delete(self.path(s))

    def tidy(self, restored: int | None = None) -> list[str]:
        """Remove what interrupted saves and prunes left (`.tmp-*`, `.trash-*`) and, counting
        back from the `restored` step, the checkpoints beyond `keep` (a kill between a save's
        rename and its prune leaves one too many). Idempotent; run on resume. Steps newer than
        `restored` (damaged ones restore skipped) are left: the next save discards them.
        Returns the names removed."""
        if not self.directory.is_dir():
            return []
        with self._write_lock:
            removed = []
            for p in sorted(self.directory.iterdir()):
                if p.name.startswith((".tmp-", ".trash-")):
                    shutil.rmtree(p, ignore_errors=True)
                    removed.append(p.name)
            if restored is not None:
                older = [s for s in self.all_steps() if s <= restored]
                for s in older[: -self.keep]:
                    self._delete(self.path(s))
                    removed.append(self.path(s).name)
            return removed

    # -- restoring -------------------------------------------------------------------------

    def restore(self, template: Any = None, step: int | None = None, place=None, opt_state=True):
        """The newest checkpoint that passes every check, or None if there are none at all.

        A damaged checkpoint is logged (logging.warning, with the reason) and the one before it
        is tried; if all are damaged, CorruptCheckpointError lists why. `step` asks for exactly
        that checkpoint (no fallback). `template=(params, opt_state)` (either may be None)
        restores into those structures, checking shapes and dtypes: a mismatch raises
        TreeMismatchError naming the first differing leaf and both shapes. `place` (e.g.
        `jax.device_put`) takes each array of the weights and optimizer state once it is read
        (into its own buffer): then the checkpoint is never in host memory whole.
        `opt_state=False` reads no optimizer state (None): what evaluating or exporting needs."""
        if template is not None and not (isinstance(template, tuple | list) and len(template) == 2):
            raise TypeError("template must be a pair (params, opt_state); either may be None")
        self.wait()
        steps = self.all_steps()
        if step is not None:
            if _check_step(step) not in steps:
                raise FileNotFoundError(
                    f"no checkpoint for step {step} in {self.directory} (have {steps})"
                )
            return self._into_template(self._load(step, place, opt_state), template)
        problems = []
        for s in reversed(steps):
            try:
                ckpt = self._load(s, place, opt_state)
            except CorruptCheckpointError as e:
                log.warning(
                    "checkpoint %s is unusable (%s); trying the previous one", self.path(s), e
                )
                problems.append(f"step {s}: {e}")
                continue
            return self._into_template(ckpt, template)
        if problems:
            raise CorruptCheckpointError(
                f"no usable checkpoint in {self.directory}: " + "; ".join(problems)
            )
        return None

    def _load(self, step: int, place=None, opt_state=True) -> Checkpoint:
        ckpt = self.path(step)
        entries = _read_manifest(ckpt, step)
        trees = {}
        with ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="minirl-sha256") as pool:
            for name in FILES:  # `place` takes the arrays of the weights and optimizer state
                if opt_state or name != "opt_state.tree":
                    put = place if name != "controller_state.tree" else None
                    trees[name] = read_tree_file(ckpt / name, entries[name], pool, put)
        return Checkpoint(step, *(trees.get(name) for name in FILES))

    def _into_template(self, ckpt: Checkpoint, template: Any) -> Checkpoint:
        if template is None:
            return ckpt
        params_t, opt_t = template
        try:
            params = ckpt.params if params_t is None else match_template(ckpt.params, params_t)
            opt = (
                ckpt.opt_state
                if opt_t is None
                else match_template(ckpt.opt_state, opt_t, "optimizer-state leaf")
            )
        except TreeMismatchError as e:
            raise TreeMismatchError(f"cannot restore {self.path(ckpt.step)}: {e}") from e
        return dataclasses.replace(ckpt, params=params, opt_state=opt)
