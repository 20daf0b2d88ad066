"""Nested frozen-dataclass configs: overrides from the command line, dicts, and a stable hash.

Every component of minirl has a small frozen dataclass config; `minirl.config.RunConfig` nests
them. This module holds the three generic operations on such trees:

  override(cfg, "engine.temperature=0.8")   a new config with one field changed; the value
                                            string is parsed by the field's declared type, and an
                                            unknown key names the valid ones
  to_dict(cfg) / from_dict(cls, d)          plain JSON-able dicts (run directories keep one)
  config_hash(cfg)                          a short stable hash (a resumed run must match it)
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import hashlib
import importlib
import inspect
import io
import json
import math
import textwrap
import tokenize
import types
import typing
from typing import Any


class ConfigError(ValueError):
    """A bad key or value in a config override or file."""


class MissingExtra(ConfigError):
    """A path the user chose needs an optional package that is not installed."""


def optional_import(module: str, extra: str, needed_for: str):
    """`module`, imported; or MissingExtra, one line naming the extra that installs it.

    minirl's core (`pip install minirl`) runs the built-in main job; Parquet files, TensorBoard,
    W&B, math-verify and the multi-host layer (scale/) need an extra of pyproject.toml. Every
    optional package is imported through here, where it is used, so a missing one says what to
    install instead of raising a traceback deep inside a run."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        raise MissingExtra(
            f"{needed_for} needs the {top!r} package ({e}): pip install 'minirl[{extra}]' "
            f"(in a checkout: pip install -e '.[{extra}]')"
        ) from None


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _parse(text: str, tp: Any, key: str) -> Any:
    """Parse a command-line string as type `tp` (bool, int, float, str, tuples, Optional). A str
    is taken as written (an instruction may start with a space); other types ignore spaces."""
    if tp is str:
        return text
    text = text.strip()
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if text.lower() in ("none", "null") and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _parse(text, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError("; ".join(errors))
    if tp is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key}: expected true/false, got {text!r}")
    if tp in (int, float):
        try:
            value = float(text) if tp is float else int(text)
        except ValueError:
            raise ConfigError(f"{key}: expected {tp.__name__}, got {text!r}") from None
        return _finite(value, key) if tp is float else value
    if tp is str:
        return text
    if origin is tuple or tp is tuple or origin is dict or tp is dict or tp is Any:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            if tp is Any:
                return text
            if origin is dict or tp is dict:  # JSON spelling too: {"enable_thinking": false}
                with contextlib.suppress(json.JSONDecodeError):
                    return _typed(json.loads(text), tp, key)
            if args in ((str, ...), (str,)):  # words: calc,py or (calc, py) -> ("calc", "py")
                return tuple(w.strip() for w in text.strip("()[]").split(",") if w.strip())
            raise ConfigError(
                f"{key}: expected a Python literal like (1, 2), got {text!r}"
            ) from None
        if origin is tuple or tp is tuple:
            value = _typed(value if isinstance(value, (list, tuple)) else (value,), tp, key)
        elif origin is dict or tp is dict:
            value = _typed(value, tp, key)
        return value
    raise ConfigError(f"{key}: cannot parse a value of type {tp}")


def override(cfg, assignment: str):
    """Apply one "a.b.c=value" assignment to a nested frozen dataclass, returning a new one."""
    if "=" not in assignment:
        raise ConfigError(
            f"override {assignment!r} must look like key=value (e.g. engine.temperature=0.8)"
        )
    key, text = assignment.split("=", 1)
    return _set(cfg, key.strip().split("."), text, key.strip())  # str values keep their spaces


def _set(cfg, path: list[str], text: str, full_key: str):
    if not dataclasses.is_dataclass(cfg):
        raise ConfigError(f"{full_key}: {type(cfg).__name__} has no sub-keys")
    names = [f.name for f in dataclasses.fields(cfg)]
    head = path[0]
    if head not in names:
        raise ConfigError(f"unknown key {full_key!r}: {type(cfg).__name__} has {', '.join(names)}")
    current = getattr(cfg, head)
    if len(path) > 1:
        if isinstance(current, dict):
            value = dict(current)
            value[path[1]] = _parse(text, Any, full_key) if len(path) == 2 else None
            if len(path) > 2:
                raise ConfigError(f"{full_key}: dict values cannot be nested")
        else:
            value = _set(current, path[1:], text, full_key)
    elif dataclasses.is_dataclass(current):
        raise ConfigError(
            f"{full_key} is a group of settings; set one of its keys, e.g. {full_key}.<name>=..."
        )
    else:
        value = _parse(text, _hints(type(cfg))[head], full_key)
    try:
        return dataclasses.replace(cfg, **{head: value})
    except (ValueError, TypeError) as e:  # __post_init__ validation
        raise ConfigError(f"{full_key}={text}: {e}") from None


