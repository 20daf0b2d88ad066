"""No inert setting: every key `minirl config` lists is read by the part it configures.

A knob that changes nothing is a bug (it changes the config hash, so it even blocks a resume).
Every config class's attribute reads are recorded while a few short runs exercise the paths the
knobs steer (lockstep and async, paged cache, cosine schedule, staleness bounds, trackers, a
dataset file and a Hugging Face model directory). Reads that only copy, compare, hash, print or
validate a config do not count: those by `dataclasses`, `minirl.configlib`, and a config's own
generated or validating methods (`__init__`, `__post_init__`, `__eq__`, `__hash__` ...). A key nobody reads is inert. The few keys whose effect is
outside a training process (where files go) are listed with what they do and checked apart.
"""

import dataclasses
import json
import sys

import pytest
from hf_tiny import make_model_dir

from minirl import config
from minirl.configlib import describe
from minirl.inference.engine import EngineConfig
from minirl.modeling.model import ModelConfig
from minirl.run.presets import make_config
from minirl.run.runner import Run
from minirl.training.trainer import TrainerConfig

pytestmark = pytest.mark.reference  # the Hugging Face model directory is made with transformers

CLASSES = {
    "task": config.TaskSpec,
    "data": config.DataConfig,
    "model": ModelConfig,
    "engine": EngineConfig,
    "trainer": TrainerConfig,
    "rl": config.RLConfig,
    "sft": config.SFTConfig,
    "eval": config.EvalConfig,
    "log": config.LogConfig,
}
NOT_READS = {
    "__post_init__",
    "__eq__",
    "__hash__",
    "__repr__",
    "__init__",
    "__setattr__",
    "__delattr__",
    "__getstate__",
    "__reduce__",
    "__copy__",
    "__deepcopy__",
}
NOT_READERS = ("dataclasses", "copy", "pickle", "minirl.configlib", "inspect", "reprlib")

# Keys with no effect inside the training process, and where their effect is checked.
ELSEWHERE: dict[str, str] = {}  # none today

SHORT = [
    "rl.steps=2",
    "rl.prompts_per_step=4",
    "rl.group_size=2",
    "eval.prompts=4",
    "eval.samples=2",
    "sft.steps=2",
    "sft.batch_size=4",
    "sft.cache=false",
]


@pytest.fixture(scope="module")
def reads():
    seen: set[tuple[str, str]] = set()
    section = {cls: name for name, cls in CLASSES.items()}
    originals = {cls: cls.__getattribute__ for cls in CLASSES.values()}

    def tracer(cls):
        fields = {f.name for f in dataclasses.fields(cls)}

        def __getattribute__(self, name):  # noqa: N807
            if name in fields:
                frame = sys._getframe(1)
                module = frame.f_globals.get("__name__", "")
                own = frame.f_code.co_name in NOT_READS and frame.f_locals.get("self") is self
                if not own and not module.startswith(NOT_READERS):
                    seen.add((section[cls], name))
            return originals[cls](self, name)

        return __getattribute__

    for cls in CLASSES.values():
        cls.__getattribute__ = tracer(cls)
    yield seen
    for cls, original in originals.items():
        cls.__getattribute__ = original


USER_CODE = """
class Env:
    def reset(self, row):
        return row["prompt"]

    def step(self, turn):
        return "ok", 0.5, False, {}

async def solve(client, row):
    r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["prompt"]}])
    return r.choices[0].message.content
"""


def _train(run_dir, preset, sets):
    Run(make_config(preset, [*SHORT, *sets]), run_dir, progress=False, log=lambda *a: None).train()


@pytest.mark.slow  # ~70 s cold: a run per knob; CI's slow lane runs it
def test_every_setting_is_read_by_the_part_it_configures(reads, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    _train(
        tmp_path / "lockstep",
        "fixture",
        ["eval.every=1", "rl.checkpoint_every=1", "rl.time_budget=1000", "rl.export_hf=true"],
    )
    _train(
        tmp_path / "async",
        "fixture",
        [
            "rl.scheduler=async",
            "rl.eta=1",
            "rl.max_lag=2",
            "rl.reload_every=2",
            "rl.reload_policy=continue",
            "rl.batch_order=oldest",
            "rl.dynamic_filter=true",
            "engine.paged=true",
            "engine.block_size=8",
            "engine.num_blocks=40",
            "engine.temperature=0.9",
            "engine.top_k=20",
            "engine.top_p=0.95",
            "engine.exact=true",
            "engine.stop_sequences=((3, 4),)",
            "engine.eos_ids=(2,)",
            "engine.dtype=float32",
            "trainer.schedule=cosine",
            "trainer.warmup_steps=1",
            "trainer.total_steps=10",
            "trainer.min_lr_ratio=0.2",
            "trainer.weight_decay=0.01",
            "trainer.ppo_epochs=2",
            "trainer.num_minibatches=2",
            "trainer.remat=dots",
            "rl.loss=decoupled_ppo",
            "rl.behaviour_cap=3.0",
            "log.tensorboard=true",
            "log.wandb=minirl-test",
            "log.samples_every=1",
            "rl.keep_checkpoints=1",
            "rl.checkpoint_every=1",
        ],
    )
    _train(
        tmp_path / "tools",
        "fixture",
        [
            "task.name=arithmetic",
            'task.args={"max_digits": 1, "max_operands": 3}',
            "task.tools=calc",
            "task.max_turns=2",
            "engine.cache_len=64",
            # a mixture of experts (its knobs are read only by MoE layers)
            "model.num_experts=4",
            "model.experts_per_token=2",
            "model.expert_dim=32",
            "model.shared_expert_dim=16",
            "model.norm_topk_prob=false",
            "model.moe_every=1",
            "model.dense_layers=(0,)",
            "trainer.routing=replay",
            "rl.router_aux_coef=0.01",
        ],
    )
    user = tmp_path / "user.py"  # your own environment and agent (task.env, task.agent)
    user.write_text(USER_CODE)
    arithmetic = ["task.name=arithmetic", 'task.args={"max_digits": 1, "max_operands": 2}']
    short = ["task.max_turns=2", "task.timeout=30", "engine.cache_len=64"]
    _train(tmp_path / "env", "fixture", [*arithmetic, *short, f"task.env={user}:Env"])
    _train(tmp_path / "agent", "fixture", [*arithmetic, *short, f"task.agent={user}:solve"])
    model = make_model_dir(tmp_path / "model", arch="qwen3")
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"q": f"{i} + 1?", "a": f"#### {i + 1}"}) + "\n" for i in range(40))
    )
    _train(
        tmp_path / "file",
        "custom",
        [
            f"model.path={model}",
            f"data.train={data}",
            "task.name=file",
            "data.prompt_key=q",
            "data.answer_key=a",
            "data.test_fraction=0.2",
            "data.system_prompt=Be brief.",
            "data.instruction= Answer with ####.",
            "data.max_new_tokens=8",
            "data.format_reward=0.1",
            "engine.slots=8",
            "engine.cache_len=128",
            "engine.prefill_buckets=(96,)",
            "model.dtype=float32",
            # on-policy distillation mixed with the reward, the model its own teacher
            f"rl.teacher={model}",
            "rl.distill_coef=0.5",
            "rl.distill_discount=0.5",
        ],
    )
    keys = [key for key, _, _ in describe(config.RunConfig)]
    unread = [k for k in keys if tuple(k.split(".", 1)) not in reads and k not in ELSEWHERE]
    assert unread == [], f"settings no part of a run reads (inert): {unread}"
    assert set(ELSEWHERE) <= set(keys)  # the list names real keys only
