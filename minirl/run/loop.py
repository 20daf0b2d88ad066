"""The step loop of every run. `minirl train` (runner.py), the Ray run and the multi-host
`--weights` run (scale/ray_run.py, scale/roles.py) all call `train`; the simulator and the
experiments call its inner `run_steps`. What differs between them is only how the parts are
built and reached (`Parts`):

    open      check the run directory, find the checkpoint to resume from (run_dir.py)
    build     the controller over its workers: in this process, in Ray actors or in JAX jobs
    restore   trainer and controller back to the checkpoint
    start     the weight store and the engine get the trainer's weights
    before    held-out evaluation before RL (once per run)
    steps     lockstep, or async (a rollout thread beside the trainer), until rl.steps or
              rl.time_budget; held-out evaluation every eval.every steps; metrics, trackers,
              samples and checkpoints (run_dir.StepRecorder)
    end       the last whole step is checkpointed however the loop ends: steps done, the time
              budget, Ctrl-C (the step under way finishes first; a second Ctrl-C stops at once)
              or an error (if the trainer still holds that step's weights)
    after     held-out evaluation of those weights, summary.json

So summary.json's "after" always scores weights that `minirl eval RUN` and `minirl export RUN`
find in the run's newest checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from minirl.config import RunConfig
from minirl.configlib import ConfigError
from minirl.control.controller import Controller
from minirl.control.workers import WorkerDied, to_plain
from minirl.losses import Objective, make_objective
from minirl.losses.advantages import GroupMean, GroupNorm, LeaveOneOut
from minirl.measure.metrics_log import truncate_metrics
from minirl.run.memory import machine_memory_bytes
from minirl.run.run_dir import (
    RunStopped,
    StepRecorder,
    lock_run_dir,
    open_run_dir,
    read_json,
    record_config,
    restore_run,
    save_checkpoint,
    snapshot,
    write_json,
)
from minirl.run.tracking import SAMPLES_FILE


@dataclasses.dataclass(frozen=True)
class Parts:
    """How one kind of run builds and reaches its parts; everything else is the loop's."""

    # the controller over its workers, at the run's start; it may record "before" (and what
    # came before it, e.g. the warm start) in the summary it is given
    build: Callable[[dict], Controller]
    # the weight store and the engine get the trainer's current weights
    start_engine: Callable[[Controller], None]
    # held-out numbers (pass@1, pass@k, ...) of (version, the weights controller.params(False) gave)
    evaluate: Callable[[int, Any], dict]
    # a lockstep trainer whose process died restarts from the last checkpoint with this empty
    # weight store; None: the error ends the run
    fresh_store: Callable[[], Any] | None = None
    trainer_side: bool = False  # the trainer writes its own checkpoints (scale/roles.py)


def train(
    cfg: RunConfig,
    run_dir,
    parts: Parts,
    *,
    resume: bool = True,
    force: bool = False,
    log=print,
    progress: bool = True,
    step_lines: bool = False,
) -> tuple[dict, Controller]:
    """Open (or resume) `run_dir`, locked meanwhile, and run it to its end (module docstring).
    Returns summary.json's contents and the controller. `step_lines`: a line per step in the
    log (for logs read by programs; `progress` draws a bar instead). An OSError on the way (a
    full disk, a read-only directory) says what was kept."""
    check_batch(cfg)  # before the warm start and the first evaluation, not at step 1
    with lock_run_dir(run_dir):
        try:
            return _train(cfg, Path(run_dir), parts, resume, force, log, progress, step_lines)
        except OSError as e:
            raise RunStopped(run_dir, e) from e


def run_objective(rl) -> Objective:
    """The loss the run trains with, from its `rl` settings (minirl/losses/presets.py)."""
    return make_objective(
        rl.loss,
        rl.behaviour_cap,
        rl.kl_coef,
        rl.router_aux_coef,
        rl.distill_coef,
        rl.distill_discount,
    )


