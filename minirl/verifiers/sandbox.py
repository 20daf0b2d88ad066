"""Run one untrusted program under resource limits and OS isolation (the code verifier's jail).

    limits = Limits(cpu_s=1, memory_mb=256)
    result = run_sandboxed([python_interpreter(), "main.py"], files={"main.py": code},
                           stdin=b"1 2\\n", limits=limits)
    result.stdout, result.status(limits)  # "ok" | "time limit" | "memory limit" | ...

RLAX (Sec. 6.1) warns that code verification "can easily damage the system if the execution
context is not safely isolated"; RLAX runs it in containers on AWS Lambda. This file is the
laptop-sized version: plain Linux processes, no container runtime, no extra dependency.

THREAT MODEL. The program is written by a model under RL pressure: assume it is buggy and, at
worst, hostile (it may loop, fork, allocate, flood output, look for the answers, phone home or
attack the verifier). We want: its reward reflects only its stdout; it cannot make the host
worse (no leftover processes or files, no crash of the verifier); it cannot read the test data or
other secrets. Each run gets, in the child between fork and exec (`preexec_fn`):

  layer                                   "uid" (we are root)   "userns" (not root)   "none"
  own session + process group, killpg     yes                   yes                   yes
  fresh temp dir as cwd, removed after    yes                   yes                   yes
  rlimits CPU, AS, FSIZE, NOFILE, CORE=0  yes                   yes                   yes
  RLIMIT_NPROC (fork bombs)               yes, per-run uid      counts all the        no (root
                                                                user's processes      ignores it)
  scrubbed env, PR_SET_NO_NEW_PRIVS       yes                   yes                   yes
  PDEATHSIG=KILL if the verifier dies     yes                   yes                   yes
  no network (new, empty net namespace:   yes                   yes                   NO
    even 127.0.0.1 is unreachable)
  new mount namespace: private /tmp, the  yes                   yes                   NO
    host fs read-only, `hidden_paths`
    (homes, /run, the test repository)
    covered by empty tmpfs
  runs as another uid: cannot signal the  yes                   NO: it can signal     NO
    verifier or other processes, cannot                         every process of the
    read our 0600 files                                         user, the verifier too
  leftover processes killed, even those   yes (kill -1 as the   process group only    group only
    that left the group with setsid()     run's uid)

"uid" mode runs the program as a fresh unprivileged uid, SANDBOX_UID_BASE + (native id of the
calling thread << 8 | a run counter mod 256). Thread ids are unique among live threads, so
concurrent runs never share a RLIMIT_NPROC count; the counter means a run never inherits the
count of killed-but-not-yet-reaped processes of the previous run on its thread (where the init
process does not reap orphans, such zombies stay forever and would otherwise block the uid).
After the run, kill(-1, SIGKILL) sent as that uid (`kill_uid`) kills every process it left.
"userns" mode is what an ordinary user gets where the kernel allows unprivileged user
namespaces; "none" is the last resort. The read-only host filesystem needs Linux >= 5.12
(mount_setattr). The mode is probed once per process (`isolation_mode`): "uid" -> "userns" ->
"none", the last with a RuntimeWarning. tests/verifiers/test_verifier_hostile.py checks each
row against hostile programs.

NOT defended (know this before running untrusted code at scale): kernel exploits and side
channels (there is no seccomp filter, no VM); the host's /proc and /sys are readable (process
list, command lines); CPU use is per process (a fork bomb of N processes may use N x cpu_s
within the wall limit); disk use in the work dir is bounded per file (RLIMIT_FSIZE) and by time,
not by a quota; in "userns" and "none" modes a program can kill(-1) every process of the user; RLIMIT_AS counts virtual memory, which over-counts for runtimes that reserve
address space (Go, Java, ASan). In "none" mode the network and the filesystem are open: use it
only for trusted code. Python candidates run as `python -S -s -B main.py`: no site, no user
site, no .pyc; not `-I`, because -I implies -E, which would ignore our PYTHONHASHSEED=0 (the
environment is ours anyway, so -E would add nothing) — fixed hashing keeps rewards deterministic.

Parent-side care: stdout is read with a byte cap (a flood never fills our memory); files are read
back with O_NOFOLLOW (a planted symlink cannot make us read /etc/shadow); the temp dir is
removed without following symlinks. `preexec_fn` runs Python between fork and exec, which is
safe in the single-threaded pool workers this is designed for.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import itertools
import math
import os
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping, Sequence

SANDBOX_UID_BASE = 0x4000_0000  # sandbox uids: BASE + (thread id << 8 | run counter % 256)
MODES = ("uid", "userns", "none")
BOX = "/tmp/box"  # where the work dir appears inside the isolated modes
STDERR_CAP = 64 * 1024

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET = 0x20000, 0x10000000, 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 4096, 0x4000, 1 << 18
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _AT_RECURSIVE = 0x1, 0x2, 0x8000
_SYS_MOUNT_SETATTR = 442  # same number on x86_64 and aarch64
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_MEMORY_MARKERS = (b"MemoryError", b"bad_alloc", b"Cannot allocate memory", b"out of memory")

_libc = ctypes.CDLL(None, use_errno=True)


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-run limits. `wall_s=None` means 2 * cpu_s + 0.5 (room for start-up and I/O)."""

    cpu_s: float = 1.0
    wall_s: float | None = None
    memory_mb: int = 256  # RLIMIT_AS (virtual memory)
    output_bytes: int = 1 << 20  # stdout cap; more is an "output limit" verdict
    file_mb: int = 16  # RLIMIT_FSIZE: largest file the program may write
    nproc: int = 16  # RLIMIT_NPROC (see the threat model for what it counts)
    nofile: int = 64  # RLIMIT_NOFILE

    def __post_init__(self):
        for name in ("cpu_s", "memory_mb", "output_bytes", "file_mb", "nproc", "nofile"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Limits.{name} must be > 0, got {getattr(self, name)}")
        if self.wall_s is not None and not self.wall_s > 0:
            raise ValueError(f"Limits.wall_s must be > 0 or None, got {self.wall_s}")

    @property
    def wall_limit_s(self) -> float:
        return self.wall_s if self.wall_s is not None else 2 * self.cpu_s + 0.5


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """How to isolate. `isolation="auto"` picks the strongest mode that works here."""

    isolation: str = "auto"  # "auto" | "uid" | "userns" | "none"
    hidden_paths: tuple[str, ...] = ("/home", "/root", "/run", "/mnt", "/media", "/srv", "/var/tmp",
                                     "/dev/shm")  # fmt: skip
    tmp_mb: int = 64  # size of the private /tmp (compilers write there)
    python: str | None = None  # interpreter for Python candidates; None = find one (see below)

    def __post_init__(self):
        if self.isolation not in ("auto", *MODES):
            raise ValueError(f"isolation must be 'auto' or one of {MODES}, got {self.isolation!r}")
        if any(not os.path.isabs(p) for p in self.hidden_paths):
            raise ValueError(f"hidden_paths must be absolute, got {self.hidden_paths}")
        if self.tmp_mb <= 0:
            raise ValueError(f"tmp_mb must be > 0, got {self.tmp_mb}")


@dataclasses.dataclass
class RunResult:
    returncode: int | None  # exit code, or -signal if killed by a signal; None if never started
    stdout: bytes = b""
    stderr: bytes = b""
    cpu_s: float = 0.0
    wall_s: float = 0.0
    max_rss_mb: float = 0.0
    wall_timeout: bool = False
    output_exceeded: bool = False
    files: dict[str, bytes] = dataclasses.field(default_factory=dict)
    error: str = ""  # the sandbox itself failed (not the program's fault)

    def status(self, limits: Limits) -> str:
        """One word for what happened, in order of precedence."""
        if self.error:
            return "sandbox error"
        killed_by = -self.returncode if self.returncode is not None and self.returncode < 0 else 0
        if self.wall_timeout or self.cpu_s > limits.cpu_s or killed_by == signal.SIGXCPU:
            return "time limit"
        if self.output_exceeded or killed_by == signal.SIGXFSZ or b"File too large" in self.stderr:
            return "output limit"
        if self.returncode != 0 and any(m in self.stderr for m in _MEMORY_MARKERS):
            return "memory limit"
        return "ok" if self.returncode == 0 else "runtime error"


# ------------------------------------------------------------------------------ child set-up


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


class _MountAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("attr_set", "attr_clr", "propagation", "userns")]


