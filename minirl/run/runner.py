"""A run, end to end: build the parts from a RunConfig, warm start, evaluate, train, resume.

`Run(cfg, run_dir).train()` starts a run, or continues it if `run_dir` holds a checkpoint of
the same configuration (a different config hash is refused unless `force=True`). The steps,
evaluations and checkpoints are the step loop's (minirl/run/loop.py, which every kind of run
calls); what goes into the run directory and how it is opened, locked, checkpointed and
resumed: minirl/run/run_dir.py. Here: the parts of a run whose trainer starts from weights in
this process (the warm start), wherever `placement` puts them.
"""

from __future__ import annotations

import json
from pathlib import Path

from tqdm.auto import tqdm

from minirl.config import RunConfig
from minirl.configlib import ConfigError
from minirl.control.controller import Controller
from minirl.control.evaluation import evaluate, heldout_prompts
from minirl.control.workers import LocalPlacement
from minirl.data.mixture import Mixture
from minirl.envs.episodes import EpisodeScores
from minirl.inference.engine import Engine
from minirl.modeling import lora
from minirl.run.loop import Parts, run_objective, train
from minirl.run.starting_point import (
    check_user_code,
    load_tokenizer,
    make_engine,
    make_task,
    make_teacher,
    make_verifier,
    teacher_model,
    train_prompts,
)
from minirl.run.tracking import check_available
from minirl.run.warmstart import warm_start
from minirl.store.weights import InMemoryWeightStore
from minirl.training.trainer import Trainer


class Run:
    """The parts of one run, built from its config once each, in order: the tokenizer, the task
    (a dataset file is read and checked here, so a bad file fails before any model work) and
    the verifier (docs/design.md, "How minirl train assembles a run"); no weights are loaded
    and nothing is compiled until `train` / `evaluate`. `placement` decides where engine, trainer
    and verifier live (default: `rl.workers`, minirl.control.workers.LocalPlacement; Ray actors:
    scale/ray_workers.py's RayPlacement); evaluation and the warm start run in this process."""

    def __init__(self, cfg: RunConfig, run_dir, log=print, progress: bool = True, placement=None):
        self.cfg, self.run_dir, self.log, self.progress = cfg, Path(run_dir), log, progress
        check_available(cfg)  # a tracker asked for and not installed: before any work
        self.placement = placement  # None: rl.workers' LocalPlacement, made with the loop
        self.tokenizer = load_tokenizer(cfg)
        if cfg.model.vocab_size < self.tokenizer.vocab_size:
            raise ConfigError(
                f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's "
                f"{self.tokenizer.vocab_size}"
            )
        check_user_code(cfg)  # your environment or agent: loaded and checked before any work
        self.task = make_task(cfg, self.tokenizer)
        self.teacher_cfg = teacher_model(cfg, self.tokenizer)  # distillation: checked, not loaded
        # episodes arrive scored by their environments or agents (as make_verifier)
        self.verifier = EpisodeScores() if cfg.task.episodes else self.task.verifier

    def engine(self, version: int, params):
        """A rollout engine holding `params` (with task.tools or task.env: an EpisodeRunner
        over one; with task.agent: an AgentRunner)."""
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
        """Warm start, evaluate, RL, evaluate (the step loop: minirl/run/loop.py); the run
        directory is locked for the whole time. With rl.export_hf the final weights also go to
        RUN_DIR/hf as a Hugging Face checkpoint."""
        parts = Parts(
            build=self._build,
            start_engine=start_engine,
            evaluate=self._evaluate_weights,
            fresh_store=self._store,
        )
        summary, controller = train(
            self.cfg,
            self.run_dir,
            parts,
            resume=resume,
            force=force,
            log=self.log,
            progress=self.progress,
        )
        if self.cfg.rl.export_hf:
            self._export(controller)
        return summary

    def _build(self, summary: dict) -> Controller:
        """Warm start, the held-out evaluation before RL (once per run, on the engine that then
        rolls out), the loop's parts."""
        base, sft_report = warm_start(self.cfg, self.tokenizer, self.task, self.progress, self.log)
        engine = self.engine(0, base)
        if "before" not in summary:
            summary["warm_start"] = sft_report
            summary["before"] = self.evaluate(engine)
            self.log(f"held-out before RL: {_fmt(summary['before'])}")
        return self.build_loop(base, engine)  # the trainer holds `base` from here on

    def _evaluate_weights(self, version: int, params) -> dict[str, float]:
        return self.evaluate(self.engine(version, params))

    def _export(self, controller: Controller) -> None:
        from minirl.run.export import export_params

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

    def _store(self) -> InMemoryWeightStore:
        return InMemoryWeightStore(keep=max(4, self.cfg.rl.reload_every + 2))

    def build_loop(self, base, engine: Engine, log=None) -> Controller:
        """The RL loop as `train` runs it: a trainer starting from `base`, a weight store, the
        prompt mixture, a distillation teacher (with rl.teacher) and a controller driving the
        engine (`engine` itself when the placement keeps it in this process), all placed by
        `self.placement`. Weights are not yet in the store (the caller publishes the start:
        `controller.params()`)."""
        cfg, rl = self.cfg, self.cfg.rl
        model_cfg, tokenizer = cfg.model, self.tokenizer
        loss = run_objective(rl)
        trainer_cfg, scoring = cfg.trainer_config(), cfg.engine.sampling.scoring
        place = self.placement if self.placement is not None else LocalPlacement(rl.workers)
        make_trainer = lambda: Trainer(model_cfg, base, loss, trainer_cfg, sampling=scoring)  # noqa: E731
        if self.progress:  # an engine in this process shows the rollouts of a long step
            engine = RolloutBar(engine)
        controller = Controller(
            cfg,
            engine=place.engine(lambda: make_engine(cfg, tokenizer), engine),
            trainer=place.trainer(make_trainer),
            verifier=place.verifier(lambda: make_verifier(cfg), self.verifier),
            store=self._store(),
            mixture=Mixture({self.task.name: train_prompts(self.task)}, seed=rl.seed),
            tokenizer=self.tokenizer,
            max_new_tokens=self.task.max_new_tokens,
            log=self.log if log is None else log,
            teacher=self._teacher(place),
        )
        return controller

    def _teacher(self, place):
        """The distillation teacher's worker, placed by `place` (None without rl.teacher)."""
        if self.teacher_cfg is None:
            return None
        cfg, teacher_cfg = self.cfg, self.teacher_cfg
        return place.teacher(lambda: make_teacher(cfg, teacher_cfg))


