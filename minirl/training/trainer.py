"""The trainer: a `Batch` of scored rollouts in, new weights out (docs/trainer.md).

    trainer = Trainer(model_cfg, params, get_preset("grpo"), TrainerConfig())
    metrics = trainer.train_step(batch)        # one RL step on a `minirl.types.Batch`
    store.put(version, trainer.params())       # publish (only if trainer.last_step_ok)

Input: a right-padded `Batch` (minirl/training/batching.py), optionally with its recomputed log pi_prox.
Output: a dict of floats (the loss's report, `dlogp_recompute/*` and `dlogp_no_recompute/*`
(RLAX Fig. 5 at no extra forward), timings: docs/trainer.md "What a step reports"). A step whose
loss or gradient is not finite leaves params and optimizer state bitwise unchanged and sets
`last_step_ok` False, so the caller never publishes corrupted weights.

One `train_step` (docs/trainer.md, "One train step"): plan micro-batches -> recompute log pi_prox
(skipped where it cannot change the loss: `skips_recompute`) and log pi_ref (only with a KL term)
-> phase 1 of the loss on the whole batch, so any row partition gives the full-batch gradient ->
`ppo_epochs` x `num_minibatches` updates, each phase 2 per micro-batch with the gradients summed
(minirl/training/forward.py) and one guarded AdamW update (minirl/training/optimizer.py).
`sft_step` is the same machinery on the token NLL. MoE routing: docs/moe.md. Rows meet devices
only through `row_layout` (scale/mesh.py's `MeshRows` on a mesh). This file holds the state and
the order of operations; how it stays fast: docs/trainer.md, "Speed".
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from minirl.losses import LossInputs, finalize_metrics, validate_inputs
from minirl.measure.diagnostics import first_update_dlogp
from minirl.modeling import exact as exact_ops
from minirl.modeling import lora
from minirl.modeling.chunked_logprobs import chunk_positions
from minirl.modeling.model import ModelConfig, abstract_model
from minirl.modeling.sampling import Sampling
from minirl.store.trees import match_template
from minirl.training import microbatch as mbt
from minirl.training import optimizer
from minirl.training.forward import (
    ForwardSpec,
    accumulate_fn,
    forward_fn,
    narrow,
    reference_fn,
    routing_fn,
    training_forward_fn,
)
from minirl.training.host_memory import release_freed
from minirl.training.optimizer import learning_rate
from minirl.training.routing import ran_positions, routing_metrics
from minirl.training.row_layout import HostRows, place_like, shardings_like_params
from minirl.training.step_losses import NLL, SelfProx
from minirl.training.trainer_config import TrainerConfig
from minirl.types import Batch

__all__ = ["Trainer", "TrainerConfig", "learning_rate"]


# ---------------------------------------------------------------------------------------------
# Loss phases: the objective's phase 1, jitted (the other losses: minirl/training/step_losses.py)


@functools.lru_cache(maxsize=32)
def _prepare_fn(objective):
    return jax.jit(objective.prepare)


# ---------------------------------------------------------------------------------------------
# The stateful part


class Trainer:
    """Holds the parameters, optimizer state and step counter; everything else is pure functions.

    `params`: the initial parameters — `nnx.to_pure_dict(nnx.split(model)[1])` (numpy or JAX
    leaves) or an `nnx.State`. They are also the reference policy for KL terms, unless
    `ref_params` is given (on resume: construct with the run's initial params, then
    `load_state_dict`). `objective`: a `minirl.losses.Objective`, or None for a trainer that only
    runs `sft_step`. With `model_cfg.lora_rank > 0` only the LoRA adapters are differentiated
    and updated, and the optimizer state covers them alone (minirl/modeling/lora.py `trainable`); the
    base weights stay bitwise as given.
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        params: Any,
        objective=None,
        cfg: TrainerConfig | None = None,
        ref_params: Any = None,
        row_layout: Any = None,
        sampling: Sampling = Sampling(),
    ):
        cfg = cfg or TrainerConfig()
        if not sampling.temperature > 0:
            raise ValueError(
                "the trainer scores under a temperature > 0: pass the engine's "
                "`sampling.scoring` (greedy reports log-probs at temperature 1)"
            )
        self._row_layout = row_layout if row_layout is not None else HostRows()
        self.model_cfg, self.objective, self.cfg = model_cfg, objective, cfg
        if cfg.routing == "replay" and not model_cfg.num_experts:
            raise ValueError("trainer.routing=replay needs a mixture-of-experts model")
        if cfg.pack and (sampling.exact or model_cfg.num_experts):
            raise ValueError("trainer.pack runs dense models in fast mode only (not exact, MoE)")
        if cfg.share_prompts and (cfg.pack or model_cfg.num_experts):
            raise ValueError("trainer.share_prompts runs dense models, without trainer.pack")
        chunk = chunk_positions(model_cfg.vocab_size, cfg.logit_chunk_mb)
        self._spec = ForwardSpec(model_cfg, sampling, cfg.remat, cfg.routing, chunk)
        self._opt = optimizer.AdamW(cfg.b1, cfg.b2, cfg.eps, cfg.weight_decay, cfg.max_grad_norm)
        self._params = self._check_params(params)
        self._ref_params = None
        if objective is not None and objective.needs_ref:  # what updates change: narrowed
            ref = self._params if ref_params is None else self._check_params(ref_params)
            changing, frozen = lora.trainable(ref, model_cfg)  # LoRA's base: shared as is
            self._ref_params = lora.join(jax.tree.map(narrow, changing), frozen)
        self._opt_state = None  # created at the first update (no work in the constructor)
        self.step = 0  # train steps (train_step + sft_step calls) done
        self.skipped_nonfinite = 0  # updates skipped by the non-finite guard, whole run
        self.last_step_ok = True  # False if the last step skipped an update: do not publish

    # ---- the interface -----------------------------------------------------------------------

    def params(self, host: bool = False, published: bool = False) -> dict:
        """The current parameters as a pure dict (what `Engine.load_weights` and
        `WeightStore.put` accept). JAX arrays, never mutated or donated afterwards; `host=True`
        read-only numpy (host_view); `published=True` what a new version holds (with LoRA the
        adapters alone: minirl/modeling/lora.py `published`)."""
        params = lora.published(self._params, self.model_cfg) if published else self._params
        return self._row_layout.host(params) if host else params

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
            and not (self.model_cfg.lora_rank and self.model_cfg.lora_dropout)  # not pi_prox
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
        release_freed()  # what generation and the last update freed, back before the forwards
        if self._spec.routing == "replay" and batch.routes is None:
            raise ValueError("trainer.routing=replay needs the engine's routes (batch.routes)")
        plan = self._plan(batch)
        skip = prox_logp is None and self.skips_recompute(on_policy)
        objective = SelfProx(self.objective) if skip else self.objective
        if skip:  # phase 1 reads log mu in its place (module docstring, step 2)
            prox_logp = batch.behaviour_logprobs
        elif prox_logp is None:
            prox_logp = self._logprobs(self._params, batch, plan)
        elif np.shape(prox_logp) != batch.mask.shape:
            raise ValueError(
                f"prox_logp must have the batch's shape {batch.mask.shape}, got {np.shape(prox_logp)}"
            )
        ref = None
        if self._ref_params is not None:  # bf16 leaves upcast in the forward: exact
            ref = self._logprobs(self._ref_params, batch, plan, reference_fn(self._spec))
        inputs = LossInputs.from_batch(batch, prox_logp, ref_logp=ref)
        validate_inputs(inputs)
        prepared = jax.device_get(_prepare_fn(objective)(inputs))
        t_recompute = time.perf_counter() - t0
        metrics, stats, first = self._updates(objective, batch, plan, prepared)
        if skip:
            prox_logp = self._masked(self._scatter(first[2], plan, batch.mask.shape), batch)
        metrics |= self._fig5(batch, prox_logp, *first[:3]) | self._routing(batch, *first)
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
                m, s, logp, choice = self._update(
                    objective, batch, prepared, sub, batch.num_rows / len(rows), len(stats)
                )
                first = first or (sub, rows, logp, choice)  # the first update: start weights
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
        parts, stat, *_ = self._update(NLL, batch, NLL.prepare(batch.mask), plan, scale=1.0)
        parts = jax.device_get(parts)
        metrics = {
            "loss": float(sum(p["loss"] for p in parts)),
            "tokens": float(sum(p["tokens"] for p in parts)),
        }
        return self._finish(metrics, [stat], plan, t0, 0.0)

    def state_dict(self, host: bool = True) -> dict:
        """Everything to resume training: params, optimizer state, counters (read-only numpy; with
        `host=False` the device arrays themselves, laid out as they are: what a sharded
        checkpoint writer such as scale/orbax_checkpoints.py saves shard by shard; the optimizer
        state's arrays are valid until the next step, which donates them to the update)."""
        copy = self._row_layout.host if host else (lambda tree: tree)
        return {
            "params": copy(self._params),
            "opt_state": copy(self._optimizer_state()),
            "step": self.step,
            "skipped_nonfinite": self.skipped_nonfinite,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a `state_dict()` (also after a round trip through minirl.store.serialization).
        Every array keeps the layout of the one it replaces (a sharded trainer stays sharded)."""
        params = match_template(state["params"], abstract_model(self.model_cfg)[1])
        self._params = jax.tree.map(place_like, params, self._params)
        template = self._optimizer_layout()[0]  # shapes only: no zeros to be replaced
        opt_state = match_template(state["opt_state"], template, what="optimizer state entry")
        self._opt_state = jax.tree.map(place_like, opt_state, template)
        self.step = int(state["step"])
        self.skipped_nonfinite = int(state["skipped_nonfinite"])
        self.last_step_ok = True

    # ---- the steps' parts --------------------------------------------------------------------

    def _plan(self, batch: Batch, rows=None) -> list[mbt.MicroBatch]:
        c = self.cfg
        if c.share_prompts:
            return mbt.share_prompts(
                batch.tokens, batch.mask, c.micro_batch_tokens, c.bucket_minimum, rows
            )
        return (mbt.pack_sequences if c.pack else mbt.pack_rows)(
            mbt.row_lengths(batch.mask),
            c.micro_batch_tokens,
            c.bucket_minimum,
            max_length=batch.tokens.shape[1],
            rows=rows,
        )

    def _rows(self, x: np.ndarray, mb: mbt.MicroBatch):
        """Micro-batch `mb`'s rows of the [B, ...] host array `x`, placed for the jitted functions."""
        return self._row_layout.rows(mbt.gather(x, mb))

    def _replayed(self, batch: Batch, mb: mbt.MicroBatch):
        """The micro-batch's engine routes where the trainer replays them, else None (a batch
        without them, e.g. `sft_step`'s, is routed freely; `train_step` refuses one)."""
        if self._spec.routing != "replay" or batch.routes is None:
            return None
        return self._rows(batch.routes, mb)

    def _scatter(self, results: list, plan, shape, dtype=np.float32) -> np.ndarray:
        """Per-micro-batch [R, Tb, ...] device results -> one [B, T, ...] host array (0
        elsewhere)."""
        out = np.zeros(shape, dtype)
        for mb, logp in zip(plan, self._row_layout.host(results), strict=True):
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
        results = [fn(params, *self._inputs(batch, mb)) for mb in plan]
        return self._masked(self._scatter(results, plan, batch.mask.shape), batch)  # [B, T]

    def _inputs(self, batch: Batch, mb: mbt.MicroBatch) -> tuple:
        """(tokens, targets, routes, packing): [R, Tb] rows, or [P, Tb] packed (`mbt.packed`)."""
        routes = self._replayed(batch, mb)
        if mb.prompts is not None:
            arrays = mbt.shared(mb, batch.tokens, batch.targets, batch.mask)
        elif mb.packing is None:
            return self._rows(batch.tokens, mb), self._rows(batch.targets, mb), routes, None
        else:
            arrays = mbt.packed(mb, mbt.row_lengths(batch.mask), batch.tokens, batch.targets)
        arrays = {k: self._row_layout.rows(v) for k, v in arrays.items()}
        return arrays.pop("tokens"), arrays.pop("targets"), routes, arrays

    def routing(self, batch: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """An MoE model's recompute forward under `trainer.routing`, with what it routed:
        (log-probs [B, T] (0 off the mask), the experts run and the routers' own choice
        [B, T, M, k] int32, 0 past each row's last counted position)."""
        self._check_batch(batch)
        if not self.model_cfg.num_experts:
            raise ValueError("routing() needs a mixture-of-experts model")
        plan, fn = self._plan(batch), routing_fn(self._spec)
        out = [fn(self._params, *self._inputs(batch, mb)[:3]) for mb in plan]
        b, t = batch.mask.shape
        shape = (b, t, len(self.model_cfg.moe_layers), self.model_cfg.experts_per_token)
        logp, ran, choice = (
            self._scatter([o[i] for o in out], plan, s, d)
            for i, s, d in ((0, (b, t), np.float32), (1, shape, np.int32), (2, shape, np.int32))
        )
        return self._masked(logp, batch), ran, choice

    def _routing(self, batch: Batch, plan, rows, logps, choices) -> dict[str, float]:
        """routing/* metrics of the first update's forward (module docstring), over the
        positions it ran that precede a counted target, in the rows it trained on."""
        if batch.routes is None or choices[0] is None:
            return {}
        shape = batch.mask.shape + batch.routes.shape[2:]  # [B, T, M, k]
        choice = self._scatter(choices, plan, shape, np.int32)
        valid = ran_positions(batch.mask, rows)
        return routing_metrics(batch.routes, choice, valid, self.model_cfg.num_experts)

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

    def _update(self, loss, batch: Batch, prepared, plan, scale: float, update: int = 0):
        """Accumulate the gradient over `plan`'s micro-batches, then one guarded optimizer update.
        Returns (per-micro-batch metrics, update statistics, per-micro-batch training-forward
        log-probs on device, per-micro-batch routers' choices (None: dense))."""
        accumulate = accumulate_fn(self._spec, loss)
        apply = optimizer.compiled(self._opt)[1]
        release_freed()  # what the last step freed, back to the OS before the gradient's buffers
        acc, metrics, logps, choices = None, [], [], []
        train, frozen = lora.trainable(self._params, self.model_cfg)  # LoRA: the adapters only
        drop = self.model_cfg.lora_rank and self.model_cfg.lora_dropout  # LoRA dropout: keyed
        share = None  # the load-balancing loss's token weights over this update's rows
        if getattr(loss, "router_aux_coef", 0.0):
            counted = sum(float(batch.mask[mb.rows].sum()) for mb in plan)
            share = batch.mask / max(counted, 1.0)
        for i, mb in enumerate(plan):
            part = jax.tree.map(lambda x, mb=mb: self._rows(x, mb), prepared)
            key = lora.dropout_key(self.cfg.seed, self.step, update, i) if drop else None
            tokens, targets, routes, packing = self._inputs(batch, mb)
            shares = None if share is None else self._rows(share, mb)
            acc, m, logp, choice = accumulate(
                train, acc, tokens, targets, part, frozen, routes, shares, key, packing
            )
            metrics.append(m)
            logps.append(logp)
            choices.append(choice)
        lr = learning_rate(self.cfg, self.step)
        train, self._opt_state, ok, grad_norm = apply(
            acc, self._optimizer_state(), train, jnp.float32(scale), jnp.float32(lr)
        )
        self._params = lora.join(train, frozen)
        return metrics, {"ok": ok, "grad_norm": grad_norm, "lr": lr}, logps, choices

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
        """AdamW's state for what the trainer updates (with LoRA: the adapters alone)."""
        if self._opt_state is None:
            _, train, shardings = self._optimizer_layout()
            init = optimizer.compiled(self._opt)[0]
            if shardings is not None:  # on a mesh: made in place, laid out as the params
                init = jax.jit(optimizer.transform(self._opt).init, out_shardings=shardings)
            self._opt_state = init(train)
        return self._opt_state

    def _optimizer_layout(self):
        """Nothing allocated: (the state's shapes, sharded on a mesh; its params; shardings)."""
        train = lora.trainable(self._params, self.model_cfg)[0]
        shapes = jax.eval_shape(optimizer.compiled(self._opt)[0], train)
        shardings = shardings_like_params(shapes, train)
        if shardings is not None:
            shapes = jax.tree.map(lambda x, s: x.update(sharding=s), shapes, shardings)
        return shapes, train, shardings

    def _check_params(self, params) -> dict:
        if isinstance(params, nnx.State):
            params = nnx.to_pure_dict(params)
        template = abstract_model(self.model_cfg)[1]
        params = jax.tree.map(jnp.asarray, match_template(params, template, what="parameter"))
        if self._spec.exact:  # on a device mesh: only splits the fixed tree can be cut at
            exact_ops.check_layout(params, "exact mode (trainer weights)")
        return params

    def _check_batch(self, batch: Batch) -> None:
        b, t = batch.tokens.shape
        for name in ("targets", "mask", "behaviour_logprobs", "versions", "teacher_logprobs"):
            x = getattr(batch, name)  # teacher_logprobs: None without a teacher
            if x is not None and x.shape != (b, t):
                raise ValueError(f"batch.{name} must be [B, T] = {(b, t)}, got {x.shape}")
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
