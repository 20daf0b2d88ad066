"""What a run measures and writes down: mismatch, KL and lag diagnostics, and the metrics.jsonl
writer and reader (docs/diagnostics.md)."""
