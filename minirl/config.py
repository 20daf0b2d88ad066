"""One place for every knob: `RunConfig` nests each component's own config (presets and
`make_config`: run_presets.py).

    RunConfig
      task      which built-in task (and its difficulty knobs), or "file": the dataset in `data`
      data      a dataset file of your own: fields, prompt format, verifier (task.name=file)
      model     shapes of the decoder (minirl.modeling.model.ModelConfig), or model.path: a Hugging Face
                checkpoint directory whose config.json gives the shapes (`resolve_model`)
      engine    rollout engine: slots, sampling, exact mode (minirl.inference.engine_config.EngineConfig)
      trainer   optimiser and micro-batching (minirl.training.trainer_config.TrainerConfig); the cosine
                schedule's length follows rl.steps unless set (`RunConfig.trainer_config`)
      rl        the controller: loss preset, batch shape, staleness knobs (j, k, eta), schedule
      sft       the supervised warm start that teaches the task's format
      eval      held-out pass@k measurement
      log       TensorBoard, W&B and sample completions (minirl/run/tracking.py)

`minirl train --preset NAME --set rl.steps=50 --set engine.temperature=0.8` builds one; every
key and its meaning is listed by `minirl config`. `minirl train --model DIR --data FILE` starts
from the `custom` preset with model.path, task.name=file and data.train set. How tokens are
drawn and scored (temperature, top-k/p, exact mode) is set once, on the engine: the trainer
scores under the same `minirl.modeling.sampling.Sampling` spec (`cfg.engine.sampling.scoring`). Defaults run on a 2-core laptop CPU.

A leaf: this module imports only the components' small config modules, never the engine, the
trainer or the controller; the loss a run trains with is built where it is used
(minirl.losses.make_objective).
"""

from __future__ import annotations

import dataclasses
import math

from minirl.configlib import ConfigError
from minirl.inference.engine_config import EngineConfig
from minirl.losses.presets import BEHAVIOUR_CAP, get_preset, has_behaviour_cap, with_kl_coef
from minirl.modeling.model_config import ModelConfig
from minirl.modeling.tokenizer import CharTokenizer
from minirl.training.trainer_config import TrainerConfig

SCHEDULERS = ("lockstep", "async")
RELOAD_POLICIES = ("discard", "continue")
BATCH_ORDERS = ("freshest", "oldest")
VOCAB = CharTokenizer().vocab_size  # the built-in tasks' character tokenizer


