"""Launch minirl's parts on many hosts: the RLAX layout, on Ray.

    python -m scale.launch ray --preset countdown --engines 2          # scale/ray_run.py
    python -m scale.launch ray --address auto --weights gs://b/run/weights \
        --checkpoints gs://b/run/trainer --trainer-hosts 4 --resource trainer:TPU=4 ...
    python -m scale.launch verifier --port 8470 --verifier code       # the HTTP verifier service

This module is the command line. What the commands run lives beside it: the roles — one
process's part of a job, built inside a Ray actor after it joined its JAX job — and the
controller's side, `drive` (the step loop every run uses, minirl/run/loop.py), in
scale/roles.py; the Ray side in scale/ray_run.py and
scale/ray_workers.py; the verifier service in scale/verifier_service.py.

Weights travel BY REFERENCE, as in RLAX's parameter server: the trainer job writes its own FSDP
shards to the TensorStore store (every process its part) and answers the controller's `params`
call with a `StoredWeights(version)` reference; the controller keeps references in a
`ReferenceStore` (it still decides which versions may be deleted, RLAX's garbage collection);
the engine job reads each version straight into its tensor-parallel layout. The controller never
holds the weights.

The roles take `minirl train`'s flags, `--model DIR --data FILE` included. The trainer job
starts from a model directory by reading it straight into its FSDP layout (`first_params`:
each process reads only the blocks its devices hold, scale/mesh.py's `load_checkpoint`).

Preemption and resume follow `minirl train`: the controller owns the run directory (config.json,
metrics.jsonl, checkpoints/ — minirl/run/run_dir.py's `open_run_dir`, `checkpoint_due`,
`save_checkpoint`, `restore_run`) and starting it again on the same --run-dir resumes from the
last checkpoint. Without --checkpoints a checkpoint holds the trainer job's params and optimizer
state (fetched with a `state_dict` call) and the controller's snapshot; with it, the trainer job
writes its own (scale/orbax_checkpoints.py: every process its shards) and the controller's
checkpoint holds its snapshot and the trainer's step, written after the trainer's save
returned; a resume restores that step and drops any newer one. Either way the trainer job then
drops the store's versions from the checkpoint's on (`publish_from`) and publishes that version
again, and the engine job loads it.

Scripts that start a service as a local process (tests, lesson 11) wait for it to print its
address with `wait_for_output(proc, r"on (http://\\S+)")`.

The loop is `minirl train`'s own: lockstep or async (rl.scheduler), held-out evaluation before,
every eval.every steps and after, rl.time_budget, a checkpoint of the last step however it
ends. Simplified on purpose: the evaluation runs in the driver's process on weights it reads
whole from the store (fine for a model one host holds).
"""

from __future__ import annotations

import argparse
import os
import re
import select
import subprocess
import time
from collections.abc import Sequence

from scale.roles import shared_token


def run_verifier(args) -> None:
    from scale import verifier_service as RV

    os.environ[RV.TOKEN_ENV] = shared_token()
    argv = [
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--repository",
        args.repository,
        "--verifier",
        args.verifier,
        "--workers",
        str(args.workers),
    ]
    RV.main(argv)


def wait_for_output(
    proc: subprocess.Popen, pattern: str, timeout: float = 300.0
) -> tuple[str, str]:
    """Read `proc`'s stdout (a pipe) until the regex `pattern` matches; return (its group 1, the
    output so far). If the process closes its output or the time runs out first, kill it (only
    it: a caller that started a process group kills the group) and raise RuntimeError with the
    end of what it printed."""
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 0.2)[0]:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break  # end of output: the process exited
            out += chunk
            match = re.search(pattern.encode(), out)
            if match:
                return match.group(1).decode(), out.decode(errors="replace")
    proc.kill()
    raise RuntimeError(
        f"no {pattern!r} within {timeout:.0f} s from {proc.args!r}: "
        f"{out.decode(errors='replace')[-3000:]}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    from scale import ray_run

    p = argparse.ArgumentParser(prog="python -m scale.launch", description=__doc__.split("\n\n")[0])
    roles = p.add_subparsers(dest="role", required=True)
    r = roles.add_parser(
        "ray",
        help="a run with engine(s), trainer and verifier as Ray actors",
        description=ray_run.__doc__.split("\n\n")[0],
    )
    ray_run.add_arguments(r)
    v = roles.add_parser(
        "verifier",
        help="serve a verifier pool over HTTP",
        description="Serve a verifier pool over HTTP (scale/verifier_service.py). Its bearer "
        "token is $MINIRL_TOKEN, the secret every job of the run shares.",
    )
    v.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all)")
    v.add_argument("--port", type=int, default=8470, help="port to listen on (default: 8470)")
    v.add_argument(
        "--repository",
        default="verifier-data",
        help="directory of the content-addressed test data (default: verifier-data)",
    )
    v.add_argument(
        "--verifier",
        default="code",
        help="code (the default) | math | task:<built-in task> | path/to/file.py:function",
    )
    v.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="verifier processes (default: this machine's cores)",
    )
    args = p.parse_args(argv)
    from minirl.configlib import ConfigError
    from minirl.hf.hf_config import CheckpointError

    try:
        {"verifier": run_verifier, "ray": ray_run.run}[args.role](args)
    except (
        ConfigError,
        CheckpointError,
        OSError,
        ValueError,
    ) as e:  # a user's mistake: one line, no traceback
        p.exit(2, f"python -m scale.launch {args.role}: error: {e}\n")


if __name__ == "__main__":
    main()
