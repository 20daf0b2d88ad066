"""How the rollout engine generates: slots, cache, prefill buckets, decode chunks, sampling.

`EngineConfig` is everything about generation that is not the model's shape (that is
`minirl.modeling.model.ModelConfig`): how many sequences decode together, how long the KV cache is,
which prompt lengths a prefill pads to (so compiled shapes stay bounded), the sampling spec
shared with the trainer, exact mode, and the paged cache's pool. minirl/inference/engine.py uses it;
docs/engine.md explains each knob's cost.
"""

from __future__ import annotations

import dataclasses

from minirl.modeling.sampling import Sampling


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Everything about how the engine generates (the model's shapes live in ModelConfig)."""

    slots: int = 8  # sequences decoded together (B)
    cache_len: int = 256  # S: prompt + completion positions per slot
    prefill_buckets: tuple[int, ...] = (32, 64, 128)  # prompt lengths pad up to one of these
    prefill_rows: int = 4  # most prompts per prefill call (row counts: powers of two)
    decode_chunk: int = 8  # decode steps per jitted call
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    stop_sequences: tuple[tuple[int, ...], ...] = ()  # token-id sequences that end a completion
    eos_ids: tuple[
        int, ...
    ] = ()  # token ids that end a completion (kept in it); () = a run uses its tokenizer's
    exact: bool = False  # fixed-order reductions: log-probs bitwise equal to the trainer's
    paged: bool = False  # paged KV cache instead of slots x cache_len
    block_size: int = 16  # paged: positions per block
    num_blocks: int | None = None  # paged: pool size incl. the null block; None = no saving
    dtype: str | None = None  # compute dtype override ("float32", "bfloat16"); None = model's

    def __post_init__(self):
        for name in ("slots", "cache_len", "prefill_rows", "decode_chunk", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        t, k, p, blocks = self.temperature, self.top_k, self.top_p, self.num_blocks
        problems = [
            (t < 0, f"temperature must be >= 0 (0 = greedy), got {t}"),
            (not 0.0 < p <= 1.0, f"top_p must be in (0, 1], got {p}"),
            (k < 0, f"top_k must be >= 0 (0 = off), got {k}"),
            (
                any(i < 0 for i in self.eos_ids),
                f"eos_ids must be token ids >= 0, got {self.eos_ids}",
            ),
            (blocks is not None and blocks < 2, f"num_blocks must be None or >= 2, got {blocks}"),
            (t == 0 and (k or p < 1.0), "greedy decoding (temperature 0) takes no top_k / top_p"),
            (
                not self.prefill_buckets or min(self.prefill_buckets) < 1,
                f"prefill_buckets must be positive lengths, got {self.prefill_buckets}",
            ),
            (
                any(not s or not isinstance(s, tuple) for s in self.stop_sequences),
                "stop_sequences must be non-empty tuples of token ids",
            ),
            (
                self.dtype not in (None, "float32", "bfloat16"),
                f"dtype must be None, 'float32' or 'bfloat16', got {self.dtype!r}",
            ),
            (
                self.paged and self.cache_len % self.block_size,
                f"paged: cache_len {self.cache_len} must be a multiple of block_size {self.block_size}",
            ),
            (
                self.paged and blocks is not None and blocks - 1 < self.blocks_per_slot,
                f"paged: num_blocks={blocks} cannot hold one full sequence plus the null block",
            ),
        ]
        for bad, message in problems:
            if bad:
                raise ValueError(message)

    @property
    def buckets(self) -> tuple[int, ...]:
        """Prefill lengths: the configured buckets below cache_len, plus cache_len itself (an
        interrupted sequence is re-prefilled with up to cache_len - 1 tokens)."""
        below = {b for b in self.prefill_buckets if b < self.cache_len}
        return tuple(sorted(below | {self.cache_len}))

    @property
    def windows(self) -> tuple[int, ...]:
        """Decode attends over the smallest of these prefixes of the cache that holds every
        active sequence: 64, 128, ... (block multiples when paged), and cache_len."""
        step = self.block_size if self.paged else 1
        widths, w = {self.cache_len}, 64
        while w < self.cache_len:
            widths.add(min(self.cache_len, -(-w // step) * step))
            w *= 2
        return tuple(sorted(widths))

    @property
    def blocks_per_slot(self) -> int:
        return -(-self.cache_len // self.block_size)

    @property
    def pool_blocks(self) -> int:
        return self.num_blocks or self.slots * self.blocks_per_slot + 1

    @property
    def sampling(self) -> Sampling:
        """How this engine draws tokens; the trainer scores them under `sampling.scoring`."""
        return Sampling(self.temperature, self.top_k, self.top_p, self.exact)
