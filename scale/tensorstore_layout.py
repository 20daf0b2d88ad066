"""How scale/tensorstore_weights.py lays versions out under its root — `data/<version>/<array>/`
and `manifests/<version>.json`, versions zero-padded so keys sort like the numbers — and a
parameter tree out as zarr v3 arrays: one array per array leaf, chunks that tile each process's shard (so no two processes write the same chunk), the
full zarr metadata kept in the manifest (so readers open arrays without reading it), and the tree's
skeleton with each array replaced by its index.

    skeleton, entries, arrays = plan(params, chunk_bytes=64 << 20)
    entries[0] == {"path": "embed", "name": "00000", "shape": [V, D], "dtype": "float32",
                   "chunks": [rows, D], "scalar": False}
"""

from __future__ import annotations

import base64
import json
import math
import re
from typing import Any

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np

from minirl.configlib import optional_import
from minirl.store.serialization import from_bytes, to_bytes
from minirl.store.trees import flatten_tree

ts = optional_import("tensorstore", "scale", "the TensorStore weight store (scale/)")

MANIFESTS = "manifests/"
_DIGITS = 12  # version numbers in keys are zero-padded, so keys sort like the numbers


def manifest_key(version: int) -> str:
    return f"{MANIFESTS}{version:0{_DIGITS}d}.json"


_MANIFEST_KEY = re.compile(rb"manifests/([0-9]+)\.json")


def manifest_version(key: bytes) -> int | None:
    """The version a manifests/ key names, or None for anything else under manifests/: only
    `manifest_key(v)` itself names v (a stray "7.json" would list a version no read finds)."""
    match = _MANIFEST_KEY.fullmatch(key)
    version = int(match.group(1)) if match else None
    return version if version is not None and manifest_key(version).encode() == key else None


def data_prefix(version: int) -> str:
    return f"data/{version:0{_DIGITS}d}/"


def prefix_range(prefix: str) -> ts.KvStore.KeyRange:
    """All keys that start with `prefix` (which ends in "/": the next byte after "/" is "0")."""
    return ts.KvStore.KeyRange(prefix.encode(), prefix[:-1].encode() + b"0")


def is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray | np.generic | jax.Array)