# The controller's memory per rollout of a step, which it holds all at once with their batch:
# 36 bytes a position of the row (the batch's five [B, T] arrays and the trainer's log pi_prox, 4
# bytes each, and the rollout's own token, log-prob and version: minirl/types.py), plus 8 KB of
# Python objects (the Rollout, its arrays, text, score and group). Measured: a step's peak memory
# (memory/peak_rss_gb) grew by 9.3 KB a rollout on countdown and 9.7 KB on the fixture preset
# (16,000 more rollouts a step, rows of 32 positions: 8,000 + 32 x 36 = 9.2 KB).
ROLLOUT_BYTES, POSITION_BYTES = 8_000, 36


def check_batch(cfg: RunConfig) -> None:
    """A step's batch (rl.prompts_per_step groups of rl.group_size rollouts) can do what the
    trainer and the loss ask of it, or a ConfigError: more mini-batches than rows fails at the
    first step, and a group of one under a loss whose advantage is relative to its group (R -
    mean_g, minirl/losses/advantages.py) is 0 for every rollout, so RL would learn nothing.
    And it fits in the memory the run may use (the machine's, or its container's limit): the
    controller holds a step's rollouts and its batch at once, the batch padded to its longest
    row (up to engine.cache_len positions); a step that cannot fit had generated every
    rollout, with nothing shown, and then died out of memory."""
    rl, parts = cfg.rl, cfg.trainer.num_minibatches
    rows = rl.prompts_per_step * rl.group_size
    need = rows * (ROLLOUT_BYTES + cfg.engine.cache_len * POSITION_BYTES)
    have = machine_memory_bytes()
    if have is not None and need > have:
        raise ConfigError(
            f"a step of rl.prompts_per_step={rl.prompts_per_step} x rl.group_size="
            f"{rl.group_size} = {rows:,} rollouts of up to engine.cache_len="
            f"{cfg.engine.cache_len} positions needs about {need / 1e9:,.2f} GB of memory for "
            f"its rollouts and batch alone, more than the {have / 1e9:,.2f} GB this machine (or "
            "its container) has; lower rl.group_size or rl.prompts_per_step"
        )
    if parts > rows:
        raise ConfigError(
            f"trainer.num_minibatches={parts} is more than the {rows} rows of a step "
            f"(rl.prompts_per_step={rl.prompts_per_step} x rl.group_size={rl.group_size})"
        )
    advantage = run_objective(rl).advantage
    if rl.group_size == 1 and isinstance(advantage, (GroupNorm, GroupMean, LeaveOneOut)):
        raise ConfigError(
            f"rl.group_size=1 with rl.loss={rl.loss}: its advantage is a reward minus its group's "
            "mean, 0 in a group of one, so RL would learn nothing; use rl.group_size >= 2 "
            "(or rl.loss=ppo, whose advantage is the reward itself)"
        )


def _train(cfg, run_dir: Path, parts: Parts, resume, force, log, progress, step_lines):
    ckpts, restored = open_run_dir(cfg, run_dir, resume, force)
    summary = read_json(run_dir, "summary.json") if restored is not None else {}
    controller = parts.build(summary)
    fresh = controller.snapshot()  # where a trainer that dies before any checkpoint rewinds to
    resumed = restored is not None
    if resumed:
        restore_run(restored, controller, run_dir, log)
        restored = None  # the trainer holds its arrays (weights, m, v) now, or copies of them
        record_config(cfg, run_dir)  # only now: the checkpoint fit
        c = controller.counters
        log(f"resumed {run_dir} at step {c.steps} (version {c.version})")
    parts.start_engine(controller)
    if "before" not in summary:
        # the trainer's own arrays, never a host copy: the fresh engine uses them as they are
        summary["before"] = parts.evaluate(controller.counters.version, controller.params(False))
        log(f"held-out before RL: {_fmt(summary['before'])}")
    write_json(run_dir, "summary.json", summary)
    t0 = time.perf_counter()
    before = None if resumed else summary["before"]  # the trackers' step 0
    loop = _Loop(cfg, run_dir, parts, ckpts, controller, log, before)
    summary["stopped"] = loop.run(fresh, progress, step_lines)
    summary["after"] = loop.finish()
    summary["rl_seconds"] = summary.get("rl_seconds", 0.0) + time.perf_counter() - t0
    summary["counters"] = to_plain(controller.counters.__dict__)  # a rewind replaces them
    write_json(run_dir, "summary.json", summary)
    log(f"held-out after RL:  {_fmt(summary['after'])}")
    return summary, controller


