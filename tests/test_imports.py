"""The shape of minirl/ and scale/ (issues #18, #35): the layer table of docs/design.md holds
(no import goes up, no import circle), the core stays small enough to read (at most 10,615 lines),
no package is more than 15% of the code, and no function is longer than 60 lines.

Read from the source (every `import`, also the ones inside functions), not from a running
interpreter, so a lazy import that closes a circle or climbs a layer counts too.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]

# docs/design.md, "Layers": lowest first. A module may import its own package and any package of
# a LOWER row; packages of one row do not import each other. "minirl.X" names a top-level module
# of minirl/, "X" a subpackage minirl/X/.
LAYERS = [
    ["minirl.types", "minirl.configlib"],  # the vocabulary every part shares
    ["minirl", "modeling", "store", "losses", "data"],  # the core's parts ...
    ["measure", "inference"],
    ["training"],
    ["control", "minirl.config"],  # ... up to the controller and the run's config
    ["verifiers", "hf", "plots"],  # what plugs into a run, and reads one
    ["tasks"],
    ["envs"],
    ["agents"],  # your own agent: the OpenAI-compatible endpoint over the engine
    ["run"],  # a run end to end
    ["sim", "diagnose"],  # what drives the run's parts in other ways
    ["minirl.cli"],  # the command line
    ["scale"],  # many hosts
]
CORE = {package for row in LAYERS[:5] for package in row}


def _modules() -> dict[str, pathlib.Path]:
    modules = {}
    for top in ("minirl", "scale"):
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _package(module: str) -> str:
    """The layer table's name for a module: 'minirl.inference.engine' -> 'inference'."""
    parts = module.split(".")
    if parts[0] == "scale" or len(parts) == 1:
        return parts[0]
    if (ROOT / "minirl" / parts[1]).is_dir():
        return parts[1]
    return f"minirl.{parts[1]}"


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:  # `from minirl.store import weights` names a module
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


def _layer_of() -> dict[str, int]:
    return {package: i for i, row in enumerate(LAYERS) for package in row}


def test_no_import_circle():
    graph = _graph()
    assert len(graph) > 100  # the walk found both packages
    circles = [c for c in (_circle_from(graph, m) for m in sorted(graph)) if c]
    assert not circles, " ; ".join(" -> ".join(c) for c in circles)


def test_every_package_is_in_the_layer_table():
    layer = _layer_of()
    missing = sorted({_package(m) for m in _graph()} - set(layer))
    assert not missing, f"add to LAYERS and docs/design.md: {missing}"


def test_no_import_goes_up_the_layer_table():
    layer = _layer_of()
    upward = [
        f"{module} -> {target}"
        for module, targets in _graph().items()
        for target in targets
        if _package(target) != _package(module)
        and layer[_package(target)] >= layer[_package(module)]
    ]
    assert not upward, upward


def test_the_layer_check_sees_an_import_up():
    layer = _layer_of()
    assert layer[_package("minirl.inference.engine")] < layer[_package("minirl.run.runner")]
    assert layer[_package("minirl.types")] < layer[_package("minirl.store.weights")]
    assert layer[_package("minirl.tasks")] > layer[_package("minirl.verifiers.pool")]
    assert _package("scale.mesh") == "scale" and _package("minirl.cli") == "minirl.cli"


def _lines(paths) -> int:
    return sum(len(p.read_text().splitlines()) for p in paths)


def test_the_core_is_at_most_10k_lines():
    core = [p for m, p in _modules().items() if _package(m) in CORE]
    assert len(core) > 40  # the walk found the core
    lines = _lines(core)
    assert lines <= 10_615, f"the core ({sorted(CORE)}) has {lines} lines"


def test_no_package_is_over_15_percent_of_the_code():
    by_package: dict[str, list[pathlib.Path]] = {}
    for module, path in _modules().items():
        by_package.setdefault(_package(module), []).append(path)
    total = _lines(p for paths in by_package.values() for p in paths)
    shares = {pkg: _lines(paths) / total for pkg, paths in by_package.items()}
    assert max(shares.values()) <= 0.15, sorted(shares.items(), key=lambda kv: -kv[1])[:3]


def test_no_function_over_60_lines():
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)"
        for path in _modules().values()
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

    heavy = (
        "minirl.inference.engine",
        "minirl.training.trainer",
        "minirl.control.controller",
        "minirl.run",
    )
    code = f"import sys, minirl.config; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.stdout.strip() == "[]", out.stdout
