"""Warm start: supervised training on a task's demonstrations, cached by configuration.

A randomly initialised model cannot even write the task's format, so RL would see reward 0
everywhere. The warm start teaches the format from the demonstrations that honestly exist for
the task (docs/tasks.md: for countdown, well-formed expressions that ignore the target) and
stops there, at a base model with partial success, so RL has room to help.

With your own environment or agent (task.env, task.agent) the demonstrations are episodes laid
out by your code: a scripted policy says the task's demonstration turns (arithmetic: one `calc`
call, then the answer: minirl/envs/tool_task.py `demonstration_turns`) to your environment or
agent through the same runner the RL episodes use (minirl/envs/scripted.py), so the supervised
steps teach exactly the prompt, tool-output layout and markers the RL episodes will have.

The result is cached under `$MINIRL_CACHE` (default `~/.cache/minirl`) in `warmstart/<hash>`,
keyed on everything that determines it (task, model, SFT and trainer configs, seed), so a second
`minirl train` skips it. `minirl sft` runs it alone.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from minirl.configlib import config_hash
from minirl.modeling import lora
from minirl.modeling.model_config import ModelConfig
from minirl.run.starting_point import initial_params, make_tools
from minirl.store import serialization
from minirl.store.hashed_files import atomic_write
from minirl.training.batching import make_batch
from minirl.training.trainer import Trainer, TrainerConfig
from minirl.types import Rollout, Score


def cache_dir() -> Path:
    return Path(os.environ.get("MINIRL_CACHE", Path.home() / ".cache" / "minirl"))


def demonstration_rollouts(
    task, tokenizer, start: int, count: int, seed: int, tools: tuple = ()
) -> list[Rollout]:
    """Demonstrations of train prompts start..start+count-1, as rollouts make_batch can pack.
    With `tools` (Tool objects) they are laid out as episodes (minirl/envs/tool_task.py: a
    task's tool demonstration, tool output masked, else its own demonstration as one turn)."""
    if tools:
        from minirl.envs import Turns, demonstration_episode

        turns = Turns(tokenizer)
        return [
            demonstration_episode(task, task.prompt(i, "train"), turns, tools, sample=seed)
            for i in range(start, start + count)
        ]
    out = []
    for i in range(start, start + count):
        prompt = task.prompt(i, "train")
        tokens = tokenizer.encode(task.demonstration(prompt, sample=seed), bos=False, eos=True)
        zeros = np.zeros(len(tokens), np.float32)
        out.append(
            Rollout(prompt, 0, tokens, zeros, zeros.astype(np.int32), "eos", score=Score(0.0))
        )
    return out


class ScriptedDemonstrations:
    """`demonstration_rollouts` of an env or agent run: the task's demonstration turns said by
    a scripted policy to your environment or agent (its runner made once, reused per batch).
    Episodes in which the policy said nothing (your code failed first) are left out."""

    def __init__(self, cfg, tokenizer, task):
        from minirl.envs import Turns
        from minirl.envs.scripted import ScriptedEngine
        from minirl.run.starting_point import episode_runner

        self.task, self.turns = task, Turns(tokenizer)
        e = cfg.engine
        self.engine = ScriptedEngine({}, tokenizer.eos_ids, e.cache_len, e.sampling)
        self.runner = episode_runner(cfg, tokenizer, self.engine, task)

    def __call__(self, start: int, count: int, seed: int) -> list[Rollout]:
        from minirl.envs import demonstration_turns
        from minirl.inference.scheduler import Request

        prompts = [self.task.prompt(i, "train") for i in range(start, start + count)]
        self.engine.script = {
            p.uid: demonstration_turns(self.task, p, self.turns, seed) for p in prompts
        }
        requests = [Request(p, 0, self.task.max_new_tokens) for p in prompts]
        return [e for e in self.runner.generate(requests) if e.mask.any()]

    def close(self) -> None:
        getattr(self.runner, "close", lambda: None)()


@dataclasses.dataclass(frozen=True)
class _Key:  # what determines a warm start (hashed for the cache file name)
    task: object
    model: ModelConfig
    sft: object
    trainer: TrainerConfig
    data: object = None  # the dataset section (task.name=file)
    files: tuple = ()  # (name, size, mtime) of the model directory's and dataset's files


def _input_files(cfg) -> tuple:
    """What the warm start reads from disk, by name, size and time: an edit misses the cache
    (your environment's or agent's file too: it lays the demonstrations out)."""
    paths = (
        sorted(p for p in Path(cfg.model.path).iterdir() if p.is_file()) if cfg.model.path else []
    )
    paths += [Path(p) for p in (cfg.data.train, cfg.data.eval) if p]
    paths += [Path(s.rpartition(":")[0]) for s in (cfg.task.env, cfg.task.agent) if s]  # yours
    return tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths)


