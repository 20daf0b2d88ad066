"""A Python tool: model-written code runs in the code verifier's sandbox; its output comes back.

    with PythonTool() as py:
        py("print(sum(range(10)))")   -> "45"
        py("1/0")                      -> "error: runtime error: ZeroDivisionError: division by zero"
        py("while True: pass")         -> "error: time limit"

Each call is one fresh program, `python -S -s -B main.py`, in `minirl.verifiers.sandbox` with
its limits (CPU, memory, output, processes, files) and isolation (no network, a private /tmp,
the host read-only, a fresh uid where the machine allows): the same jail, with the same threat
model, as the programs the code verifier judges (see that file's table and
tests/verifiers/test_verifier_hostile.py). And as for code verification, the jail is entered
from a `VerifierPool` worker process (forkserver), never by forking the trainer's process, whose
JAX threads make fork unsafe; a worker that crashes or hangs is replaced and the call answers
with an error. Nothing the code does reaches the run: the answer is its stdout (capped) or a
one-line error naming what happened.

Simplified on purpose: no state between calls (each call is a new process; a model that needs
a value again recomputes it), no stdin, no files in or out; calls run one at a time.
"""

from __future__ import annotations

import numpy as np

from minirl.types import Prompt, Rollout, Score
from minirl.verifiers.pool import PoolConfig, VerifierPool
from minirl.verifiers.sandbox import Limits, SandboxConfig, python_interpreter, run_sandboxed

TOOL_LIMITS = Limits(cpu_s=1.0, memory_mb=256, output_bytes=4096, nproc=8)


def run_python(code: str, limits: Limits, sandbox: SandboxConfig) -> str:
    """Run `code` once in the sandbox: its stripped stdout, or "error: <what happened>"."""
    argv = [python_interpreter(sandbox), "-S", "-s", "-B", "main.py"]
    result = run_sandboxed(argv, files={"main.py": code.encode()}, limits=limits, config=sandbox)
    status = result.status(limits)
    if status == "ok":
        return result.stdout.decode("utf-8", errors="replace").strip()
    if status == "runtime error":
        lines = result.stderr.decode("utf-8", errors="replace").strip().splitlines()
        return f"error: runtime error: {lines[-1] if lines else f'exit {result.returncode}'}"
    return f"error: {status}" + (f" ({result.error})" if result.error else "")


class _Runner:
    """The pool's "verifier": runs each rollout's text; reward 1 = it ran, the reason is its
    answer (a pool failure is reward 0 with the pool's reason)."""

    def __init__(self, limits: Limits, sandbox: SandboxConfig):
        self.limits, self.sandbox = limits, sandbox

    def score(self, rollouts):
        return [Score(1.0, run_python(r.text, self.limits, self.sandbox)) for r in rollouts]


class PythonTool:
    """The tool `py`: a Python program in, its stdout (or an error) out. Holds one pool worker
    (started at the first call); `close()` stops it."""

    name = "py"

    def __init__(
        self,
        limits: Limits = TOOL_LIMITS,
        sandbox: SandboxConfig = SandboxConfig(),
        pool: PoolConfig = PoolConfig(workers=1, item_timeout_s=30.0),
    ):
        self._pool = VerifierPool(_Runner(limits, sandbox), pool)

    def __call__(self, call: str) -> str:
        none = np.zeros(0, np.int32)
        prompt = Prompt(uid=0, task="py", text="", tokens=none)
        rollout = Rollout(prompt, 0, none, none.astype(np.float32), none, "stop", text=call)
        score = self._pool.score([rollout])[0]
        return score.reason if score.reward == 1.0 else f"error: {score.reason}"

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> PythonTool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