def _mount_setattr(path: bytes, set_flags: int, clear_flags: int) -> None:
    attr = _MountAttr(set_flags, clear_flags, 0, 0)
    ret = _libc.syscall(_SYS_MOUNT_SETATTR, -100, path, _AT_RECURSIVE, ctypes.byref(attr), 32)
    _check(ret, f"mount_setattr {path.decode()}")


def _mount(
    source: bytes | None, target: bytes, fstype: bytes | None, flags: int, data: bytes | None
):
    _check(_libc.mount(source, target, fstype, flags, data), f"mount {target.decode()}")


def _isolate_filesystem_and_network(mode: str, hidden: Sequence[str], tmp_mb: int) -> None:
    """In the child, cwd = host work dir: new mount + net namespaces; private /tmp with the work
    dir bound at /tmp/box; hidden paths covered; everything else read-only."""
    outer_uid, outer_gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWNS | _CLONE_NEWNET | (_CLONE_NEWUSER if mode == "userns" else 0)
    _check(_libc.unshare(flags), "unshare")
    if mode == "userns":  # map our own ids, so files we create keep our owner
        for name, text in (("setgroups", "deny"), ("uid_map", f"{outer_uid} {outer_uid} 1"),
                           ("gid_map", f"{outer_gid} {outer_gid} 1")):  # fmt: skip
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    _mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None)  # nothing we do leaks to the host
    for path in hidden:
        if os.path.isdir(path):
            _mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=1m,mode=755")
    tmp_opts = f"size={tmp_mb}m,mode=1777".encode()
    _mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV, tmp_opts)
    os.mkdir(BOX, 0o755)
    _mount(b".", BOX.encode(), None, _MS_BIND | _MS_REC, None)  # "." is still the host work dir
    os.chdir(BOX)
    _mount_setattr(b"/", _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID, 0)
    _mount_setattr(b"/tmp", 0, _MOUNT_ATTR_RDONLY)  # /tmp and the box stay writable


