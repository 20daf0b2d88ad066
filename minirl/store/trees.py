"""Pytree helpers shared by serialization, the weight stores, checkpoints and tests: leaf paths,
flattening to `{"a/b/c": leaf}` and back, putting stored leaves into a template's structure
(optax namedtuples included), and comparing two trees with a message that names the first
differing leaf.

    flat = flatten_tree(params)                      # {"layers/0/attn/q": array, ...}
    state = match_template(stored, template)         # TreeMismatchError names the first bad leaf
    assert_trees_equal(resumed, reference)           # bit-exact: NaN == NaN, 0.0 != -0.0
    host_view(jax_array)                             # read-only numpy, no copy on the CPU
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 & co. with numpy)
import numpy as np


class TreeMismatchError(ValueError):
    """A tree does not have the structure, shapes or dtypes it was expected to have."""


def host_view(x: Any) -> np.ndarray:
    """A read-only host numpy array of `x`. A JAX array on the CPU is viewed in place (no copy:
    at the 0.5B shape a checkpoint's params and AdamW state are 6 GB); elsewhere it is copied
    to the host. JAX arrays never change, and one whose buffer a view still holds is not
    donated (XLA then writes the jitted function's output elsewhere), so the view keeps its
    values. A numpy array is copied: its owner may still write to it."""
    import jax

    a = np.asarray(x) if isinstance(x, jax.Array) else np.array(x, copy=True, order="C")
    a.flags.writeable = False
    return a


def is_array(x: Any) -> bool:
    """numpy or jax arrays and numpy scalars (anything with __array__, shape and dtype)."""
    return isinstance(x, np.ndarray | np.generic) or (
        hasattr(x, "__array__") and hasattr(x, "shape") and hasattr(x, "dtype")
    )


def c_order(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else a.copy(order="C")  # (np.ascontiguousarray makes 0-d 1-d)


def byte_view(a: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array as a flat uint8 view (works for bfloat16 too, which
    the buffer protocol rejects)."""
    return a.reshape(-1).view(np.uint8)


def key_name(entry: Any) -> str:
    """One step of a jax key path as a plain name: dict key, field name or index."""
    for attr in ("key", "name", "idx"):  # DictKey / FlattenedIndexKey, GetAttrKey, SequenceKey
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def _paths(tree: Any) -> tuple[list[tuple[str, ...]], list[Any], Any]:
    """(leaf paths as tuples of names, leaves, treedef), in jax's leaf order."""
    import jax

    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    paths = [tuple(key_name(k) for k in path) for path, _ in flat]
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


def match_template(
    tree: Any, template: Any, what: str = "parameter", check_dtype: bool = True
) -> Any:
    """Return the leaves of `tree` arranged in `template`'s structure (e.g. optax namedtuples).

    Leaves are matched by path; every template leaf with a shape/dtype (arrays,
    jax.ShapeDtypeStruct) must match exactly (the dtype only with `check_dtype`: a caller that
    casts anyway). Raises TreeMismatchError naming the first mismatching `what` and both
    shapes/dtypes.
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
        same_dtype = not check_dtype or np.dtype(v.dtype) == t.dtype
        if not is_array(v) or tuple(v.shape) != tuple(t.shape) or not same_dtype:
            raise TreeMismatchError(
                f"{what} {_show(p)!r}: stored {_describe(v)}, but the template has {_describe(t)}"
            )
    return jax.tree_util.tree_unflatten(treedef, [stored[p] for p in paths])


def _leaf_mismatch(a: Any, b: Any, rtol: float | None, atol: float) -> str | None:
    if not (is_array(a) and is_array(b)):
        if type(a) is not type(b) or a != b:
            return f"{_describe(a)} vs {_describe(b)}"
        return None
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{_describe(a)} vs {_describe(b)}"
    if a.size == 0:
        return None
    if rtol is None or a.dtype.kind not in "biufcV":  # bit-exact: NaN == NaN, 0.0 != -0.0
        as_bytes = lambda x: byte_view(c_order(x)).reshape(x.shape + (x.itemsize,))
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
