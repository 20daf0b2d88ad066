"""A run directory's life cycle, for the step loop of every run (minirl/run/loop.py):

    run_dir/
      config.json      the resolved RunConfig (and its hash; a resume must match it)
      meta.json        seeds, library versions, machine, start time
      metrics.jsonl    one line per RL step (train/, reward/, mismatch/, lag/, time/, count/ ...)
      samples.jsonl    a few rollouts every log.samples_every steps (`minirl samples RUN_DIR`)
      tensorboard/     event files, with log.tensorboard=true; wandb/, wandb.json with log.wandb
      checkpoints/     params + optimizer state + controller snapshot, at reload boundaries
      summary.json     evaluation before / after, wall time, counters
      .lock            held while a run writes here (`lock_run_dir`)

`open_run_dir` (every check first, the checkpoint to resume from), `restore_run` (trainer and
controller back to it, metrics of later steps dropped), `record_config` (written once the
checkpoint fit), `checkpoint_due` / `snapshot` / `save_checkpoint`, and `StepRecorder` (what each step leaves
behind). They reach the trainer only through the controller's worker (`state_dict` /
`load_state_dict` calls), so a remote trainer resumes the same way.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import platform
import sys
import time
from pathlib import Path

import jax
import numpy as np

from minirl.config import RunConfig
from minirl.configlib import ConfigError, config_hash, from_dict, read_json_object, to_dict
from minirl.control.controller import Controller
from minirl.control.workers import from_plain, to_plain
from minirl.measure.metrics_log import METRICS_FILE, MetricsWriter, truncate_metrics
from minirl.run.memory import peak_rss_gb
from minirl.run.starting_point import describe_inputs
from minirl.run.tracking import SAMPLES_FILE, Trackers, sample_rows
from minirl.store.checkpoints import Checkpoint, CheckpointManager
from minirl.store.hashed_files import CorruptCheckpointError, atomic_write
from minirl.store.trees import TreeMismatchError, match_template

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


def load_config(run_dir) -> RunConfig:
    """The RunConfig a run directory was written with; a missing, damaged or hand-edited
    config.json that no longer holds a valid config is a ConfigError naming the file."""
    path = Path(run_dir) / "config.json"
    data = read_json_object(path)
    if data is None:
        raise ConfigError(f"{path} does not exist (not a minirl run directory)")
    if not {"hash", "config"} & data.keys():  # not damaged: some other program's config.json
        hf = "model_type" in data or "architectures" in data
        raise ConfigError(
            f"{run_dir} is not a minirl run directory (its config.json is "
            f"{'a Hugging Face model' if hf else 'not a minirl run'}'s); a run directory is "
            "what `minirl train` writes, e.g. runs/countdown"
        )
    if not isinstance(data.get("config"), dict) or not isinstance(data.get("hash"), str):
        raise ConfigError(
            f"{path} must hold {{'hash': str, 'config': {{...}}}} as minirl wrote "
            "it; it was changed by hand or damaged"
        )
    try:
        return from_dict(RunConfig, data["config"]).check()
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


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
        restored = ckpts.restore(place=_to_host_xla()) if resume and ckpts.all_steps() else None
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
        inputs = read_json(run_dir, "meta.json").get("inputs")
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


def _to_host_xla():
    """Where a resume puts each array of the weights and optimizer state as it is read: an XLA
    buffer in host memory, which a trainer on the CPU keeps as it is, so the checkpoint is never
    in memory twice (docs/trainer.md, "Peak memory"). None (numpy) without a CPU backend."""
    try:
        return functools.partial(jax.device_put, device=jax.devices("cpu")[0])
    except RuntimeError:  # JAX_PLATFORMS without cpu
        return None


def _check_fits(restored: Checkpoint, cfg: RunConfig, ckpts: CheckpointManager) -> None:
    """The checkpoint's parameters have the shapes `cfg.model` builds (a --force resume with a
    changed model would fail only later, in the trainer)."""
    if not restored.params:  # the trainer keeps its own checkpoints (scale/): it checks them
        return
    from minirl.modeling.model import param_shapes

    try:
        match_template(restored.params, param_shapes(cfg.model))
    except TreeMismatchError as e:
        raise ConfigError(f"{ckpts.path(restored.step)} does not fit model.*: {e}") from None


def record_config(cfg: RunConfig, run_dir) -> None:
    """Write run_dir/config.json: the config and its hash (what a resume is checked against),
    and the values derived from it that the run uses (`resolved`: the cosine schedule's length,
    RunConfig.trainer_config)."""
    resolved = {"trainer.total_steps": cfg.trainer_config().total_steps}
    write_json(
        run_dir,
        "config.json",
        {
            "hash": config_hash(cfg, ignore=RESUMABLE_CHANGES),
            "config": to_dict(cfg),
            "resolved": resolved,
        },
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
        message = (
            f"the run stopped: {error.strerror or error}{where}; "
            f"{kept}. Fix the cause, then: minirl train --resume {run_dir}"
        )
        # an OSError raised with a message alone (TimeoutError("...")) has no errno to show
        super().__init__(*([message] if error.errno is None else [error.errno, message]))


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


def restore_run(restored: Checkpoint, controller: Controller, run_dir, log=print) -> None:
    """Put the trainer (through the controller's worker) and the controller back to
    `restored`, and drop metrics.jsonl lines of the steps about to be redone; a damaged line
    before them is moved to a side file, and `log` says so."""
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
    for name in (METRICS_FILE, SAMPLES_FILE):
        side = truncate_metrics(run_dir, controller.counters.steps, name)
        if side is not None:
            log(
                f"{Path(run_dir) / name} held damaged lines (torn writes): the file was "
                f"rewritten without them, their bytes are in {side}"
            )


def checkpoint_due(cfg: RunConfig, counters, async_scheduler: bool = False) -> bool:
    """Lockstep runs snapshot at reload boundaries (the engine then holds the trainer's version,
    so one set of weights is the whole state), every rl.checkpoint_every steps and at the last;
    async ones between any two steps."""
    at_boundary = async_scheduler or counters.engine_version == counters.version
    return at_boundary and (
        counters.steps % cfg.rl.checkpoint_every == 0 or counters.steps == cfg.rl.steps
    )


def snapshot(controller: Controller, rollouts=None) -> dict:
    """The controller's snapshot, taken under its lock; with the async scheduler's rollout
    thread, the prompts it has in flight (read under the same lock) go into it."""
    with controller.cond:
        return controller.snapshot(rollouts.pending_prompts() if rollouts is not None else [])


def save_checkpoint(
    ckpts: CheckpointManager,
    controller: Controller,
    snap: dict,
    trainer_side: bool = False,
    state: dict | None = None,
) -> None:
    """One checkpoint at the step of `snap` (`snapshot`): the trainer's state (`state`, or
    fetched through the controller's worker) and the snapshot. `trainer_side`: the trainer
    writes its own state (a `save_checkpoint` call that returns once it is committed,
    scale/launch.py) and this checkpoint holds the controller's snapshot and a reference to it,
    written after; the trainer then drops the steps no checkpoint here refers to."""
    step = int(snap["counters"]["steps"])
    if trainer_side:
        ref = controller.trainer.call("save_checkpoint", step).result()
        ckpts.save(step, {}, {}, to_plain({"controller": snap, "trainer_checkpoint": ref}))
        controller.trainer.call("keep_checkpoints", ckpts.all_steps()).result()
        return
    if state is None:
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
    """What each step of a run leaves behind (minirl/run/loop.py): its metrics.jsonl line, the trackers' points and samples
    (minirl/run/tracking.py), and a checkpoint when one is due. `rollouts`: the async scheduler's
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
        if (peak := peak_rss_gb()) is not None:  # this process's peak so far (run/memory.py)
            metrics = {**metrics, "memory/peak_rss_gb": peak}
        self.writer.write(metrics, step=c.steps)
        self.trackers.log(metrics, c.steps)
        if self.trackers.samples_due(c.steps):
            rows = sample_rows(self.controller.last_trained, log_cfg.samples_per_step, c.version)
            self.trackers.samples(rows, c.steps)
        if checkpoint_due(self.cfg, c, self.rollouts is not None):
            snap = snapshot(self.controller, self.rollouts)
            save_checkpoint(self.ckpts, self.controller, snap, self.trainer_side)

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


def write_json(run_dir, name: str, data) -> None:
    """`run_dir/name` as indented JSON, atomically (hashed_files.atomic_write)."""
    atomic_write(Path(run_dir) / name, json.dumps(data, indent=2, default=float).encode())


def read_json(run_dir, name: str) -> dict:
    path = Path(run_dir) / name
    return json.loads(path.read_text()) if path.exists() else {}