def _make_preexec(mode: str, limits: Limits, config: SandboxConfig, uid: int | None):
    cpu = max(1, math.ceil(limits.cpu_s))
    rlimits = (
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, limits.memory_mb << 20, limits.memory_mb << 20),
        (resource.RLIMIT_FSIZE, limits.file_mb << 20, limits.file_mb << 20),
        (resource.RLIMIT_NPROC, limits.nproc, limits.nproc),
        (resource.RLIMIT_NOFILE, limits.nofile, limits.nofile),
        (resource.RLIMIT_CORE, 0, 0),
    )

    def preexec() -> None:  # runs in the child after fork (and setsid), before exec
        if mode != "none":
            _isolate_filesystem_and_network(mode, config.hidden_paths, config.tmp_mb)
        for which, soft, hard in rlimits:
            resource.setrlimit(which, (soft, hard))
        _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        _check(_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")

    return preexec


# ----------------------------------------------------------------------------- parent side


def _sandbox_env(mode: str, box: str) -> dict[str, str]:
    inside = box if mode == "none" else BOX
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": inside,
        "TMPDIR": inside if mode == "none" else "/tmp",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8",
        "MINIRL_SANDBOX": "1",  # a marker: lets tests find stray sandbox processes
    }


def _communicate(proc: subprocess.Popen, stdin: bytes, limits: Limits, deadline: float):
    """Feed stdin, read stdout/stderr with caps, stop at exit, deadline or output overflow.
    Returns (stdout, stderr, wall_timeout, output_exceeded). Does not reap the child."""
    out, err = bytearray(), bytearray()
    wall_timeout = output_exceeded = exited = False
    sel = selectors.DefaultSelector()
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    for fd in streams:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    pending = memoryview(stdin)
    if pending:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    pidfd = os.pidfd_open(proc.pid) if hasattr(os, "pidfd_open") else None
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ)

    def read(fd: int) -> int:  # bytes read; 0 at EOF, -1 if nothing there right now
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return -1
        buf = streams[fd]
        buf += chunk[: max(0, (limits.output_bytes + 1 if buf is out else STDERR_CAP) - len(buf))]
        return len(chunk)

    try:
        while not (exited or output_exceeded):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                wall_timeout = True
                break
            for key, _ in sel.select(min(remaining, 0.05) if pidfd is None else remaining):
                fd = key.fd
                if fd == pidfd:
                    exited = True
                elif fd in streams:
                    if read(fd) == 0:
                        sel.unregister(fd)
                else:  # stdin
                    try:
                        pending = pending[os.write(fd, pending[: 1 << 16]) :]
                    except BlockingIOError:
                        pass
                    except BrokenPipeError:  # the program stopped reading: fine
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(fd)
                        proc.stdin.close()
            output_exceeded = len(out) > limits.output_bytes
            if pidfd is None and not exited:
                exited = (
                    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
                )
        for fd in streams:  # whatever the program wrote before it exited
            while read(fd) > 0 and len(out) <= limits.output_bytes:
                pass
        output_exceeded = len(out) > limits.output_bytes
    finally:
        sel.close()
        if pidfd is not None:
            os.close(pidfd)
    return bytes(out[: limits.output_bytes]), bytes(err), wall_timeout, output_exceeded


