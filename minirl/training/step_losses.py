"""The two losses a train step runs besides a preset's objective, two-phase like it: `TokenNLL`
(`Trainer.sft_step`'s mean token NLL) and `SelfProx` (log pi_prox from the training forward, for
the step that skips the recompute: `Trainer.skips_recompute`, docs/trainer.md)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from minirl.losses import LossInputs
from minirl.losses.inputs import clamped_difference


@dataclasses.dataclass(frozen=True)
class TokenNLL:
    """The supervised loss as a two-phase loss: phase 1 weights every counted token by
    1 / (counted tokens in the whole batch); phase 2 sums -w log p. Summed over micro-batches it
    is the batch's mean token NLL."""

    needs_entropy = False

    @staticmethod
    def prepare(mask: np.ndarray) -> dict:
        mask = np.asarray(mask, np.float32)
        return {"weight": mask / max(float(mask.sum()), 1.0)}  # [B, T]

    @staticmethod
    def loss(logp, part, entropy=None):
        w = part["weight"]
        nll = -jnp.where(w > 0, logp, 0.0) * w
        return nll.sum(), {"loss": nll.sum(), "tokens": (w > 0).sum().astype(jnp.float32)}


NLL = TokenNLL()


@dataclasses.dataclass(frozen=True)
class SelfProx:
    """`objective` with log pi_prox taken from the training forward itself (the skipped
    recompute, `Trainer.skips_recompute`): phase 1 runs with log mu in pi_prox's place (nothing
    it keeps depends on pi_prox without rejection) and hands log mu on; phase 2 sets log pi_prox
    = stop_gradient(log pi_theta) and log c = clamp(log pi_prox - log mu), exactly as phase 1
    would have from a recompute that equals the training forward."""

    objective: Any

    @property
    def needs_entropy(self) -> bool:
        return self.objective.needs_entropy

    @property
    def router_aux_coef(self) -> float:
        return self.objective.router_aux_coef

    def prepare(self, inputs: LossInputs):
        prepared = self.objective.prepare(inputs)
        return prepared, prepared.prox_logp  # [B, T] log mu, 0 off the mask

    def loss(self, logp, part, entropy=None):
        prepared, behav = part
        prox = jnp.where(prepared.valid > 0, jax.lax.stop_gradient(logp), 0.0)  # [b, T]
        log_c = clamped_difference(prox, behav, self.objective.log_ratio_clamp)
        prepared = prepared.replace(prox_logp=prox, log_c=log_c)
        return self.objective.loss(logp, prepared, entropy=entropy)
