"""The roles of a multi-host run and the controller's loop over them (`python -m scale.launch ray
--weights ...`, scale/ray_run.py). One process's part of a job, built inside a Ray actor after it
joined its JAX job (scale/ray_workers.py's RayJob):

    trainer_role   minirl's Trainer on an FSDP mesh; publishes its own weights to TensorStore,
                   writes its own Orbax checkpoints (`--checkpoints`)
    engine_role    minirl's Engine on a tensor-parallel mesh; loads weights from TensorStore

and `drive`, the controller's loop over them: minirl's Controller, the only active part. How
weights travel (by reference) and how a run resumes: scale/launch.py's docstring.
"""

from __future__ import annotations

import json
import os
import time

from scale.tensorstore_weights import StoredWeights

TOKEN_ENV = "MINIRL_TOKEN"


# ---------------------------------------------------------------------------------- the roles


class TrainerRole:
    """The trainer job's object: minirl's Trainer, publishing its own weights. `make_trainer()`
    builds a fresh Trainer at the run's starting weights (a fresh run starts from it)."""

    def __init__(self, make_trainer, store, checkpoints=None):
        self.make_trainer, self.store = make_trainer, store
        self.checkpoints = checkpoints  # scale.orbax_checkpoints.TrainerCheckpoints, or None
        self.trainer = make_trainer()
        self.version = -1  # the newest version published
        self._dirty = True  # weights changed since the last publish

    def publish_from(self, version: int) -> None:
        """Where a run (re)starts: the next `params` call publishes the current weights as
        `version`. Versions >= it that an earlier attempt left in the store are dropped (a
        resumed run replays them); a fresh run (version 0) starts from a fresh Trainer."""
        import jax

        from scale import mesh as M

        if version == 0 and self.trainer.step:
            self.trainer = self.make_trainer()
        if jax.process_index() == 0:
            self.store.discard_from(version)
        M.barrier(f"minirl-publish-from-{version}")
        self.version, self._dirty = version - 1, True

    def state_dict(self) -> dict:
        """Params, optimizer state and counters as numpy (for the controller's checkpoint)."""
        return self.trainer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.trainer.load_state_dict(state)
        self._dirty = True

    # Trainer-side checkpoints (--checkpoints): every process writes and reads its own shards;
    # the controller's checkpoint holds only a reference (minirl.tools.run_dir.save_checkpoint).

    def checkpoint_directory(self) -> str | None:
        return None if self.checkpoints is None else self.checkpoints.directory

    def save_checkpoint(self, step: int) -> dict:
        """Write params and optimizer state as `step`; returns once it is committed."""
        self.checkpoints.save(step, self.trainer)
        return {"directory": self.checkpoints.directory, "step": step}

    def restore_checkpoint(self, step: int) -> None:
        """Back to `step` (a resume): steps after it, written by an attempt the controller never
        checkpointed, are dropped; they are about to be redone."""
        self.checkpoints.discard_after(step)
        self.checkpoints.restore(step, self.trainer)
        self._dirty = True

    def keep_checkpoints(self, steps: list[int]) -> list[int]:
        """Drop the steps the controller no longer references."""
        return self.checkpoints.keep_only(steps)

    def recompute_logprobs(self, batch):
        return self.trainer.recompute_logprobs(batch)

    def train_step(self, batch, prox_logp=None):
        metrics = self.trainer.train_step(batch, prox_logp)
        self._dirty |= self.trainer.last_step_ok
        return metrics

    def train_step_with_prox(self, batch, prox_logp=None, on_policy=False):
        metrics, prox = self.trainer.train_step_with_prox(batch, prox_logp, on_policy)
        self._dirty |= self.trainer.last_step_ok
        return metrics, prox

    def params(self, host: bool = True) -> StoredWeights:
        """Publish the current weights (if new) and return a reference to them."""
        from scale import mesh as M

        if self._dirty:
            self.version += 1
            M.publish(self.store, self.version, self.trainer.params())
            self._dirty = False
        return StoredWeights(self.version)


