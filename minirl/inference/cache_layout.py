"""Where the engine keeps keys and values: two layouts behind one small interface.

    layout = ContiguousLayout(model_cfg, engine_cfg)   # or PagedLayout (engine.paged=true)
    cache = layout.empty()                              # allocated once
    layout.ensure(slot, positions)                      # room for that many positions? (host)
    layout.release(slot)                                # the slot's sequence is done (host)
    layout.for_device(cache)                            # what the compiled functions take

    # inside the compiled prefill / decode (static methods, traced):
    cache = layout.write_rows(cache, rows, slot_ids, lengths)   # a prefill's keys/values in
    view = layout.view(cache, width)                            # what a decode chunk attends over
    cache = layout.write_back(cache, view, starts, count, steps)  # the chunk's new positions out

ContiguousLayout reserves `cache_len` positions for every slot up front: `ensure` always
succeeds, a view is the cache itself (read up to `width` in place), nothing to release.
PagedLayout (paged_cache.py: a block pool, block tables, a free list) hands blocks out as
sequences grow: `ensure` fails when the pool is dry (the engine then preempts the youngest), a
view is gathered from the blocks, and the host's block table travels with the cache. The engine
and the compiled functions call only these methods: neither has a branch on the layout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from minirl.inference import paged_cache
from minirl.modeling.model import KVCache, ModelConfig


def cache_dtype(model_cfg: ModelConfig):
    """float32 on a CPU (holds bf16 keys/values exactly; XLA CPU upcast a bf16 cache by copying
    it whole, every layer of every decode step: docs/engine.md), else the compute dtype."""
    return jnp.float32 if jax.default_backend() == "cpu" else model_cfg.compute_dtype


class ContiguousLayout:
    """slots x cache_len positions, reserved up front."""

    def __init__(self, model_cfg: ModelConfig, engine_cfg):
        self.model_cfg, self.cfg = model_cfg, engine_cfg

    def empty(self) -> KVCache:
        m = self.model_cfg
        return KVCache.zeros(m, self.cfg.slots, self.cfg.cache_len, cache_dtype(m))

    def ensure(self, slot: int, positions: int) -> bool:
        return True

    def release(self, slot: int) -> None:
        pass

    def for_device(self, cache: KVCache) -> KVCache:
        return cache

    def memory(self, used_tokens: int, peak_tokens: int) -> dict[str, int]:
        """Positions allocated, used now and at the peak, and the largest temporary view."""
        c = self.cfg
        return {
            "allocated": c.slots * c.cache_len,
            "used": used_tokens,
            "peak_used": peak_tokens,
            "transient": 0,  # a decode chunk reads its window in place
        }

    @staticmethod
    def write_rows(cache: KVCache, rows: KVCache, slot_ids, lengths) -> KVCache:
        """Prefill: rows [R, T] go to slots `slot_ids` (>= B: dropped)."""
        t = rows.k[0].shape[1]
        put = lambda c, r: c.at[slot_ids, :t].set(r.astype(c.dtype), mode="drop")  # noqa: E731
        return KVCache(
            tuple(map(put, cache.k, rows.k)),
            tuple(map(put, cache.v, rows.v)),
            cache.lengths.at[slot_ids].set(lengths, mode="drop"),
        )

    @staticmethod
    def view(cache: KVCache, width: int) -> KVCache:
        """The cache itself: the model reads its first `width` positions in place."""
        return cache

    @staticmethod
    def write_back(cache: KVCache, view: KVCache, starts, count, steps: int) -> KVCache:
        """The view is the cache: the chunk wrote its new positions in place."""
        return view


class PagedLayout:
    """A pool of `block_size`-position blocks handed out on demand (minirl/inference/paged_cache.py)."""

    def __init__(self, model_cfg: ModelConfig, engine_cfg):
        self.model_cfg, self.cfg = model_cfg, engine_cfg
        c = engine_cfg
        self.blocks = paged_cache.BlockAllocator(
            c.pool_blocks, c.block_size, c.slots, c.blocks_per_slot
        )

    def empty(self) -> paged_cache.PagedKVCache:
        c, m = self.cfg, self.model_cfg
        shape = (c.slots, c.pool_blocks, c.block_size, c.blocks_per_slot)
        return paged_cache.PagedKVCache.zeros(m, *shape, cache_dtype(m))

    def ensure(self, slot: int, positions: int) -> bool:
        return self.blocks.ensure(slot, positions)

    def release(self, slot: int) -> None:
        self.blocks.release(slot)

    def for_device(self, cache: paged_cache.PagedKVCache) -> paged_cache.PagedKVCache:
        return cache._replace(table=jnp.asarray(self.blocks.table))  # the host's table is truth

    def memory(self, used_tokens: int, peak_tokens: int) -> dict[str, int]:
        c, blocks = self.cfg, self.blocks
        return {
            "allocated": c.pool_blocks * c.block_size,
            "used": blocks.num_used * c.block_size,
            "peak_used": blocks.peak_used * c.block_size,
            "transient": c.slots * c.cache_len,
        }  # (the widest view, gathered)

    write_rows = staticmethod(paged_cache.write_rows)
    view = staticmethod(paged_cache.gather_view)
    write_back = staticmethod(paged_cache.write_back)


class OneDevice:
    """The slots' rows on jit's default device (scale.slots.MeshSlots: split over a mesh)."""

    empty = staticmethod(lambda make: make())  # the empty cache `make` returns
    put = staticmethod(lambda tree: tree)  # the cache and [B, ...] arrays, as jit takes them
    host = staticmethod(jax.device_get)  # results -> numpy


def layout_of(engine_cfg) -> type:
    """The layout class `engine_cfg` asks for."""
    return PagedLayout if engine_cfg.paged else ContiguousLayout
