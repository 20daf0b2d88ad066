"""Your own environment from a file (`--env file.py:Class`, task.env; minirl/envs/user_env.py).

set-up mistakes (no file, no class, not a class, a constructor with arguments, reset/step of
  the wrong arity) are one line at the start, from `minirl train` too
the adapter: the row handed to reset, 4-tuples and Steps, text / message / list observations;
  what is not a step is refused with the reason
hostile environments through the real engine (raise, hang, answer nonsense, SystemExit) end
  their own episode with reward 0 and the reason; the run goes on, the others' episodes are
  bitwise the ones a run without them samples, and a hang costs task.timeout, not forever
slow: `minirl train --env` end to end, in-process and with the engine in a worker process,
  the two runs bitwise equal
"""

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from turn_shapes import CFG, EXACT, TOK

from minirl import cli
from minirl.envs import EpisodeConfig, EpisodeRunner, Step, Turns
from minirl.envs.base import as_step
from minirl.envs.scripted import ScriptedEngine
from minirl.envs.turns import TOY_TEMPLATE
from minirl.envs.user_env import FileEnv, FileEnvs, load_env
from minirl.inference.engine import Engine, Request
from minirl.modeling.model import init_model
from minirl.types import Prompt

ROOT = Path(__file__).resolve().parents[2]

ENVS = """
import time

class Good:
    tools = None
    def reset(self, row):
        self.turns = 0
        return row["prompt"]
    def step(self, turn):
        self.turns += 1
        return f"t{self.turns} {len(turn)}", 0.25, self.turns == 2, {"reason": "scripted"}

class Hostile(Good):
    def reset(self, row):
        self.kind = row["prompt"].split()[0]
        if self.kind == "hang_reset":
            time.sleep(60)
        if self.kind == "raise_reset":
            raise KeyError("no such field")
        return super().reset(row)
    def step(self, turn):
        kind = self.kind
        if kind == "hang_step":
            time.sleep(60)
        if kind == "raise_step":
            raise ZeroDivisionError("division by zero")
        if kind == "exit_step":
            raise SystemExit(3)
        if kind == "three":
            return "x", 1.0, False
        if kind == "nan":
            return "x", float("nan"), False, {}
        if kind == "bad_obs":
            return 42, 1.0, False, {}
        return super().step(turn)

def not_a_class():
    pass

class Needs:
    def __init__(self, size): pass
    def reset(self, row): pass
    def step(self, turn): pass

class TwoArgs(Good):
    def step(self, turn, extra): pass

class NoReset:
    def step(self, turn): pass

class Unwritable(Good):  # a tool name the character tokenizer has no letters for
    tools = [{"type": "function", "function": {"name": "Calc", "parameters": {}}}]
"""


@pytest.fixture(scope="module")
def env_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("envs") / "my_env.py"
    path.write_text(ENVS)
    return path


@pytest.mark.parametrize(
    "name, message",
    [
        ("Missing", "has no class 'Missing'"),
        ("not_a_class", "'not_a_class' is a function, not a class"),
        ("Needs", "the constructor must take no arguments; its signature is (size)"),
        ("TwoArgs", "TwoArgs.step must take one argument; its signature is (self, turn, extra)"),
        ("NoReset", "NoReset has no method reset(...)"),
    ],
)
def test_a_wrong_environment_is_named_in_one_line(env_file, name, message):
    with pytest.raises(ValueError, match=r"^--env '.*my_env.py:\w+': ") as e:
        load_env(f"{env_file}:{name}")
    assert message in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="no file"):
        load_env(f"{env_file.parent}/nothing.py:Good")