class RolloutBar:
    """An engine whose `generate` draws a bar of the rollouts it finishes, from 5 seconds on: a
    step's rl.prompts_per_step x rl.group_size rollouts are one engine call, which the RL bar
    counts only when the step ends, so a large step would show nothing for as long as it
    runs. Every other attribute is the engine's."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def generate(self, requests):
        requests = list(requests)
        with tqdm(total=len(requests), desc="rollouts", delay=5, leave=False) as bar:
            return self.engine.generate(requests, progress=bar.update)


def start_engine(controller: Controller) -> None:
    """The engine starts from the trainer's weights (a resumed run: the snapshot's version, a
    reload boundary, so nothing older is needed). As `Controller._publish`: the trainer's own
    arrays (no host copy beside the store's), and a LoRA run stores the adapters alone."""
    params = controller.trainer.call("params").result()
    controller.store.put(controller.counters.version, lora.published(params, controller.cfg.model))
    controller.counters.engine_version = controller.counters.version
    controller.engine.call("load_weights", controller.counters.version, params).result()


def summary_json(run_dir, summary: dict) -> str:
    """What `minirl train` prints at the end: held-out before / after, the RL time, and why
    RL stopped (rl.steps done, rl.time_budget reached, interrupted)."""
    keep = {
        "before": summary["before"],
        "after": summary["after"],
        "rl_seconds": round(summary["rl_seconds"], 1),
        "stopped": summary["stopped"],
    }
    return json.dumps({"run_dir": str(run_dir), **keep}, indent=2)


def _fmt(d: dict) -> str:
    return "  ".join(f"{k} {v:.3f}" for k, v in d.items())
