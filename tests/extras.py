"""What `pip install minirl` alone does not install: the import names of every package that only
an extra of pyproject.toml brings (issue #44), read from the installed package's metadata.

`OPTIONAL` is what tests/test_core_install.py forbids at module level on the core path and
blocks in a subprocess (`blocked_python`) to run minirl as the core install would, without
making a second virtual environment. CI also proves it for real (.ci/run's first phase).
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _dist_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;(]", requirement.strip(), maxsplit=1)[0]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements() -> list[str]:
    """minirl's requirement strings as installed metadata writes them (`x>=1; extra == "hf"`),
    from pyproject.toml itself where Python can read TOML (3.11+), so an edit counts at once."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the installed metadata
        return list(md.requires("minirl") or [])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = list(project["dependencies"])
    for extra, reqs in project.get("optional-dependencies", {}).items():
        out += [f'{r}; extra == "{extra}"' for r in reqs]
    return out


def extra_distributions() -> dict[str, set[str]]:
    """{"core": dists of the core, extra name: its dists}."""
    out: dict[str, set[str]] = {"core": set()}
    for req in _requirements():
        match = re.search(r"""extra\s*==\s*["']([^"']+)["']""", req)
        out.setdefault(match.group(1) if match else "core", set()).add(_normal(_dist_name(req)))
    return out


def _import_names(dists: set[str]) -> set[str]:
    """Top-level import names of `dists`: from what is installed, else the usual spelling."""
    found: dict[str, set[str]] = {}
    for top, owners in md.packages_distributions().items():
        for owner in owners:
            found.setdefault(_normal(owner), set()).add(top)
    names = set()
    for dist in dists:
        names |= {n for n in found.get(dist, ()) if not n.startswith("_")} or {
            dist.replace("-", "_")
        }
    return names


def core_closure() -> set[str]:
    """The core's dists and everything they require in turn (flax brings orbax-checkpoint and
    tensorstore, say), as far as it is installed here."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = list(extra_distributions()["core"])
    while todo:
        dist = todo.pop()
        if dist in seen:
            continue
        seen.add(dist)
        try:
            requires = md.requires(dist) or []
        except md.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_normal(req.name))
    return seen


@functools.cache
def optional_imports() -> frozenset[str]:
    """Import names that only an extra installs (in an extra, not needed by the core)."""
    dists = extra_distributions()
    core = core_closure()
    only_extras = set().union(*(d for k, d in dists.items() if k != "core")) - core
    return frozenset(_import_names(only_extras) - _import_names(core))


def blocked_python(code: str) -> list[str]:
    """A `python -c` command line running `code` as if no extra were installed: each optional
    package is None in sys.modules, so importing it raises ImportError."""
    block = f"import sys\nfor _m in {sorted(optional_imports())!r}:\n    sys.modules[_m] = None\n"
    return [sys.executable, "-c", block + code]
