"""The roles of a multi-host run and the controller's side of it (`python -m scale.launch ray
--weights ...`, scale/ray_run.py). One process's part of a job, built inside a Ray actor after it
joined its JAX job (scale/ray_workers.py's RayJob):

    trainer_role   minirl's Trainer on an FSDP mesh; publishes its own weights to TensorStore,
                   writes its own Orbax checkpoints (`--checkpoints`)
    engine_role    minirl's Engine on a tensor-parallel mesh; loads weights from TensorStore

and `drive`, the controller's side: the step loop every run uses (minirl/run/loop.py) over
them, with weights passed by reference. How weights travel and how a run resumes:
scale/launch.py's docstring.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

from minirl.control.workers import register_message_type

TOKEN_ENV = "MINIRL_TOKEN"
BASE_VERSION = 0  # the one version of a LoRA run's base store


@register_message_type
@dataclasses.dataclass(frozen=True)
class StoredWeights:
    """A reference to committed weight `version` of a store: what travels between the parts of
    a multi-host run instead of the weights themselves (scale/launch.py)."""

    version: int


# ---------------------------------------------------------------------------------- the roles


class TrainerRole:
    """The trainer job's object: minirl's Trainer, publishing its own weights. `make_trainer()`
    builds a fresh Trainer at the run's starting weights (a fresh run starts from it)."""

    def __init__(self, make_trainer, store, checkpoints=None, base=None):
        self.make_trainer, self.store = make_trainer, store
        self.checkpoints = checkpoints  # scale.orbax_checkpoints.TrainerCheckpoints, or None
        self.base = base  # a LoRA run's store of its frozen base (`base_store`), or None
        self.trainer = make_trainer()
        self.version = -1  # the newest version published
        self._dirty = True  # weights changed since the last publish
        self._base_missing = False  # the base store lacks the base: the next publish writes it

    def publish_from(self, version: int) -> None:
        """Where a run (re)starts: the next `params` call publishes the current weights as
        `version`. Versions >= it that an earlier attempt left in the store are dropped (a
        resumed run replays them); a fresh run (version 0) starts from a fresh Trainer."""
        import jax

        from scale import mesh as mesh_lib

        if version == 0 and self.trainer.step:
            self.trainer = self.make_trainer()
        if jax.process_index() == 0:
            self.store.discard_from(version)
            if version == 0 and self.base is not None:  # a fresh run writes its own base
                self.base.discard_from(BASE_VERSION)
        mesh_lib.barrier(f"minirl-publish-from-{version}")
        self.version, self._dirty = version - 1, True
        # every process looks before any writes (writes start after this barrier, and a version
        # is listed only once all processes have written it), so all agree
        self._base_missing = self.base is not None and BASE_VERSION not in self.base.versions()

    def state_dict(self) -> dict:
        """Params, optimizer state and counters as numpy (for the controller's checkpoint)."""
        return self.trainer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.trainer.load_state_dict(state)
        self._dirty = True

    # Trainer-side checkpoints (--checkpoints): every process writes and reads its own shards;
    # the controller's checkpoint holds only a reference (minirl.run.run_dir.save_checkpoint).

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

    def params(self, host: bool = True, published: bool = False) -> StoredWeights:
        """Publish the current weights (if new) and return a reference to them. A LoRA run's
        versions hold the adapters alone; its frozen base is written once, to the base store."""
        from minirl.modeling import lora
        from scale import mesh as mesh_lib

        if self._dirty:
            self.version += 1
            if self._base_missing:
                frozen = lora.partition(self.trainer.params(), lambda n: not lora.is_adapter(n))
                mesh_lib.publish(self.base, BASE_VERSION, frozen[0])
                self._base_missing = False
            weights = self.trainer.params(published=self.base is not None)
            mesh_lib.publish(self.store, self.version, weights)
            self._dirty = False
        return StoredWeights(self.version)