class EngineRole:
    """The engine job's object: minirl's Engine, loading weights from the store by reference."""

    def __init__(self, engine, store, mesh, rules):
        self.engine, self.store, self.mesh, self.rules = engine, store, mesh, rules

    def load_weights(self, version: int, weights: StoredWeights) -> None:
        from scale import mesh as M

        _, params = M.load(self.store, weights.version, self.mesh, self.rules)
        self.engine.load_weights(version, params)

    def generate(self, requests):
        return self.engine.generate(requests)

    def submit(self, requests):
        return self.engine.submit(requests)

    def step(self):
        return self.engine.step()

    def interrupt(self, policy: str):
        return self.engine.interrupt(policy)

    def work_stats(self) -> dict[str, int]:
        return self.engine.work_stats()


class ReferenceStore:
    """The controller's weight store: references to versions the trainer job published."""

    def __init__(self, store):
        self.store = store

    def put(self, version: int, weights: StoredWeights) -> None:
        if not isinstance(weights, StoredWeights) or weights.version != version:
            raise ValueError(f"expected StoredWeights({version}), got {weights!r}")
        if version not in self.store.versions():
            raise LookupError(f"the trainer did not publish version {version}")

    def get(self, version: int | None = None):
        available = self.store.versions()
        version = available[-1] if version is None else version
        if version not in available:
            raise LookupError(f"weight version {version} is not in the store ({available})")
        return version, StoredWeights(version)

    def versions(self) -> list[int]:
        return self.store.versions()

    def release(self, before_version: int) -> list[int]:
        return self.store.release(before_version)

    def nbytes(self) -> int:
        return self.store.nbytes()


# ----------------------------------------------------------------------------------- commands


def shared_token() -> str:
    token = os.environ.get(TOKEN_ENV, "")
    if len(token) < 8:
        raise SystemExit(f"set ${TOKEN_ENV} to a shared secret of at least 8 characters")
    return token


def role_config(args):
    """(config, tokenizer, task) of a role, from the same flags `minirl train` takes (--preset,
    --set, --model DIR, --data FILE): every role builds the same tokenizer from the model
    directory, so ids and EOS agree across hosts."""
    from minirl.config_args import config_from_args
    from minirl.configlib import override
    from minirl.tools.inputs import load_tokenizer, make_task

    cfg = config_from_args(args)
    if getattr(args, "steps", 0):
        cfg = override(cfg, f"rl.steps={args.steps}")
    tokenizer = load_tokenizer(cfg)
    return cfg, tokenizer, make_task(cfg, tokenizer)


def first_params(cfg, tokenizer, task, mesh):
    """The trainer job's starting weights on its FSDP mesh. A --model directory (no SFT steps) is
    read block by block: every process reads only the slices its own devices hold
    (scale.mesh.load_checkpoint); otherwise the warm start (random init, SFT) is placed."""
    from minirl.tools.inputs import checked_params
    from minirl.tools.warmstart import warm_start
    from scale import mesh as M

    if cfg.model.path and not cfg.sft.steps:
        loaded, params, read = M.load_checkpoint(cfg.model.path, mesh, M.fsdp(), cfg.model.dtype)
        print(
            f"read {read:,} bytes of {cfg.model.path} (the blocks this process holds)", flush=True
        )
        return checked_params(cfg, loaded, params)
    base, _ = warm_start(cfg, tokenizer, task, progress=False)
    return M.place_params(base, mesh, M.fsdp())


def trainer_role(args) -> TrainerRole:
    """This process's part of the trainer job (JAX already joined its job): minirl's Trainer on
    the FSDP mesh `args.mesh`, the TensorStore store `args.weights`, and with `args.checkpoints`
    its own Orbax checkpoints. Built in each Ray actor of the trainer job by
    `python -m scale.launch ray --weights ...` (scale/ray_run.py)."""
    from minirl.trainer import Trainer
    from scale import mesh as M
    from scale.tensorstore_weights import TensorStoreWeightStore

    cfg, tokenizer, task = role_config(args)
    mesh = M.make_mesh(M.MeshConfig.parse(args.mesh))
    start = first_params(cfg, tokenizer, task, mesh)  # jax arrays: a Trainer never mutates them

    def make_trainer() -> Trainer:
        return Trainer(
            cfg.model,
            start,
            cfg.rl.objective(),
            cfg.trainer,
            placement=M.RowPlacement(mesh, M.fsdp()),
            sampling=cfg.engine.sampling.scoring,
        )

    store = TensorStoreWeightStore(args.weights, keep=args.keep)
    checkpoints = None
    if args.checkpoints:
        from scale.orbax_checkpoints import TrainerCheckpoints

        checkpoints = TrainerCheckpoints(args.checkpoints)
    return TrainerRole(make_trainer, store, checkpoints)


