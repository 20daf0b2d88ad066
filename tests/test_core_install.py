"""`pip install minirl` alone runs the main job (issue #44): no module of minirl/ or scale/
imports an optional package at module level, every module imports with the extras blocked,
the commands a new user types first work, and every path that needs an extra says which one in
one line.

"Optional" is read from pyproject.toml (tests/extras.py): a package only an extra installs and
the core does not bring. The static check walks the module-level imports (what running
`import x` executes), following minirl's own modules, so an optional import two modules away
from `minirl train` counts. The runtime checks run Python with the optional packages set to None
in sys.modules: importing one raises ImportError, as on a machine without it. CI also runs the
real thing in a venv made with `pip install -e .` alone (.ci/run, .ci/core_check.py).
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess

from extras import ROOT, blocked_python, optional_imports

# The modules that ARE an extra's adapter and may need it when imported: none today. The
# TensorStore store (scale/tensorstore_*.py) imports tensorstore through `optional_import`,
# which raises a one-line MissingExtra instead of ImportError.
ADAPTERS: set[str] = set()


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for top in ("minirl", "scale"):
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _module_level_imports(body) -> list[ast.stmt]:
    """Import statements that run when the module is imported: top level and inside top-level
    if/try blocks (a try is still a module-level import: its except must not be the only path),
    not in functions or under `if TYPE_CHECKING`."""
    out = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        elif isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                out += _module_level_imports(node.body) + _module_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            out += _module_level_imports(node.body)
    return out


def _imported_names(module: str, path: pathlib.Path, node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level == 0:
        base = node.module
    else:  # relative: from the module's package, `level` steps up
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".")
    return [base] + [f"{base}.{a.name}" for a in node.names]


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """({module: minirl/scale modules it imports at module level, its parent packages
    included}, {module: top-level names of other packages it imports at module level})."""
    modules = _modules()
    inner, outer = {}, {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        targets, others = set(), set()
        for node in _module_level_imports(tree.body):
            for name in _imported_names(module, path, node):
                parts = name.split(".")
                prefixes = {".".join(parts[: i + 1]) for i in range(len(parts))}
                targets |= {p for p in prefixes if p in modules}
                if parts[0] not in ("minirl", "scale"):
                    others.add(parts[0])
        parts = module.split(".")  # importing a.b.c runs a/__init__ and a/b/__init__ first
        targets |= {".".join(parts[:i]) for i in range(1, len(parts))}
        inner[module], outer[module] = targets - {module}, others
    return inner, outer


def optional_at_import(inner, outer, optional) -> dict[str, str]:
    """{module: "pkg (via a -> b -> c)"} for every module whose import runs an optional import."""
    found = {}
    for start in inner:
        stack, seen = [(start, [start])], {start}
        while stack:
            module, path = stack.pop()
            hit = sorted(outer[module] & optional)
            if hit:
                found[start] = f"{hit[0]} (via {' -> '.join(path)})"
                break
            for nxt in sorted(inner[module] - seen):
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return found


def test_no_module_imports_an_optional_package_at_module_level():
    inner, outer = import_graph()
    assert len(inner) > 120  # the walk found minirl/ and scale/
    optional = optional_imports()
    assert {"pyarrow", "ray", "torch", "wandb", "pytest"} <= optional  # pyproject was read
    bad = {m: why for m, why in optional_at_import(inner, outer, optional).items()}
    bad = {m: why for m, why in bad.items() if m not in ADAPTERS}
    assert not bad, "import it where it is used, through minirl.configlib.optional_import: " + (
        "; ".join(f"{m}: {why}" for m, why in sorted(bad.items()))
    )


def test_the_walk_sees_an_optional_import_two_modules_away():
    inner = {"minirl.cli": {"minirl.run"}, "minirl.run": {"minirl.hf"}, "minirl.hf": set()}
    outer = {"minirl.cli": {"argparse"}, "minirl.run": {"numpy"}, "minirl.hf": {"jinja2"}}
    found = optional_at_import(inner, outer, {"jinja2"})
    assert found["minirl.cli"] == "jinja2 (via minirl.cli -> minirl.run -> minirl.hf)"
    assert set(found) == {"minirl.cli", "minirl.run", "minirl.hf"}
    assert optional_at_import(inner, outer, {"torch"}) == {}


def test_what_the_core_path_uses_is_core_and_pytest_is_not():
    optional = optional_imports()
    assert not {"jinja2", "safetensors", "tokenizers", "sympy", "jax", "flax"} & optional
    assert {"pytest", "transformers", "math_verify", "pyarrow"} <= optional


def _run(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        blocked_python(code),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"},
    )


def test_every_module_imports_with_the_extras_blocked():
    names = sorted(m for m in _modules() if m not in ADAPTERS)
    code = (
        "import importlib, json\nbad = {}\n"
        f"for m in {names!r}:\n"
        "    try:\n        importlib.import_module(m)\n"
        "    except Exception as e:\n        bad[m] = f'{type(e).__name__}: {e}'\n"
        "print(json.dumps(bad))"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}


def _cli_runs(*argvs: list[str]) -> list[dict]:
    """`minirl ARGV` for each argv, in one blocked interpreter: [{"rc", "out", "err"}]."""
    code = (
        "import contextlib, io, json\nfrom minirl.cli import main\nres = []\n"
        f"for argv in {[list(a) for a in argvs]!r}:\n"
        "    out, err = io.StringIO(), io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        "        try:\n            rc = main(argv)\n"
        "        except SystemExit as e:\n            rc = e.code\n"
        "    res.append({'rc': rc, 'out': out.getvalue(), 'err': err.getvalue()})\n"
        "print('RESULTS' + json.dumps(res))"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.split("RESULTS", 1)[1])


def _one_line_naming(res: dict, extra: str) -> str:
    assert res["rc"] == 2, res
    lines = res["err"].strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res["err"], res["err"]
    assert f"pip install 'minirl[{extra}]'" in lines[0], lines[0]
    return lines[0]


def test_first_commands_work_and_paths_needing_an_extra_say_which(tmp_path):
    (tmp_path / "train.parquet").write_bytes(b"PAR1")
    (tmp_path / "agent.py").write_text("async def solve(client, row):\n    return 1.0\n")
    run = ["--run-dir", str(tmp_path / "r")]
    helps, train_help, config, tensorboard, wandb, parquet, agent = _cli_runs(
        ["--help"],
        ["train", "--help"],
        ["config"],
        ["train", "--preset", "fixture", *run, "--set", "log.tensorboard=true"],
        ["train", "--preset", "fixture", *run, "--set", "log.wandb=proj"],
        ["train", "--data", str(tmp_path / "train.parquet"), *run],
        ["train", "--preset", "fixture", *run, "--agent", f"{tmp_path / 'agent.py'}:solve"],
    )
    assert helps["rc"] == 0 and "usage: minirl" in helps["out"]
    assert train_help["rc"] == 0 and "--preset" in train_help["out"]
    assert config["rc"] == 0 and "rl.steps" in config["out"]
    assert "log.tensorboard needs the 'tensorboardX' package" in _one_line_naming(
        tensorboard, "track"
    )
    assert "log.wandb needs the 'wandb' package" in _one_line_naming(wandb, "track")
    assert "a .parquet data file needs the 'pyarrow' package" in _one_line_naming(parquet, "hf")
    assert "--agent (your agent's OpenAI client) needs the 'openai' package" in _one_line_naming(
        agent, "agent"
    )
    assert not (tmp_path / "r").exists()  # each refused before any work


def test_math_verify_and_scale_without_their_extras_say_which(tmp_path):
    launch = "from scale.launch import main as launch\n"
    out = _run(
        "from minirl.configlib import MissingExtra\n"
        "from minirl.verifiers.math_verifier import MathVerifier, MathVerifierConfig\n"
        "MathVerifier(MathVerifierConfig())  # the built-in backend needs nothing\n"
        "def say(f):\n    try:\n        f()\n    except MissingExtra as e:\n        print(e)\n"
        "    except SystemExit as e:\n        print('exit', e.code)\n"
        "say(lambda: MathVerifier(MathVerifierConfig(backend='math_verify')))\n"
        "import scale\nsay(lambda: scale.RayWorker(lambda: None).start())\n"
        f"{launch}say(lambda: launch(['--help']))\n"
        f"say(lambda: launch(['ray', '--preset', 'fixture', '--run-dir', {str(tmp_path)!r}]))\n"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    math = [x for x in lines if "math_verify backend" in x]
    assert math and "needs the 'math_verify' package" in math[0] and "minirl[math]" in math[0]
    assert any("Ray actors" in x and "pip install 'minirl[scale]'" in x for x in lines)
    assert "usage: python -m scale.launch" in out.stdout and "exit 0" in lines  # --help
    assert "exit 2" in lines and "Traceback" not in out.stderr  # `ray` without Ray
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and "needs the 'ray' package" in err[0] and "minirl[scale]" in err[0]


def test_every_extra_in_pyproject_is_known_to_the_message_helper():
    """Each extra named in an `optional_import` call exists in pyproject.toml."""
    from extras import extra_distributions

    extras = set(extra_distributions()) - {"core"}
    named = set()
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "optional_import"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
            ):
                named.add(node.args[1].value)
    assert named and named <= extras, named - extras
