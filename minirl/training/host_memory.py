"""Freed host memory reused, and handed back to the operating system (glibc's malloc).

On a CPU XLA's buffers come from malloc, and glibc gives each thread its own arena: what the main
thread freed was not reused by the gradient program's buffers (XLA allocates from its own threads)
and stayed resident (2.2 GB at the Qwen2.5-0.5B shape; docs/trainer.md, "Peak memory").
`share_arenas` (the command line, before XLA starts its threads) makes threads share one arena;
`release_freed` (before each update) returns what is free. Without glibc both do nothing.
"""

from __future__ import annotations

import ctypes

__all__ = ["release_freed", "share_arenas"]

try:
    _LIBC = ctypes.CDLL(None)  # the process's own C library
except (OSError, TypeError):  # no C library to open (Windows)
    _LIBC = None


def share_arenas(count: int = 1) -> bool:
    """Threads started from now on allocate from at most `count` arenas, so what one frees the
    others reuse. Whether the C library took it."""
    mallopt = getattr(_LIBC, "mallopt", None)
    return mallopt is not None and mallopt(-8, count) == 1  # -8: M_ARENA_MAX


def release_freed() -> None:
    """Return the memory malloc holds free to the operating system (glibc), else nothing."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)
