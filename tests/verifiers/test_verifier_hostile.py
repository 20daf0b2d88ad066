"""Hostile programs, scored as one batch through a 2-worker VerifierPool.

Every program's expected output ("pwned") is reachable only if its attack works, so contained
attacks score 0. Then the host side is checked: no stray processes, no files written outside,
no connection on the loopback listener, the secret and the test data unread, and the pool still
scores the next batch. What is guaranteed depends on the isolation mode the machine allows (see
the table in minirl/verifiers/sandbox.py); on this machine (root, namespaces) it is "uid".
Only loopback (127.0.0.1) is ever contacted.
"""

import os
import socket
import textwrap
import uuid

import pytest

from minirl.verifiers import (
    CodeVerifier,
    CodeVerifierConfig,
    Limits,
    PoolConfig,
    SandboxConfig,
    VerifierPool,
    isolation_mode,
    put_tests,
)


@pytest.fixture(scope="module")
def mode():
    return isolation_mode()


def hostile_programs(tmp_path, repo_file: str, port: int, marker: str) -> dict[str, str]:
    outside = [
        str(tmp_path / f"escape-{marker}"),
        f"/var/tmp/escape-{marker}",
        f"../../escape-{marker}",
        f"/escape-{marker}",
    ]
    programs = {
        "infinite loop": "while True:\n    pass",
        "sleep past the limit": "import time\ntime.sleep(60)\nprint('pwned')",
        "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "memory bomb": "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 2**20))",
        "huge output": "import sys\nwhile True:\n    sys.stdout.write('pwned' * 10000)",
        "huge file": "f = open('big', 'wb')\nwhile True:\n    f.write(b'x' * 2**20)",
        "write outside": textwrap.dedent(f"""
            wrote = 0
            for path in {outside!r}:
                try:
                    open(path, 'w').write('x')
                    wrote += 1
                except OSError:
                    pass
            print('pwned' if wrote else 'contained')
        """),
        "write private tmp": f"open('/tmp/escape-{marker}', 'w').write('x')\nprint('contained')",
        "read secret": f"print(open({str(tmp_path / 'secret.txt')!r}).read())",
        "read test data": f"import json\nprint(json.load(open({repo_file!r}))['cases'][0]['output'])",
        "network": textwrap.dedent(f"""
            import socket
            s = socket.create_connection(('127.0.0.1', {port}), timeout=1)
            s.sendall(b'hello')
            print('pwned')
        """),
        "signal parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('pwned')",
        "escape process group": textwrap.dedent("""
            import os, time
            r, w = os.pipe()
            if os.fork() == 0:
                os.setsid()
                os.write(w, b'out')  # tell the parent we left its process group
                time.sleep(30)  # outlives the run; as root (own uid) it must not
                os._exit(0)
            os.read(r, 3)
            print('pwned?')
        """),
    }
    if os.geteuid() == 0:  # runs get their own uid; without root these would hit pytest
        programs["signal parent group"] = (
            "import os, signal\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)\nprint('pwned')"
        )
        programs["kill everything"] = textwrap.dedent("""
            import os, signal, time
            parent = os.getppid()
            try:  # "succeeds" even when every target refused (EPERM); in a pid namespace of
                os.kill(-1, signal.SIGKILL)  # its own there is nobody to signal (ESRCH)
            except ProcessLookupError:
                pass
            time.sleep(0.3)
            print('pwned' if os.getppid() != parent else 'contained')
        """)
    return programs


