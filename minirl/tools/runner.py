"""A run, end to end: build the parts from a RunConfig, warm start, evaluate, train, resume.

`Run(cfg, run_dir).train()` starts a run, or continues it if `run_dir` holds a checkpoint of
the same configuration (a different config hash is refused unless `force=True`). What goes into
the run directory and how it is opened, locked, checkpointed and resumed: minirl/tools/run_dir.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tqdm.auto import tqdm

from minirl.config import RunConfig
from minirl.configlib import ConfigError
from minirl.controller import Controller
from minirl.data.mixture import Mixture
from minirl.engine import Engine
from minirl.evaluation import evaluate, heldout_prompts
from minirl.metrics_log import truncate_metrics
from minirl.tools.inputs import load_tokenizer, make_engine, make_task, make_verifier, train_prompts
from minirl.tools.run_dir import (
    RunStopped,
    StepRecorder,
    lock_run_dir,
    open_run_dir,
    read_json,
    record_config,
    restore_run,
    write_json,
)
from minirl.tools.tracking import SAMPLES_FILE, check_available
from minirl.tools.warmstart import warm_start
from minirl.trainer import Trainer
from minirl.weights import InMemoryWeightStore
from minirl.workers import LocalPlacement, WorkerDied, to_plain


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
        # with task.tools the episodes arrive scored by their environments (EpisodeScores)
        self.verifier = make_verifier(cfg) if cfg.task.tools else self.task.verifier
        check_available(cfg)  # a tracker asked for and not installed: before any work

    def engine(self, version: int, params):
        """A rollout engine holding `params` (with task.tools: an EpisodeRunner over one)."""
        engine = make_engine(self.cfg, self.tokenizer, self.task)
        engine.load_weights(version, params)
        return engine

    def evaluate(self, engine) -> dict[str, float]:
        """Held-out pass@k of `engine`'s weights, with a progress bar of completions."""
        prompts = heldout_prompts(self.task, self.cfg.eval.prompts)
        samples = self.cfg.eval.samples
        total = len(prompts) * samples
        with tqdm(total=total, desc="eval", leave=False, disable=not self.progress) as bar:
            return evaluate(
                engine, self.task, self.tokenizer, prompts, samples, self.verifier, bar.update
            )

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
        summary = read_json(self.run_dir, "summary.json") if restored is not None else {}
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
            from minirl.tools.export import export_params

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
        loss, scoring = rl.objective(), cfg.engine.sampling.scoring
        place = self.placement
        make_trainer = lambda: Trainer(model_cfg, base, loss, trainer_cfg, sampling=scoring)  # noqa: E731
        controller = Controller(
            cfg,
            engine=place.engine(lambda: make_engine(cfg, tokenizer), engine),
            trainer=place.trainer(make_trainer),
            verifier=place.verifier(lambda: make_verifier(cfg), self.verifier),
            store=InMemoryWeightStore(keep=max(4, rl.reload_every + 2)),
            mixture=Mixture({self.task.name: train_prompts(self.task)}, seed=rl.seed),
            tokenizer=self.tokenizer,
            max_new_tokens=self.task.max_new_tokens,
            log=self.log if log is None else log,
        )
        return controller


def summary_json(run_dir, summary: dict) -> str:
    """What `minirl train` prints at the end: held-out before / after and the RL time."""
    keep = {
        "before": summary["before"],
        "after": summary["after"],
        "rl_seconds": round(summary["rl_seconds"], 1),
    }
    return json.dumps({"run_dir": str(run_dir), **keep}, indent=2)


def _fmt(d: dict) -> str:
    return "  ".join(f"{k} {v:.3f}" for k, v in d.items())