class EngineRole:
    """The engine job's object: minirl's Engine, loading weights from the store by reference."""

    def __init__(self, engine, store, mesh, rules, base=None):
        self.engine, self.store, self.mesh, self.rules = engine, store, mesh, rules
        self.base = base  # a LoRA run's base store, read at this engine's first load only

    def load_weights(self, version: int, weights: StoredWeights) -> None:
        from minirl.inference.decoding import cast_params, check_params
        from minirl.modeling import lora
        from scale import mesh as mesh_lib

        _, params = mesh_lib.load(self.store, weights.version, self.mesh, self.rules)
        if self.base is not None:  # LoRA: this engine's first load brings the base; the engine
            # keeps it and joins every later adapters-only version to it (lora.EngineBase)
            _, frozen = mesh_lib.load(self.base, BASE_VERSION, self.mesh, self.rules)
            params, self.base = lora.join(params, frozen), None
        if "embed" in params:  # a whole set read for the engine alone, which keeps JAX arrays
            # as given (Engine.load_weights): cast by the engine's own rule, as it casts numpy
            # (the adapters stay float32; an adapters-only version is a few MB, kept as read)
            cfg = self.engine.model_config
            params = cast_params(check_params(params, cfg), cfg)
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
    from minirl.run.config_args import config_from_args
    from minirl.run.starting_point import load_tokenizer, make_task

    cfg = config_from_args(args)
    tokenizer = load_tokenizer(cfg)
    return cfg, tokenizer, make_task(cfg, tokenizer)


def base_store(cfg, args):
    """A LoRA run's store for its frozen base, beside `args.weights` (URL + "-base/"): the base
    is written once and read once per engine process, so each version in `args.weights` holds
    the adapters alone (docs/lora.md). None without LoRA."""
    from scale.tensorstore_weights import TensorStoreWeightStore

    if not cfg.model.lora_rank:
        return None
    return TensorStoreWeightStore(args.weights.rstrip("/") + "-base/", keep=1)


def first_params(cfg, tokenizer, task, mesh):
    """The trainer job's starting weights on its FSDP mesh. A --model directory (no SFT steps) is
    read block by block: every process reads only the slices its own devices hold
    (scale.mesh.load_checkpoint); otherwise the warm start (random init, SFT) is placed."""
    from minirl.run.starting_point import checked_params
    from minirl.run.warmstart import warm_start
    from scale import mesh as mesh_lib

    if cfg.model.path and not cfg.sft.steps:
        loaded, params, read = mesh_lib.load_checkpoint(
            cfg.model.path, mesh, mesh_lib.fsdp(), cfg.model.dtype
        )
        print(
            f"read {read:,} bytes of {cfg.model.path} (the blocks this process holds)", flush=True
        )
        return checked_params(cfg, loaded, params)
    base, _ = warm_start(cfg, tokenizer, task, progress=False)
    return mesh_lib.place_params(base, mesh, mesh_lib.fsdp())


def trainer_role(args) -> TrainerRole:
    """This process's part of the trainer job (JAX already joined its job): minirl's Trainer on
    the FSDP mesh `args.mesh`, the TensorStore store `args.weights`, and with `args.checkpoints`
    its own Orbax checkpoints. Built in each Ray actor of the trainer job by
    `python -m scale.launch ray --weights ...` (scale/ray_run.py)."""
    from minirl.losses import make_objective
    from minirl.training.trainer import Trainer
    from scale import mesh as mesh_lib
    from scale.tensorstore_weights import TensorStoreWeightStore

    cfg, tokenizer, task = role_config(args)
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.parse(args.mesh))
    start = first_params(cfg, tokenizer, task, mesh)  # jax arrays: a Trainer never mutates them

    def make_trainer() -> Trainer:
        return Trainer(
            cfg.model,
            start,
            make_objective(
                cfg.rl.loss, cfg.rl.behaviour_cap, cfg.rl.kl_coef, cfg.rl.router_aux_coef
            ),
            cfg.trainer_config(),
            row_layout=mesh_lib.MeshRows(mesh, mesh_lib.fsdp()),
            sampling=cfg.engine.sampling.scoring,
        )

    store = TensorStoreWeightStore(args.weights, keep=args.keep)
    checkpoints = None
    if args.checkpoints:
        from scale.orbax_checkpoints import TrainerCheckpoints

        checkpoints = TrainerCheckpoints(args.checkpoints)
    return TrainerRole(make_trainer, store, checkpoints, base_store(cfg, args))