FILE_TASK = "file"  # task.name of a run on the dataset files named in `data`
DEFAULT_PRESET = "countdown"  # what `minirl train` runs (minirl/run/presets.py)
TOOLS = ("calc", "py")  # task.tools: minirl/envs/calculator.py, minirl/envs/python_tool.py
# what a chat template is given by minirl itself (minirl/hf/chat_template.py), not by data.chat_template_kwargs
TEMPLATE_VARIABLES = ("messages", "add_generation_prompt", "tools", "documents")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    name: str = "countdown"  # a built-in task (minirl/tasks/: list_tasks()), or "file" (see data.*)
    args: dict = dataclasses.field(default_factory=dict)  # the task's difficulty knobs
    tools: tuple[
        str, ...
    ] = ()  # multi-turn episodes with these tools: calc, py (docs/multiturn.md)
    max_turns: int = 4  # with tools, env or agent: assistant turns (model calls) per episode
    env: str = ""  # your environment: path/to/file.py:Class with reset(row) and step(turn) (minirl train --env; docs/multiturn.md)
    agent: str = ""  # your agent: path/to/file.py:solve, an async function of (openai client, row) run against minirl's endpoint (minirl train --agent; docs/multiturn.md)
    timeout: float = 60.0  # with env or agent: seconds one episode may spend in your code (environment calls; the agent between its model calls), summed; past it, reward 0

    def __post_init__(self):
        unknown = [t for t in self.tools if t not in TOOLS]
        if unknown or len(set(self.tools)) != len(self.tools):
            raise ValueError(f"task.tools: each of {TOOLS} at most once, got {list(self.tools)}")
        if self.max_turns < 1:
            raise ValueError(f"task.max_turns must be >= 1, got {self.max_turns}")
        if not 0 < self.timeout < math.inf:
            raise ValueError(f"task.timeout must be a number of seconds > 0, got {self.timeout}")
        if sum(map(bool, (self.tools, self.env, self.agent))) > 1:
            raise ValueError("task.tools, env and agent: an episode has one kind; choose one")

    @property
    def episodes(self) -> bool:
        """Multi-turn episodes (tools, your environment or agent), each scored as it ends."""
        return bool(self.tools or self.env or self.agent)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Your own dataset (used when task.name=file; minirl/tasks/files.py reads it)."""

    train: str = ""  # training problems: a .jsonl or .parquet file
    eval: str = ""  # held-out problems (same format); "" = hold out a content-hash split of train
    test_fraction: float = 0.05  # share of train held out when data.eval is empty
    prompt_key: str = "question"  # the field holding the problem text
    answer_key: str = "answer"  # the gold answer: "... #### 42", "... \\boxed{42}" or "42"
    messages_key: str = "messages"  # or a chat-format list of {role, content} under this field
    system_prompt: str = ""  # a system message put before every prompt ("" = none)
    instruction: str = ""  # appended to every question, e.g. "\nPut the final answer in \\boxed{}."
    chat_template: bool = True  # render prompts with the model's chat template, if it has one
    chat_template_kwargs: dict = dataclasses.field(
        default_factory=dict
    )  # more variables for the template, e.g. {"enable_thinking": False} (Qwen3's non-thinking mode)
    max_new_tokens: int = 256  # completion budget per sample (tokens, EOS included)
    verifier: str = "math"  # how completions are scored: math | math_verify (the gold answer), code (the row's tests), path/to/file.py:function (your reward function of the completion and the row), or rm:DIR (a reward model's score: docs/verifiers.md)
    format_reward: float = 0.0  # reward for a wrong but well-formed (extractable) final answer

    def __post_init__(self):
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"data.test_fraction must be in (0, 1), got {self.test_fraction}")
        if self.max_new_tokens < 1:
            raise ValueError(f"data.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0.0 <= self.format_reward < 1.0:
            raise ValueError(f"data.format_reward must be in [0, 1), got {self.format_reward}")
        taken = set(self.chat_template_kwargs) & set(TEMPLATE_VARIABLES)
        if taken or not all(isinstance(k, str) for k in self.chat_template_kwargs):
            raise ValueError(
                "data.chat_template_kwargs: names (strings) other than the ones minirl sets "
                f"{TEMPLATE_VARIABLES}, got {sorted(map(str, self.chat_template_kwargs))}"
            )


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """The controller's knobs (RLAX §3; AReaL §5; docs/losses.md for the loss presets)."""

    loss: str = "grpo"  # loss preset (minirl.losses.list_presets()), e.g. grpo, dapo, decoupled_ppo
    kl_coef: float | None = (
        None  # beta of the loss's KL term (grpo 0.04, reinforce_pp 1e-3); 0 = no KL term, no reference model and no reference forward; None = the preset's
    )
    router_aux_coef: float = 0.0  # MoE models: weight of the routers' load-balancing loss (E sum_e f_e P_e) added to the RL loss; 0 = off
    behaviour_cap: float = 5.0  # decoupled_ppo: tokens with c = pi_prox/mu above this leave the loss (AReaL's bound); 0 = uncapped (the paper's Eq. 5)
    teacher: str = ""  # on-policy distillation: a frozen teacher that scores the student's tokens, a Hugging Face directory with the student's tokenizer (`minirl train --teacher DIR`) or a model preset name (random weights: for tests and timing); used by rl.loss=distill or rl.distill_coef > 0 (docs/distillation.md)
    distill_coef: float | None = (
        None  # weight of the teacher's per-token advantage -(log mu - log pi_T): the distill preset's is 1; > 0 adds it to any token-level loss's reward advantage (e.g. rl.loss=grpo); None = the preset's
    )
    distill_discount: float = 0.0  # the teacher's advantage at a token: the discounted sum of the per-token terms from there on (0 = the token's own, as Thinking Machines' on-policy distillation; 1 = the whole rest of the sequence, the unbiased reverse-KL gradient)
    steps: int = 200  # train steps (weight versions) to run
    time_budget: float = 0.0  # stop RL after this many seconds (0 = no limit)
    prompts_per_step: int = 32  # prompts per train batch
    group_size: int = 8  # G: samples per prompt
    reload_every: int = 1  # j: the engine loads every j-th weight version
    max_lag: int = 0  # k: accept a rollout whose oldest token is <= k versions behind the version the step produces; 0 = unbounded
    eta: int = (
        0  # AReaL: generation may run at most eta batches ahead of training (0 = synchronous)
    )
    scheduler: str = "lockstep"  # lockstep (bitwise reproducible) | async (free-running threads)
    reload_policy: str = "discard"  # in-flight requests at a reload: discard (re-queue) | continue
    batch_order: str = (
        "freshest"  # which acceptable groups a step takes: freshest (RLAX) | oldest (AReaL)
    )
    workers: str = "inprocess"  # inprocess | process: engine and verifier in their own local processes (Ray: python -m scale.launch ray)
    dynamic_filter: bool = False  # DAPO: drop groups whose rewards are all equal, sample more (on anyway for rl.loss=dapo)
    seed: int = 0  # keys the prompt mixture and every sampling draw
    checkpoint_every: int = 10  # write a checkpoint every N steps (at reload boundaries)
    keep_checkpoints: int = 2  # checkpoints kept on disk
    export_hf: bool = (
        False  # at the end, also write RUN_DIR/hf: a Hugging Face checkpoint (minirl export)
    )

    def __post_init__(self):
        for name in (
            "steps",
            "prompts_per_step",
            "group_size",
            "reload_every",
            "checkpoint_every",
            "keep_checkpoints",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"rl.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_lag < 0 or self.eta < 0 or self.time_budget < 0 or self.seed < 0:
            raise ValueError("rl.max_lag, rl.eta, rl.time_budget and rl.seed must be >= 0")
        get_preset(self.loss)  # an unknown name fails here, before any work starts
        if self.kl_coef is not None:
            try:  # < 0, or > 0 for a loss without a KL term
                with_kl_coef(get_preset(self.loss), self.kl_coef)
            except ValueError as e:
                raise ValueError(f"rl.kl_coef={self.kl_coef}: {e}") from None
        if not (self.router_aux_coef >= 0 and math.isfinite(self.router_aux_coef)):
            raise ValueError(
                f"rl.router_aux_coef must be finite and >= 0, got {self.router_aux_coef}"
            )
        if not (0.0 <= (self.distill_coef or 0) < math.inf and 0 <= self.distill_discount <= 1):
            raise ValueError(
                "rl.distill_coef must be finite and >= 0, rl.distill_discount in [0, 1]"
            )
        if not (self.behaviour_cap == 0 or self.behaviour_cap >= 1):
            raise ValueError(
                f"rl.behaviour_cap must be 0 (uncapped) or >= 1, got {self.behaviour_cap}"
            )
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"rl.scheduler must be one of {SCHEDULERS}, got {self.scheduler!r}")
        if self.workers not in ("inprocess", "process"):
            raise ValueError(f"rl.workers must be inprocess or process, got {self.workers!r}")
        if self.reload_policy not in RELOAD_POLICIES:
            raise ValueError(
                f"rl.reload_policy must be one of {RELOAD_POLICIES}, got {self.reload_policy!r}"
            )
        if self.batch_order not in BATCH_ORDERS:
            raise ValueError(
                f"rl.batch_order must be one of {BATCH_ORDERS}, got {self.batch_order!r}"
            )
        if self.max_lag and self.max_lag < self.reload_every:
            raise ValueError(
                f"rl.max_lag={self.max_lag} < rl.reload_every={self.reload_every}: "
                "every rollout would be too stale to train on"
            )


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Supervised warm start on the task's demonstrations (format only, for countdown)."""

    steps: int = 300  # supervised updates
    batch_size: int = 64  # demonstrations per update
    learning_rate: float = 3e-3  # peak learning rate (warm-up then cosine)
    seed: int = 0  # keys the demonstration stream
    cache: bool = True  # reuse a warm start with the same config from the cache directory

    def __post_init__(self):
        if self.steps < 0 or self.batch_size < 1 or self.seed < 0:
            raise ValueError(
                f"sft: steps >= 0, batch_size >= 1 and seed >= 0, got {self.steps}, "
                f"{self.batch_size}, {self.seed}"
            )
        if not self.learning_rate > 0:
            raise ValueError(f"sft.learning_rate must be > 0, got {self.learning_rate}")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    prompts: int = 256  # held-out prompts (test split)
    samples: int = 8  # samples per prompt: pass@1 is their mean, pass@k uses all of them
    every: int = 0  # evaluate every N RL steps as well (0 = only before and after)

    def __post_init__(self):
        if self.prompts < 1 or self.samples < 1 or self.every < 0:
            raise ValueError(
                f"eval: prompts >= 1, samples >= 1 and every >= 0, got "
                f"{self.prompts}, {self.samples}, {self.every}"
            )


