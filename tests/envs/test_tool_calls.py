"""The model's own tool calls (minirl/envs/tool_calls.py) and episodes laid out with them.

parse(render_call(...)) is the call, in each format (Qwen's <tool_call>, Llama 3.1's JSON,
  minirl's tags); what is not a valid call stays content, never an error
the chat template renders `tools=` as transformers does (Qwen2.5- and Llama-3.1-style
  tool-calling templates of tests/hf_tiny.py)
an episode whose turns are native tool calls (said by a ScriptedEngine, so no model is needed):
  its text equals transformers' rendering of the same conversation with structured
  `tool_calls` and `tool` messages; each turn's tokens are the ones "sampled", byte for byte;
  observation tokens are the template's markers + the tool's output, mask 0; the environment
  is handed the parsed calls (`turn.tool_calls`)
"""

import json

import numpy as np
import pytest

from minirl.envs import EpisodeConfig, EpisodeRunner, Turn, Turns
from minirl.envs.scripted import ScriptedEngine
from minirl.envs.tool_calls import format_of, parse, render_call, stop_sequences
from minirl.envs.turns import TOY_TEMPLATE
from minirl.envs.user_env import FileEnv
from minirl.inference.scheduler import Request
from minirl.modeling.tokenizer import CharTokenizer
from minirl.types import Prompt

CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Exact arithmetic on + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 2*(3+4)"}},
            "required": ["expression"],
        },
    },
}


@pytest.mark.parametrize("fmt", ["hermes", "llama", "tags"])
def test_a_rendered_call_parses_back(fmt):
    text = render_call(fmt, "calc", {"expression": "12*(3+4)"})
    content, calls = parse(fmt, text, [CALC])
    assert content == "" and len(calls) == 1
    assert calls[0]["function"] == {"name": "calc", "arguments": '{"expression": "12*(3+4)"}'}
    assert calls[0]["id"] == "call_0" and calls[0]["type"] == "function"
    for not_a_call in ["just text", text[:-3], "{", ""]:
        assert parse(fmt, not_a_call, [CALC]) == (not_a_call, [])


def test_each_format_by_hand():
    two = (
        'Let me see.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>'
    )
    content, calls = parse("hermes", two)
    assert content == "Let me see." and [c["function"]["name"] for c in calls] == ["a", "b"]
    assert [c["id"] for c in calls] == ["call_0", "call_1"]
    bad_json = "<tool_call>\n{name: a}\n</tool_call>"
    assert parse("hermes", bad_json) == (bad_json, [])
    assert parse("hermes", '<tool_call>{"name": "a", "arguments": "x"}</tool_call>')[1] == []
    tagged = '<|python_tag|>{"name": "calc", "parameters": {"expression": "1"}}'
    assert parse("llama", tagged)[1][0]["function"]["arguments"] == '{"expression": "1"}'
    assert parse("llama", 'The answer is {"name": "x", "parameters": {}}')[1] == []
    assert parse("tags", "try <calc>1+2</calc> ", [CALC]) == (
        "try",
        [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "calc", "arguments": '{"expression": "1+2"}'},
            }
        ],
    )
    assert parse("tags", "<other>1</other>", [CALC])[1] == []  # only declared tools
    assert parse("tags", "<calc>1</calc>", None)[1] == []
    tok = CharTokenizer()
    assert stop_sequences("tags", [CALC], tok) == (tuple(tok.encode("</calc>", bos=False)),)
    assert stop_sequences("hermes", [CALC], tok) == ()
    turn = Turn("x <calc>1</calc>", "x", [{"id": "call_0"}])
    assert turn == "x <calc>1</calc>" and turn.endswith("</calc>") and turn.content == "x"


def test_what_the_model_or_a_schema_gets_wrong_is_no_call_never_an_error():
    """JSON nested past the parser's depth (a model can write 1,000 brackets) and tool schemas
    of the wrong shape (your environment's `tools`, an agent's request) are text, not calls."""
    deep = "[" * 5000
    hermes = f'<tool_call>{{"name": "calc", "arguments": {deep}</tool_call>'
    assert parse("hermes", hermes) == (hermes, [])
    llama = f'{{"name": "calc", "parameters": {{"x": {deep}}}}}'
    assert parse("llama", llama) == (llama, [])
    tok = CharTokenizer()
    for schema, named in [
        ({"type": "function", "function": "calc"}, False),
        ({"function": {"name": ["calc"], "parameters": CALC["function"]["parameters"]}}, False),
        ({"type": "function", "function": {"name": "calc", "parameters": "x"}}, True),
        ({"function": {"name": "calc", "parameters": {"properties": ["expression"]}}}, True),
    ]:
        assert parse("tags", "<calc>1+2</calc>", [schema]) == ("<calc>1+2</calc>", []), schema
        closing = (tuple(tok.encode("</calc>", bos=False)),) if named else ()
        assert stop_sequences("tags", [schema], tok) == closing
    assert parse("tags", "<calc>1+2</calc>", [{"name": "calc", **CALC["function"]}])[1]  # bare