def engine_role(args) -> EngineRole:
    """This process's part of the engine job: minirl's Engine on the tensor-parallel mesh
    `args.mesh`, loading weights from the TensorStore store `args.weights`."""
    from scale import mesh as M
    from scale.tensorstore_weights import TensorStoreWeightStore

    cfg, tokenizer, _ = role_config(args)
    from minirl.tools.inputs import make_engine

    mesh = M.make_mesh(M.MeshConfig.parse(args.mesh))
    store = TensorStoreWeightStore(args.weights, keep=args.keep)
    return EngineRole(make_engine(cfg, tokenizer), store, mesh, M.tensor_parallel())


def drive(args, cfg, tokenizer, task, engine, trainer, verifier) -> dict:
    """The controller's loop over engine, trainer and verifier workers (Ray jobs): open or
    resume the run directory (locked meanwhile), publish the start by reference, train,
    checkpoint, summarize."""
    from minirl.tools.run_dir import lock_run_dir

    with lock_run_dir(args.run_dir):
        return _drive(args, cfg, tokenizer, task, engine, trainer, verifier)


def _drive(args, cfg, tokenizer, task, engine, trainer, verifier) -> dict:
    from minirl.controller import Controller
    from minirl.data.mixture import Mixture
    from minirl.tools import run_dir
    from minirl.tools.inputs import train_prompts
    from scale.tensorstore_weights import TensorStoreWeightStore

    ckpts, restored = run_dir.open_run_dir(cfg, args.run_dir, resume=True, force=args.force)
    store = ReferenceStore(TensorStoreWeightStore(args.weights, keep=args.keep))
    controller = Controller(
        cfg,
        engine=engine,
        trainer=trainer,
        verifier=verifier,
        store=store,
        mixture=Mixture({task.name: train_prompts(task)}, seed=cfg.rl.seed),
        tokenizer=tokenizer,
        max_new_tokens=task.max_new_tokens,
    )
    trainer_side = trainer.call("checkpoint_directory").result() is not None
    if restored is not None:
        run_dir.restore_run(
            restored, controller, args.run_dir
        )  # the trainer job loads the checkpoint
        run_dir.record_config(cfg, args.run_dir)
        print(
            f"resumed {args.run_dir} at step {controller.counters.steps} "
            f"(version {controller.counters.version})",
            flush=True,
        )
    c = controller.counters
    trainer.call("publish_from", c.version).result()
    first = trainer.call("params", True).result()  # the trainer job publishes c.version
    store.put(first.version, first)
    engine.call("load_weights", first.version, first).result()
    c.engine_version = first.version
    record = run_dir.StepRecorder(cfg, args.run_dir, ckpts, controller, trainer_side=trainer_side)
    t0 = time.perf_counter()
    while c.steps < cfg.rl.steps:
        m = controller.step()
        record.step(m)  # metrics.jsonl, trackers, samples, a checkpoint when due
        print(
            f"step {c.steps} version {c.version} reward {m['reward/mean']:.3f} "
            f"step_s {m['time/step']:.2f}",
            flush=True,
        )
    record.close()
    scored = getattr(getattr(verifier, "obj", None), "stats", {})  # a RemoteVerifier's counts
    summary = {
        "steps": c.steps,
        "version": c.version,
        "seconds": time.perf_counter() - t0,
        "weights": store.versions(),
        "verifier": scored,
    }
    run_dir.write_json(args.run_dir, "summary.json", summary)
    print(f"done: {json.dumps(summary)}", flush=True)
    return summary
