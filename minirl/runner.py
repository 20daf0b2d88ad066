"""A run, end to end: build the parts from a RunConfig, warm start, evaluate, train, resume.

    run_dir/
      config.json      the resolved RunConfig (and its hash; a resume must match it)
      meta.json        seeds, library versions, machine, start time
      metrics.jsonl    one line per RL step (train/, reward/, mismatch/, lag/, time/, count/ ...)
      samples.jsonl    a few rollouts every log.samples_every steps (`minirl samples RUN_DIR`)
      tensorboard/     event files, with log.tensorboard=true; wandb/, wandb.json with log.wandb
      checkpoints/     params + optimizer state + controller snapshot, at reload boundaries
      summary.json     evaluation before / after, wall time, counters
      plots/           dashboard.png and friends (`minirl plot RUN_DIR`)

`train(cfg, run_dir)` starts a run, or continues it if `run_dir` holds a checkpoint of the same
configuration (a different config hash is refused unless `force=True`).

The run directory's life cycle is also four functions, shared with scale/launch.py (whose
trainer lives in another job): `open_run_dir` (config check, the checkpoint to resume from),
`restore_run` (trainer and controller back to it, metrics of later steps dropped),
`checkpoint_due` and `save_checkpoint`. They reach the trainer only through the controller's
worker (`state_dict` / `load_state_dict` calls), so a remote trainer resumes the same way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from minirl.checkpoints import Checkpoint, CheckpointManager
from minirl.config import RunConfig, load_config
from minirl.configlib import ConfigError, config_hash, read_json_object, to_dict
from minirl.controller import Controller
from minirl.data.mixture import Mixture
from minirl.engine import Engine
from minirl.evaluation import evaluate, heldout_prompts
from minirl.hashed_files import CorruptCheckpointError, atomic_write
from minirl.inputs import (
    describe_inputs,
    load_tokenizer,
    make_engine,
    make_task,
    make_verifier,
    train_prompts,
)
from minirl.losses import get_preset
from minirl.metrics_log import MetricsWriter, truncate_metrics
from minirl.tracking import SAMPLES_FILE, Trackers, check_available, sample_rows
from minirl.trainer import Trainer
from minirl.trees import TreeMismatchError, match_template
from minirl.warmstart import warm_start
from minirl.weights import InMemoryWeightStore
from minirl.workers import LocalPlacement, WorkerDied, from_plain, to_plain

# Keys a resumed run may change: how long to run and how often to evaluate, not what a step does.
RESUMABLE_CHANGES = ("rl.steps", "rl.time_budget", "eval.every", "rl.export_hf", "log")


def _versions() -> dict[str, str]:
    import flax
    import jax
    import optax

    return {
        "python": sys.version.split()[0],
        "jax": jax.__version__,
        "flax": flax.__version__,
        "optax": optax.__version__,
        "numpy": np.__version__,
        "machine": platform.platform(),
    }


class Run:
    """The parts of one run, built from its config: the tokenizer and the task (a dataset file is
    read and checked here, so a bad file fails before any model work); no weights are loaded
    and nothing is compiled until `train` / `evaluate`. `placement` decides where engine, trainer
    and verifier live (default: `rl.workers`, minirl.workers.LocalPlacement; Ray actors:
    scale/ray_workers.py's RayPlacement); evaluation and the warm start run in this process."""

    def __init__(self, cfg: RunConfig, run_dir, log=print, progress: bool = True, placement=None):
        self.cfg, self.run_dir, self.log, self.progress = cfg, Path(run_dir), log, progress
        self.placement = placement if placement is not None else LocalPlacement(cfg.rl.workers)
        self.tokenizer = load_tokenizer(cfg)
        if cfg.model.vocab_size < self.tokenizer.vocab_size:
            raise ConfigError(
                f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's "
                f"{self.tokenizer.vocab_size}"
            )
        self.task = make_task(cfg, self.tokenizer)
        check_available(cfg)  # a tracker asked for and not installed: before any work

    def engine(self, version: int, params) -> Engine:
        engine = make_engine(self.cfg, self.tokenizer)
        engine.load_weights(version, params)
        return engine

    def evaluate(self, engine) -> dict[str, float]:
        prompts = heldout_prompts(self.task, self.cfg.eval.prompts)
        return evaluate(engine, self.task, self.tokenizer, prompts, self.cfg.eval.samples)

    def train(self, resume: bool = True, force: bool = False) -> dict:
        """Warm start, evaluate, RL, evaluate; the run directory is locked for the whole time.
        An OSError on the way (a full disk, a read-only directory) says what was kept."""
        with lock_run_dir(self.run_dir):
            try:
                return self._train(resume, force)
            except OSError as e:
                raise RunStopped(self.run_dir, e) from e

    def _train(self, resume: bool, force: bool) -> dict:
        ckpts, restored = open_run_dir(self.cfg, self.run_dir, resume, force)
        controller, summary = self._start(restored)
        fresh = controller.snapshot()  # where a trainer that dies before any checkpoint rewinds to
        if restored is not None:
            restore_run(restored, controller, self.run_dir)
            record_config(self.cfg, self.run_dir)  # only now: the checkpoint fit
            self.log(
                f"resumed {self.run_dir} at step {controller.counters.steps} "
                f"(version {controller.counters.version})"
            )
        self._start_engine(controller)
        t0 = time.perf_counter()
        self._loop(controller, ckpts, fresh, summary, resumed=restored is not None)
        summary["rl_seconds"] = summary.get("rl_seconds", 0.0) + time.perf_counter() - t0
        return self._finish(controller, summary)

    def _start(self, restored) -> tuple[Controller, dict]:
        """Warm start, the held-out evaluation before RL (once per run), the loop's parts."""
        base, sft_report = warm_start(self.cfg, self.tokenizer, self.task, self.progress, self.log)
        summary = _read_json(self.run_dir, "summary.json") if restored is not None else {}
        engine = self.engine(0, base)
        if "before" not in summary:
            summary["warm_start"] = sft_report
            summary["before"] = self.evaluate(engine)
            self.log(f"held-out before RL: {_fmt(summary['before'])}")
            write_json(self.run_dir, "summary.json", summary)
        return self.build_loop(base, engine), summary  # the trainer holds `base` from here on

    def _loop(self, controller: Controller, ckpts, fresh: dict, summary: dict, resumed: bool):
        """Train until rl.steps or rl.time_budget: step (lockstep or async), evaluate every
        eval.every steps, record; a dead trainer (lockstep) rewinds to the last checkpoint."""
        cfg, rl = self.cfg, self.cfg.rl
        rollouts = None
        if rl.scheduler == "async":
            from minirl.async_loop import RolloutThread

            rollouts = RolloutThread(controller)
            if resumed:
                rollouts.resubmit(controller.pending_on_restore)
            rollouts.start()
        record = StepRecorder(cfg, self.run_dir, ckpts, controller, self.log, rollouts)
        if not resumed:
            record.trackers.log({f"eval/{k}": v for k, v in summary["before"].items()}, 0)
        t0 = time.perf_counter()
        bar = tqdm(
            total=rl.steps, initial=controller.counters.steps, desc="RL", disable=not self.progress
        )
        while controller.counters.steps < rl.steps:
            try:
                m = controller.step() if rollouts is None else controller.step_async(rollouts)
            except WorkerDied as e:  # engine and verifier deaths are handled in the controller
                if rollouts is not None or controller.trainer.alive():
                    raise
                self._rewind(controller, ckpts, fresh, e)
                record.reopen()  # metrics.jsonl was rewritten; trackers drop the redone steps
                bar.n = controller.counters.steps
                continue
            c = controller.counters
            if cfg.eval.every and c.steps % cfg.eval.every == 0:
                # the trainer's weights on an engine of its own: the rollout engine's counters
                # (the next step's engine/ metrics) must not see evaluation work, or a resumed
                # run would differ; compiled functions are shared, so nothing recompiles
                judge = self.engine(c.version, controller.params())
                m.update({f"eval/{k}": v for k, v in self.evaluate(judge).items()})
            record.step(m)
            bar.update(1)
            bar.set_postfix(
                reward=f"{m['reward/mean']:.3f}",
                step_s=f"{m['time/step']:.2f}",
                lag=f"{m['lag/mean']:.1f}",
            )
            if rl.time_budget and time.perf_counter() - t0 > rl.time_budget:
                self.log(f"time budget of {rl.time_budget:.0f}s reached after {c.steps} steps")
                break
        bar.close()
        if rollouts is not None:
            rollouts.stop()
            rollouts.join()
        self._final_evaluation(controller, summary, record)
        record.close()

    def _final_evaluation(self, controller: Controller, summary: dict, record) -> None:
        """Held-out after RL, on a fresh engine (the async one may still hold requests)."""
        c, every = controller.counters, self.cfg.eval.every
        summary["after"] = self.evaluate(self.engine(c.version, controller.params()))
        if not (every and c.steps % every == 0):  # else the loop's evaluation has this step
            record.trackers.log({f"eval/{k}": v for k, v in summary["after"].items()}, c.steps)

    def _finish(self, controller: Controller, summary: dict) -> dict:
        """summary.json; the final weights as a Hugging Face checkpoint with rl.export_hf."""
        summary["counters"] = to_plain(controller.counters.__dict__)
        write_json(self.run_dir, "summary.json", summary)
        self.log(f"held-out after RL:  {_fmt(summary['after'])}")
        if self.cfg.rl.export_hf:
            from minirl.export import export_params

            source = {"run_dir": str(self.run_dir.resolve()), "step": controller.counters.steps}
            out = export_params(
                controller.params(),
                self.cfg,
                self.tokenizer,
                self.run_dir / "hf",
                force=True,
                source=source,
            )
            self.log(f"exported the final weights as a Hugging Face checkpoint: {out}")
        return summary

    def _start_engine(self, controller: Controller) -> None:
        """The engine starts from the trainer's weights (a resumed run: the snapshot's version,
        a reload boundary, so nothing older is needed)."""
        params = controller.params()
        controller.store.put(controller.counters.version, params)
        controller.counters.engine_version = controller.counters.version
        controller.engine.call("load_weights", controller.counters.version, params).result()

    def _rewind(self, controller: Controller, ckpts, fresh: dict, error: Exception) -> None:
        """The trainer's process died (lockstep): its weights and optimizer state are gone.
        Start a fresh trainer, go back to the last checkpoint (or the run's start) and go on;
        the steps after it are redone exactly as they were, so nothing is lost or trained
        twice and the run ends bit for bit where an undisturbed one does."""
        restarts = controller.counters.worker_restarts + 1
        self.log(f"trainer worker died ({error}); restarting it from the last checkpoint")
        controller.trainer.restart()
        controller.store = InMemoryWeightStore(keep=controller.store.keep)
        ckpts.wait()
        restored = ckpts.restore() if ckpts.all_steps() else None
        if restored is not None:
            restore_run(restored, controller, self.run_dir)
        else:
            controller.restore(fresh)
            truncate_metrics(self.run_dir, controller.counters.steps)
            truncate_metrics(self.run_dir, controller.counters.steps, SAMPLES_FILE)
        controller.counters.worker_restarts = restarts
        self._start_engine(controller)

    def build_loop(self, base, engine: Engine, log=None) -> Controller:
        """The RL loop as `train` runs it: a trainer starting from `base`, a weight store, the
        prompt mixture and a controller driving the engine (`engine` itself when the placement
        keeps it in this process), all placed by `self.placement`. Weights are not yet in the
        store (the caller publishes the start: `controller.params()`)."""
        cfg, rl = self.cfg, self.cfg.rl
        model_cfg, trainer_cfg, tokenizer = cfg.model, cfg.trainer, self.tokenizer
        loss, scoring = get_preset(rl.loss), cfg.engine.sampling.scoring
        place = self.placement
        make_trainer = lambda: Trainer(model_cfg, base, loss, trainer_cfg, sampling=scoring)  # noqa: E731
        controller = Controller(
            cfg,
            engine=place.engine(lambda: make_engine(cfg, tokenizer), engine),
            trainer=place.trainer(make_trainer),
            verifier=place.verifier(lambda: make_verifier(cfg), self.task.verifier),
            store=InMemoryWeightStore(keep=max(4, rl.reload_every + 2)),
            mixture=Mixture({self.task.name: train_prompts(self.task)}, seed=rl.seed),
            tokenizer=self.tokenizer,
            max_new_tokens=self.task.max_new_tokens,
            log=self.log if log is None else log,
        )
        return controller


# ---------------------------------------------------------------------------------------------
# The run directory's life cycle (also scale/launch.py's)


def open_run_dir(
    cfg: RunConfig, run_dir, resume: bool = True, force: bool = False
) -> tuple[CheckpointManager, Checkpoint | None]:
    """Check `run_dir` against `cfg`. Returns the checkpoint manager and the checkpoint to
    resume from. Everything is checked before anything is written: a fresh start writes
    config.json and meta.json here (and drops metrics.jsonl lines of an earlier attempt that
    never checkpointed); a resumed run writes config.json only once its checkpoint was restored
    (`record_config`). Leftovers of interrupted saves and prunes are removed here."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    chash = config_hash(cfg, ignore=RESUMABLE_CHANGES)
    ckpts = CheckpointManager(run_dir, keep=cfg.rl.keep_checkpoints)
    if not resume and (run_dir / "metrics.jsonl").exists():
        raise ConfigError(f"{run_dir} already holds a run; resume it or choose another directory")
    try:
        restored = ckpts.restore() if resume and ckpts.all_steps() else None
    except CorruptCheckpointError as e:
        raise ConfigError(
            f"{e}. Nothing of it can be resumed: start afresh in another directory "
            "(the damaged files stay for inspection)"
        ) from None
    if restored is not None:
        load_config(run_dir)  # a damaged or hand-edited config.json is named here
        started = read_json_object(run_dir / "config.json")["hash"]
        if started != chash and not force:
            raise ConfigError(
                f"{run_dir} was started with another configuration (hash "
                f"{started}, now {chash}); use a new run directory, or --force "
                "to continue anyway"
            )
        inputs = _read_json(run_dir, "meta.json").get("inputs")
        if inputs is not None and inputs != describe_inputs(cfg) and not force:
            raise ConfigError(
                f"{run_dir} was started on other data or model files (their sha256 in "
                "meta.json differ from the files now); restore them, or --force"
            )
        _check_fits(restored, cfg, ckpts)
    ckpts.tidy(restored.step if restored is not None else None)
    if restored is None:
        record_config(cfg, run_dir)
        write_json(
            run_dir,
            "meta.json",
            {
                "seed": cfg.rl.seed,
                "started": time.time(),
                "versions": _versions(),
                "inputs": describe_inputs(cfg),
            },
        )
        truncate_metrics(run_dir, 0)
        truncate_metrics(run_dir, 0, SAMPLES_FILE)
    return ckpts, restored


def _check_fits(restored: Checkpoint, cfg: RunConfig, ckpts: CheckpointManager) -> None:
    """The checkpoint's parameters have the shapes `cfg.model` builds (a --force resume with a
    changed model would fail only later, in the trainer)."""
    if not restored.params:  # the trainer keeps its own checkpoints (scale/): it checks them
        return
    from minirl.model import param_shapes

    try:
        match_template(restored.params, param_shapes(cfg.model))
    except TreeMismatchError as e:
        raise ConfigError(f"{ckpts.path(restored.step)} does not fit model.*: {e}") from None


def record_config(cfg: RunConfig, run_dir) -> None:
    """Write run_dir/config.json: the config and its hash (what a resume is checked against)."""
    write_json(
        run_dir,
        "config.json",
        {"hash": config_hash(cfg, ignore=RESUMABLE_CHANGES), "config": to_dict(cfg)},
    )


class RunStopped(OSError):
    """An OSError stopped a run: the message says what was kept and how to go on."""

    def __init__(self, run_dir, error: OSError):
        steps = CheckpointManager(run_dir).all_steps()
        kept = (
            f"its last checkpoint is step {steps[-1]} ({Path(run_dir) / 'checkpoints'})"
            if steps
            else "no checkpoint was written yet"
        )
        where = f" ({error.filename})" if error.filename else ""
        super().__init__(
            error.errno,
            f"the run stopped: {error.strerror or error}{where}; "
            f"{kept}. Fix the cause, then: minirl train --resume {run_dir}",
        )


@contextlib.contextmanager
def lock_run_dir(run_dir):
    """Hold an exclusive lock on `run_dir` (flock on run_dir/.lock, released by the OS even if
    this process is killed): two runs writing one directory would interleave their metrics and
    delete each other's checkpoints. A second writer gets a ConfigError naming the first."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise ConfigError(
                f"{run_dir} is in use by another minirl process ({holder}); "
                "wait for it to end, or use another run directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {platform.node()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def restore_run(restored: Checkpoint, controller: Controller, run_dir) -> None:
    """Put the trainer (through the controller's worker) and the controller back to
    `restored`, and drop metrics.jsonl lines of the steps about to be redone."""
    state = from_plain(restored.controller_state)
    if "trainer_checkpoint" in state:  # the trainer wrote its own (save_checkpoint, trainer_side)
        controller.trainer.call("restore_checkpoint", state["trainer_checkpoint"]["step"]).result()
    else:
        trainer_state = {
            "params": restored.params,
            "opt_state": restored.opt_state,
            **state["trainer"],
        }
        controller.trainer.call("load_state_dict", trainer_state).result()
    controller.restore(state["controller"])
    truncate_metrics(run_dir, controller.counters.steps)
    truncate_metrics(run_dir, controller.counters.steps, SAMPLES_FILE)


