"""Benchmark: what the OpenAI-compatible endpoint costs per model call, against the same engine
work driven directly.

Run (a minute or two):
    python -m pytest benchmarks/test_bench_endpoint.py -q -s

Every round runs the same episodes twice on the same engine and weights:

  agent    32 episodes of the agent below through AgentRunner: the real `openai` client, HTTP on
           localhost, each call checked against the episode's tokens, rendered, answered (3 chat
           calls per episode, up to 16 new tokens each, a tool message between calls)
  direct   the very engine work of that run, replayed without agents or HTTP: the requests the
           runner handed the engine, submitted before the same engine step they were, then the
           step (recorded by a spy on the first round)

and reports the wall time of each, `ratio = direct / agent` (1.0 = the endpoint is free) and the
endpoint's cost per call, `(agent - direct) / calls`. A second measurement without a model
(`ScriptedEngine`: the engine answers at once) gives the endpoint's own cost per call, its floor.
The model is the tests' tiny character model (2 layers, width 64), so engine work is small and
the ratio is a worst case for the endpoint. Absolute times on this shared 2-core machine are
noisy; the ratio and the per-call cost are measured in the same run.
"""

from __future__ import annotations

import time

import jax
import numpy as np
from flax import nnx

from minirl.agents import AgentConfig, AgentRunner, load_agent
from minirl.envs import Turns
from minirl.envs.scripted import ScriptedEngine
from minirl.inference.engine import Engine, EngineConfig, Request
from minirl.modeling.model import ModelConfig, init_model
from minirl.modeling.tokenizer import CharTokenizer
from minirl.types import Prompt

TOK = CharTokenizer()
CFG = ModelConfig(
    vocab_size=TOK.vocab_size,
    dim=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    mlp_dim=128,
    max_seq_len=128,
)
ENGINE = EngineConfig(
    slots=16,
    cache_len=128,
    prefill_buckets=(32, 64),
    prefill_rows=8,
    decode_chunk=8,
    eos_ids=(TOK.eos_id,),
)
EPISODES, CALLS, ROUNDS = 32, 3, 5
AGENT = """
async def solve(client, row):
    messages = [{"role": "user", "content": row["prompt"]}]
    for k in range(3):
        r = await client.chat.completions.create(model="m", messages=messages, max_tokens=16)
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "content": f"t{k}"})
    return 0.0
"""


class Recorder:
    """The engine, recording which requests were submitted before which step."""

    def __init__(self, engine):
        self.engine, self.steps, self.log = engine, 0, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def submit(self, requests):
        requests = list(requests)
        self.log.append((self.steps, requests))
        self.engine.submit(requests)

    def step(self):
        self.steps += 1
        return self.engine.step()


def requests() -> list[Request]:
    prompts = [Prompt(100 + i, "t", f"{i}+{i}=", np.ones(1, np.int32)) for i in range(EPISODES)]
    return [Request(p, 0, 16) for p in prompts]


def agent_run(agent, engine) -> float:
    runner = AgentRunner(engine, agent, Turns(TOK), None, AgentConfig(timeout=60.0))
    t0 = time.perf_counter()
    runner.generate(requests())
    seconds = time.perf_counter() - t0
    runner.close()
    return seconds


def direct_run(engine, log, steps: int) -> float:
    by_step: dict[int, list] = {}
    for step, batch in log:
        by_step.setdefault(step, []).extend(batch)
    t0 = time.perf_counter()
    for step in range(steps):
        engine.submit(by_step.get(step, []))
        engine.step()
    return time.perf_counter() - t0


def test_endpoint_overhead_per_call(tmp_path):
    (tmp_path / "agent.py").write_text(AGENT)
    agent = load_agent(f"{tmp_path}/agent.py:solve")
    params = jax.jit(lambda: nnx.to_pure_dict(nnx.split(init_model(CFG, seed=0))[1]))()

    def engine():
        e = Engine(CFG, ENGINE, seed=0)
        e.load_weights(0, params)
        return e

    recorder = Recorder(engine())
    agent_run(agent, recorder)  # warm-up: compiles, and the schedule to replay
    direct_run(engine(), recorder.log, recorder.steps)
    calls = sum(len(batch) for _, batch in recorder.log)
    assert calls == EPISODES * CALLS
    times = {"agent": [], "direct": []}
    for _ in range(ROUNDS):
        times["agent"].append(agent_run(agent, engine()))
        times["direct"].append(direct_run(engine(), recorder.log, recorder.steps))
    a, d = np.median(times["agent"]), np.median(times["direct"])
    floor = []
    for _ in range(ROUNDS):  # the endpoint alone: an engine that answers at once
        scripted = ScriptedEngine({}, TOK.eos_ids, 128)
        floor.append(agent_run(agent, scripted) / calls)
    print(
        f"\n{EPISODES} episodes x {CALLS} calls, {ROUNDS} rounds (medians): agent {a:.2f}s, "
        f"direct {d:.2f}s, ratio direct/agent {d / a:.2f}; endpoint cost per call "
        f"{(a - d) / calls * 1e3:.1f} ms (with a model), {np.median(floor) * 1e3:.1f} ms "
        f"(no model: ScriptedEngine)"
    )
    assert 0 < d / a <= 1.2  # the same engine work, plus the endpoint
