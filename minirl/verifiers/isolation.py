"""The child side of the sandbox: namespaces, mounts, rlimits, uids — and cleaning up after.

`sandbox.py` (read its threat model first) starts each program with `preexec_fn=make_preexec(...)`;
this file holds what runs in the child between fork and exec, and the parent-side helpers that
depend on the same uids:

  isolate_filesystem_and_network  unshare(CLONE_NEWNS | CLONE_NEWNET [| CLONE_NEWUSER]); make all
                                  mounts private; cover hidden paths with empty tmpfs; a fresh
                                  tmpfs /tmp with the work dir bound at /tmp/box; everything else
                                  read-only (mount_setattr, Linux >= 5.12)
  make_preexec                    the above, then rlimits, PR_SET_NO_NEW_PRIVS, setresuid to the
                                  run's uid (when we are root, in every mode), PDEATHSIG=SIGKILL
  sandbox_uid / thread_uids       per-run uids: BASE + (thread id << 8 | counter % 256)
  kill_uid / kill_thread_sandboxes  kill what a run (or a killed worker's runs) left behind
  stray_processes                 for tests: sandbox processes still alive

Linux only; the raw syscall and prctl numbers below are for x86_64 and aarch64. Everything is
plain `ctypes` on libc, so the module needs nothing outside the standard library.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import resource
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence

SANDBOX_UID_BASE = 0x4000_0000  # sandbox uids: BASE + (thread id << 8 | run counter % 256)
BOX = "/tmp/box"  # where the work dir appears inside the isolated modes

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWNET = 0x20000, 0x10000000, 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 4096, 0x4000, 1 << 18
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _AT_RECURSIVE = 0x1, 0x2, 0x8000
_SYS_MOUNT_SETATTR = 442  # same number on x86_64 and aarch64
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38

_libc = ctypes.CDLL(None, use_errno=True)


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


def isolate_filesystem_and_network(mode: str, hidden: Sequence[str], tmp_mb: int) -> None:
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


def make_preexec(
    mode: str,
    rlimits: Sequence[tuple[int, int, int]],
    hidden: Sequence[str],
    tmp_mb: int,
    uid: int | None,
) -> Callable[[], None]:
    """The function `subprocess.Popen(preexec_fn=...)` runs in the child: isolation (unless
    mode is "none"), `rlimits` as (resource, soft, hard), no new privileges, drop to `uid`
    (if given), and die with the parent."""

    def preexec() -> None:  # runs in the child after fork (and setsid), before exec
        if mode != "none":
            isolate_filesystem_and_network(mode, hidden, tmp_mb)
        for which, soft, hard in rlimits:
            resource.setrlimit(which, (soft, hard))
        _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        _check(_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")

    return preexec


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
        pids = [pid for pid, uid in live_processes() if uid in uids]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
    return killed


def live_processes() -> list[tuple[int, int]]:
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
    for pid, uid in live_processes():
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