def test_templates_teach_their_format():
    from hf_tiny import LLAMA_TOOLS_TEMPLATE, QWEN_TEMPLATE, QWEN_TOOLS_TEMPLATE

    assert format_of(QWEN_TOOLS_TEMPLATE) == "hermes"
    assert format_of(LLAMA_TOOLS_TEMPLATE) == "llama"
    assert format_of(TOY_TEMPLATE) == format_of(None) == format_of(QWEN_TEMPLATE) == "tags"
    assert Turns(CharTokenizer()).format == "tags"


class CalcEnv:
    """A user's environment with native tools: each call is answered in the tool role (its id
    kept), a turn without calls is the answer."""

    tools = [CALC]
    seen: list = []

    def reset(self, row):
        return [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": row["prompt"]},
        ]

    def step(self, turn):
        CalcEnv.seen.append(turn)
        if turn.tool_calls:
            out = []
            for c in turn.tool_calls:
                expression = json.loads(c["function"]["arguments"])["expression"]
                a, b = expression.split("*")
                out.append(
                    {"role": "tool", "tool_call_id": c["id"], "content": str(int(a) * int(b))}
                )
            return out, 0.0, False, {}
        return "", float(turn.content.strip() == "84"), True, {"reason": "answered"}


@pytest.fixture(scope="module", params=["qwen_tools", "llama_tools"])
def tokenizers(request, tmp_path_factory):
    import transformers
    from hf_tiny import make_tokenizer_dir

    from minirl.hf.hf_tokenizer import HFTokenizer

    path = make_tokenizer_dir(tmp_path_factory.mktemp(request.param), style=request.param)
    return HFTokenizer.from_dir(path), transformers.AutoTokenizer.from_pretrained(path)


CONVERSATIONS = [
    [{"role": "user", "content": "What is 12*7?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 12*7?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "calc", "arguments": {"expression": "12*7"}},
                }
            ],
        },
        {"role": "tool", "content": "84"},
        {"role": "assistant", "content": "84"},
        {"role": "user", "content": "  thanks "},
    ],
]


@pytest.mark.reference
def test_tools_render_as_transformers_renders_them(tokenizers):
    mine, theirs = tokenizers
    for chat in CONVERSATIONS:
        for tools in (None, [CALC]):
            want = theirs.apply_chat_template(
                chat, tools=tools, tokenize=False, add_generation_prompt=True
            )
            assert mine.apply_chat_template(chat, True, tools=tools) == want


@pytest.mark.reference
def test_a_native_tool_call_episode_equals_transformers_rendering(tokenizers):
    """Turn 1 calls calc in the model's own format and ends with its EOS, the environment
    answers in the tool role, turn 2 answers: the episode's text is transformers' rendering of
    the structured conversation, its tokens the sampled ones plus the template's."""
    mine, theirs = tokenizers
    turns = Turns(mine)
    call = render_call(turns.format, "calc", {"expression": "12*7"})
    said = [mine.encode(call, bos=False, eos=True), mine.encode("84", bos=False, eos=True)]
    prompt = Prompt(5, "t", "What is 12*7?", np.ones(1, np.int32))
    engine = ScriptedEngine({5: said}, mine.eos_ids)
    CalcEnv.seen = []
    runner = EpisodeRunner(engine, lambda: FileEnv(CalcEnv), turns, EpisodeConfig(max_turns=3))
    (episode,) = runner.generate([Request(prompt, 0, 256)])
    assert episode.score.reward == 1.0 and episode.score.reason == "answered"
    assert [t.tool_calls[0]["function"] for t in CalcEnv.seen[:1]] == [
        {"name": "calc", "arguments": '{"expression": "12*7"}'}
    ]
    structured = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 12*7?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "calc", "arguments": {"expression": "12*7"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "84"},
    ]
    want = theirs.apply_chat_template(
        structured, tools=[CALC], tokenize=False, add_generation_prompt=True
    )
    eos = mine.decode([mine.eos_id], skip_special=False)
    spelled = mine.decode(
        np.concatenate([episode.prompt.tokens, episode.tokens]), skip_special=False
    )
    assert spelled == want + "84" + eos
    # token in, token out: the turns are the sampled tokens; only observations were encoded
    policy = episode.tokens[episode.mask > 0]
    assert policy.tolist() == np.concatenate(said).tolist()
    n1 = len(said[0])
    observation = episode.tokens[n1 : len(episode.tokens) - len(said[1])]
    assert (episode.mask[n1 : n1 + len(observation)] == 0).all()
    prompt_text = theirs.apply_chat_template(
        structured[:2], tools=[CALC], tokenize=False, add_generation_prompt=True
    )
    text_after_turn1 = mine.decode(
        np.concatenate([episode.prompt.tokens, said[0]]), skip_special=False
    )
    assert text_after_turn1 == prompt_text + call + eos
    assert observation.tolist() == mine.encode(want[len(text_after_turn1) :], bos=False).tolist()
