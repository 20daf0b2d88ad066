"""How the trainer optimises: AdamW and its schedule, micro-batch sizes, PPO updates, remat.

`TrainerConfig` is everything about a train step that is not the loss (that is the `rl.loss`
preset, minirl/losses/) or how tokens are scored (that is the engine's `Sampling` spec, shared
with the trainer): the optimiser, the token budget of a micro-batch, how many optimizer updates
one batch gets (`ppo_epochs` x `num_minibatches`), remat, the LM head's chunks (`logit_chunk_mb`).
minirl/training/trainer.py uses it; docs/trainer.md explains each knob's cost.
"""

from __future__ import annotations

import dataclasses
import math

from minirl.training import optimizer
from minirl.training.forward import REMAT_POLICIES, ROUTINGS


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """Optimisation and numerics of the trainer. Defaults run the `tiny` model on a laptop CPU."""

    # optimiser: AdamW with global-norm clipping
    learning_rate: float = 1e-4  # peak learning rate
    schedule: str = "constant"  # "constant" or "cosine" (after warm-up, down to min_lr_ratio)
    warmup_steps: int = 0  # train steps of linear warm-up
    total_steps: int = (
        0  # cosine: train steps from start to the end of the decay (0 = the run's rl.steps)
    )
    min_lr_ratio: float = 0.1  # cosine: final learning rate / peak
    b1: float = 0.9  # Adam's decay of the gradient mean
    b2: float = 0.95  # Adam's decay of the squared-gradient mean
    eps: float = 1e-8  # Adam's epsilon (added to the root of the squared-gradient mean)
    weight_decay: float = 0.0  # decoupled (AdamW); applied to matrices only, never to norms
    max_grad_norm: float = 1.0  # global-norm clipping threshold; 0 = no clipping
    # batching
    micro_batch_tokens: int = 4096  # padded tokens (rows x length) per forward/backward pass
    bucket_minimum: int = 32  # micro-batch lengths are bucket lengths (minirl.training.batching)
    ppo_epochs: int = 1  # passes over the batch per train step
    num_minibatches: int = 1  # optimizer updates per pass (rows shuffled, split evenly)
    seed: int = 0  # keys the mini-batch shuffle: fold(seed, step, epoch)
    pack: bool = False  # run each micro-batch on packed rows (several sequences per row)
    share_prompts: bool = False  # rows with one prompt (a GRPO group) run it once per micro-batch
    remat: str = "none"  # "none" | "dots" | "nothing": jax.checkpoint policy per block
    routing: str = "free"  # MoE models: free (the trainer's routers choose) | replay (run the experts the engine recorded, R3)
    logit_chunk_mb: float = 64.0  # MiB the LM head computes at once (docs/trainer.md: slices of ids, or positions per chunk = this / (4 V)); 0 = a whole micro-batch at once

    def __post_init__(self):
        s = self
        rules = [  # (holds, what must hold)
            (s.learning_rate > 0 and math.isfinite(s.learning_rate), "learning_rate > 0, finite"),
            (s.schedule in optimizer.SCHEDULES, f"schedule in {optimizer.SCHEDULES}"),
            (s.warmup_steps >= 0 and s.total_steps >= 0, "warmup_steps >= 0, total_steps >= 0"),
            (s.seed >= 0, "seed >= 0"),
            (
                s.schedule != "cosine" or s.total_steps == 0 or s.total_steps > s.warmup_steps,
                "total_steps > warmup_steps",
            ),
            (0.0 <= s.min_lr_ratio <= 1.0, "0 <= min_lr_ratio <= 1"),
            (0.0 <= s.b1 < 1.0 and 0.0 <= s.b2 < 1.0, "0 <= b1, b2 < 1"),
            (s.eps > 0 and s.weight_decay >= 0, "eps > 0 and weight_decay >= 0"),
            (s.max_grad_norm >= 0, "max_grad_norm >= 0 (0 = no clipping)"),
            (
                s.micro_batch_tokens >= 1 and s.bucket_minimum >= 1,
                "micro_batch_tokens, bucket_minimum >= 1",
            ),
            (s.ppo_epochs >= 1 and s.num_minibatches >= 1, "ppo_epochs, num_minibatches >= 1"),
            (s.remat in REMAT_POLICIES, f"remat in {tuple(REMAT_POLICIES)}"),
            (s.routing in ROUTINGS, f"routing in {ROUTINGS}"),
            (s.logit_chunk_mb >= 0 and math.isfinite(s.logit_chunk_mb), "logit_chunk_mb >= 0"),
        ]
        for holds, rule in rules:
            if not holds:
                raise ValueError(f"TrainerConfig: {rule} must hold; got {self}")
