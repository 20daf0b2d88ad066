"""Parameter pytrees <-> bytes, plus the pytree helpers the store, checkpoints and tests share.

A parameter set (or optimizer state, or controller snapshot) is a pytree: nested dicts, lists and
tuples whose leaves are arrays (numpy or jax; float32, bfloat16, ints, ...), Python scalars, str,
bytes or None. `to_bytes` / `from_bytes` turn one into bytes and back, bit for bit; `write_tree` /
`read_tree` do the same to a file without building the bytes in memory first.

The format ("minirl tree", version 1) is the same in memory and on disk, in the spirit of
safetensors: a small msgpack header describing the tree, then the raw bytes of every array.

    offset 0    8 bytes   magic b"MRLTREE1"
    offset 8    8 bytes   header length H, unsigned little-endian
    offset 16   H bytes   msgpack map {"format": 1,
                                       "arrays": [[dtype, shape, offset], ...],
                                       "tree": <msgpack bytes of the tree skeleton>}
    zero padding up to a multiple of 64 (the start of the data section)
    the bytes of each array in C order, each at `data start + offset`, offsets multiples of 64

The skeleton is the tree with each array replaced by a reference to its entry in "arrays".
Because array bytes are never packed element by element, writing is one `write` per array and
reading is one `readinto` straight into the final numpy buffer; `from_bytes` makes zero-copy
(read-only) views. dtypes are stored by name ("<f4", "bfloat16"), so bfloat16 (from ml_dtypes,
which jax installs) round-trips exactly.

Simplified on purpose:
  * A namedtuple (optax states) or any other registered pytree node is stored as a dict of its
    fields; its Python type is not stored. `match_template` puts the values back into the
    template's structure (that is how checkpoints restore optax states). Tuples stay tuples.
  * Dict keys must be str or int. Integers wider than 64 bits (numpy RNG states) are kept exact.
  * No compression, no sharding: one tree is one buffer/file.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 & co. with numpy, so np.dtype("bfloat16") works)
import msgpack
import numpy as np

MAGIC = b"MRLTREE1"
FORMAT_VERSION = 1
ALIGN = 64  # every array starts at a multiple of this many bytes
CHUNK = 16 << 20  # files are read and written in pieces of at most this size

_ARRAY, _TUPLE, _BIGINT = 1, 2, 3  # msgpack extension type codes used in the skeleton
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what msgpack stores natively
_DTYPE_KINDS = "biufcmMSU"  # bool, ints, floats, complex, datetimes, fixed-width strings


class TreeMismatchError(ValueError):
    """A tree does not have the structure, shapes or dtypes it was expected to have."""


# ----------------------------------------------------------------------------------------------
# Encoding


def _dtype_name(dtype: np.dtype) -> str:
    if dtype.type.__module__ == "ml_dtypes":
        return dtype.name  # "bfloat16"; its dtype.str would be the meaningless "<V2"
    if dtype.kind not in _DTYPE_KINDS or dtype.names is not None:
        raise TypeError(f"cannot serialize arrays of dtype {dtype} (object or structured)")
    return dtype.str  # "<f4": keeps the byte order


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray | np.generic) or (
        hasattr(x, "__array__") and hasattr(x, "shape") and hasattr(x, "dtype")
    )


def _node_children(x: Any, path: str) -> dict:
    """Children of a registered pytree node that is not a dict/list/tuple, by key name (jax is
    imported only when such a node is met, so plain trees serialize without it)."""
    import jax

    flat, _ = jax.tree_util.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)
    if not (len(flat) == 1 and flat[0][1] is x):  # x is a node, not an unknown leaf
        return {_key_name(p[0]): child for p, child in flat}
    raise TypeError(f"cannot serialize {type(x).__name__} at '{path or '<root>'}'")


def _encode(x: Any, arrays: list[np.ndarray], path: str) -> Any:
    """The msgpack-native skeleton of `x`; arrays are appended to `arrays`."""
    if x is None or isinstance(x, bool | float | str | bytes):
        return x
    if isinstance(x, int):
        return x if _INT_MIN <= x <= _INT_MAX else msgpack.ExtType(_BIGINT, str(x).encode())
    if _is_array(x):
        scalar = isinstance(x, np.generic)
        arr = _c_order(np.asarray(x))
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


def _c_order(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else a.copy(order="C")  # (np.ascontiguousarray makes 0-d 1-d)


def _raw(a: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array as a flat uint8 view (works for bfloat16 too, which
    the buffer protocol rejects)."""
    return a.reshape(-1).view(np.uint8)


