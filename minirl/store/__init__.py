"""What survives a step: the versioned weight store, pytree serialization, run checkpoints and
sha256-checked files (docs/weights.md)."""