@dataclasses.dataclass(frozen=True)
class LogConfig:
    """Where a run's numbers go besides metrics.jsonl (minirl/run/tracking.py); none of it changes
    what a step does, so a resumed run may change any of it."""

    tensorboard: bool = False  # TensorBoard event files in RUN_DIR/tensorboard (the `track` extra)
    wandb: str = ""  # a W&B project name ("" = off); offline unless an API key is set up
    samples_every: int = (
        10  # every N steps, a few rollouts to samples.jsonl and the trackers (0 = off)
    )
    samples_per_step: int = 4  # how many rollouts of the step's batch

    def __post_init__(self):
        if self.samples_every < 0 or self.samples_per_step < 1:
            raise ValueError(
                f"log: samples_every >= 0 and samples_per_step >= 1, got "
                f"{self.samples_every}, {self.samples_per_step}"
            )


@dataclasses.dataclass(frozen=True)
class RunConfig:
    task: TaskSpec = TaskSpec()
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig(vocab_size=VOCAB)
    engine: EngineConfig = EngineConfig(
        slots=64, cache_len=64, prefill_buckets=(16, 32), prefill_rows=16, decode_chunk=8
    )
    trainer: TrainerConfig = TrainerConfig(learning_rate=1e-4)
    rl: RLConfig = RLConfig()
    sft: SFTConfig = SFTConfig()
    eval: EvalConfig = EvalConfig()
    log: LogConfig = LogConfig()

    def trainer_config(self) -> TrainerConfig:
        """The trainer's config as a run uses it: trainer.total_steps (the cosine schedule's
        length) is rl.steps when left at 0. Derived, not stored, so the config hash does not
        move with rl.steps, which a resumed run may change; the run directory's config.json
        records the value used."""
        if self.trainer.total_steps:
            return self.trainer
        return dataclasses.replace(self.trainer, total_steps=self.rl.steps)

    def check(self) -> RunConfig:
        """Rules across sections, checked once the whole config is assembled (a preset and its
        overrides may pass through states that break them). Returns self."""
        uses_file = self.task.name == FILE_TASK
        if uses_file and not self.data.train:
            raise ConfigError("task.name=file needs a dataset: --data FILE (data.train)")
        if self.data.train and not uses_file:
            raise ConfigError(
                f"data.train is set but task.name={self.task.name!r}; the dataset is "
                "used with task.name=file (what `minirl train --data` sets)"
            )
        if not uses_file and self.data != DataConfig():
            changed = [
                f.name
                for f in dataclasses.fields(DataConfig)
                if getattr(self.data, f.name) != getattr(DataConfig(), f.name)
            ]
            raise ConfigError(f"data.{changed[0]} does nothing without a dataset (--data FILE)")
        if uses_file and self.task.tools:
            raise ConfigError(
                "task.tools works with the built-in tasks only for now: a dataset's prompts "
                "are rendered with the chat template before an episode could lay them out "
                "(your own environment, --env, lays a row out itself)"
            )
        if self.task.max_turns != TaskSpec.max_turns and not self.task.episodes:
            raise ConfigError("task.max_turns does nothing without task.tools, env or agent")
        if self.task.timeout != TaskSpec.timeout and not (self.task.env or self.task.agent):
            raise ConfigError("task.timeout does nothing without task.env or task.agent")
        rl = self.rl
        if rl.behaviour_cap != BEHAVIOUR_CAP and not has_behaviour_cap(get_preset(rl.loss)):
            raise ConfigError(
                f"rl.behaviour_cap={rl.behaviour_cap} does nothing with rl.loss={rl.loss}: only "
                "decoupled_ppo and decoupled_ppo_mis bound c = pi_prox/mu"
            )
        moe_knobs = {"trainer.routing=replay": self.trainer.routing == "replay"}
        moe_knobs["rl.router_aux_coef"] = rl.router_aux_coef > 0
        if self.trainer.pack and (self.engine.exact or self.model.num_experts):
            raise ConfigError("trainer.pack: dense models in fast mode only (not exact, MoE)")
        for knob, used in moe_knobs.items():
            if used and not self.model.num_experts:
                raise ConfigError(f"{knob} needs a mixture-of-experts model (model.num_experts)")
        try:
            self.trainer_config()
        except ValueError as e:  # e.g. warm-up longer than a cosine schedule of rl.steps
            raise ConfigError(f"trainer.total_steps follows rl.steps={rl.steps}: {e}") from None
        return self