class _Loop:
    """One attempt at a run's steps: the rollout thread (async), the recorder, the checkpoint
    of the last whole step."""

    def __init__(self, cfg, run_dir, parts, ckpts, controller, log, before: dict | None):
        self.cfg, self.run_dir, self.parts, self.ckpts = cfg, run_dir, parts, ckpts
        self.controller, self.log = controller, log
        self.rollouts = None
        if cfg.rl.scheduler == "async":
            from minirl.control.async_loop import RolloutThread

            self.rollouts = RolloutThread(controller)
            if before is None:  # resumed
                self.rollouts.resubmit(controller.pending_on_restore)
        self.record = StepRecorder(
            cfg, run_dir, ckpts, controller, log, self.rollouts, parts.trainer_side
        )
        if before is not None:
            self.record.trackers.log({f"eval/{k}": v for k, v in before.items()}, 0)
        self.last = snapshot(controller, self.rollouts)  # the last whole step's state

    def run(self, fresh: dict, progress: bool, step_lines: bool) -> str:
        """Steps until rl.steps, rl.time_budget or Ctrl-C; returns which ended them. However they
        end, the last whole step is in a checkpoint afterwards."""
        cfg, ctl = self.cfg, self.controller
        bar = tqdm(total=cfg.rl.steps, initial=ctl.counters.steps, desc="RL", disable=not progress)

        def on_step(m: dict) -> None:
            self.last, c = snapshot(ctl, self.rollouts), ctl.counters  # a whole step
            if cfg.eval.every and c.steps % cfg.eval.every == 0:
                # the trainer's weights on an engine of its own: the rollout engine's counters
                # (the next step's engine/ metrics) must not see evaluation work, or a resumed
                # run would differ
                m.update({f"eval/{k}": v for k, v in self._evaluate().items()})
            self.record.step(m)
            bar.update(1)
            bar.set_postfix(
                reward=f"{m['reward/mean']:.3f}",
                step_s=f"{m['time/step']:.2f}",
                lag=f"{m['lag/mean']:.1f}",
            )
            if step_lines:
                self.log(
                    f"step {c.steps} version {c.version} reward {m['reward/mean']:.3f} "
                    f"step_s {m['time/step']:.2f}"
                )

        def rewind(error: Exception) -> None:
            self._rewind(fresh, error)
            bar.n = ctl.counters.steps

        if self.rollouts is not None:
            self.rollouts.start()
        try:
            with _interruptible(self.log) as interrupted:
                why = run_steps(
                    ctl,
                    cfg.rl.steps,
                    on_step,
                    time_budget=cfg.rl.time_budget,
                    rollouts=self.rollouts,
                    rewind=rewind if self.parts.fresh_store is not None else None,
                    stop=interrupted,
                )
        except BaseException:
            self._stop_rollouts()
            self._save_last(after_error=True)
            self.record.close()
            raise
        finally:
            bar.close()
        if why == "time_budget":
            self.log(
                f"time budget of {cfg.rl.time_budget:.0f}s reached after {ctl.counters.steps} steps"
            )
        self._stop_rollouts()
        self._save_last(after_error=False)
        return why

    def finish(self) -> dict:
        """Held-out numbers of the last step's weights (on a fresh engine: the async one may
        still hold requests); the recorder closed."""
        c, every = self.controller.counters, self.cfg.eval.every
        try:
            after = self._evaluate()
            if not (every and c.steps % every == 0):  # else the step's evaluation has it
                self.record.trackers.log({f"eval/{k}": v for k, v in after.items()}, c.steps)
        finally:
            self.record.close()
        return after

    def _evaluate(self) -> dict:
        c = self.controller
        return self.parts.evaluate(c.counters.version, c.params(host=False))

    def _stop_rollouts(self) -> None:
        if self.rollouts is not None and self.rollouts.is_alive():
            self.rollouts.stop()
            self.rollouts.join()

    def _save_last(self, after_error: bool) -> None:
        """A checkpoint of the last whole step unless one exists. After an error the step under
        way may have been torn: the trainer must still hold the last whole step's weights (its
        step count tells), else the newest checkpoint stays the last; nothing here hides the
        error that ended the run."""
        step = self.last["counters"]["steps"]
        self.ckpts.wait()
        if step == 0 or step in self.ckpts.all_steps():
            return
        try:
            state = None
            if after_error:
                state = self.controller.trainer.call("state_dict").result()
                if state["step"] != step:
                    self.log(
                        f"the last whole step ({step}) was not checkpointed: the trainer had moved on"
                    )
                    return
                if self.parts.trainer_side:
                    state = None  # it writes its own, from the weights it holds
            save_checkpoint(self.ckpts, self.controller, self.last, self.parts.trainer_side, state)
            self.log(f"checkpointed the last step ({step})")
        except Exception as e:  # noqa: BLE001 - after an error: report, keep the first error
            if not after_error:
                raise
            self.log(f"could not checkpoint the last step ({step}): {e}")

    def _rewind(self, fresh: dict, error: Exception) -> None:
        """The trainer's process died (lockstep): its weights and optimizer state are gone.
        Start a fresh trainer, go back to the last checkpoint (or the run's start) and go on;
        the steps after it are redone exactly as they were, so nothing is lost or trained
        twice and the run ends bit for bit where an undisturbed one does."""
        ctl, ckpts = self.controller, self.ckpts
        restarts = ctl.counters.worker_restarts + 1
        self.log(f"trainer worker died ({error}); restarting it from the last checkpoint")
        ctl.trainer.restart()
        ctl.store = self.parts.fresh_store()
        ckpts.wait()
        restored = ckpts.restore() if ckpts.all_steps() else None
        if restored is not None:
            restore_run(restored, ctl, self.run_dir, self.log)
            restored = None  # as in _train: not held while the engine starts
        else:
            ctl.restore(fresh)
            truncate_metrics(self.run_dir, ctl.counters.steps)
            truncate_metrics(self.run_dir, ctl.counters.steps, SAMPLES_FILE)
        ctl.counters.worker_restarts = restarts
        self.parts.start_engine(ctl)
        self.last = snapshot(ctl, self.rollouts)
        self.record.reopen()  # metrics.jsonl was rewritten; trackers drop the redone steps