@pytest.mark.parametrize("isolation", ["auto", "none"])
def test_hostile_programs_are_contained(tmp_path, repo, make_rollout, wait_no_strays, isolation):
    """ "auto": the strongest mode here. "none": no namespaces — the documented holes open up,
    but as root every run still has its own uid, so nothing runs as root."""
    sandbox = SandboxConfig(isolation=isolation)
    mode = isolation_mode(sandbox)
    isolated = mode != "none"
    marker = uuid.uuid4().hex[:12]
    (tmp_path / "secret.txt").write_text("pwned")
    os.chmod(tmp_path / "secret.txt", 0o644)
    tests = put_tests(repo, [("", "pwned\n")])
    repo_file = os.path.join(repo.root, tests[:2], tests)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    programs = hostile_programs(tmp_path, repo_file, listener.getsockname()[1], marker)
    names = list(programs)
    rollouts = [make_rollout(f"```python\n{programs[n]}\n```", {"tests": tests}) for n in names]
    config = CodeVerifierConfig(limits=Limits(cpu_s=1.0, wall_s=2.0), sandbox=sandbox)
    outside = [
        tmp_path / f"escape-{marker}",
        f"/var/tmp/escape-{marker}",
        f"/escape-{marker}",
        f"/tmp/escape-{marker}",
    ]
    try:
        with VerifierPool(
            CodeVerifier(repo, config), PoolConfig(workers=2, item_timeout_s=20)
        ) as pool:
            pids_before, dirs = pool.worker_pids, pool.worker_dirs
            scores = dict(zip(names, pool.score(rollouts), strict=True))
            pids_after = pool.worker_pids
            good = put_tests(repo, [("2 3\n", "5\n")])
            add = make_rollout("print(sum(map(int, input().split())))", {"tests": good})
            followup = pool.score([add] * 4)
        try:
            listener.accept()[0].close()
            connected = True
        except BlockingIOError:
            connected = False
        written = [str(p) for p in outside if os.path.exists(p)]
    finally:
        listener.close()
        for path in outside:  # "none" mode may have let these through (documented)
            if os.path.exists(path):
                os.unlink(path)

    reasons = {n: s.reason for n, s in scores.items()}
    open_holes = () if isolated else ("write outside", "read secret", "read test data", "network")
    for name, score in scores.items():
        if name not in open_holes:
            assert score.reward == 0.0, (name, score.reason)
    assert reasons["infinite loop"].startswith("time limit")
    assert reasons["sleep past the limit"].startswith("time limit")
    assert reasons["fork bomb"].startswith(("time limit", "runtime error"))
    assert reasons["memory bomb"].startswith("memory limit")
    assert reasons["huge output"].startswith("output limit")
    assert reasons["huge file"].startswith("output limit")  # RLIMIT_FSIZE
    assert [s.reward for s in followup] == [1.0] * 4  # the pool still works
    assert not any(os.path.exists(d) for d in dirs)  # work dirs removed
    if isolated:
        assert written == [] and connected is False
        assert reasons["network"].startswith("runtime error")
        assert reasons["write outside"].startswith("wrong answer")  # it printed "contained"
    if os.geteuid() == 0:  # runs use another uid: signals to the verifier are refused
        assert reasons["signal parent"].startswith("runtime error")
        assert reasons["signal parent group"].startswith("runtime error")
        assert reasons["kill everything"].startswith("wrong answer")  # its parent survived
        assert pids_after == pids_before
        assert wait_no_strays(timeout_s=5.0) == []  # the setsid escapee was killed by uid
    else:  # documented hole without root: only the process group is killed
        strays = wait_no_strays(timeout_s=1.0)
        for pid in strays:
            os.kill(pid, 9)
        assert len(strays) <= 1


def test_repository_is_hidden_wherever_it_lives(make_rollout, mode):
    """/tmp is always private; a repository elsewhere is hidden because the code verifier adds
    its root to the hidden paths. Here: /dev/shm with the default hiding of /dev/shm turned off,
    and a control file next to the repository that stays readable."""
    import shutil
    import tempfile

    from minirl.verifiers import TestRepository

    base = tempfile.mkdtemp(prefix="minirl-test-", dir="/dev/shm")
    try:
        os.chmod(base, 0o755)
        with open(os.path.join(base, "control.txt"), "w") as f:
            f.write("pwned")
        os.chmod(os.path.join(base, "control.txt"), 0o644)
        repo = TestRepository(os.path.join(base, "repo"))
        tests = put_tests(repo, [("", "pwned\n")])
        for path in (repo.root, os.path.dirname(os.path.join(repo.root, tests[:2], tests))):
            os.chmod(path, 0o755)
        config = CodeVerifierConfig(sandbox=SandboxConfig(hidden_paths=()))
        verifier = CodeVerifier(repo, config)
        steal = f"import json\nprint(json.load(open({os.path.join(repo.root, tests[:2], tests)!r}))['cases'][0]['output'])"
        control = f"print(open({os.path.join(base, 'control.txt')!r}).read())"
        stolen, readable = verifier.score(
            [make_rollout(steal, {"tests": tests}), make_rollout(control, {"tests": tests})]
        )
    finally:
        shutil.rmtree(base)
    assert readable.reward == 1.0  # /dev/shm itself is visible with this config
    if mode != "none":
        assert stolen.reward == 0.0 and "No such file" in stolen.reason


def test_a_worker_killed_mid_run_leaves_no_processes(repo, make_rollout, wait_no_strays):
    """The pool's item timeout fires while the program (and a setsid() escapee it forked) still
    runs: PDEATHSIG kills the program, and (as root) the pool kills the uids of the dead
    worker's thread, which takes the escapee too."""
    tests = put_tests(repo, [("", "pwned\n")])
    code = textwrap.dedent("""
        import os, time
        if os.fork() == 0:
            os.setsid()
        time.sleep(30)
    """)
    verifier = CodeVerifier(repo, CodeVerifierConfig(limits=Limits(cpu_s=1.0, wall_s=20.0)))
    with VerifierPool(verifier, PoolConfig(workers=1, item_timeout_s=1.0)) as pool:
        killed_dir = pool.worker_dirs[0]
        score = pool.score([make_rollout(code, {"tests": tests})])[0]
        assert score.reason == "verifier timed out after 1s" and pool.restarts == 1
        assert not os.path.exists(killed_dir)  # with the work dir of the interrupted run
        if os.geteuid() == 0:
            assert wait_no_strays(timeout_s=5.0) == []
        else:  # documented: only the program itself dies with its worker (PDEATHSIG)
            strays = wait_no_strays(timeout_s=1.0)
            for pid in strays:
                os.kill(pid, 9)
            assert len(strays) <= 1
        assert pool.score([make_rollout("print('pwned')", {"tests": tests})])[0].reward == 1.0
        last_dir = pool.worker_dirs[0]
    assert not os.path.exists(last_dir)