def test_minirl_train_refuses_a_wrong_environment_before_any_work(env_file, tmp_path, capsys):
    argv = ["train", "--preset", "fixture", "--run-dir", str(tmp_path / "run")]
    assert cli.main([*argv, "--env", f"{env_file}:TwoArgs"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("minirl train: error: --env ") and "Traceback" not in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "run").exists()
    assert cli.main([*argv, "--env", "my_env:Good"]) == 2  # not a file.py:name
    assert "--env 'my_env:Good': expected path/to/file.py:class" in capsys.readouterr().err
    both = ["--env", f"{env_file}:Good", "--set", "task.tools=calc"]
    assert cli.main([*argv, *both]) == 2
    assert "an episode has one kind" in capsys.readouterr().err
    assert cli.main([*argv, "--env", f"{env_file}:Unwritable"]) == 2
    err = capsys.readouterr().err.strip()
    assert "a tool's closing tag: character 'C' is not in the tokenizer's alphabet" in err
    assert len(err.splitlines()) == 1


def test_the_adapter_hands_over_the_row_and_reads_any_step(env_file):
    envs = FileEnvs(f"{env_file}:Good")
    env = envs()
    assert isinstance(env, FileEnv) and env is not envs() and env.tools is None
    built_in = Prompt(7, "arithmetic", "1+2=", np.ones(1, np.int32), {"operands": [1, 2]})
    assert env.reset(built_in) == "1+2="  # {"prompt": text, **meta}
    assert env.env.turns == 0
    row = {"question": "q", "answer": "a", "n": 3}
    from_file = Prompt(8, "file", "rendered", np.ones(1, np.int32), {"fields": row, "row": 1})
    assert FileEnv(type("E", (), {"reset": lambda s, r: r, "step": None})).reset(from_file) == row
    assert env.step("abc") == ("t1 3", 0.25, False, {"reason": "scripted"})
    assert as_step(env.step("ab")) == Step("t2 2", 0.25, True, {"reason": "scripted"})
    assert as_step(Step("x", 1, np.bool_(True))) == Step("x", 1.0, True, {})
    assert as_step(("x", True, 0, None)) == Step("x", 1.0, False, {})
    lock = threading.Lock()  # a reason that cannot travel to the trainer (pickle) becomes text
    assert pickle_round_trip(as_step(("x", 1, True, {"reason": lock}))).info == {
        "reason": str(lock)
    }
    for bad, why in [
        (("x", 1.0, False), "a 3-tuple"),
        (("x", 1.0, False, False, {}), "a 5-tuple"),
        ("x", "str, not"),
        (("x", math.nan, False, {}), "the reward nan"),
        (("x", "1", False, {}), "the reward '1'"),
        (("x", 1.0, "yes", {}), "done='yes'"),
        (("x", 1.0, 2, {}), "done=2"),
        (("x", 1.0, True, ["reason"]), "info of type list"),
    ]:
        with pytest.raises(ValueError, match=why):
            as_step(bad)
    assert pickle_round_trip(envs).spec == envs.spec  # travels to a worker process as its path


def pickle_round_trip(obj):
    import pickle

    return pickle.loads(pickle.dumps(obj))


@pytest.fixture(scope="module")
def params():
    return jax.jit(lambda: nnx.to_pure_dict(nnx.split(init_model(CFG, seed=0))[1]))()


def _episodes(params, env_file, kinds, timeout):
    engine = Engine(CFG, EXACT, seed=3)
    engine.load_weights(0, params)
    runner = EpisodeRunner(
        engine, FileEnvs(f"{env_file}:Hostile"), Turns(TOK), EpisodeConfig(3, timeout=timeout)
    )
    prompts = [
        Prompt(100 + i, "t", f"{kind} {i}+1=", np.ones(1, np.int32)) for i, kind in enumerate(kinds)
    ]
    t0 = time.perf_counter()
    episodes = runner.generate([Request(p, 0, 8) for p in prompts])
    return {p.text.split()[0]: e for p, e in zip(prompts, episodes, strict=True)}, t0


def test_hostile_environments_end_their_own_episode_only(params, env_file):
    hostile = ["raise_reset", "raise_step", "exit_step", "three", "nan", "bad_obs"]
    hostile += ["hang_reset", "hang_step"]
    kinds = ["good"] + hostile + ["fine"]
    got, t0 = _episodes(params, env_file, kinds, timeout=1.0)
    seconds = time.perf_counter() - t0
    alone, _ = _episodes(
        params, env_file, ["good", "x", "x", "x", "x", "x", "x", "x", "x", "fine"], 1.0
    )
    for kind in ("good", "fine"):  # unaffected: the tokens a run without the hostile ones samples
        assert got[kind].score.reward in (0.25, 0.5) and got[kind].score.reason != "failed"
        assert np.array_equal(got[kind].tokens, alone[kind].tokens)
        assert got[kind].score == alone[kind].score
    reasons = {
        "raise_reset": "environment reset failed: KeyError: 'no such field'",
        "hang_reset": "environment timed out (its calls took over task.timeout=1.0s)",
        "raise_step": "environment error: ZeroDivisionError: division by zero",
        "hang_step": "environment timed out",
        "exit_step": "SystemExit: 3",
        "three": "step returned a 3-tuple, not (observation, reward, done, info)",
        "nan": "step returned the reward nan",
        "bad_obs": "its observation: expected text or chat messages, got int",
    }
    for kind, why in reasons.items():
        assert got[kind].score.reward == 0.0 and why in got[kind].score.reason, (kind, got[kind])
    assert len(got["raise_reset"].tokens) == len(got["hang_reset"].tokens) == 0  # never started
    assert len(got["hang_step"].tokens) > 0 and got["hang_step"].mask.all()  # one turn, then cut
    assert seconds < 30  # two hangs of 60 s each cost about task.timeout, side by side


CALC = {"type": "function", "function": {"name": "calc", "parameters": {"properties": {"e": {}}}}}


class Careless:
    """Mistakes your environment could make that only show once episodes run."""

    def reset(self, prompt):  # an Environment (base.py): its tools are read after reset
        self.kind = prompt.text.split()[0]
        self.tools = [CALC]
        if self.kind == "bad_schema":  # "parameters" is no schema: declares no tool
            self.tools = [{"type": "function", "function": {"name": "calc", "parameters": "e"}}]
        if self.kind == "long":  # with a turn, over the episode's token limit
            return "1" * 200
        if self.kind == "random":  # another prompt when the engine restarts the episode
            return f"{time.monotonic_ns()} {prompt.text}"
        return prompt.text

    def step(self, turn):  # 0.25 a turn with a call, 0.5 without
        return "5", 0.5 / (1 + len(turn.tool_calls)), False, {}


class Discarding(ScriptedEngine):
    def interrupt(self, policy: str) -> int:  # as the engine's "discard": back to the prompt
        for s in self._live.values():
            s.tokens, s.mask, s.turn, s.ready = [], [], 0, True
        return len(self._live)


def _careless(turns, kinds: dict, cache_len: int, max_new_tokens: int) -> dict:
    prompts = [Prompt(200 + i, "t", f"{k} 1+2=", np.ones(1, np.int32)) for i, k in enumerate(kinds)]
    script = {p.uid: [TOK.encode(kinds[p.text.split()[0]], bos=False)] * 2 for p in prompts}
    engine, config = Discarding(script, TOK.eos_ids, cache_len), EpisodeConfig(2, timeout=5.0)
    runner = EpisodeRunner(engine, Careless, turns, config)
    runner.submit([Request(p, 0, max_new_tokens) for p in prompts])
    done = runner.step()  # every episode's first turn and observation
    runner.interrupt("discard")
    while runner.pending():
        done += runner.step()
    return {e.prompt.text.split()[-2]: e for e in done}


def test_careless_environments_end_their_own_episode_only():
    """A first message too long for the cache, a reset that is not deterministic (noticed when
    the engine restarts the episode), a tool schema of the wrong shape, and a model's call
    nested past the JSON parser's depth: reward 0 with the reason, or no call; never an end of
    the run. Model-free: a ScriptedEngine says the turns."""
    kinds = {"good": "<calc>1</calc>", "long": "1", "random": "1", "bad_schema": "<calc>1</calc>"}
    got = _careless(Turns(TOK), kinds, cache_len=128, max_new_tokens=16)
    assert got["good"].score.reward == 0.5 and got["bad_schema"].score.reward == 1.0  # 2 turns
    assert len(got["good"].tokens) == len(got["bad_schema"].tokens) == 2 * 14 + len("\n= 5\n")
    for kind, why in [
        ("long", "its first message is 201 tokens, and with a turn of 16 over the episode"),
        ("random", "environment reset is not deterministic"),
    ]:
        assert got[kind].score.reward == 0.0 and why in got[kind].score.reason, got[kind].score
        assert len(got[kind].tokens) == 0
    deep = {"deep": "<tool_call>" + "[" * 1200 + "</tool_call>"}  # the hermes format's calls
    got = _careless(Turns(TOK, TOY_TEMPLATE + "{# <tool_call> #}"), deep, 4096, 1300)
    assert got["deep"].score.reward == 1.0 and got["deep"].mask.sum() == 2 * 1223


@pytest.mark.slow
def test_minirl_train_with_an_environment_from_a_file(tmp_path):
    """The CLI path end to end: the fixture model on arithmetic, a calculator environment
    written as a user's class; with the engine (and so the environments) in this process and
    in a worker process, the two runs are bitwise equal, the episodes multi-turn."""
    env = tmp_path / "calc_env.py"
    env.write_text(CALC_ENV)
    base = [sys.executable, "-m", "minirl.cli", "train", "--preset", "fixture", "--quiet"]
    base += ["--env", f"{env}:CalcEnv", *CALC_RUN]
    runs = {}
    for workers in ("inprocess", "process"):
        run_dir = tmp_path / workers
        cmd = [*base, "--run-dir", str(run_dir), "--set", f"rl.workers={workers}"]
        environ = {**os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run(cmd, check=True, env=environ, capture_output=True, timeout=900)
        runs[workers] = [
            json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()
        ]
    summary = json.loads((tmp_path / "inprocess" / "summary.json").read_text())
    assert summary["before"]["turns"] > 1.2  # the environment's calculator is used
    for a, b in zip(runs["inprocess"], runs["process"], strict=True):
        for key in ("reward/mean", "train/loss", "train/grad_norm", "turns/mean"):
            assert a[key] == b[key], key


CALC_ENV = """
import json

class CalcEnv:
    # a tool in OpenAI's form: with the character tokenizer (no chat template of its own) the
    # model calls it as <calc>1+2</calc>, which also ends its turn
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}}}}}]

    def reset(self, row):
        self.total = sum(row["operands"])
        return row["prompt"]

    def step(self, turn):
        if turn.tool_calls:
            expression = json.loads(turn.tool_calls[0]["function"]["arguments"])["expression"]
            try:
                return str(sum(int(x) for x in expression.split("+"))), 0.0, False, {}
            except ValueError:
                return "error", 0.0, False, {}
        right = turn.strip().endswith(f"#### {self.total}")
        return "", float(right), True, {"reason": "correct" if right else "wrong answer"}
"""
CALC_RUN = [
    *("--set", "task.name=arithmetic", "--set", 'task.args={"max_digits":1,"max_operands":3}'),
    *("--set", "engine.cache_len=64", "--set", "engine.prefill_buckets=(16,32)"),
    *("--set", "rl.steps=3", "--set", "eval.prompts=16", "--set", "sft.steps=40"),
]