def engine_role(args) -> EngineRole:
    """This process's part of the engine job: minirl's Engine on the mesh `args.mesh`, its
    weights split over "tensor" (`tensor_parallel()`) and its slots over "data" (`MeshSlots`:
    a ValueError for an axis that would change nothing or slots that do not split evenly),
    loading weights from the TensorStore store `args.weights`."""
    from scale import mesh as mesh_lib
    from scale import slots as slots_lib
    from scale.tensorstore_weights import TensorStoreWeightStore

    cfg, tokenizer, _ = role_config(args)
    from minirl.run.starting_point import make_engine

    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.parse(args.mesh))
    rules = mesh_lib.tensor_parallel()
    slot_layout = slots_lib.MeshSlots(mesh, rules, cfg.engine.slots)
    engine = make_engine(cfg, tokenizer, slot_layout=slot_layout)
    store = TensorStoreWeightStore(args.weights, keep=args.keep)
    return EngineRole(engine, store, mesh, rules, base_store(cfg, args))


def _evaluate_stored(run, store, base, version: int, weights: StoredWeights) -> dict:
    """The driver's held-out evaluation of a version read from the TensorStore store (a LoRA
    version holds the adapters: joined to the base from `base`, the base store)."""
    from minirl.modeling import lora

    _, params = store.get(weights.version)
    if base is not None:
        params = lora.join(params, base.get(BASE_VERSION)[1])
    return run.evaluate(run.engine(version, params))


def drive(args, run, engine, trainer, verifier) -> dict:
    """The controller's side of a multi-host run: the step loop of every run
    (minirl/run/loop.py: lockstep or async, evaluation, rl.time_budget, checkpoints, resume)
    over the trainer and engine jobs and the verifier, weights by reference through the
    TensorStore store `args.weights`. `run` (a minirl.run.runner.Run) gives the tokenizer,
    the task and the held-out evaluation, which runs in this process on weights read from the
    store."""
    from minirl.control.controller import Controller
    from minirl.data.mixture import Mixture
    from minirl.run.loop import Parts, train
    from minirl.run.run_dir import write_json
    from minirl.run.starting_point import train_prompts
    from scale.tensorstore_weights import TensorStoreWeightStore

    cfg, task = run.cfg, run.task
    store = ReferenceStore(TensorStoreWeightStore(args.weights, keep=args.keep))

    def build(summary: dict) -> Controller:
        return Controller(
            cfg,
            engine=engine,
            trainer=trainer,
            verifier=verifier,
            store=store,
            mixture=Mixture({task.name: train_prompts(task)}, seed=cfg.rl.seed),
            tokenizer=run.tokenizer,
            max_new_tokens=task.max_new_tokens,
            log=run.log,
        )

    def start_engine(controller: Controller) -> None:
        c = controller.counters
        trainer.call("publish_from", c.version).result()
        first = trainer.call("params", True).result()  # the trainer job publishes c.version
        store.put(first.version, first)
        engine.call("load_weights", first.version, first).result()
        c.engine_version = first.version

    evaluate = functools.partial(_evaluate_stored, run, store.store, base_store(cfg, args))

    trainer_side = trainer.call("checkpoint_directory").result() is not None
    parts = Parts(build, start_engine, evaluate, trainer_side=trainer_side)
    summary, controller = train(
        cfg, args.run_dir, parts, force=args.force, log=run.log, progress=False, step_lines=True
    )
    c = controller.counters
    summary.update(
        steps=c.steps,
        version=c.version,
        weights=store.versions(),
        verifier=getattr(getattr(verifier, "obj", None), "stats", {}),  # a RemoteVerifier's
    )
    write_json(args.run_dir, "summary.json", summary)
    run.log(f"done: {json.dumps({k: summary[k] for k in ('steps', 'version', 'weights')})}")
    return summary
