"""The parent's side of talking to an untrusted program (sandbox.py runs it): feed its stdin,
read its output with caps, read back a file it wrote, and remove the directory it wrote into.

Everything here assumes the program is hostile: stdout is read with a byte cap (a flood never
fills our memory), stderr too; files are read back with O_NOFOLLOW and only if regular (a
planted symlink cannot make us read /etc/shadow); the work dir is removed without following
symlinks, whatever depth or permissions the program left.
"""

from __future__ import annotations

import os
import selectors
import shutil
import stat
import subprocess
import time
import warnings

STDERR_CAP = 64 * 1024


def _feed(fd: int, pending: memoryview) -> memoryview:
    """Write what the pipe takes now; returns what is left (nothing if the program closed its
    input: it stopped reading, which is fine)."""
    try:
        return pending[os.write(fd, pending[: 1 << 16]) :]
    except BlockingIOError:
        return pending
    except BrokenPipeError:
        return pending[:0]


def _selector(proc: subprocess.Popen, streams, feeding: bool):
    """A selector on the program's output pipes (non-blocking), its stdin when there is input
    to feed (else stdin is closed now), and its pidfd where the kernel has them (exit
    notification without polling). Returns (selector, pidfd or None)."""
    sel = selectors.DefaultSelector()
    for fd in streams:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    if feeding:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    pidfd = os.pidfd_open(proc.pid) if hasattr(os, "pidfd_open") else None
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ)
    return sel, pidfd


def communicate(proc: subprocess.Popen, stdin: bytes, output_bytes: int, deadline: float):
    """Feed stdin, read stdout/stderr with caps, stop at exit, deadline or output overflow.
    Returns (stdout, stderr, wall_timeout, output_exceeded). Does not reap the child."""
    out, err = bytearray(), bytearray()
    wall_timeout = output_exceeded = exited = False
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    pending = memoryview(stdin)
    sel, pidfd = _selector(proc, streams, bool(pending))

    def read(fd: int) -> int:  # bytes read; 0 at EOF, -1 if nothing there right now
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return -1
        buf = streams[fd]
        buf += chunk[: max(0, (output_bytes + 1 if buf is out else STDERR_CAP) - len(buf))]
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
                    pending = _feed(fd, pending)
                    if not pending:
                        sel.unregister(fd)
                        proc.stdin.close()
            output_exceeded = len(out) > output_bytes
            if pidfd is None and not exited:
                exited = (
                    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
                )
        for fd in streams:  # whatever the program wrote before it exited
            while read(fd) > 0 and len(out) <= output_bytes:
                pass
        output_exceeded = len(out) > output_bytes
    finally:
        sel.close()
        if pidfd is not None:
            os.close(pidfd)
    return bytes(out[:output_bytes]), bytes(err), wall_timeout, output_exceeded


def read_back(path: str, cap: int) -> bytes | None:
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


def remove_tree(path: str) -> None:
    """Delete a directory a program wrote into, never following its symlinks. Never raises.

    shutil.rmtree is fd-based (no symlink is followed) but recursive: a program that builds a
    directory chain a few thousand deep makes it fail with RecursionError. The fallback is
    coreutils, which walks any depth iteratively, first giving back the owner's rights the
    program may have taken from its directories (chmod -R does not follow symlinks either)."""
    if not path or not os.path.lexists(path):
        return
    try:
        shutil.rmtree(path)
        return
    except (OSError, RecursionError):
        pass
    for argv in (["chmod", "-R", "u+rwx", "--", path], ["rm", "-rf", "--", path]):
        try:
            subprocess.run(
                argv,
                env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
                check=False,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=120,
            )
        except (OSError, subprocess.SubprocessError):
            pass
    if os.path.lexists(path):
        warnings.warn(f"minirl sandbox: could not remove {path}", RuntimeWarning, stacklevel=2)
