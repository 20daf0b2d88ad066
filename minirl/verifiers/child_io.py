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

    Iterative and fd-based (`_empty`): whatever depth the program built (a chain of 5,000
    directories takes it a second), the work is linear in the number of entries and no
    recursion limit or external tool is involved. Directories the program made unreadable or
    unwritable get their owner's rights back (u+rwx) on the way. A warning, never an exception,
    if something stays."""
    if not path or not os.path.lexists(path):
        return
    try:
        parent, name = os.path.split(os.path.abspath(path))
        top = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if stat.S_ISDIR(os.lstat(name, dir_fd=top).st_mode):
                _empty(top, name)
                os.rmdir(name, dir_fd=top)
            else:
                os.unlink(name, dir_fd=top)
        finally:
            os.close(top)
    except OSError:
        pass
    if os.path.lexists(path):
        warnings.warn(f"minirl sandbox: could not remove {path}", RuntimeWarning, stacklevel=2)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir(parent_fd: int, name: str) -> int:
    """A directory's fd, opened relative to its parent and never through a symlink; its owner's
    rights restored first if the program took them away (the owner may always chmod)."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except PermissionError:  # no read or search right: chmod through an O_PATH handle
        handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY, dir_fd=parent_fd)
        try:
            os.chmod(f"/proc/self/fd/{handle}", 0o700)
        finally:
            os.close(handle)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    mode = os.fstat(fd).st_mode
    if os.geteuid() != 0 and mode & 0o700 != 0o700:  # root needs no rights to unlink
        os.fchmod(fd, stat.S_IMODE(mode) | 0o700)
    return fd


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _clear_files(fd: int) -> list[str]:
    """Unlink everything in the directory `fd` that is not a directory (symlinks included, as
    links); return the names of its subdirectories."""
    with os.scandir(fd) as it:
        entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    for name, _ in (e for e in entries if not e[1]):
        os.unlink(name, dir_fd=fd)
    return [name for name, is_dir in entries if is_dir]


def _empty(top: int, name: str) -> None:
    """Remove everything inside directory `name` of `top`, depth first, one fd open at a time:
    each directory is opened once on the way down and its parent re-opened once through ".."
    on the way up, its identity (device, inode) checked against the one seen going down, so a
    tree moved meanwhile stops the walk (OSError) instead of leading it elsewhere."""
    fd = _open_dir(top, name)
    frames = [[name, _identity(fd), None]]  # per level: name, identity, subdirs left to visit
    try:
        while True:
            frame = frames[-1]
            if frame[2] is None:
                frame[2] = _clear_files(fd)
            if frame[2]:
                sub = frame[2].pop()
                child = _open_dir(fd, sub)
                os.close(fd)
                fd = child
                frames.append([sub, _identity(fd), None])
                continue
            if len(frames) == 1:
                return
            frames.pop()
            up = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = up
            if _identity(fd) != frames[-1][1]:
                raise OSError("the directory tree moved while it was being removed")
            os.rmdir(frame[0], dir_fd=fd)
    finally:
        os.close(fd)
