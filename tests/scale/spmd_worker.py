"""A 2-process JAX job served SPMD-style (run by tests/scale/test_remote_worker.py):

    python tests/scale/spmd_worker.py LOG COORDINATOR PROCESS_ID

Process 0 serves a small object on 127.0.0.1 (printing "listening on host:port"); process 1
follows. Every process appends the calls it ran to LOG.<process id> and, on each call, runs a
computation over both processes' devices (a psum), as an engine or trainer job would.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from scale import mesh as M  # noqa: E402
from scale.remote_worker import follow, serve  # noqa: E402

log, coordinator, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
M.initialize(M.DistributedConfig(coordinator, 2, pid))


class Job:
    def __init__(self):
        self.calls = []
        self.mesh = M.make_mesh(M.MeshConfig(data=-1))

    def total(self, values):
        """sum(values) * number of processes, computed across the job."""
        self.calls.append(["total", list(values)])
        sharding = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec("data"))
        x = jax.make_array_from_callback(
            (2,), sharding, lambda i: np.full(1, sum(values), np.float32)
        )
        out = jax.jit(
            lambda a: a.sum(),
            out_shardings=jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec()),
        )(x)
        with open(f"{log}.{jax.process_index()}", "w") as f:
            json.dump(self.calls, f)
        return float(out.addressable_data(0))


job = Job()
if jax.process_index() == 0:
    serve(
        job,
        "127.0.0.1",
        0,
        "spmd-token-123",
        announce=lambda a: print(f"listening on {a}", flush=True),
    )
else:
    follow(job)
M.barrier("spmd-done")
