"""The shape of minirl/ (issue #18): the import graph has no circle and nothing in the core
imports the tools above it; the core stays small enough to read (at most 10k lines) and no
function is longer than 60 lines.

Read from the source (every `import`, also the ones inside functions), not from a running
interpreter, so a lazy import that closes a circle counts too (config.py once imported
run_presets.py inside `make_config`, and run_presets.py imports config.py).
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "minirl"


def _graph() -> dict[str, set[str]]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:  # `from minirl import config` names a module
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _circle_from(graph, start) -> list[str] | None:
    """A path start -> ... -> start, or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in graph[node]:
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_no_import_circle():
    graph = _graph()
    assert len(graph) > 50  # the walk found the package
    circles = [c for c in (_circle_from(graph, m) for m in sorted(graph)) if c]
    assert not circles, " ; ".join(" -> ".join(c) for c in circles)


def test_the_core_never_imports_the_tools():
    upward = [
        (module, target)
        for module, targets in _graph().items()
        if not module.startswith("minirl.tools")
        for target in targets
        if target.startswith("minirl.tools")
    ]
    assert not upward


def test_the_core_is_at_most_10k_lines():
    core = [p for p in PACKAGE.rglob("*.py") if "tools" not in p.relative_to(PACKAGE).parts]
    assert len(core) > 40  # the walk found the core
    lines = sum(len(p.read_text().splitlines()) for p in core)
    assert lines <= 10_000, f"the core (minirl/ without tools/) has {lines} lines"


def test_no_function_over_60_lines():
    long = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({length} lines)"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (length := node.end_lineno - node.lineno + 1) > 60
    ]
    assert not long


def test_the_check_sees_a_lazy_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circle_from(graph, "a") == ["a", "b", "c", "a"]
    assert _circle_from(graph, "d") is None


def test_the_config_is_a_leaf():
    """Loading the config loads no engine, trainer or controller (config.py imports only the
    components' small *_config modules), in a fresh interpreter."""
    import subprocess
    import sys

    heavy = ("minirl.engine", "minirl.trainer", "minirl.controller", "minirl.tools")
    code = f"import sys, minirl.config; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=PACKAGE.parent,
        env={**__import__("os").environ, "PYTHONPATH": str(PACKAGE.parent)},
    )
    assert out.stdout.strip() == "[]", out.stdout
