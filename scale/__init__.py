"""scale/: the scale-out layer — device meshes, TensorStore weights, remote verifiers and workers,
Ray actors, Orbax checkpoints.

It imports minirl; minirl never imports it. Map (scale/README.md is the guide):

  mesh.py                  jax.distributed init, meshes, the sharding rules (no_sharding /
                           fsdp / tensor_parallel), placing, publishing and loading weights
  tensorstore_weights.py   TensorStoreWeightStore: versioned weights on file/memory/gcs/s3,
                           atomic commits, per-process shard reads; StoredWeights references
  verifier_service.py      VerifierService: a verifier pool over HTTP; test data by sha256
  remote_verifier.py       RemoteVerifier: its client, a minirl Verifier (retries, by reference)
  ray_workers.py           RayWorker, RayJob, RayPlacement: minirl's worker futures to Ray actors
  ray_run.py               `python -m scale.launch ray`: minirl train with its parts in actors
  orbax_checkpoints.py     TrainerCheckpoints: the trainer job's sharded checkpoints (Orbax)
  launch.py                `python -m scale.launch ray|verifier`; the trainer and engine roles
  diagnose.py              `python -m scale.diagnose`: minirl's mismatch table + "sharding"

The names below are imported lazily (`scale.TensorStoreWeightStore` loads only that module), so
a verifier host never starts JAX and a launcher can configure devices before JAX starts.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

_EXPORTS = {
    "mesh": (
        "DistributedConfig",
        "MeshConfig",
        "ShardingRules",
        "initialize",
        "make_mesh",
        "no_sharding",
        "fsdp",
        "tensor_parallel",
        "place_params",
        "publish",
        "load",
        "MeshRows",
    ),
    "tensorstore_weights": ("TensorStoreWeightStore",),
    "roles": ("StoredWeights",),
    "verifier_service": ("VerifierService", "ServiceConfig"),
    "remote_verifier": ("RemoteVerifier", "ClientConfig", "RemoteVerifierError"),
    "ray_workers": ("RayWorker", "RayJob", "RayPlacement"),
    "orbax_checkpoints": ("TrainerCheckpoints",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted([*_WHERE, "use_cpu_devices"])


def use_cpu_devices(count: int) -> None:
    """Run JAX on `count` fake CPU devices (tests, laptops). Call before JAX starts: the flag is
    read once, when the first computation initialises the CPU backend."""
    if count < 1:
        raise ValueError(f"use_cpu_devices needs a count >= 1, got {count}")
    os.environ["JAX_PLATFORMS"] = "cpu"
    flag = f"--xla_force_host_platform_device_count={count}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'scale' has no attribute {name!r}")
    return getattr(importlib.import_module(f"scale.{_WHERE[name]}"), name)