def checkpoint_due(cfg: RunConfig, counters, async_scheduler: bool = False) -> bool:
    """Lockstep runs snapshot at reload boundaries (the engine then holds the trainer's version,
    so one set of weights is the whole state), every rl.checkpoint_every steps and at the last;
    async ones between any two steps."""
    at_boundary = async_scheduler or counters.engine_version == counters.version
    return at_boundary and (
        counters.steps % cfg.rl.checkpoint_every == 0 or counters.steps == cfg.rl.steps
    )


def save_checkpoint(
    ckpts: CheckpointManager, controller: Controller, in_flight=None, trainer_side: bool = False
) -> None:
    """One checkpoint: the trainer's state (fetched through the controller's worker) and the
    controller's snapshot; `in_flight()`: the prompts in flight (async), read under the same
    lock as the snapshot. `trainer_side`: the trainer writes its own state (a `save_checkpoint`
    call that returns once it is committed, scale/launch.py) and this checkpoint holds the
    controller's snapshot and a reference to it, written after; the trainer then drops the
    steps no checkpoint here refers to."""
    with controller.cond:
        snap = controller.snapshot(in_flight() if in_flight is not None else [])
    step = controller.counters.steps
    if trainer_side:
        ref = controller.trainer.call("save_checkpoint", step).result()
        ckpts.save(step, {}, {}, to_plain({"controller": snap, "trainer_checkpoint": ref}))
        controller.trainer.call("keep_checkpoints", ckpts.all_steps()).result()
        return
    state = controller.trainer.call("state_dict").result()
    ckpts.save(
        step,
        state["params"],
        state["opt_state"],
        to_plain(
            {
                "controller": snap,
                "trainer": {"step": state["step"], "skipped_nonfinite": state["skipped_nonfinite"]},
            }
        ),
    )


