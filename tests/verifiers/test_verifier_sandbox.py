"""The sandbox itself: modes, I/O, limits, parent-side safety, and the unprivileged path."""

import ast
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading

import pytest

from minirl.verifiers import Limits, SandboxConfig, isolation_mode, run_sandboxed
from minirl.verifiers.isolation import sandbox_uid, thread_uids
from minirl.verifiers.sandbox import MODES, python_interpreter

FAST = Limits(cpu_s=1.0, wall_s=2.0)


def run_py(code: str, **kwargs):
    argv = [python_interpreter(), "-S", "-s", "-B", "main.py"]
    return run_sandboxed(argv, files={"main.py": code.encode()}, **kwargs)


def test_mode_is_probed_and_strongest_for_root():
    mode = isolation_mode()
    assert mode in MODES
    if os.geteuid() == 0:
        assert mode in ("uid", "none")  # root never settles for the weaker userns mode
        with pytest.raises(RuntimeError, match="not for root"):
            isolation_mode(SandboxConfig(isolation="userns"))
    assert run_py("print('hi')").stdout == b"hi\n"


def test_stdin_stdout_exit_code_and_stderr():
    data = b"x" * 3_000_000 + b"\n"  # larger than any pipe buffer: written while reading
    result = run_py(
        "import sys\ns = sys.stdin.read()\nprint(len(s))\nsys.stderr.write('e')\nsys.exit(4)",
        stdin=data,
    )
    assert result.stdout == b"3000001\n"
    assert result.stderr == b"e"
    assert result.returncode == 4
    assert result.status(Limits()) == "runtime error"


def test_program_not_reading_its_input_is_fine():
    result = run_py("print(1)", stdin=b"y" * 2_000_000)
    assert result.status(Limits()) == "ok" and result.stdout == b"1\n"


def test_output_is_capped_in_the_parent():
    result = run_py("import sys\nsys.stdout.write('a' * 5000)", limits=Limits(output_bytes=1000))
    assert result.output_exceeded and len(result.stdout) == 1000
    assert result.status(Limits(output_bytes=1000)) == "output limit"


def test_environment_is_scrubbed():
    os.environ["MINIRL_TEST_SECRET"] = "hunter2"
    try:
        result = run_py("import os\nprint(sorted(os.environ))")
    finally:
        del os.environ["MINIRL_TEST_SECRET"]
    names = ast.literal_eval(result.stdout.decode())
    assert "MINIRL_TEST_SECRET" not in names
    assert set(names) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PYTHONHASHSEED",
                          "PYTHONIOENCODING", "MINIRL_SANDBOX", "LC_CTYPE"}  # fmt: skip


def test_hash_seed_is_fixed_so_output_is_deterministic():
    code = "print(list({'apple', 'banana', 'cherry', 'date', 'elder', 'fig'}))"
    assert run_py(code).stdout == run_py(code).stdout


def test_collect_reads_regular_files_but_never_follows_symlinks(tmp_path):
    code = "import os\nopen('ok', 'w').write('fine')\nos.symlink('/etc/hostname', 'link')\nos.mkfifo('fifo')"
    result = run_py(code, collect=("ok", "link", "fifo", "missing"))
    assert result.files == {"ok": b"fine"}


def test_work_dir_is_removed_without_following_symlinks(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "file").write_text("precious")
    before = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("minirl-box-")}
    code = textwrap.dedent(f"""
        import os
        os.symlink({str(keep)!r}, 'outside')
        os.makedirs('locked/inner')
        open('locked/inner/f', 'w').write('x')
        os.chmod('locked/inner', 0)
        os.chmod('locked', 0)
        print('done')
    """)
    assert run_py(code).stdout == b"done\n"
    after = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("minirl-box-")}
    assert after <= before  # our box is gone (other runs may come and go concurrently)
    assert (keep / "file").read_text() == "precious"


def test_files_must_be_plain_names():
    with pytest.raises(ValueError, match="plain names"):
        run_sandboxed(["true"], files={"../evil": b""})


def test_a_missing_program_is_a_sandbox_error_not_an_exception():
    result = run_sandboxed(["/nonexistent/binary"])
    assert result.error and result.status(Limits()) == "sandbox error"


def test_none_mode_still_limits_time_and_never_runs_as_root():
    config = SandboxConfig(isolation="none")
    ok = run_sandboxed(
        [python_interpreter(config), "-S", "-c", "import os; print(os.getuid())"], config=config
    )
    assert int(ok.stdout) != 0 and (int(ok.stdout) == os.getuid() or os.geteuid() == 0)
    slow = run_sandboxed([python_interpreter(config), "-S", "-c", "while 1: pass"], config=config,
                         limits=Limits(cpu_s=0.5, wall_s=1.0))  # fmt: skip
    assert slow.status(Limits(cpu_s=0.5)) == "time limit"


