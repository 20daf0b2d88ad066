"""Row layout: how the trainer's arrays meet devices, the one door between minirl and a mesh.

minirl's Trainer never mentions a device or a mesh. Every micro-batch array it hands to its
jitted functions passes through `row_layout.rows(x)` (axis 0 = rows of the micro-batch, N), and
every per-row result it brings back passes through `row_layout.host(x)`:

    HostRows()                   the default: numpy in (jit puts it on the default device),
                                 read-only numpy out (`host_view`). One device, no mesh.
    scale.mesh.MeshRows(mesh, rules)
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

from minirl.store.trees import host_view


class HostRows:
    """The default row layout: no mesh. Micro-batch arrays go to the jitted functions as numpy
    (jit puts them on the default device); results come back as read-only numpy (`host_view`)."""

    def rows(self, x: np.ndarray) -> Any:
        """A host array whose axis 0 is micro-batch rows -> what the jitted functions take."""
        return x

    def host(self, tree: Any) -> Any:
        """Device arrays (a pytree) -> read-only numpy, the same on every process of a job."""
        return jax.tree.map(host_view, tree)


def place_like(value: Any, like: Any) -> jax.Array:
    """A host value laid out like `like` (the array it replaces, or a jax.ShapeDtypeStruct): same
    sharding, each process filling its own shards. A device array laid out so is used as is."""
    sharding = getattr(like, "sharding", None)  # an array's, a jax.ShapeDtypeStruct's or None
    if isinstance(value, jax.Array) and (
        sharding is None or value.sharding.is_equivalent_to(sharding, like.ndim)
    ):
        return value
    host = np.asarray(value)
    if sharding is None:
        return jnp.asarray(host)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def shardings_like_params(state: Any, params: Any) -> Any:
    """Shardings for an optimizer state (arrays or jax.ShapeDtypeStructs) laid out as the
    parameters it mirrors, or None when the parameters are on no mesh. A leaf whose path ends
    with a parameter's path (Adam's mu["layers"][0]["attn"]["q_proj"] ends with the parameter
    ["layers"][0]["attn"]["q_proj"]) and has its shape gets that parameter's sharding; the
    others (step counts) are replicated over the mesh. Needed because a jitted init makes zeros
    that depend on no input, and XLA puts those on one device: a sharded trainer would otherwise
    hold its whole optimizer state on one device until the first update."""
    from jax.sharding import NamedSharding, PartitionSpec

    by_path = {
        tuple(p): x
        for p, x in jax.tree_util.tree_flatten_with_path(params)[0]
        if isinstance(x, jax.Array)
    }
    mesh = next(
        (x.sharding.mesh for x in by_path.values() if isinstance(x.sharding, NamedSharding)), None
    )
    if mesh is None:
        return None

    def sharding(path, leaf):
        for n in range(len(path)):
            param = by_path.get(tuple(path[n:]))
            if param is not None and param.shape == leaf.shape:
                return param.sharding
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree_util.tree_map_with_path(sharding, state)