_SYS_SETRESUID = {"x86_64": 117, "aarch64": 147}.get(os.uname().machine)


def kill_uid(uid: int) -> None:
    """Kill every process owned by `uid` (root only) with kill(-1, SIGKILL) sent as that uid.
    kill(-1) walks the process list under a lock that fork also takes, so a fork bomb cannot
    outrun it. To send it as `uid` without forking, a short-lived thread drops its OWN
    credentials with the raw setresuid syscall (Linux credentials are per thread; only glibc's
    wrapper changes all threads), sends the signal and ends; the rest of the process stays root.
    Without a known syscall number, `kill -9 -1` runs as `uid` instead."""
    if _SYS_SETRESUID is None:
        subprocess.run(["kill", "-9", "-1"], user=uid, group=uid, extra_groups=[],
                       env={"PATH": "/bin:/usr/bin"}, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)  # fmt: skip
        return

    def as_uid() -> None:
        if _libc.syscall(_SYS_SETRESUID, uid, uid, uid) == 0:  # this thread only
            _libc.kill(-1, signal.SIGKILL)

    thread = threading.Thread(target=as_uid, name="minirl-sandbox-kill")
    thread.start()
    thread.join()


_run_counter = itertools.count()


def sandbox_uid() -> int:
    """A fresh uid for one "uid"-mode run started by the calling thread."""
    return SANDBOX_UID_BASE + (threading.get_native_id() << 8 | next(_run_counter) % 256)


def thread_uids(thread_id: int) -> range:
    """All uids that runs started by thread `thread_id` may use."""
    first = SANDBOX_UID_BASE + (thread_id << 8)
    return range(first, first + 256)


def kill_thread_sandboxes(thread_id: int) -> int:
    """Kill every live process running as one of `thread_uids(thread_id)` (root only; for the
    pool, after it killed a worker mid-run). Returns how many were signalled."""
    uids, killed = thread_uids(thread_id), 0
    for _ in range(10):  # repeat: a fork bomb may create more while we scan
        pids = [pid for pid, uid in _live_processes() if uid in uids]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
    return killed


