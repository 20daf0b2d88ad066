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

  layer                                   "uid" (root)          "userns" (not root)   "none"
  own session + process group, killpg     yes                   yes                   yes
  fresh temp dir as cwd, removed after    yes                   yes                   yes
  rlimits CPU, AS, FSIZE, NOFILE, CORE=0  yes                   yes                   yes
  scrubbed env, PR_SET_NO_NEW_PRIVS       yes                   yes                   yes
  PDEATHSIG=KILL if the verifier dies     yes                   yes                   yes
  no sockets: seccomp makes socket()     yes                   yes                   yes
    and io_uring_setup() fail (EACCES),
    so no Unix socket file on the host,
    no vsock, nothing a namespace misses
  no network (new, empty net namespace:   yes                   yes                   NO
    even 127.0.0.1 is unreachable)
  new mount namespace: private /tmp, the  yes                   yes                   NO
    host fs read-only, `hidden_paths`
    (homes, /run, the test repository)
    covered by empty tmpfs
  new pid namespace with its own /proc:   yes                   yes                   NO
    no host process is visible or
    signalable; all die with the run
  the work dir a tmpfs of its own (inputs yes                   yes                   NO: the
    copied in, collected files copied out                                             host temp
    by init; tmp_mb + inputs, BOX_INODES                                              dir itself
    entries): nothing written reaches the
    host disk, the kernel frees it all
  a fresh unprivileged uid per run:       yes                   NO: same uid as the   if root
    RLIMIT_NPROC binds per run; cannot                          verifier, so it can
    signal the verifier or read our 0600                        signal the user's
    files; kill(-1) as that uid removes                         processes; NPROC
    everything it left (even setsid()                           counts them all;
    escapees)                                                   group-kill only

"uid" mode needs root (CAP_SYS_ADMIN for the namespaces, CAP_SETUID for the uid); "userns" is what
an ordinary user gets where the kernel allows unprivileged user namespaces; "none" is the last
resort — and as root it still drops to a fresh uid, so nothing ever runs as root. The per-run uid
is SANDBOX_UID_BASE + (native id of the calling thread << 8 | a run counter mod 256). Thread ids
are unique among live threads, so concurrent runs never share a RLIMIT_NPROC count; the counter
means a run never inherits the count of killed-but-not-yet-reaped processes of the previous run
on its thread (where the init process does not reap orphans, such zombies stay forever and would
otherwise block the uid). After the run, kill(-1, SIGKILL) sent as that uid (`kill_uid`) kills
every process it left. The read-only host filesystem needs Linux >= 5.12 (mount_setattr). The
mode is probed once per process (`isolation_mode`): "uid" -> "userns" -> "none", the last with a
RuntimeWarning. tests/verifiers/test_verifier_hostile.py checks each row against hostile
programs.

