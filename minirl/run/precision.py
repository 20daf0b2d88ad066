"""Which compute dtype runs fastest here: bf16 mixed precision where the hardware multiplies bf16
natively, float32 elsewhere.

    native_bf16()          True on an accelerator, and on a CPU with AVX512-BF16 or AMX-BF16
    fastest_compute_dtype  "bfloat16" where `native_bf16()`, else "float32"

Mixed precision in minirl is `ModelConfig(dtype="bfloat16", param_dtype="float32")`: every
matmul takes bf16 inputs and sums in float32 (minirl/modeling/exact.py `dense`), the weights
the trainer updates and the optimizer's moments stay float32, and the logits, log-softmax and
loss are float32. On a CPU, XLA hands such a dot to YNNPACK, which has kernels for AVX512-BF16
(`vdpbf16ps`: twice the products of a float32 FMA per instruction) and for AMX-BF16 tiles; a
CPU with neither upcasts bf16 to float32, so bf16 there only adds rounding.

`MINIRL_COMPUTE_DTYPE` ("float32" or "bfloat16"), when set, is the answer instead: the test
suite pins float32 so that its numbers do not depend on the CPU it runs on.

Simplified on purpose: the CPU's features are read from /proc/cpuinfo (Linux); elsewhere a CPU
counts as float32-only.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import jax

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo names
PIN = "MINIRL_COMPUTE_DTYPE"


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The feature flags of the first CPU in /proc/cpuinfo (or in the text `cpuinfo`)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.exists() else ""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


@functools.lru_cache(maxsize=1)
def native_bf16() -> bool:
    """Whether JAX's default backend multiplies bf16 natively (see the module docstring)."""
    if jax.default_backend() != "cpu":
        return True
    return bool(cpu_flags() & set(BF16_CPU_FLAGS))


def fastest_compute_dtype() -> str:
    """The model.dtype a run on a user's model takes unless set (minirl/run/derived.py)."""
    pinned = os.environ.get(PIN, "")
    if pinned:
        if pinned not in ("float32", "bfloat16"):
            raise ValueError(f"{PIN} must be float32 or bfloat16, got {pinned!r}")
        return pinned
    return "bfloat16" if native_bf16() else "float32"