def _read_back(path: str, cap: int) -> bytes | None:
    """A regular file's bytes, never following a symlink the program may have planted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(cap)
    finally:
        os.close(fd)


def _remove_tree(path: str) -> None:
    try:
        shutil.rmtree(path)  # fd-based on Linux: never follows symlinks
        return
    except OSError:
        pass
    for root, dirs, _ in os.walk(path):  # a program may have chmod-ed its dirs to 000
        for d in dirs:
            try:
                fd = os.open(os.path.join(root, d), os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY)
                os.fchmod(fd, 0o700)
                os.close(fd)
            except OSError:
                pass
    shutil.rmtree(path, ignore_errors=True)


def _run(argv, files, stdin, limits, config, collect, mode) -> RunResult:
    uid = sandbox_uid() if mode == "uid" else None
    box = tempfile.mkdtemp(prefix="minirl-box-")
    proc = None
    try:
        for name, data in files.items():
            if not name or "/" in name or name.startswith("."):
                raise ValueError(f"sandbox file names must be plain names, got {name!r}")
            with open(os.path.join(box, name), "wb") as f:
                f.write(data)
            os.chmod(os.path.join(box, name), 0o555)
        if uid is not None:
            os.chown(box, uid, uid)
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                list(argv), cwd=box, env=_sandbox_env(mode, box), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                preexec_fn=_make_preexec(mode, limits, config, uid),
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError) as e:
            return RunResult(None, error=f"could not start {argv[0]!r} ({mode} mode): {e}")
        try:
            out, err, wall_timeout, exceeded = _communicate(
                proc, stdin, limits, start + limits.wall_limit_s
            )
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            pass
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                stream.close()
        wall = time.monotonic() - start
        got = {name: _read_back(os.path.join(box, name), 64 << 20) for name in collect}
        return RunResult(
            returncode=proc.returncode,
            stdout=out,
            stderr=err,
            cpu_s=usage.ru_utime + usage.ru_stime,
            wall_s=wall,
            max_rss_mb=usage.ru_maxrss / 1024,
            wall_timeout=wall_timeout,
            output_exceeded=exceeded,
            files={k: v for k, v in got.items() if v is not None},
        )
    finally:
        _remove_tree(box)


@functools.cache
def _probe(mode: str, config: SandboxConfig) -> str:
    """'' if `mode` works on this machine, else why not. Cached per process (cheap, ~5 ms)."""
    if mode == "uid" and os.geteuid() != 0:
        return "needs root"
    true = shutil.which("true", path="/bin:/usr/bin") or "/bin/true"
    try:
        result = _run([true], {}, b"", Limits(), config, (), mode)
    except OSError as e:
        return str(e)
    return result.error or ("" if result.returncode == 0 else f"exit {result.returncode}")


def isolation_mode(config: SandboxConfig = SandboxConfig()) -> str:
    """The mode runs will use: `config.isolation` if it works (else RuntimeError), or for
    "auto" the first working of "uid", "userns", falling back to "none" with a warning."""
    if config.isolation != "auto":
        why = _probe(config.isolation, config)
        if why:
            raise RuntimeError(f"sandbox isolation {config.isolation!r} unavailable: {why}")
        return config.isolation
    for mode in ("uid", "userns"):
        if not _probe(mode, config):
            return mode
    if not _probe("none", config):
        warnings.warn(  # shown once per call site by the default warning filter
            "minirl sandbox: no namespaces here, running code WITHOUT network or filesystem "
            "isolation (see minirl/verifiers/sandbox.py)",
            RuntimeWarning,
            stacklevel=2,
        )
    return "none"


def _world_executable(path: str) -> bool:
    """Every directory on the way is o+x and the file o+x (what an unrelated uid needs)."""
    parts = path.split("/")
    for i in range(2, len(parts) + 1):
        try:
            if not os.stat("/".join(parts[:i]) or "/").st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def python_interpreter(config: SandboxConfig = SandboxConfig()) -> str:
    """The interpreter for Python candidates: `config.python`, else the first of
    sys.executable, /usr/bin/python3, /usr/local/bin/python3 that the sandbox can see (not under
    /tmp or a hidden path; world-executable in "uid" mode)."""
    if config.python:
        return config.python
    mode = isolation_mode(config)
    hidden = () if mode == "none" else ("/tmp", *config.hidden_paths)
    for path in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        real = os.path.realpath(path)
        if not os.path.isfile(real) or any(real.startswith(h + "/") for h in hidden):
            continue
        if mode != "uid" or _world_executable(real):
            return real
    raise RuntimeError(
        "no Python interpreter is usable inside the sandbox; set SandboxConfig.python"
    )


def run_sandboxed(
    argv: Sequence[str],
    *,
    files: Mapping[str, bytes] | None = None,
    stdin: bytes = b"",
    limits: Limits = Limits(),
    config: SandboxConfig = SandboxConfig(),
    collect: Sequence[str] = (),
) -> RunResult:
    """Run `argv` in a fresh work dir holding `files` (read-only, executable), feeding `stdin`.
    Files named in `collect` are read back after the run (e.g. a compiler's output). Never
    raises for anything the program does; a sandbox failure is `RunResult.error`."""
    return _run(
        argv, dict(files or {}), stdin, limits, config, tuple(collect), isolation_mode(config)
    )


def _live_processes() -> list[tuple[int, int]]:
    """(pid, real uid) of every process that is not a zombie."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
            if "\nState:\tZ" not in status:
                found.append((int(entry), int(status.split("\nUid:")[1].split()[0])))
        except (OSError, IndexError, ValueError):
            continue
    return found


def stray_processes() -> list[int]:
    """Pids of live processes started by a sandbox (a sandbox uid, or the MINIRL_SANDBOX marker
    in their environment). For tests and health checks; empty when every run cleaned up."""
    found = []
    for pid, uid in _live_processes():
        if uid >= SANDBOX_UID_BASE:
            found.append(pid)
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if b"MINIRL_SANDBOX=1\0" in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found
