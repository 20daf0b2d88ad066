"""The trainer: log-prob recomputation, token-budget micro-batches, AdamW, a non-finite guard.

    trainer = Trainer(model_cfg, params, get_preset("grpo"), TrainerConfig())
    metrics = trainer.train_step(batch)        # one RL step on a `minirl.types.Batch`
    store.put(version, trainer.params())       # publish (only if trainer.last_step_ok)

What one `train_step(batch)` does:

 1. Plan micro-batches: whole rows packed first-fit-decreasing under `micro_batch_tokens` padded
    tokens (AReaL Algorithm 1; minirl/microbatch.py). Micro-batch shapes come from a small set
    (bucket lengths x power-of-two row counts), so the jitted functions compile a few times per run.
 2. Recompute log pi_prox under the weights the step starts from (AReaL's "proximal policy";
    RLAX §5.1 "log-prob recomputation"): never trust the engine's numbers for the ratio. The
    forward is the engine's computation — the engine's `Sampling` spec, in scoring form — and runs
    in the same micro-batch shapes as the training forward, so on the first update the training
    forward sees the same numbers (PPO ratio = 1 at the start, not 1 +- rounding noise).
    With a KL term, log pi_ref is computed the same way under a frozen copy of the initial params
    (no KL term: no reference copy and no reference forward; `rl.kl_coef=0` drops grpo's).
    Skipped where it cannot change the loss (`skips_recompute`): when the caller says the batch
    was sampled under the current weights and the step makes one update, that update's training
    forward runs under the weights pi_prox stands for, so log pi_prox = stop_gradient(log
    pi_theta) there (ratio exactly 1) and phase 1 runs on log mu instead (`_SelfProx`).
 3. Phase 1 of the loss on the WHOLE batch (`objective.prepare`): advantages, rejection masks and
    aggregation weights with batch-level normalisers.
 4. For each of `ppo_epochs` x `num_minibatches` updates: phase 2 (`objective.loss`) per
    micro-batch, gradients summed — the sum over a row partition IS the full-batch gradient —
    then one optimizer update: global-norm clipping, AdamW with a warm-up/cosine schedule.
 5. Non-finite guard (PipelineRL limits study): if the loss or any gradient is nan/inf, the update
    is skipped (params and optimizer state bitwise unchanged), counted in
    `metrics["skipped_nonfinite"]`, and `last_step_ok` turns False so the caller does not
    publish those weights as a new version.

`sft_step(batch)` runs the same machinery on the mean token negative log-likelihood over the
mask (the supervised warm-start). `recompute_logprobs(batch)` is step 2 on its own.

RLAX Fig. 5, every step, at no extra forward: the training forward of the FIRST update (the
weights the step starts from) is what the PPO ratio's numerator sees, and its denominator is
either the recompute (log pi_prox: "with recomputation", minirl's way) or the engine's log mu
("without recomputation", what a trainer that trusts the engine would use). `train_step` returns
mean / p95 / max of both |log pi_theta - log pi_old| over the first update's counted tokens:
`dlogp_recompute/*` and `dlogp_no_recompute/*` (docs/diagnostics.md). On-policy the first is pure
numerics (the training graph vs the recompute graph), the second adds the decode-vs-forward gap;
for tokens of older versions the second also holds the real policy change since then.

Placement (the one door to devices): micro-batch arrays enter the jitted functions through
`placement.rows(x)` and row-shaped results leave through `placement.host(x)`
(minirl/placement.py). `HostPlacement` (the default) hands numpy to jit; scale/mesh.py's
`RowPlacement` splits rows over a mesh's data axes: with `scale.mesh.place_params`, data and FSDP.

The parts live in their own files: minirl/trainer_config.py the knobs, minirl/microbatch.py the
micro-batch plan, minirl/forward.py the engine-matched forward with its remat policy and the
per-micro-batch gradient, minirl/optimizer.py the guarded AdamW update. This file holds the
state (params, optimizer state, counters) and the order of operations.

How it stays fast on a CPU: the NNX model is split once (`nnx.split`); the forward, the
per-micro-batch gradient accumulation and the optimizer update are pure functions under
`jax.jit`, shared between trainers with equal settings (so tests and benchmarks reuse compiles).
The gradient accumulator and the optimizer state are donated (the update writes the new
parameters into the gradient buffers, the moments in place: minirl/optimizer.py); the
parameters never are: the engine and the weight store may still hold the arrays `params()`
handed out. The hand-written dense backward and the causal block skipping in
minirl/exact.py are what brought the `small` step to the matmul-peak target (docs/trainer.md).

Simplified on purpose: no mesh of its own (scale/ places parameters and rows); no critic (the
model has no value head; PPO's advantages use V = 0); rows are padded, not packed.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from minirl import microbatch as mbt
from minirl import optimizer
from minirl.diagnostics import first_update_dlogp
from minirl.forward import (
    ForwardSpec,
    accumulate_fn,
    forward_fn,
    training_forward_fn,
)
from minirl.losses import LossInputs, finalize_metrics, validate_inputs
from minirl.losses.inputs import clamped_difference
from minirl.model import ModelConfig, abstract_model
from minirl.optimizer import learning_rate
from minirl.placement import HostPlacement, place_like, shardings_like_params
from minirl.sampling import Sampling
from minirl.trainer_config import TrainerConfig
from minirl.trees import match_template
from minirl.types import Batch

__all__ = ["Trainer", "TrainerConfig", "learning_rate"]


# ---------------------------------------------------------------------------------------------
# Loss phases: the objective's phase 1, jitted; the supervised loss


@functools.lru_cache(maxsize=32)
def _prepare_fn(objective):
    return jax.jit(objective.prepare)


@dataclasses.dataclass(frozen=True)
class _TokenNLL:
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


_NLL = _TokenNLL()


@dataclasses.dataclass(frozen=True)
class _SelfProx:
    """`objective` with log pi_prox taken from the training forward itself (the skipped
    recompute, `Trainer.skips_recompute`): phase 1 runs with log mu in pi_prox's place (nothing
    it keeps depends on pi_prox without rejection) and hands log mu on; phase 2 sets log pi_prox
    = stop_gradient(log pi_theta) and log c = clamp(log pi_prox - log mu), exactly as phase 1
    would have from a recompute that equals the training forward."""

    objective: Any

    @property
    def needs_entropy(self) -> bool:
        return self.objective.needs_entropy

    def prepare(self, inputs: LossInputs):
        prepared = self.objective.prepare(inputs)
        return prepared, prepared.prox_logp  # [B, T] log mu, 0 off the mask

    def loss(self, logp, part, entropy=None):
        prepared, behav = part
        prox = jnp.where(prepared.valid > 0, jax.lax.stop_gradient(logp), 0.0)  # [b, T]
        log_c = clamped_difference(prox, behav, self.objective.log_ratio_clamp)
        prepared = prepared.replace(prox_logp=prox, log_c=log_c)
        return self.objective.loss(logp, prepared, entropy=entropy)


# ---------------------------------------------------------------------------------------------
# The stateful part


class Trainer:
    """Holds the parameters, optimizer state and step counter; everything else is pure functions.

    `params`: the initial parameters — `nnx.to_pure_dict(nnx.split(model)[1])` (numpy or JAX
    leaves) or an `nnx.State`. They are also the reference policy for KL terms, unless
    `ref_params` is given (on resume: construct with the run's initial params, then
    `load_state_dict`). `objective`: a `minirl.losses.Objective`, or None for a trainer that only
    runs `sft_step`.
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        params: Any,
        objective=None,
        cfg: TrainerConfig | None = None,
        ref_params: Any = None,
        placement: Any = None,
        sampling: Sampling = Sampling(),
    ):
        cfg = cfg or TrainerConfig()
        if not sampling.temperature > 0:
            raise ValueError(
                "the trainer scores under a temperature > 0: pass the engine's "
                "`sampling.scoring` (greedy reports log-probs at temperature 1)"
            )
        self._placement = placement if placement is not None else HostPlacement()
        self.model_cfg, self.objective, self.cfg = model_cfg, objective, cfg
        self._spec = ForwardSpec(model_cfg, sampling, cfg.remat)
        self._opt = optimizer.AdamW(cfg.b1, cfg.b2, cfg.eps, cfg.weight_decay, cfg.max_grad_norm)
        self._params = self._check_params(params)
        self._ref_params = None
        if objective is not None and objective.needs_ref:
            self._ref_params = (
                self._params if ref_params is None else self._check_params(ref_params)
            )
        self._opt_state = None  # created at the first update (no work in the constructor)
        self.step = 0  # train steps (train_step + sft_step calls) done
        self.skipped_nonfinite = 0  # updates skipped by the non-finite guard, whole run
        self.last_step_ok = True  # False if the last step skipped an update: do not publish

    # ---- the interface -----------------------------------------------------------------------

    def params(self, host: bool = False) -> dict:
        """The current parameters as a pure dict (what `Engine.load_weights` and
        `WeightStore.put` accept). JAX arrays, never mutated or donated afterwards; `host=True`
        returns numpy copies."""
        return self._placement.host(self._params) if host else self._params

    def recompute_logprobs(self, batch: Batch) -> np.ndarray:
        """log pi(targets) under the current weights, with the engine's settings.  [B, T] float32,
        0 where batch.mask == 0."""
        self._check_batch(batch)
        return self._logprobs(self._params, batch, self._plan(batch))

    def train_step(
        self, batch: Batch, prox_logp: np.ndarray | None = None, on_policy: bool = False
    ) -> dict[str, float]:
        """One RL step (module docstring). `prox_logp` [B, T]: the caller's own
        `recompute_logprobs(batch)` under the current weights, to avoid recomputing it.
        `on_policy`: the caller's word that every counted token was sampled under the weights
        the trainer holds now; then the recompute is skipped where it cannot change the loss
        (`skips_recompute`)."""
        return self.train_step_with_prox(batch, prox_logp, on_policy)[0]

    def skips_recompute(self, on_policy: bool) -> bool:
        """Whether a step on a batch sampled under the current weights (`on_policy`) skips the
        log pi_prox recompute: one update per step (1 epoch, 1 mini-batch), so the training
        forward of that update runs under the very weights pi_prox means and its log-probs ARE
        log pi_prox (ratio 1 by construction); no rejection (its masks, and the batch
        normalisers after them, are needed before that forward); not exact mode (there the
        recompute is the zero-mismatch check itself)."""
        o, c = self.objective, self.cfg
        return bool(
            on_policy
            and c.ppo_epochs == 1
            and c.num_minibatches == 1
            and not self._spec.exact
            and o.token_reject is None
            and o.sequence_reject is None
        )

    def train_step_with_prox(
        self, batch: Batch, prox_logp: np.ndarray | None = None, on_policy: bool = False
    ) -> tuple[dict[str, float], np.ndarray]:
        """`train_step`, also returning the log pi_prox [B, T] it trained with: the recompute,
        or (skipped) the update's own training-forward log-probs, 0 off the mask."""
        if self.objective is None:
            raise ValueError(
                "this Trainer has no objective: construct it with one to call train_step"
            )
        t0 = time.perf_counter()
        self._check_batch(batch)
        plan = self._plan(batch)
        skip = prox_logp is None and self.skips_recompute(on_policy)
        objective = _SelfProx(self.objective) if skip else self.objective
        if skip:  # phase 1 reads log mu in its place (module docstring, step 2)
            prox_logp = batch.behaviour_logprobs
        elif prox_logp is None:
            prox_logp = self._logprobs(self._params, batch, plan)
        elif np.shape(prox_logp) != batch.mask.shape:
            raise ValueError(
                f"prox_logp must have the batch's shape {batch.mask.shape}, got {np.shape(prox_logp)}"
            )
        ref = (
            self._logprobs(self._ref_params, batch, plan) if self._ref_params is not None else None
        )
        inputs = LossInputs.from_batch(batch, prox_logp, ref_logp=ref)
        validate_inputs(inputs)
        prepared = jax.device_get(_prepare_fn(objective)(inputs))
        t_recompute = time.perf_counter() - t0
        metrics, stats, first = self._updates(objective, batch, plan, prepared)
        if skip:
            prox_logp = self._masked(self._scatter(first[2], plan, batch.mask.shape), batch)
        metrics |= self._fig5(batch, prox_logp, *first)
        metrics = {k: float(v) for k, v in metrics.items()}
        return self._finish(metrics, stats, plan, t0, t_recompute), prox_logp

    def _updates(self, objective, batch: Batch, plan, prepared):
        """The step's `ppo_epochs` x `num_minibatches` updates: (metrics averaged over epochs,
        update statistics, the first update's (plan, rows, training-forward log-probs))."""
        epochs, stats, first = [], [], None
        for epoch in range(self.cfg.ppo_epochs):
            parts = []
            for rows in self._minibatches(batch.num_rows, epoch):
                sub = plan if len(rows) == batch.num_rows else self._plan(batch, rows)
                m, s, logp = self._update(
                    objective, batch, prepared, sub, scale=batch.num_rows / len(rows)
                )
                first = first or (sub, rows, logp)  # the first update: the start weights
                parts += m
                stats.append(s)
            epochs.append({k: float(v) for k, v in finalize_metrics(jax.device_get(parts)).items()})
        metrics = {
            k: (max if k.endswith("_max") else np.mean)([e[k] for e in epochs]) for k in epochs[0]
        }
        return metrics, stats, first

    def sft_step(self, batch: Batch) -> dict[str, float]:
        """One supervised update: mean token negative log-likelihood of `targets` over `mask`."""
        t0 = time.perf_counter()
        self._check_batch(batch)
        plan = self._plan(batch)
        parts, stat, _ = self._update(_NLL, batch, _NLL.prepare(batch.mask), plan, scale=1.0)
        parts = jax.device_get(parts)
        metrics = {
            "loss": float(sum(p["loss"] for p in parts)),
            "tokens": float(sum(p["tokens"] for p in parts)),
        }
        return self._finish(metrics, [stat], plan, t0, 0.0)

    def state_dict(self, host: bool = True) -> dict:
        """Everything to resume training: params, optimizer state, counters (numpy copies; with
        `host=False` the device arrays themselves, laid out as they are: what a sharded
        checkpoint writer such as scale/orbax_checkpoints.py saves shard by shard; the optimizer
        state's arrays are valid until the next step, which donates them to the update)."""
        copy = self._placement.host if host else (lambda tree: tree)
        return {
            "params": copy(self._params),
            "opt_state": copy(self._optimizer_state()),
            "step": self.step,
            "skipped_nonfinite": self.skipped_nonfinite,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict()` (also after a round trip through minirl.serialization).
        Every array keeps the layout of the one it replaces (a sharded trainer stays sharded)."""
        params = match_template(state["params"], abstract_model(self.model_cfg)[1])
        self._params = jax.tree.map(place_like, params, self._params)
        template = self._optimizer_state()  # laid out like the params
        opt_state = match_template(state["opt_state"], template, what="optimizer state entry")
        self._opt_state = jax.tree.map(place_like, opt_state, template)
        self.step = int(state["step"])
        self.skipped_nonfinite = int(state["skipped_nonfinite"])
        self.last_step_ok = True

    # ---- the steps' parts --------------------------------------------------------------------

    def _plan(self, batch: Batch, rows=None) -> list[mbt.MicroBatch]:
        return mbt.pack_rows(
            mbt.row_lengths(batch.mask),
            self.cfg.micro_batch_tokens,
            self.cfg.bucket_minimum,
            max_length=batch.tokens.shape[1],
            rows=rows,
        )

    def _rows(self, x: np.ndarray, mb: mbt.MicroBatch):
        """Micro-batch `mb`'s rows of the [B, ...] host array `x`, placed for the jitted functions."""
        return self._placement.rows(mbt.gather(x, mb))

    def _scatter(self, results: list, plan, shape) -> np.ndarray:
        """Per-micro-batch [R, Tb] device results -> one [B, T] host array (0 elsewhere)."""
        out = np.zeros(shape, np.float32)
        for mb, logp in zip(plan, self._placement.host(results), strict=True):
            mbt.scatter(logp, mb, out)
        return out

    def training_forward_logprobs(self, batch: Batch) -> np.ndarray:
        """log pi(targets) as the training step's forward computes them (under the gradient,
        with remat), in the trainer's micro-batches: [B, T] float32, 0 where the mask is 0."""
        self._check_batch(batch)
        fn = training_forward_fn(self._spec)
        return self._logprobs(self._params, batch, self._plan(batch), lambda *a: fn(*a)[0])

    def _logprobs(self, params, batch: Batch, plan, fn=None) -> np.ndarray:
        fn = fn or forward_fn(self._spec)
        results = [
            fn(params, self._rows(batch.tokens, mb), self._rows(batch.targets, mb)) for mb in plan
        ]
        return self._masked(self._scatter(results, plan, batch.mask.shape), batch)  # [B, T]

    @staticmethod
    def _masked(logp: np.ndarray, batch: Batch) -> np.ndarray:
        return np.where(batch.mask > 0, logp, 0.0).astype(np.float32)

    def _fig5(self, batch: Batch, prox_logp, plan, rows, logps) -> dict[str, float]:
        """The first update's |log pi_theta - log pi_old| with and without recomputation, over
        the counted tokens of the rows it trained on."""
        train_logp = self._scatter(logps, plan, batch.mask.shape)  # [B, T]
        mask = np.zeros_like(batch.mask)
        mask[rows] = batch.mask[rows]
        return first_update_dlogp(train_logp, prox_logp, batch.behaviour_logprobs, mask)

    def _minibatches(self, num_rows: int, epoch: int) -> list[np.ndarray]:
        k = self.cfg.num_minibatches
        if k == 1:
            return [np.arange(num_rows)]
        if num_rows < k:
            raise ValueError(
                f"num_minibatches={k} needs at least {k} rows, the batch has {num_rows}"
            )
        perm = np.random.default_rng([self.cfg.seed, self.step, epoch]).permutation(num_rows)
        return [np.sort(part) for part in np.array_split(perm, k)]

    def _update(self, loss, batch: Batch, prepared, plan, scale: float):
        """Accumulate the gradient over `plan`'s micro-batches, then one guarded optimizer update.
        Returns (per-micro-batch metrics, update statistics, per-micro-batch training-forward
        log-probs on device)."""
        accumulate = accumulate_fn(self._spec, loss)
        apply = optimizer.compiled(self._opt)[1]
        acc, metrics, logps = None, [], []
        for mb in plan:
            part = jax.tree.map(lambda x, mb=mb: self._rows(x, mb), prepared)
            tokens, targets = self._rows(batch.tokens, mb), self._rows(batch.targets, mb)
            acc, m, logp = accumulate(self._params, acc, tokens, targets, part)
            metrics.append(m)
            logps.append(logp)
        lr = learning_rate(self.cfg, self.step)
        self._params, self._opt_state, ok, grad_norm = apply(
            acc, self._optimizer_state(), self._params, jnp.float32(scale), jnp.float32(lr)
        )
        return metrics, {"ok": ok, "grad_norm": grad_norm, "lr": lr}, logps

    def _finish(
        self, metrics: dict, stats: list, plan, t0: float, t_recompute: float
    ) -> dict[str, float]:
        stats = jax.device_get(stats)
        skipped = sum(1 for s in stats if not s["ok"])
        self.skipped_nonfinite += skipped
        self.last_step_ok = skipped == 0
        self.step += 1
        norms = [float(s["grad_norm"]) for s in stats]
        return {
            **metrics,
            "grad_norm": float(np.mean(norms)),
            "learning_rate": float(stats[-1]["lr"]),
            "updates": float(len(stats) - skipped),
            "skipped_nonfinite": float(skipped),
            "micro_batches": float(len(plan)),
            "padded_tokens": float(sum(mb.padded_tokens for mb in plan)),
            "time_recompute_s": t_recompute,
            "time_step_s": time.perf_counter() - t0,
        }

    # ---- checks ------------------------------------------------------------------------------

    def _optimizer_state(self):
        if self._opt_state is None:
            init = optimizer.compiled(self._opt)[0]
            shardings = shardings_like_params(jax.eval_shape(init, self._params), self._params)
            if shardings is not None:  # on a mesh: made in place, laid out as the params
                init = jax.jit(optimizer.transform(self._opt).init, out_shardings=shardings)
            self._opt_state = init(self._params)
        return self._opt_state

    def _check_params(self, params) -> dict:
        if isinstance(params, nnx.State):
            params = nnx.to_pure_dict(params)
        template = abstract_model(self.model_cfg)[1]
        return jax.tree.map(jnp.asarray, match_template(params, template, what="parameter"))

    def _check_batch(self, batch: Batch) -> None:
        b, t = batch.tokens.shape
        for name in ("targets", "mask", "behaviour_logprobs", "versions"):
            if getattr(batch, name).shape != (b, t):
                raise ValueError(
                    f"batch.{name} must be [B, T] = {(b, t)}, got {getattr(batch, name).shape}"
                )
        for name in ("rewards", "group_ids"):
            if getattr(batch, name).shape != (b,):
                raise ValueError(
                    f"batch.{name} must be [B] = ({b},), got {getattr(batch, name).shape}"
                )
        v = self.model_cfg.vocab_size
        for name in ("tokens", "targets"):
            x = getattr(batch, name)
            if x.size and (x.min() < 0 or x.max() >= v):
                raise ValueError(f"batch.{name} holds ids outside the vocabulary [0, {v})")
