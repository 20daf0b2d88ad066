"""Parameter pytrees <-> bytes (the pytree helpers they share with the store, checkpoints and
tests live in minirl/store/trees.py).

A parameter set (or optimizer state, or controller snapshot) is a pytree: nested dicts, lists and
tuples whose leaves are arrays (numpy or jax; float32, bfloat16, ints, ...), Python scalars, str,
bytes or None. `to_bytes` / `from_bytes` turn one into bytes and back, bit for bit; `write_tree` /
`read_tree` do the same to a file without building the bytes in memory first.

The format ("minirl tree", version 1) is the same in memory and on disk, in the spirit of
safetensors: a small msgpack header describing the tree (dtypes by name, "<f4" or "bfloat16", so
bfloat16 round-trips exactly), then the raw bytes of every array, each 64-byte aligned. The
byte layout, why the arrays are not packed inside msgpack, the supported leaf types, and how a
namedtuple (an optax state) is stored as a dict of its fields and put back by `match_template`
(minirl.store.trees): docs/weights.md, "Serialization".

Simplified on purpose: the Python type of a pytree node is not stored (loading never imports
code); no compression, no sharding: one tree is one buffer/file.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 & co. with numpy, so np.dtype("bfloat16") works)
import msgpack
import numpy as np

from minirl.store.trees import byte_view, c_order, is_array, key_name

MAGIC = b"MRLTREE1"
FORMAT_VERSION = 1
ALIGN = 64  # every array starts at a multiple of this many bytes
CHUNK = 16 << 20  # files are read and written in pieces of at most this size

_ARRAY, _TUPLE, _BIGINT = 1, 2, 3  # msgpack extension type codes used in the skeleton
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what msgpack stores natively
_DTYPE_KINDS = "biufcmMSU"  # bool, ints, floats, complex, datetimes, fixed-width strings


# ----------------------------------------------------------------------------------------------
# Encoding


def _dtype_name(dtype: np.dtype) -> str:
    if dtype.type.__module__ == "ml_dtypes":
        return dtype.name  # "bfloat16"; its dtype.str would be the meaningless "<V2"
    if dtype.kind not in _DTYPE_KINDS or dtype.names is not None:
        raise TypeError(f"cannot serialize arrays of dtype {dtype} (object or structured)")
    return dtype.str  # "<f4": keeps the byte order


def _node_children(x: Any, path: str) -> dict:
    """Children of a registered pytree node that is not a dict/list/tuple, by key name (jax is
    imported only when such a node is met, so plain trees serialize without it)."""
    import jax

    flat, _ = jax.tree_util.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)
    if not (len(flat) == 1 and flat[0][1] is x):  # x is a node, not an unknown leaf
        return {key_name(p[0]): child for p, child in flat}
    raise TypeError(f"cannot serialize {type(x).__name__} at '{path or '<root>'}'")


def _encode(x: Any, arrays: list[np.ndarray], path: str) -> Any:
    """The msgpack-native skeleton of `x`; arrays are appended to `arrays`."""
    if x is None or isinstance(x, bool | float | str | bytes):
        return x
    if isinstance(x, int):
        return x if _INT_MIN <= x <= _INT_MAX else msgpack.ExtType(_BIGINT, str(x).encode())
    if is_array(x):
        scalar = isinstance(x, np.generic)
        arr = c_order(np.asarray(x))
        _dtype_name(arr.dtype)  # fail early on unsupported dtypes
        arrays.append(arr)
        return msgpack.ExtType(_ARRAY, msgpack.packb([len(arrays) - 1, scalar]))
    if isinstance(x, Mapping):
        out = {}
        for k, v in x.items():
            if isinstance(k, bool) or not isinstance(k, str | int):
                raise TypeError(f"dict keys must be str or int, got {k!r} at '{path}'")
            out[k] = _encode(v, arrays, f"{path}/{k}" if path else str(k))
        return out
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple -> dict of fields
        return _encode(dict(zip(x._fields, x, strict=True)), arrays, path)
    if isinstance(x, list | tuple):
        items = [_encode(v, arrays, f"{path}/{i}" if path else str(i)) for i, v in enumerate(x)]
        return items if isinstance(x, list) else msgpack.ExtType(_TUPLE, msgpack.packb(items))
    return _encode(_node_children(x, path), arrays, path)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _layout(tree: Any) -> tuple[bytes, list[np.ndarray], list[int]]:
    """(prefix = magic + length + header + padding, arrays, their offsets in the data section)."""
    arrays: list[np.ndarray] = []
    skeleton = msgpack.packb(_encode(tree, arrays, ""))
    offsets, pos = [], 0
    for a in arrays:
        offsets.append(pos)
        pos = _aligned(pos + a.nbytes)
    header = msgpack.packb(
        {
            "format": FORMAT_VERSION,
            "arrays": [
                [_dtype_name(a.dtype), list(a.shape), o]
                for a, o in zip(arrays, offsets, strict=True)
            ],
            "tree": skeleton,
        }
    )
    prefix = MAGIC + struct.pack("<Q", len(header)) + header
    return prefix + bytes(_aligned(len(prefix)) - len(prefix)), arrays, offsets


def _pieces(prefix: bytes, arrays: list[np.ndarray], offsets: list[int]):
    """Everything to write, in order: prefix, then each array (in CHUNK pieces) and padding."""
    yield prefix
    pos = 0
    for a, off in zip(arrays, offsets, strict=True):
        if off > pos:
            yield bytes(off - pos)
        raw = byte_view(a)
        for i in range(0, raw.size, CHUNK):
            yield raw[i : i + CHUNK]
        pos = off + a.nbytes


def to_bytes(tree: Any) -> bytes:
    """Serialize a pytree; `from_bytes(to_bytes(t))` equals `t` bit for bit (see module doc)."""
    return b"".join(_pieces(*_layout(tree)))  # one copy of each array's bytes


def to_buffer(tree: Any) -> np.ndarray:
    """The bytes of `to_bytes(tree)` in a writable uint8 numpy array. For large trees this is
    ~4x cheaper than `to_bytes`: numpy backs big buffers with huge pages, so filling one costs
    about a memcpy, while a 300 MB `bytes` also pays ~75k page faults."""
    pieces = [np.frombuffer(piece, np.uint8) for piece in _pieces(*_layout(tree))]
    out = np.empty(sum(piece.size for piece in pieces), np.uint8)
    pos = 0
    for piece in pieces:
        out[pos : pos + piece.size] = piece
        pos += piece.size
    return out


def write_tree(f, tree: Any) -> int:
    """Write `tree` to the binary file `f` (anything with `write`); returns bytes written.
    Produces exactly `to_bytes(tree)`, without holding it in memory."""
    total = 0
    for piece in _pieces(*_layout(tree)):
        view = memoryview(piece)
        while view.nbytes:  # raw files may write less than asked
            n = f.write(view)
            view, total = view[n:], total + n
    return total


# ----------------------------------------------------------------------------------------------
# Decoding


def _parse_header(header: bytes) -> tuple[list[tuple[np.dtype, tuple, int]], bytes]:
    try:
        h = msgpack.unpackb(header)
        if h["format"] != FORMAT_VERSION:
            raise ValueError(f"unsupported tree format {h['format']} (this code reads 1)")
        specs = [(np.dtype(d), tuple(int(s) for s in shape), int(o)) for d, shape, o in h["arrays"]]
        return specs, h["tree"]
    except (msgpack.UnpackException, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"corrupt tree header: {e}") from e


def _decode(skeleton: bytes, arrays: list[np.ndarray]) -> Any:
    def hook(code: int, data: bytes) -> Any:
        if code == _ARRAY:
            index, scalar = msgpack.unpackb(data)
            return arrays[index][()] if scalar else arrays[index]
        if code == _TUPLE:
            return tuple(msgpack.unpackb(data, ext_hook=hook, strict_map_key=False))
        if code == _BIGINT:
            return int(data.decode())
        raise ValueError(f"corrupt tree skeleton: unknown extension type {code}")

    try:
        return msgpack.unpackb(skeleton, ext_hook=hook, strict_map_key=False)
    except (msgpack.UnpackException, IndexError, TypeError) as e:
        raise ValueError(f"corrupt tree skeleton: {e}") from e


def _prefix_length(first16: bytes) -> int:
    if len(first16) < 16 or first16[:8] != MAGIC:
        raise ValueError("not a minirl tree (bad magic bytes or too short)")
    return struct.unpack("<Q", first16[8:16])[0]


def _check_layout(specs: list, start: int, size: int | None) -> None:
    """Offsets in order and aligned, no negative dims, and (if `size` is known) every array
    inside the buffer/file: a damaged header fails here, before anything is allocated."""
    end = 0
    for dtype, shape, off in specs:
        if off < end or off % ALIGN or min(shape, default=0) < 0:
            raise ValueError("corrupt tree header: bad array offsets or shapes")
        end = off + dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if size is not None and start + end > size:
        raise ValueError(f"truncated tree: the header describes {start + end} bytes, got {size}")


def from_bytes(b: bytes | bytearray | memoryview, copy: bool = False) -> Any:
    """Inverse of `to_bytes`. Arrays are views into `b` (zero copy; read-only if `b` is, e.g.
    bytes) unless `copy`. `b` may be a uint8 numpy array (`to_buffer`, a file read into one)."""
    b = memoryview(b).cast("B")
    n = _prefix_length(bytes(b[:16]))
    if 16 + n > b.nbytes:
        raise ValueError(f"truncated tree: header needs {16 + n} bytes, got {b.nbytes}")
    specs, skeleton = _parse_header(bytes(b[16 : 16 + n]))
    start = _aligned(16 + n)
    _check_layout(specs, start, b.nbytes)
    arrays = []
    for dtype, shape, off in specs:
        count = int(np.prod(shape, dtype=np.int64))
        a = np.frombuffer(b, dtype, count, offset=start + off) if count else np.empty(0, dtype)
        a = a.reshape(shape)
        arrays.append(a.copy() if copy else a)
    return _decode(skeleton, arrays)


def _read_exact(f, view) -> None:
    view = memoryview(view).cast("B")
    while view.nbytes:
        n = f.readinto(view)
        if not n:
            raise ValueError(f"truncated tree: file ended {view.nbytes} bytes early")
        view = view[n:]


def read_tree(f, size: int | None = None, place=None) -> Any:
    """Read one tree written by `write_tree` from the binary file `f` (needs `readinto`): fresh,
    writable numpy arrays, their bytes read straight into place, each handed to `place` if given
    (the tree holds what it returns). `size` (the file's length) catches a damaged header early."""
    first = bytearray(16)
    _read_exact(f, first)
    n = _prefix_length(bytes(first))
    if size is not None and 16 + n > size:
        raise ValueError(f"truncated tree: header needs {16 + n} bytes, the file has {size}")
    rest = bytearray(_aligned(16 + n) - 16)  # header + padding
    _read_exact(f, rest)
    specs, skeleton = _parse_header(bytes(rest[:n]))
    _check_layout(specs, _aligned(16 + n), size)
    arrays, pos = [], 0
    for dtype, shape, off in specs:
        if off > pos:
            _read_exact(f, bytearray(off - pos))
        a = np.empty(shape, dtype)
        raw = byte_view(a)
        for i in range(0, raw.size, CHUNK):
            _read_exact(f, raw[i : i + CHUNK])
        arrays.append(a if place is None else place(a))
        pos = off + a.nbytes
    return _decode(skeleton, arrays)