def read_json_object(file, error: type[Exception] = ConfigError) -> dict | None:
    """The JSON object in `file` (None if there is no such file), or `error` naming the file:
    what every reader of a model directory's config files needs."""
    from pathlib import Path

    file = Path(file)
    if not file.exists():
        return None
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{file} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise error(f"{file} must hold a JSON object, not {type(data).__name__}")
    return data


def to_dict(cfg) -> dict[str, Any]:
    """A nested dataclass -> JSON-able nested dict (tuples become lists)."""
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        out[f.name] = to_dict(v) if dataclasses.is_dataclass(v) else _jsonable(v)
    return out


def _jsonable(v):
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    return v


def from_dict(cls, data: dict[str, Any], prefix: str = ""):
    """Rebuild a nested dataclass from `to_dict` output. Every value is checked against its
    field's declared type (a hand-edited file may hold "ten" for an int): a wrong type or an
    unknown key is a ConfigError naming the dotted key."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{prefix.rstrip('.') or cls.__name__}: expected a JSON object, got {data!r}"
        )
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"unknown keys for {prefix or cls.__name__}: {sorted(unknown)}")
    kwargs = {}
    for name, value in data.items():
        tp, key = hints[name], prefix + name
        if dataclasses.is_dataclass(tp):
            kwargs[name] = from_dict(tp, value, key + ".")
        else:
            kwargs[name] = _typed(value, tp, key)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:  # __post_init__ validation
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {e}") from None


def _typed(value: Any, tp: Any, key: str) -> Any:
    """`value` (parsed JSON) as declared type `tp`, or ConfigError. Lists become tuples."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is not type(None):
                try:
                    return _typed(value, arg, key)
                except ConfigError:
                    pass
    elif tp is Any or tp is dict or origin is dict:
        if tp is Any or isinstance(value, dict):
            return value
    elif tp is tuple or origin is tuple:
        if isinstance(value, (list, tuple)):
            inner = args[0] if args and (len(args) == 1 or args[-1] is Ellipsis) else Any
            return tuple(_typed(v, inner, f"{key}[{i}]") for i, v in enumerate(value))
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _finite(float(value), key)
    elif isinstance(tp, type) and isinstance(value, tp):
        return value
    name = getattr(tp, "__name__", str(tp))
    raise ConfigError(f"{key}: expected {name}, got {value!r}")


def _finite(value: float, key: str) -> float:
    """No knob takes nan or inf: a non-finite value is always a mistake (and nan passes every
    `x < 0` range check silently)."""
    if not math.isfinite(value):
        raise ConfigError(f"{key}: must be a finite number, got {value}")
    return value


def config_hash(cfg, ignore: tuple[str, ...] = ()) -> str:
    """A short hash of the config's content (stable across processes and runs); `ignore` names
    dotted keys left out (e.g. how long to run, which does not change what a step does)."""
    data = to_dict(cfg)
    for key in ignore:
        *parents, leaf = key.split(".")
        node = data
        for name in parents:
            node = node.get(name, {})
        node.pop(leaf, None)
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _field_comments(cls) -> dict[str, str]:
    """The `# comment` of each field in the class source: the knob's help text. A field that a
    formatter wrapped over several lines keeps its comment somewhere inside its statement, so
    every comment from the field's first line to its last is read, in order, and joined."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}  # line number -> comment text
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    (body,) = ast.parse(source).body
    found = {}
    for node in body.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            lines = range(node.lineno, node.end_lineno + 1)
            text = " ".join(comments[n] for n in lines if comments.get(n))
            if text:
                found[node.target.id] = text
    return found


def describe(cls, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, help) for every leaf field of a nested config class, for `--help`."""
    rows = []
    defaults, comments = cls(), _field_comments(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        value = getattr(defaults, f.name)
        if dataclasses.is_dataclass(value):
            rows += describe(type(value), key + ".")
        else:
            rows.append((key, repr(value), f.metadata.get("help", comments.get(f.name, ""))))
    return rows
