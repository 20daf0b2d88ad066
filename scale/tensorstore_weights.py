"""A versioned weight store on TensorStore: RLAX's parameter server, on any key-value store.

RLAX (§3) builds its parameter server on TensorStore, partitioned like the model's own weight
sharding, keeping up to N snapshots. `TensorStoreWeightStore` is that idea in its smallest honest
form. It passes the same contract as minirl's `InMemoryWeightStore` (tests/weightstore_suite.py)
and adds what a multi-host run needs: several processes can write and read it, and each process
can read only the slices of each array it owns.

    store = TensorStoreWeightStore("file:///tmp/run/weights", keep=4)   # or "memory://", "gs://b/p/"
    store.put(7, trainer.params())
    version, params = store.get()                           # newest committed version
    version, part = store.read_slices(7, {"embed": np.s_[0:128, :]})    # one slice of one leaf
    version, params = store.get_sharded(7, shardings)       # jax.Arrays, only addressable shards read

Layout under the root (a TensorStore kvstore: `file`, `memory`, `gcs`, `s3`, ... given by URL):

    data/000000000007/00000/zarr.json, c/0/0, ...   one zarr v3 array per array leaf, in leaf order
    data/000000000007/00001/...
    manifests/000000000007.json                     written LAST: the commit marker

Publishing is atomic for readers: all arrays of a version are written (and durable) before its
manifest is written with a single key write; readers list only `manifests/`, so a version without
a manifest (being written, or left by a crash) does not exist for them. Deleting runs the other
way round: manifest first, then data. A reader re-checks the manifest after reading, and reads
with `fill_missing_data_reads=False` (a deleted chunk is an error, never silently zeros), so a
version evicted while it was being read raises `UnknownVersionError` instead of returning a
mixture. Chunks equal to the fill value are stored anyway (`store_data_equal_to_fill_value`), so
"missing" always means deleted.

The manifest (JSON) holds the tree's structure — the pytree serialized with
`minirl.store.serialization.to_bytes` after every array leaf is replaced by a one-element int64 array
holding its index — and one entry per array: leaf path ("layers/0/attn/q_proj"), zarr array
name, shape, dtype and chunk shape. Readers open arrays with that metadata (`assume_metadata`),
so reading a version costs one manifest read, a read of each array's zarr.json the first time a
store object reads the version, and the chunk reads. A manifest is checked before any array is
opened by it (tensorstore_layout.check_manifest): one that is not JSON, names another version,
or whose entries' names, dtypes, shapes, byte count or skeleton disagree is a ValueError naming
the version; so is an entry whose dtype, shape or chunks differ from what the array's own
zarr.json records (check_stored: a dtype edited to another of the same width, float32 to int32,
would otherwise read every weight as garbage), naming the array too. Only
`manifests/<12 digits>.json` keys are versions; any other file there is ignored.

Multi-process publishing (scale/mesh.py `publish`): `begin(version)` on one process, a barrier,
`write(version, params, primary=...)` on every process (each writes the shards it holds, with
chunks aligned to the shard shape, so no two processes write the same chunk), a barrier, then
`commit(version, params)` on one process. `put` is the three in a row for one process.

Simplified on purpose:
  * Containers come back as dicts, lists and tuples (as with minirl.store.serialization): namedtuples
    and other pytree nodes are stored as dicts of their fields.
  * No compression (weights barely compress) and no checksums (the kvstore's own integrity is
    trusted; minirl/store/checkpoints.py is the checksummed, long-term storage).
  * One writer at a time. Leftovers of a crashed `put` are removed when that version is begun
    again; data of crashed older attempts stays until someone deletes `data/` entries by hand.
  * On `file` kvstores TensorStore fsyncs every chunk (durable but slower than page-cache I/O);
    on `gcs`/`s3` credentials come from the usual environment (see scale/README.md).
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np

from minirl.configlib import optional_import
from minirl.store.serialization import from_bytes
from minirl.store.trees import flatten_tree
from minirl.store.weights import (
    UnknownVersionError,
    check_new_version,
    check_release,
    check_version,
    empty_store,
    unknown_version,
)
from scale.tensorstore_layout import (
    MANIFESTS,
    check_manifest,
    check_stored,
    data_prefix,
    manifest_key,
    manifest_version,
    nbytes,
    plan,
    prefix_range,
    zarr_metadata,
)

ts = optional_import("tensorstore", "scale", "the TensorStore weight store (scale/)")

FORMAT = "minirl-tensorstore-weights/1"

__all__ = ["FORMAT", "TensorStoreWeightStore"]


def _as_index(index: Any, ndim: int) -> tuple:
    index = index if isinstance(index, tuple) else (index,)
    if len(index) > ndim or any(not isinstance(i, slice | int | np.integer) for i in index):
        raise ValueError(f"a slice selection must be up to {ndim} slices/ints, got {index!r}")
    return index


class TensorStoreWeightStore:
    """Up to `keep` committed weight versions in a TensorStore kvstore (module docstring).

    `root`: a kvstore URL ("file:///abs/path/", "memory://name/", "gs://bucket/path/",
    "s3://bucket/path/"), a plain local path, or a kvstore JSON spec. `chunk_bytes`: target chunk
    size. `context`: a `ts.Context` (stores sharing one see the same `memory://` data; a fresh
    context per store otherwise). `file_sync=False` skips the fsync of every file on local
    disks (3-4x faster publishing here; a machine crash may then lose a committed version).
    Nothing is opened until the first call.
    """

    def __init__(
        self,
        root: str | os.PathLike | dict,
        keep: int = 4,
        *,
        chunk_bytes: int = 8 << 20,
        context: ts.Context | None = None,
        file_sync: bool = True,
    ):
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}")
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be an int >= 1, got {chunk_bytes!r}")
        if isinstance(root, os.PathLike) or (isinstance(root, str) and "://" not in root):
            root = {"driver": "file", "path": os.path.abspath(os.fspath(root))}
        if isinstance(root, str) and root.startswith("file://"):
            root = {"driver": "file", "path": root.removeprefix("file://")}
        if isinstance(root, dict) and root.get("driver") == "file" and not file_sync:
            root = {**root, "file_io_sync": False}
        if isinstance(root, dict) and not str(root.get("path", "/")).endswith("/"):
            root = {**root, "path": root["path"] + "/"}
        if isinstance(root, str) and not root.endswith("/"):
            root += "/"
        self.root = root
        self.keep = keep
        self.chunk_bytes = chunk_bytes
        self.context = context or ts.Context()
        self.stats = {"bytes_written": 0, "bytes_read": 0}  # array bytes, this process
        self._kv: ts.KvStore | None = None
        self._manifests: dict[int, dict] = {}  # committed manifests are immutable: cached
        self._pending: list = []  # (version, future) of data deletions still running
        self._lock = threading.Lock()

    # ---- the WeightStore interface --------------------------------------------------------

    def put(self, version: int, params: Any) -> None:
        """Write every array of `params`, then commit `version` (one process; see `begin`)."""
        version = self.begin(version)
        self.write(version, params, primary=True)
        self.commit(version, params)

    def get(self, version: int | None = None) -> tuple[int, Any]:
        """(version, params) with numpy leaves; the newest committed version if None."""

        def read(v):
            v, manifest = self._manifest_for(v)
            return v, self._rebuild(
                manifest, self._read(v, manifest, [(e, ()) for e in manifest["arrays"]])
            )

        return self._newest(read, version)

    @staticmethod
    def _newest(read, version: int | None):
        """read(version); with version None (the newest), read again if the newest seen was
        evicted meanwhile (a writer put `keep` versions while this one read): "the newest" is
        never unknown, whereas a version asked for by number may be."""
        while True:
            try:
                return read(version)
            except UnknownVersionError:
                if version is not None:
                    raise

    def versions(self) -> list[int]:
        """Committed versions, oldest first (listed from the kvstore on every call)."""
        keys = self._store().list(prefix_range(MANIFESTS)).result()
        return sorted(v for v in map(manifest_version, keys) if v is not None)

    def release(self, before_version: int) -> list[int]:
        """Delete every version older than `before_version` (never the newest)."""
        before_version = check_version(before_version)
        available = self.versions()
        check_release(before_version, available[-1] if available else None)
        gone = [v for v in available if v < before_version]
        for v in gone:
            self._delete(v)
        return gone

    def discard_from(self, version: int) -> list[int]:
        """Delete every committed version >= `version`, newest first, and wait until their data
        is gone: a run resumed from an older checkpoint publishes those versions again. (Other
        processes may have cached a discarded version's manifest; a version published again by
        the same trainer layout has the same arrays and chunking, so their reads stay right.)"""
        version = check_version(version)
        gone = [v for v in self.versions() if v >= version][::-1]
        for v in gone:
            self._delete(v)
        self.flush()
        return gone

    def nbytes(self) -> int:
        """Array bytes of all committed versions."""
        total = 0
        for v in self.versions():
            try:
                total += self._load_manifest(v)["nbytes"]
            except LookupError:
                pass  # evicted between listing and reading
        return total

    # ---- publishing in parts (multi-process) ----------------------------------------------

    def begin(self, version: int) -> int:
        """Check that `version` is new and clear what a crashed attempt at it left behind.
        Call on ONE process before any `write` of this version."""
        version = check_version(version)
        available = self.versions()
        check_new_version(version, available[-1] if available else None)
        self._store().delete_range(prefix_range(data_prefix(version))).result()
        return version

    def write(self, version: int, params: Any, *, primary: bool = True) -> int:
        """Write this process's part of `params` as (uncommitted) `version`; returns bytes
        written. jax.Arrays: the addressable shards with replica_id 0 (each shard exactly once
        across processes). Other leaves (numpy, scalars): only the `primary` process writes them.
        The primary also writes each array's zarr metadata."""
        version = check_version(version)
        _, entries, arrays = plan(params, self.chunk_bytes)
        jobs = []  # (open future, pieces): every array is opened concurrently, then written
        for entry, x in zip(entries, arrays, strict=True):
            pieces = []
            if isinstance(x, jax.Array):
                pieces = [(s.index, s.data) for s in x.addressable_shards if s.replica_id == 0]
            elif primary:
                pieces = [((), x)]
            if pieces or primary:
                jobs.append((self._open(version, entry, create=primary), pieces))
        futures, written = [], 0
        for opening, pieces in jobs:
            array = opening.result()
            for index, data in pieces:
                host = np.asarray(data)
                host = host.astype(host.dtype.newbyteorder("="), copy=False)
                futures.append(array[index].write(host) if index else array.write(host))
                written += host.nbytes
        for f in futures:
            f.result()  # durable once every future is done (file kvstore: fsynced)
        self.stats["bytes_written"] += written
        return written

    def commit(self, version: int, params: Any) -> None:
        """Publish `version`: write its manifest (the commit marker), then evict versions beyond
        `keep`. Call on ONE process, after every process's `write` has returned."""
        version = check_version(version)
        available = self.versions()
        check_new_version(version, available[-1] if available else None)
        skeleton, entries, _ = plan(params, self.chunk_bytes)
        manifest = {
            "format": FORMAT,
            "version": version,
            "created_unix_s": time.time(),
            "nbytes": sum(nbytes(e) for e in entries),
            "skeleton": base64.b64encode(skeleton).decode(),
            "arrays": entries,
        }
        key = manifest_key(version)
        self._store().write(key.encode(), json.dumps(manifest, indent=1).encode()).result()
        for v in (available + [version])[: -self.keep]:  # the hard cap: oldest go first
            self._delete(v)

    # ---- partial reads ----------------------------------------------------------------------

    def read_slices(
        self, version: int | None, selection: Mapping[str, Any]
    ) -> tuple[int, dict[str, np.ndarray]]:
        """Read only `selection`: {leaf path: index} (a slice, int or tuple of them, e.g.
        `np.s_[0:128, :]`; `()` = the whole leaf). Returns (version, {path: array})."""
        version, manifest = self._manifest_for(version)
        by_path = {e["path"]: e for e in manifest["arrays"]}
        wanted = []
        for path, index in selection.items():
            if path not in by_path:
                raise KeyError(
                    f"version {version} has no array {path!r} (first paths: {list(by_path)[:4]})"
                )
            wanted.append((by_path[path], _as_index(index, len(by_path[path]["shape"]))))
        arrays = self._read(version, manifest, wanted)
        return version, dict(zip(selection, arrays, strict=True))

    def get_sharded(self, version: int | None, shardings: Any) -> tuple[int, Any]:
        """(version, params as global jax.Arrays) placed with `shardings`: a pytree of
        `jax.sharding.Sharding` matching params, one Sharding for every array, or a function
        (path, shape) -> Sharding. Each process reads only the slices its devices hold (each
        distinct slice once, however many local devices replicate it)."""
        return self._newest(lambda v: self._get_sharded(v, shardings), version)

    def _get_sharded(self, version: int | None, shardings: Any) -> tuple[int, Any]:
        version, manifest = self._manifest_for(version)
        entries = manifest["arrays"]
        if isinstance(shardings, jax.sharding.Sharding):
            per_leaf = [shardings] * len(entries)
        elif callable(shardings):
            per_leaf = [shardings(e["path"], tuple(e["shape"])) for e in entries]
        else:
            flat = flatten_tree(shardings)
            missing = [e["path"] for e in entries if e["path"] not in flat]
            if missing:
                raise KeyError(f"no sharding given for {missing[:3]} ({len(missing)} leaves)")
            per_leaf = [flat[e["path"]] for e in entries]
        wanted, plan = [], []  # distinct (entry, index) reads; per leaf: device -> read number
        for entry, sharding in zip(entries, per_leaf, strict=True):
            index_map = sharding.addressable_devices_indices_map(tuple(entry["shape"]))
            seen: dict[tuple, int] = {}
            devices = {}
            for device, index in index_map.items():
                norm = tuple((s.start, s.stop, s.step) for s in index)
                if norm not in seen:
                    seen[norm] = len(wanted)
                    wanted.append((entry, tuple(index)))
                devices[device] = seen[norm]
            plan.append((sharding, devices))
        pieces = self._read(version, manifest, wanted)
        arrays = []
        for entry, (sharding, devices) in zip(entries, plan, strict=True):
            shards = [jax.device_put(pieces[i], d) for d, i in devices.items()]
            shape = tuple(entry["shape"])
            arrays.append(jax.make_array_from_single_device_arrays(shape, sharding, shards))
        return version, self._rebuild(manifest, arrays)

    # ---- internals ------------------------------------------------------------------------

    def _store(self) -> ts.KvStore:
        if self._kv is None:
            self._kv = ts.KvStore.open(self.root, context=self.context).result()
        return self._kv

    def _open(self, version: int, entry: dict, create: bool) -> ts.Future:
        spec = {
            "driver": "zarr3",
            "metadata": zarr_metadata(entry),
            "fill_missing_data_reads": False,  # a deleted chunk is an error, not zeros
            "store_data_equal_to_fill_value": True,  # ... so every chunk is really stored
        }
        kvstore = self._store() / f"{data_prefix(version)}{entry['name']}/"
        if create:
            return ts.open(spec, kvstore=kvstore, context=self.context, create=True)
        return ts.open(spec, kvstore=kvstore, context=self.context, open=True, assume_metadata=True)

    def _load_manifest(self, version: int) -> dict:
        with self._lock:
            if version in self._manifests:
                return self._manifests[version]
        result = self._store().read(manifest_key(version).encode()).result()
        if result.state != "value":
            raise unknown_version(version, self.versions())
        try:
            manifest = json.loads(result.value)
        except ValueError as e:  # UnicodeDecodeError included
            raise ValueError(f"version {version}: its manifest is not JSON ({e})") from None
        check_manifest(version, manifest, FORMAT)
        self._check_stored(version, manifest)
        with self._lock:
            self._manifests[version] = manifest
        return manifest

    def _check_stored(self, version: int, manifest: dict) -> None:
        """Every array's own zarr.json (read concurrently) agrees with the manifest's entry
        (tensorstore_layout.check_stored), or ValueError naming the array and the version; a
        version evicted meanwhile is unknown."""
        kv = self._store()
        keys = [f"{data_prefix(version)}{e['name']}/zarr.json".encode() for e in manifest["arrays"]]
        found = [f.result() for f in [kv.read(key) for key in keys]]
        if any(r.state != "value" for r in found) and not self._committed(version):
            raise unknown_version(version, self.versions())
        for entry, r in zip(manifest["arrays"], found, strict=True):
            check_stored(version, entry, r.value if r.state == "value" else None)

    def _manifest_for(self, version: int | None) -> tuple[int, dict]:
        available = self.versions()
        if not available:
            raise empty_store()
        version = available[-1] if version is None else check_version(version)
        if version not in available:
            raise unknown_version(version, available)
        with self._lock:  # forget manifests of versions that are gone
            for v in [v for v in self._manifests if v < available[0]]:
                del self._manifests[v]
        return version, self._load_manifest(version)

    def _committed(self, version: int) -> bool:
        key = manifest_key(version).encode()
        return self._store().read(key).result().state == "value"

    def _read(self, version: int, manifest: dict, wanted: list[tuple[dict, tuple]]) -> list:
        """Read (entry, index) pairs concurrently. If the version disappears meanwhile (evicted),
        raise UnknownVersionError: the manifest is deleted before the data, so a manifest that
        still exists after the reads means the reads saw only committed data."""
        try:
            opened = [(self._open(version, entry, create=False), index) for entry, index in wanted]
            futures = []
            for opening, index in opened:
                array = opening.result()
                futures.append((array[index] if index else array).read())
            out = [f.result() for f in futures]
        except ValueError:
            if not self._committed(version):
                raise unknown_version(version, self.versions()) from None
            raise
        if not self._committed(version):
            raise unknown_version(version, self.versions())
        self.stats["bytes_read"] += sum(a.nbytes for a in out)
        return out

    @staticmethod
    def _rebuild(manifest: dict, arrays: list) -> Any:
        skeleton = from_bytes(base64.b64decode(manifest["skeleton"]), copy=True)
        entries = manifest["arrays"]

        def fill(leaf: Any) -> Any:
            if isinstance(leaf, np.ndarray):  # a placeholder: [index]
                i = int(leaf[0])
                x = arrays[i]
                return x[()] if entries[i]["scalar"] and isinstance(x, np.ndarray) else x
            return leaf

        return jax.tree_util.tree_map(fill, skeleton)

    def _delete(self, version: int) -> None:
        """Manifest first (the version stops existing for readers), then its data. The data
        deletion runs in the background (file systems delete slowly); `flush` waits for it."""
        kv = self._store()
        kv.write(manifest_key(version).encode(), None).result()
        with self._lock:
            self._manifests.pop(version, None)
            future = kv.delete_range(prefix_range(data_prefix(version)))
            self._pending.append((version, future))
            backlog = len(self._pending) > self.keep
        self._reap(wait=backlog)

    def _reap(self, wait: bool) -> None:
        """Finish background deletions: the done ones, or all of them if `wait`."""
        with self._lock:
            pending, self._pending = self._pending, []
        keep = []
        for version, future in pending:
            if wait or future.done():
                future.result()  # a failed deletion surfaces here
                self._remove_empty_dir(data_prefix(version))
            else:
                keep.append((version, future))
        with self._lock:
            self._pending = keep + self._pending

    def flush(self) -> None:
        """Wait until deleted versions' data is gone from storage."""
        self._reap(wait=True)

    def _remove_empty_dir(self, sub: str) -> None:
        """`file` kvstores leave empty directories behind a delete_range; tidy them."""
        spec = self._store().spec().to_json()
        if spec.get("driver") != "file":
            return
        try:
            os.rmdir(os.path.join(spec["path"], sub))
        except OSError:
            pass

    def __repr__(self) -> str:
        root = self.root if isinstance(self.root, str) else json.dumps(self.root)
        return f"TensorStoreWeightStore({root!r}, keep={self.keep})"
