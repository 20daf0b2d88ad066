"""Freed host memory handed back to the operating system before a gradient program runs.

On a CPU XLA's buffers come from malloc, and glibc kept what a step freed in arenas that the next
gradient program (its buffers allocated from XLA's threads) did not reuse: 2.2 GB at the
Qwen2.5-0.5B shape, counted into the run's peak (docs/trainer.md, "Peak memory"). `malloc_trim`
returns it; without one (macOS, musl) this does nothing.
"""

from __future__ import annotations

import ctypes
import functools

__all__ = ["release_freed"]


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # the process's own C library
    except (OSError, AttributeError):
        return None


def release_freed() -> None:
    """Return the memory malloc holds free to the operating system (glibc), else nothing."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
