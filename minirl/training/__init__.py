"""The trainer: scored rollouts to a padded batch, token-budget micro-batches, the forward that
matches the engine's log-probs, the optimizer and the jitted two-phase train step
(docs/trainer.md). The losses it optimizes are in minirl/losses/."""
