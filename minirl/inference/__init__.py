"""The rollout engine: continuous batching over slots, the scheduler, jitted prefill and decode,
contiguous and paged KV caches (docs/engine.md)."""
