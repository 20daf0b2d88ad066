"""Tool calls a model really samples, in its own family's format, through the endpoint (slow).

A tiny random Qwen2 model with a Qwen2.5-style or a Llama-3.1-style tool-calling template
(tests/hf_tiny.py) is taught one conversation: the agent's own episode, laid out by the agent
with a scripted policy (minirl/envs/scripted.py) — a `calc` call in the family's format, the
tool's answer, the final answer. Then the trained model, decoding greedily through the endpoint,
is run by the same agent with the real `openai` client:

  the model's call is parsed into `tool_calls` (Qwen's <tool_call> block, Llama's JSON), the
    agent runs its tool, the model answers: reward 1
  the batch's answers are, byte for byte, the tokens the engine sampled (no re-tokenization)
  the episode's text is transformers' rendering of the conversation the agent holds (with
    structured `tool_calls` and a `tool` message), plus the final answer and its EOS
"""

import json

import numpy as np
import pytest
import transformers
from flax import nnx
from hf_tiny import make_model_dir

from minirl.agents import AgentConfig, AgentRunner, load_agent
from minirl.envs import Turns
from minirl.envs.scripted import ScriptedEngine
from minirl.envs.tool_calls import render_call
from minirl.hf.hf_tokenizer import HFTokenizer
from minirl.hf.model_files import load_hf, read_token_ids
from minirl.inference.engine import Engine, EngineConfig, Request
from minirl.training.batching import make_batch
from minirl.training.trainer import Trainer, TrainerConfig
from minirl.types import Prompt

pytestmark = [pytest.mark.slow, pytest.mark.reference]

CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Multiply two integers.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
AGENT = f"""
import json
from pathlib import Path

CALC = {json.dumps(CALC)}

async def solve(client, row):
    messages = [{{"role": "user", "content": row["prompt"]}}]
    for _ in range(3):
        r = await client.chat.completions.create(model="m", messages=messages, tools=[CALC])
        m = r.choices[0].message
        messages.append(m.model_dump(exclude_none=True))
        if not m.tool_calls:
            break
        for c in m.tool_calls:
            a, b = json.loads(c.function.arguments)["expression"].split("*")
            messages.append({{"role": "tool", "tool_call_id": c.id, "content": str(int(a) * int(b))}})
    Path(row["out"]).write_text(json.dumps(messages))
    return float(messages[-1]["content"] == "84")
"""


class Spy:
    def __init__(self, engine):
        self.engine, self.seen = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def step(self):
        out = self.engine.step()
        self.seen += out
        return out


def _as_transformers_reads_it(messages):
    """The agent's messages as transformers' templates take them: arguments as objects."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None or k == "content"}
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {
                    "type": "function",
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": json.loads(c["function"]["arguments"]),
                    },
                }
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


@pytest.mark.parametrize("style", ["qwen_tools", "llama_tools"])
def test_a_sampled_native_tool_call_equals_transformers_rendering(style, tmp_path):
    path = make_model_dir(tmp_path / style, arch="qwen2", style=style, max_positions=1024)
    tok = HFTokenizer.from_dir(path, extra_eos_ids=read_token_ids(path).eos)
    model_cfg, model = load_hf(path)
    params = nnx.to_pure_dict(nnx.split(model)[1])
    (tmp_path / "agent.py").write_text(AGENT)
    agent, turns = load_agent(f"{tmp_path}/agent.py:solve"), Turns(tok)
    out = tmp_path / "messages.json"
    prompt = Prompt(1, "t", "What is 12*7?", np.ones(1, np.int32), {"out": str(out)})
    engine_cfg = EngineConfig(
        slots=2,
        cache_len=1024,
        prefill_buckets=(512,),
        prefill_rows=2,
        decode_chunk=8,
        temperature=0.0,
        eos_ids=tok.eos_ids,
    )

    # the agent lays out its own demonstration; the model learns to say it
    call = render_call(turns.format, "calc", {"expression": "12*7"})
    script = {1: [tok.encode(call, bos=False, eos=True), tok.encode("84", bos=False, eos=True)]}
    scripted = ScriptedEngine(script, tok.eos_ids, 1024, engine_cfg.sampling)
    (demo,) = AgentRunner(scripted, agent, turns, None, AgentConfig()).generate(
        [Request(prompt, 0, 128)]
    )
    assert demo.score.reward == 1.0
    trainer = Trainer(
        model_cfg, params, None, TrainerConfig(learning_rate=3e-3, micro_batch_tokens=2048)
    )
    batch = make_batch([demo], tok.pad_id)
    for _ in range(150):
        loss = trainer.sft_step(batch)["loss"]
    assert loss < 0.05

    # the trained model through the endpoint
    engine = Spy(Engine(model_cfg, engine_cfg, seed=0))
    engine.load_weights(0, trainer.params(host=True))
    runner = AgentRunner(engine, agent, turns, None, AgentConfig())
    (episode,) = runner.generate([Request(prompt, 0, 128)])
    runner.close()
    messages = json.loads(out.read_text())
    assert episode.score.reward == 1.0 and len(messages) == 4, messages
    assert messages[1]["tool_calls"][0]["function"] == {
        "name": "calc",
        "arguments": '{"expression": "12*7"}',
    }

    answers = [r.tokens for r in sorted(engine.seen, key=lambda r: r.prompt.meta["turn"])]
    assert episode.tokens[episode.mask > 0].tobytes() == np.concatenate(answers).tobytes()
    theirs = transformers.AutoTokenizer.from_pretrained(path)
    want = theirs.apply_chat_template(
        _as_transformers_reads_it(messages[:3]),
        tools=[CALC],
        tokenize=False,
        add_generation_prompt=True,
    )
    eos = tok.decode([tok.eos_id], skip_special=False)
    got = tok.decode(np.concatenate([episode.prompt.tokens, episode.tokens]), skip_special=False)
    assert got == want + "84" + eos