def run_steps(
    controller: Controller,
    steps: int,
    on_step: Callable[[dict], None],
    *,
    time_budget: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
    rollouts=None,
    rewind: Callable[[Exception], None] | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> str:
    """Step `controller` until it has done `steps` steps ("steps"), `time_budget` seconds have
    passed on `clock` ("time_budget"; 0 = no limit) or `stop()` says so ("interrupted");
    `on_step(metrics)` after each step. `rollouts`: the async scheduler's rollout thread, already
    started (each step then takes a batch it buffered); otherwise lockstep. `rewind(error)`: a
    lockstep trainer's process died and `rewind` puts the controller back to go on; without it
    the error ends the loop."""
    t0 = clock()
    while controller.counters.steps < steps:
        try:
            m = controller.step() if rollouts is None else controller.step_async(rollouts)
        except WorkerDied as e:  # engine and verifier deaths are handled in the controller
            if rewind is None or rollouts is not None or controller.trainer.alive():
                raise
            rewind(e)
            continue
        on_step(m)
        if time_budget and clock() - t0 > time_budget:
            return "time_budget"
        if stop():
            return "interrupted"
    return "steps"


@contextlib.contextmanager
def _interruptible(log):
    """The first Ctrl-C asks the loop to stop after the step under way (yields the question:
    has it been asked?); the second raises KeyboardInterrupt at once. Only the main thread
    receives signals: elsewhere Ctrl-C keeps Python's default."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    asked = []

    def handler(signum, frame):
        if asked:
            raise KeyboardInterrupt
        asked.append(True)
        log("interrupted: stopping after this step (Ctrl-C again to stop at once)")

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield lambda: bool(asked)
    finally:
        signal.signal(signal.SIGINT, previous)


def _fmt(d: dict) -> str:
    return "  ".join(f"{k} {v:.3f}" for k, v in d.items())
