"""Placement: how the trainer's arrays meet devices, the one door between minirl and a mesh.

minirl's Trainer never mentions a device or a mesh. Every micro-batch array it hands to its
jitted functions passes through `placement.rows(x)` (axis 0 = rows of the micro-batch, N), and
every per-row result it brings back passes through `placement.host(x)`:

    HostPlacement()              the default: numpy in (jit puts it on the default device),
                                 numpy copies out. One device, no mesh.
    scale.mesh.RowPlacement(mesh, rules)
                                 rows split over the rules' "batch" mesh axes (data x fsdp for
                                 FSDP training), results gathered from every process

Parameters are placed by whoever builds the Trainer (`scale.mesh.place_params`); the Trainer
keeps their layout, also when it restores a checkpoint (`place_like`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


class HostPlacement:
    """The default placement: no mesh. Micro-batch arrays go to the jitted functions as numpy
    (jit puts them on the default device); results come back as numpy copies."""

    def rows(self, x: np.ndarray) -> Any:
        """A host array whose axis 0 is micro-batch rows -> what the jitted functions take."""
        return x

    def host(self, tree: Any) -> Any:
        """Device arrays (a pytree) -> numpy copies, the same on every process of a job."""
        return jax.tree.map(lambda x: np.array(x, copy=True), tree)


def place_like(value: Any, like: Any) -> jax.Array:
    """A host value laid out like the device array `like` it replaces (same sharding, also
    across processes: each process fills its own shards from `value`)."""
    host = np.asarray(value)
    if not isinstance(like, jax.Array):
        return jnp.asarray(host)
    return jax.make_array_from_callback(host.shape, like.sharding, lambda index: host[index])