def test_limits_and_config_validation():
    assert Limits(cpu_s=2).wall_limit_s == 4.5
    assert Limits(cpu_s=2, wall_s=3).wall_limit_s == 3
    with pytest.raises(ValueError, match="memory_mb"):
        Limits(memory_mb=0)
    with pytest.raises(ValueError, match="isolation"):
        SandboxConfig(isolation="docker")
    with pytest.raises(ValueError, match="absolute"):
        SandboxConfig(hidden_paths=("relative",))


def test_sandbox_uids_are_fresh_per_run_and_grouped_by_thread():
    a, b = sandbox_uid(), sandbox_uid()
    assert a != b
    assert a in thread_uids(threading.get_native_id()) and b in thread_uids(
        threading.get_native_id()
    )
    assert a > 2**30  # far above any real user


UNPRIVILEGED_SCRIPT = """
import importlib.util, json, os, sys, types
# a bare interpreter (no numpy): load only the two stdlib-only sandbox modules, by path
for name in ("minirl", "minirl.verifiers"):
    sys.modules[name] = types.ModuleType(name)
for name in ("isolation", "sandbox"):
    path = os.path.join(sys.argv[1], name + ".py")
    spec = importlib.util.spec_from_file_location("minirl.verifiers." + name, path)
    sys.modules[spec.name] = module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
sb = sys.modules["minirl.verifiers.sandbox"]
port, secret = int(sys.argv[2]), sys.argv[3]
py = sb.python_interpreter()
lim = sb.Limits(cpu_s=1.0, wall_s=1.5, nproc=64)
def run(code):
    r = sb.run_sandboxed([py, "-S", "main.py"], files={"main.py": code.encode()}, limits=lim)
    return {"status": r.status(lim), "out": r.stdout.decode()}
out = {"mode": sb.isolation_mode(), "uid": __import__("os").getuid()}
out["net"] = run(f"import socket\\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\\nprint('connected')")
out["secret"] = run(f"print(open({secret!r}).read())")
out["write"] = run("open('../../escape-minirl', 'w').write('x')\\nprint('wrote')")
out["fork"] = run("import os\\nwhile True:\\n    try: os.fork()\\n    except OSError: pass")
print(json.dumps(out))
"""


def test_unprivileged_user_gets_namespace_isolation(tmp_path, wait_no_strays):
    """The "userns" path: as root we drop to `nobody` to exercise it; otherwise we already are
    an ordinary user. Where the kernel forbids user namespaces this documents the "none" mode."""
    secret = tempfile.NamedTemporaryFile("w", prefix="minirl-secret-", delete=False)
    secret.write("s3cret")
    secret.close()
    os.chmod(secret.name, 0o644)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    package_dir = os.path.dirname(sys.modules[run_sandboxed.__module__].__file__)
    argv = [
        sys.executable,
        "-c",
        UNPRIVILEGED_SCRIPT,
        package_dir,
        str(listener.getsockname()[1]),
        secret.name,
    ]
    kwargs = {}
    if os.geteuid() == 0:  # become nobody, with an interpreter nobody may run
        argv[0] = "/usr/bin/python3"
        kwargs = dict(user=65534, group=65534, extra_groups=[], cwd="/")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, **kwargs)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.splitlines()[-1])
        try:
            listener.accept()[0].close()
            connected = True
        except BlockingIOError:
            connected = False
        isolated = out["mode"] == "userns"
    finally:
        listener.close()
        os.unlink(secret.name)
    assert out["uid"] != 0 and out["mode"] in ("userns", "none")
    assert connected is not isolated  # "none" mode leaves the network open (documented)
    if isolated:
        assert out["net"]["status"] == "runtime error" and out["net"]["out"] == ""
        assert out["secret"]["status"] == "runtime error"  # private /tmp: the file is not there
        assert out["write"]["status"] == "runtime error"  # read-only host filesystem
    assert out["fork"]["status"] in ("time limit", "runtime error")  # RLIMIT_NPROC holds
    assert not os.path.exists("/escape-minirl")
    assert wait_no_strays() == []


def test_rlimit_nproc_binds_per_run(wait_no_strays):
    code = textwrap.dedent("""
        import os, time
        n = 0
        for _ in range(40):
            try:
                if os.fork() == 0:
                    time.sleep(2)
                    os._exit(0)
                n += 1
            except OSError:
                break
        print(n)
    """)
    result = run_py(code, limits=Limits(nproc=8))
    forks = int(result.stdout)
    if os.geteuid() == 0:
        assert forks == 7  # a fresh uid per run (any mode): this process + 7 children
    else:
        assert forks <= 7  # our own uid: the limit counts every process of the user
    assert wait_no_strays() == []  # the children were in the process group: killed