NOT defended (know this before running untrusted code at scale): kernel exploits and side
channels (the seccomp filter only removes sockets; there is no VM); /sys is the host's, read-only
(hardware facts, no other process's data); /proc/1 inside is a copy of the verifier process
(the namespace's init, forked from it), so its command line is visible; CPU use is per process (a fork bomb of N processes may use N x cpu_s
within the wall limit); in "none" mode, disk use in the work dir is bounded per file
(RLIMIT_FSIZE) and by time, not by a quota; without root (no uid of its own) and without namespaces ("none") a program can kill(-1) every
process of the user; RLIMIT_AS counts virtual memory, which over-counts for runtimes that reserve address space
(Go, Java, ASan). In "none" mode the network and the filesystem are open: trusted code only. Python candidates run as `python -S -s -B main.py`: no site, no user
site, no .pyc; not `-I`, because -I implies -E, which would ignore our PYTHONHASHSEED=0 (the
environment is ours anyway, so -E would add nothing) — fixed hashing keeps rewards deterministic.

Parent-side care (capped reads, no symlink followed, a removal that never fails) lives in
`child_io.py`; the child-side steps and the uid bookkeeping in `isolation.py`. `preexec_fn` runs
Python between fork and exec, which is safe only in a single-threaded process: the pool workers
this is designed for (they call `fork_here()`). Called from any other process (the trainer's,
with JAX's threads), a run is forked by a launcher process instead (`launcher.py`), so the
JAX process never forks.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence

from minirl.verifiers.child_io import communicate, read_back, remove_tree
from minirl.verifiers.isolation import BOX, kill_uid, make_preexec, sandbox_uid
from minirl.verifiers.launcher import Launcher, LauncherDied, serve

MODES = ("uid", "userns", "none")

_MEMORY_MARKERS = (b"MemoryError", b"bad_alloc", b"Cannot allocate memory", b"out of memory")


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
    hidden_paths: tuple[str, ...] = (
        "/home",
        "/root",
        "/run",
        "/mnt",
        "/media",
        "/srv",
        "/var/tmp",
        "/dev/shm",
    )
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
    max_rss_mb: float = 0.0  # wait4's ru_maxrss: on Linux at least the launching process's peak
    # at the fork (the kernel carries it across exec), so an upper bound, not the program's own
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


def _rlimits(limits: Limits) -> tuple[tuple[int, int, int], ...]:
    """(resource, soft, hard) for a run. CPU in whole seconds (the exact limit is checked on the
    measured usage); the hard CPU limit one second later kills what ignores SIGXCPU."""
    cpu = max(1, math.ceil(limits.cpu_s))
    return (
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, limits.memory_mb << 20, limits.memory_mb << 20),
        (resource.RLIMIT_FSIZE, limits.file_mb << 20, limits.file_mb << 20),
        (resource.RLIMIT_NPROC, limits.nproc, limits.nproc),
        (resource.RLIMIT_NOFILE, limits.nofile, limits.nofile),
        (resource.RLIMIT_CORE, 0, 0),
    )


def _start_run(argv, files, stdin, limits, config, collect, mode) -> RunResult:
    """One run, forked from here in a process made for it (`fork_here`), else by the launcher
    process (launcher.py: forking a multi-threaded process, JAX's, can deadlock the child).
    The uid is chosen here either way: it derives from the calling thread."""
    uid = sandbox_uid() if os.geteuid() == 0 else None  # never run a program as root
    args = (argv, files, stdin, limits, config, collect, mode, uid)
    if _FORK_HERE:
        return _run(*args)
    try:
        return _LAUNCHER.run(args)
    except LauncherDied as e:
        return RunResult(None, error=str(e))


def serve_runs() -> None:
    """What the launcher process runs: `_run` for each request (launcher.py)."""
    fork_here()
    serve(_run)


_LAUNCHER = Launcher("minirl.verifiers.sandbox:serve_runs")  # started on first use
_FORK_HERE = False


def fork_here() -> None:
    """Declare this process fit to fork its sandboxed programs itself: single-threaded Python by
    design, as a `VerifierPool` worker is. Every other process hands its runs to a launcher."""
    global _FORK_HERE
    _FORK_HERE = True


def _run(argv, files, stdin, limits, config, collect, mode, uid) -> RunResult:
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
        box_mb = config.tmp_mb + math.ceil(sum(len(d) for d in files.values()) / 2**20)
        preexec = make_preexec(
            mode, _rlimits(limits), config.hidden_paths, config.tmp_mb, uid, box_mb, collect
        )
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                list(argv),
                cwd=box,
                env=_sandbox_env(mode, box),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except (OSError, subprocess.SubprocessError) as e:
            return RunResult(None, error=f"could not start {argv[0]!r} ({mode} mode): {e}")
        try:
            out, err, wall_timeout, exceeded = communicate(
                proc, stdin, limits.output_bytes, start + limits.wall_limit_s
            )
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if uid is not None:
                kill_uid(uid)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                stream.close()
        wall = time.monotonic() - start
        got = {name: read_back(os.path.join(box, name), 64 << 20) for name in collect}
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
        remove_tree(box)


@functools.cache
def _probe(mode: str, config: SandboxConfig) -> str:
    """'' if `mode` works on this machine, else why not. Cached per process (cheap, ~5 ms)."""
    if mode == "uid" and os.geteuid() != 0:
        return "needs root"
    if mode == "userns" and os.geteuid() == 0:
        return "not for root (root uses 'uid', or 'none' with a per-run uid)"
    true = shutil.which("true", path="/bin:/usr/bin") or "/bin/true"
    try:
        result = _start_run([true], {}, b"", Limits(), config, (), mode)
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
    /tmp or a hidden path; world-executable when runs drop to another uid, i.e. as root)."""
    if config.python:
        return config.python
    mode = isolation_mode(config)
    hidden = () if mode == "none" else ("/tmp", *config.hidden_paths)
    for path in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        real = os.path.realpath(path)
        if not os.path.isfile(real) or any(real.startswith(h + "/") for h in hidden):
            continue
        if os.geteuid() != 0 or _world_executable(real):
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
    return _start_run(
        argv, dict(files or {}), stdin, limits, config, tuple(collect), isolation_mode(config)
    )
