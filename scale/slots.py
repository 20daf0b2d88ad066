"""The engine's slots on a device mesh: `MeshSlots`, the `slot_layout` of minirl's Engine.

    slots = MeshSlots(mesh, tensor_parallel(), ecfg.slots)   # slots over "data"
    engine = Engine(model_cfg, ecfg, slot_layout=slots)
    engine.load_weights(v, place_params(params, mesh, tensor_parallel()))   # weights over "tensor"

An engine on one device (`minirl.inference.cache_layout.OneDevice`, the default) never mentions
a mesh. On a mesh, every per-slot array (the KV cache's rows, each slot's length and block
table, the pending token, position, sampling ids and step budget of a decode) is split over the
rules' "batch" axes, so each of the mesh's `data` replicas holds and decodes its share of the
slots, while the weights and the cache's KV heads follow "tensor" (scale/mesh.py's rules). The
trainer's counterpart is scale/mesh.py's `MeshRows`, which this extends.

`check_slots` is what the launcher runs before any job starts: an engine mesh axis the rules
give nothing to ("fsdp") would change nothing, and the slots must divide evenly over "data".

Simplified on purpose: a prefill runs whole on every data replica (each keeps its own slots'
rows), and a paged cache's block pool, shared by all slots, stays whole on each.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from scale.mesh import (
    MeshRows,
    ShardingRules,
    activation_sharding,
    batch_sharding,
    place,
)


def check_slots(sizes: Mapping[str, int], rules: ShardingRules, slots: int) -> None:
    """ValueError (one line) unless an engine of `slots` slots can use every axis of a mesh of
    these sizes under `rules` (`tensor_parallel()`: weights over "tensor", slots over "data"): an
    axis no rule names would change nothing, and the slots must split evenly over the batch axes.
    A size of -1 (the devices left, not known yet) counts as more than 1; the slot count is then
    left to the job, which knows its devices."""
    batch = rules.mesh_axes("batch")
    weights = sorted({a for logical, _ in rules.rules for a in rules.mesh_axes(logical)} - {*batch})
    if unused := [f"{a}={n}" for a, n in sizes.items() if n != 1 and a not in {*batch, *weights}]:
        raise ValueError(
            f"engine mesh {','.join(unused)}: the engine splits its weights over "
            f"{'/'.join(weights)} and its slots over {'/'.join(batch)} only, so this axis "
            "would change nothing; more engines come from `python -m scale.launch ray "
            "--engines N` (replicas)"
        )
    ways = [sizes.get(a, 1) for a in batch]
    if -1 not in ways and slots % math.prod(ways):
        raise ValueError(
            f"engine.slots={slots} cannot be split over {math.prod(ways)} data replicas: set "
            f"engine.slots to a multiple of {math.prod(ways)}"
        )


class MeshSlots(MeshRows):
    """A rollout engine's slots on a mesh (`minirl.inference.engine.Engine`'s `slot_layout`):

        engine = Engine(cfg, ecfg, slot_layout=MeshSlots(mesh, tensor_parallel(), ecfg.slots))

    Every per-slot array — the KV cache's rows, each slot's cache length and block table, its
    pending token, position, sampling ids and step budget — is split over the rules' "batch"
    axes (`tensor_parallel()`: "data"), so each data replica holds and decodes slots / data of
    the slots; the cache's KV heads follow "tensor", as the weights do. A paged cache's block
    pool is shared by all slots: it stays whole on every data replica (its views are split).
    Results come back whole on every process. The slot count must divide by the batch axes, and
    every axis of the mesh must be one the rules use (an unused axis would change nothing)."""

    def __init__(self, mesh: Mesh, rules: ShardingRules, slots: int):
        check_slots(dict(mesh.shape), rules, slots)
        super().__init__(mesh, rules)

    def shardings(self, tree: Any) -> Any:
        """A NamedSharding for every leaf of `tree`: a KV cache (contiguous or paged, real or
        `jax.eval_shape`'s) or a tuple of per-slot arrays [B, ...]."""
        from minirl.inference.paged_cache import PagedKVCache
        from minirl.modeling.model import KVCache

        def rows(x) -> NamedSharding:
            return _as_jit_spells(batch_sharding(np.shape(x), self.mesh, self.rules))

        if not isinstance(tree, KVCache | PagedKVCache):
            return jax.tree.map(rows, tree)
        kind = "kv_pool" if isinstance(tree, PagedKVCache) else "kv_cache"

        def kv(x) -> NamedSharding:
            return _as_jit_spells(activation_sharding(kind, x.shape, self.mesh, self.rules))

        per_slot = {f: rows(getattr(tree, f)) for f in tree._fields if f not in ("k", "v")}
        return tree._replace(k=tuple(map(kv, tree.k)), v=tuple(map(kv, tree.v)), **per_slot)

    def empty(self, make) -> Any:
        """The empty cache `make()` returns, allocated where it belongs (never whole on one
        device first)."""
        return jax.jit(make, out_shardings=self.shardings(jax.eval_shape(make)))()

    def put(self, tree: Any) -> Any:
        """`tree` laid out by `shardings`; arrays already laid out so are passed as they are."""

        def put(x, sharding):
            if isinstance(x, jax.Array) and x.sharding.is_equivalent_to(sharding, x.ndim):
                return x
            return place(x, sharding)

        return jax.tree.map(put, tree, self.shardings(tree))


def _as_jit_spells(sharding: NamedSharding) -> NamedSharding:
    """`sharding` with its spec's trailing Nones dropped, as jit spells the layouts it returns:
    the cache a compiled call returns then matches the one it was given, and no function is
    compiled a second time for the same layout spelled another way."""
    spec = list(sharding.spec)
    while spec and spec[-1] is None:
        spec.pop()
    return NamedSharding(sharding.mesh, PartitionSpec(*spec))