def rows_per_chunk(shape: tuple[int, ...], itemsize: int, target: int, divide: bool) -> int:
    """Rows (leading-axis entries) per chunk so a chunk holds about `target` bytes. With
    `divide`, a divisor of shape[0], so chunks tile a shard exactly."""
    if not shape or shape[0] <= 1:
        return 1
    row = itemsize * int(np.prod(shape[1:], dtype=np.int64)) or 1
    rows = max(1, min(shape[0], target // row))
    if divide:
        while shape[0] % rows:
            rows -= 1
    return rows


def chunk_shape(x: Any, target: int) -> list[int]:
    """Chunks fill a shard (a jax.Array's per-device block) or the whole array, split along the
    leading axis into pieces of about `target` bytes."""
    shape = tuple(int(s) for s in x.shape)
    if isinstance(x, jax.Array) and not isinstance(x.sharding, jax.sharding.SingleDeviceSharding):
        block = tuple(int(s) for s in x.sharding.shard_shape(shape))
        divide = bool(block) and block[0] != shape[0]  # axis 0 split: chunks must tile shards
    else:
        block, divide = shape, False
    itemsize = np.dtype(x.dtype).itemsize
    rows = rows_per_chunk(block, itemsize, target, divide)
    return [max(1, d) for d in (rows, *block[1:])] if block else []


def zarr_metadata(entry: dict) -> dict:
    """Full zarr v3 metadata of one array entry, so readers can open without reading it."""
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": entry["shape"],
        "data_type": entry["dtype"],
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": entry["chunks"]}},
        "chunk_key_encoding": {"name": "default"},
        "fill_value": False if entry["dtype"] == "bool" else 0,
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
    }


def _dtype_name(dtype: Any) -> str:
    dtype = np.dtype(dtype)
    try:
        return ts.dtype(dtype.newbyteorder("=")).name
    except (TypeError, ValueError):
        raise TypeError(f"TensorStore cannot store arrays of dtype {dtype}") from None


def plan(params: Any, chunk_bytes: int) -> tuple[bytes, list[dict], list[Any]]:
    """(skeleton bytes, one manifest entry per array leaf, the array leaves), in jax leaf order."""
    paths = list(flatten_tree(params))
    leaves, treedef = jax.tree_util.tree_flatten(params)
    if len(paths) != len(leaves):  # flatten_tree and tree_flatten walk the same leaves
        raise AssertionError("leaf paths and leaves disagree")
    entries, arrays, skeleton = [], [], []
    for path, leaf in zip(paths, leaves, strict=True):
        if not is_array(leaf):
            skeleton.append(leaf)  # ints, floats, strings stay in the skeleton
            continue
        entries.append(
            {
                "path": path,
                "name": f"{len(arrays):05d}",
                "shape": [int(s) for s in leaf.shape],
                "dtype": _dtype_name(leaf.dtype),
                "chunks": chunk_shape(leaf, chunk_bytes),
                "scalar": isinstance(leaf, np.generic),
            }
        )
        skeleton.append(np.array([len(arrays)], np.int64))  # placeholder: its index
        arrays.append(leaf)
    return to_bytes(jax.tree_util.tree_unflatten(treedef, skeleton)), entries, arrays


def nbytes(entry: dict) -> int:
    return math.prod(entry["shape"]) * np.dtype(entry["dtype"]).itemsize


def check_manifest(version: int, manifest: Any, fmt: str) -> dict:
    """`manifest` (parsed JSON) if it is a well-formed `fmt` manifest of `version`, else
    ValueError naming what is wrong. A damaged or hand-edited manifest is refused before any
    array is opened by it: an entry's name is its index (a name is a path under the version's
    directory), and shapes must hold the bytes the manifest counts (a stray shape would read a
    part of an array, or allocate without bound)."""

    def bad(what: str) -> ValueError:
        return ValueError(f"version {version}: the store's manifest is damaged ({what})")

    if not isinstance(manifest, dict):
        raise bad(f"a JSON {type(manifest).__name__}, not an object")
    if manifest.get("format") != fmt:
        raise ValueError(f"version {version}: unknown manifest format {manifest.get('format')!r}")
    if manifest.get("version") != version:
        raise bad(f"it is the manifest of version {manifest.get('version')!r}")
    arrays = manifest.get("arrays")
    if not isinstance(arrays, list):
        raise bad("no list of arrays")
    for i, e in enumerate(arrays):
        if not _well_formed(e, i):
            raise bad(f"array entry {i} is {json.dumps(e)[:200]}")
    total = sum(nbytes(e) for e in arrays)
    if manifest.get("nbytes") != total:
        raise bad(f"its arrays hold {total} bytes, not {manifest.get('nbytes')!r}")
    try:
        skeleton = from_bytes(base64.b64decode(manifest["skeleton"], validate=True))
    except (KeyError, TypeError, ValueError) as e:
        raise bad(f"unreadable skeleton: {e}") from None
    placeholders = [int(x[0]) for x in jax.tree.leaves(skeleton) if isinstance(x, np.ndarray)]
    if placeholders != list(range(len(arrays))):
        raise bad(f"the skeleton holds {len(placeholders)} arrays, the entries {len(arrays)}")
    return manifest


def check_stored(version: int, entry: dict, stored: bytes | None) -> None:
    """ValueError unless `stored` (the array's own zarr.json; None: missing) records the dtype,
    shape and chunks of its manifest `entry`. Readers open arrays with the manifest's metadata
    alone, so a manifest edited from float32 to int32 (or bfloat16 to float16: the same bytes
    per element) would otherwise read every weight as another type."""
    where = f"version {version}: array {entry['path']!r} (data/.../{entry['name']}/)"
    try:
        meta = json.loads(stored)
        grid = meta["chunk_grid"]["configuration"]["chunk_shape"]
        found = f"{meta['data_type']} {meta['shape']} (chunks {grid})"
    except (TypeError, ValueError, KeyError) as e:  # None, not JSON, not zarr v3 metadata
        raise ValueError(f"{where}: its zarr.json is missing or unreadable ({e!r})") from None
    said = f"{entry['dtype']} {entry['shape']} (chunks {entry['chunks']})"
    if found != said:
        raise ValueError(
            f"{where} is stored as {found}, but the version's manifest says {said}: the "
            "manifest was edited or damaged, and the version cannot be read"
        )


def _well_formed(e: Any, i: int) -> bool:
    def ints(xs: Any, low: int) -> bool:
        return isinstance(xs, list) and all(type(x) is int and x >= low for x in xs)

    try:
        dtype_ok = _dtype_name(e["dtype"]) == e["dtype"]
    except (KeyError, TypeError):
        return False
    return (
        dtype_ok
        and e.get("name") == f"{i:05d}"
        and isinstance(e.get("path"), str)
        and ints(e.get("shape"), 0)
        and ints(e.get("chunks"), 1)
        and len(e["chunks"]) == len(e["shape"])
        and isinstance(e.get("scalar"), bool)
    )