class StepRecorder:
    """What each step of a run leaves behind, for `minirl train` and the multi-host controller
    loop (scale/roles.py) alike: its metrics.jsonl line, the trackers' points and samples
    (minirl/tracking.py), and a checkpoint when one is due. `rollouts`: the async scheduler's
    rollout thread (its in-flight prompts go into each checkpoint); `trainer_side`: the trainer
    writes its own checkpoints (`save_checkpoint`)."""

    def __init__(
        self,
        cfg: RunConfig,
        run_dir,
        ckpts: CheckpointManager,
        controller: Controller,
        log=print,
        rollouts=None,
        trainer_side: bool = False,
    ):
        self.cfg, self.run_dir, self.ckpts, self.controller = cfg, Path(run_dir), ckpts, controller
        self.log, self.rollouts, self.trainer_side = log, rollouts, trainer_side
        self.writer = MetricsWriter(run_dir)
        self.trackers = Trackers.open(cfg, run_dir, controller.counters.steps, log)

    def step(self, metrics: dict) -> None:
        c, log_cfg = self.controller.counters, self.cfg.log
        self.writer.write(metrics, step=c.steps)
        self.trackers.log(metrics, c.steps)
        if self.trackers.samples_due(c.steps):
            rows = sample_rows(self.controller.last_trained, log_cfg.samples_per_step, c.version)
            self.trackers.samples(rows, c.steps)
        if checkpoint_due(self.cfg, c, self.rollouts is not None):
            in_flight = self.rollouts.pending_prompts if self.rollouts is not None else None
            save_checkpoint(self.ckpts, self.controller, in_flight, self.trainer_side)

    def reopen(self) -> None:
        """After a rewind: metrics.jsonl was cut back, the trackers must drop the redone steps."""
        self.writer.close()
        self.trackers.close()
        self.trackers = Trackers.open(
            self.cfg, self.run_dir, self.controller.counters.steps, self.log
        )

    def close(self) -> None:
        self.writer.close()
        self.ckpts.close()
        self.trackers.close()


def summary_json(run_dir, summary: dict) -> str:
    """What `minirl train` prints at the end: held-out before / after and the RL time."""
    keep = {
        "before": summary["before"],
        "after": summary["after"],
        "rl_seconds": round(summary["rl_seconds"], 1),
    }
    return json.dumps({"run_dir": str(run_dir), **keep}, indent=2)


def write_json(run_dir, name: str, data) -> None:
    """`run_dir/name` as indented JSON, atomically (hashed_files.atomic_write)."""
    atomic_write(Path(run_dir) / name, json.dumps(data, indent=2, default=float).encode())


def _read_json(run_dir, name: str) -> dict:
    path = Path(run_dir) / name
    return json.loads(path.read_text()) if path.exists() else {}


def _fmt(d: dict) -> str:
    return "  ".join(f"{k} {v:.3f}" for k, v in d.items())