def warm_start(cfg, tokenizer, task, progress: bool = True, log=print) -> tuple[dict, dict]:
    """Params after `cfg.sft.steps` supervised steps from a seed-`cfg.sft.seed` random init, and
    a small report. Cached when `cfg.sft.cache`. With LoRA (model.lora_rank > 0) the warm start
    trains the whole base model as without it (the same cache entry), then fresh seed-`rl.seed`
    adapters are added (B = 0: the same model)."""
    base_cfg = dataclasses.replace(cfg, model=lora.base_config(cfg.model))
    params, report = _warm_start(base_cfg, tokenizer, task, progress, log)
    return lora.add_adapters(params, cfg.model, cfg.rl.seed), report


def _sft_steps(cfg, tokenizer, task, trainer, progress) -> list[float]:
    """`cfg.sft.steps` supervised steps on the task's demonstrations (laid out by your own
    environment or agent, when the run has one); their losses."""
    sft, tools = cfg.sft, tuple(make_tools(cfg))  # () without task.tools
    scripted = (
        ScriptedDemonstrations(cfg, tokenizer, task) if cfg.task.env or cfg.task.agent else None
    )
    losses = []
    bar = tqdm(range(sft.steps), desc="warm start (SFT)", disable=not progress, leave=False)
    for step in bar:
        start = step * sft.batch_size
        demos = (
            scripted(start, sft.batch_size, sft.seed)
            if scripted
            else demonstration_rollouts(task, tokenizer, start, sft.batch_size, sft.seed, tools)
        )
        m = trainer.sft_step(make_batch(demos, tokenizer.pad_id))
        losses.append(m["loss"])
        bar.set_postfix(loss=f"{m['loss']:.3f}")
    if scripted:
        scripted.close()
    return losses


def _warm_start(cfg, tokenizer, task, progress, log) -> tuple[dict, dict]:
    """`warm_start` of a model without adapters."""
    sft = cfg.sft
    # Supervised learning of the demonstrations: plain cross-entropy (temperature 1, no
    # truncation, fast reductions) whatever the RL run's sampling settings, so one warm start
    # serves every RL configuration of the same task and model. The RL-only knobs (PPO epochs,
    # mini-batches and their shuffle) do not touch an SFT step, so they are not part of the key.
    trainer_cfg = dataclasses.replace(
        cfg.trainer,
        learning_rate=sft.learning_rate,
        schedule="cosine",
        warmup_steps=min(20, sft.steps // 10),
        total_steps=max(sft.steps, 1),
        ppo_epochs=1,
        num_minibatches=1,
        seed=0,
    )
    key = config_hash(_Key(cfg.task, cfg.model, sft, trainer_cfg, cfg.data, _input_files(cfg)))
    path = cache_dir() / "warmstart" / f"{key}.mrl"
    if sft.cache and path.exists():
        try:
            with open(path, "rb") as f:
                params = serialization.read_tree(f)
            log(f"warm start: loaded from cache {path}")
            return params, {"cached": True, "path": str(path)}
        except (OSError, ValueError) as e:  # a damaged cache is rebuilt, never fatal
            log(f"warm start: cache {path} unreadable ({e}); retraining")

    params = initial_params(cfg, seed=sft.seed)  # the model directory's weights, or a random init
    if sft.steps == 0:
        return params, {"cached": False, "steps": 0}
    trainer = Trainer(cfg.model, params, None, trainer_cfg)
    t0 = time.perf_counter()
    losses = _sft_steps(cfg, tokenizer, task, trainer, progress)
    params = trainer.params(host=True)
    report = {
        "cached": False,
        "steps": sft.steps,
        "seconds": time.perf_counter() - t0,
        "final_loss": float(np.mean(losses[-10:])),
    }
    if sft.cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: serialization.write_tree(f, params))
    log(
        f"warm start: {sft.steps} SFT steps in {report['seconds']:.0f}s, loss {report['final_loss']:.3f}"
    )
    return params, report