def _pieces(prefix: bytes, arrays: list[np.ndarray], offsets: list[int]):
    """Everything to write, in order: prefix, then each array (in CHUNK pieces) and padding."""
    yield prefix
    pos = 0
    for a, off in zip(arrays, offsets, strict=True):
        if off > pos:
            yield bytes(off - pos)
        raw = _raw(a)
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


def read_tree(f, size: int | None = None) -> Any:
    """Read one tree written by `write_tree` from the binary file `f` (needs `readinto`).
    Arrays are fresh, writable numpy arrays; their bytes are read straight into place.
    `size` (the file's length, if known) lets a damaged header be caught before allocating."""
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
        raw = _raw(a)
        for i in range(0, raw.size, CHUNK):
            _read_exact(f, raw[i : i + CHUNK])
        arrays.append(a)
        pos = off + a.nbytes
    return _decode(skeleton, arrays)


# ----------------------------------------------------------------------------------------------
# Pytree helpers: paths, flattening, templates, comparisons (these use jax.tree_util)


def _key_name(entry: Any) -> str:
    """One step of a jax key path as a plain name: dict key, field name or index."""
    for attr in ("key", "name", "idx"):  # DictKey / FlattenedIndexKey, GetAttrKey, SequenceKey
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def _paths(tree: Any) -> tuple[list[tuple[str, ...]], list[Any], Any]:
    """(leaf paths as tuples of names, leaves, treedef), in jax's leaf order."""
    import jax

    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    paths = [tuple(_key_name(k) for k in path) for path, _ in flat]
    if len(set(paths)) != len(paths):
        raise ValueError("two leaves have the same path (e.g. dict keys 1 and '1')")
    return paths, [leaf for _, leaf in flat], treedef


def _show(path: tuple[str, ...]) -> str:
    return "/".join(path)


def flatten_tree(tree: Any, sep: str = "/") -> dict[str, Any]:
    """`{"layers/0/attn/q": array, ...}` in jax's leaf order (dict keys sorted). Namedtuple
    fields and dict keys give the same names, so an optax state and its stored dict agree."""
    paths, leaves, _ = _paths(tree)
    for name in (name for path in paths for name in path):
        if sep in name:
            raise ValueError(f"key {name!r} contains the path separator {sep!r}")
    return {sep.join(path): leaf for path, leaf in zip(paths, leaves, strict=True)}


def unflatten_tree(flat: Mapping[str, Any], sep: str = "/") -> dict:
    """Nested dicts from `flatten_tree` output (lists come back as dicts with "0", "1" keys;
    use `match_template` to get the exact original structure)."""
    out: dict = {}
    for path, leaf in flat.items():
        *parents, last = path.split(sep)
        node = out
        for name in parents:
            node = node.setdefault(name, {})
            if not isinstance(node, dict):
                raise ValueError(f"path {path!r} passes through a leaf at {name!r}")
        if last in node:
            raise ValueError(f"path {path!r} is given twice or is also a parent")
        node[last] = leaf
    return out


def _describe(x: Any) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"shape {tuple(x.shape)} {np.dtype(x.dtype).name}"
    return f"{type(x).__name__} {x!r}"


def match_template(tree: Any, template: Any, what: str = "parameter") -> Any:
    """Return the leaves of `tree` arranged in `template`'s structure (e.g. optax namedtuples).

    Leaves are matched by path; every template leaf with a shape/dtype (arrays,
    jax.ShapeDtypeStruct) must match exactly. Raises TreeMismatchError naming the first
    mismatching `what` and both shapes/dtypes.
    """
    import jax

    stored = dict(zip(*_paths(tree)[:2], strict=True))
    paths, leaves, treedef = _paths(template)
    missing = [p for p in paths if p not in stored]
    wanted = set(paths)
    extra = [p for p in stored if p not in wanted]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{len(missing)} {what}(s) missing, first {_show(missing[0])!r}")
        if extra:
            parts.append(f"{len(extra)} unexpected {what}(s), first {_show(extra[0])!r}")
        raise TreeMismatchError(
            f"stored tree does not match the template: {'; '.join(parts)} "
            f"(stored {len(stored)} leaves, template {len(paths)})"
        )
    for p, t in zip(paths, leaves, strict=True):
        v = stored[p]
        if not (hasattr(t, "shape") and hasattr(t, "dtype")):
            continue
        if not _is_array(v) or tuple(v.shape) != tuple(t.shape) or np.dtype(v.dtype) != t.dtype:
            raise TreeMismatchError(
                f"{what} {_show(p)!r}: stored {_describe(v)}, but the template has {_describe(t)}"
            )
    return jax.tree_util.tree_unflatten(treedef, [stored[p] for p in paths])


def _leaf_mismatch(a: Any, b: Any, rtol: float | None, atol: float) -> str | None:
    if not (_is_array(a) and _is_array(b)):
        if type(a) is not type(b) or a != b:
            return f"{_describe(a)} vs {_describe(b)}"
        return None
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{_describe(a)} vs {_describe(b)}"
    if a.size == 0:
        return None
    if rtol is None or a.dtype.kind not in "biufcV":  # bit-exact: NaN == NaN, 0.0 != -0.0
        as_bytes = lambda x: _raw(_c_order(x)).reshape(x.shape + (x.itemsize,))
        diff = ~np.all(as_bytes(a) == as_bytes(b), axis=-1)
    else:  # "V": bfloat16 & co.
        wide = np.complex128 if a.dtype.kind == "c" else np.float64
        fa, fb = a.astype(wide), b.astype(wide)
        diff = ~np.isclose(fa, fb, rtol=rtol, atol=atol, equal_nan=True)
    if not diff.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(diff)[0])
    return (
        f"{_describe(a)}: {int(diff.sum())} of {a.size} elements differ, "
        f"first at index {idx}: {a[idx]} vs {b[idx]}"
    )


def tree_mismatch(
    actual: Any, expected: Any, rtol: float | None = None, atol: float = 0.0
) -> str | None:
    """None if the trees are equal, else a message naming the first differing leaf path with
    both shapes and dtypes. `rtol=None` means bit-exact; otherwise np.isclose(rtol, atol)."""
    pa, la, ta = _paths(actual)
    pe, le, te = _paths(expected)
    if pa != pe:
        only_a = [p for p in pa if p not in set(pe)]
        only_e = [p for p in pe if p not in set(pa)]
        first = f"first only in actual: {_show(only_a[0])!r}" if only_a else ""
        first += ("; " if first else "") + (
            f"first only in expected: {_show(only_e[0])!r}" if only_e else ""
        )
        return f"leaf paths differ ({len(pa)} vs {len(pe)} leaves; {first or 'order differs'})"
    for p, a, e in zip(pa, la, le, strict=True):
        msg = _leaf_mismatch(a, e, rtol, atol)
        if msg:
            return f"leaf {_show(p)!r}: {msg}"
    if ta != te:
        return f"same leaves but different containers: {ta} vs {te}"
    return None


def assert_trees_equal(actual: Any, expected: Any) -> None:
    """Assert two pytrees are bit-identical (structure, shapes, dtypes, bytes)."""
    msg = tree_mismatch(actual, expected)
    if msg:
        raise AssertionError(msg)


def assert_trees_allclose(
    actual: Any, expected: Any, rtol: float = 1e-6, atol: float = 0.0
) -> None:
    """Assert same structure, shapes and dtypes, and values close (np.isclose, NaN == NaN)."""
    msg = tree_mismatch(actual, expected, rtol=rtol, atol=atol)
    if msg:
        raise AssertionError(msg)
