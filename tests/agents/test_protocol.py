"""The OpenAI wire format (minirl/agents/protocol.py), without a server: what a request may ask,
what is refused with which error body, and the shapes of answers and streams."""

import numpy as np
import pytest

from minirl.agents.protocol import (
    APIError,
    Choice,
    chat_call,
    chat_response,
    completion_call,
    completion_response,
    stream_chunks,
)
from minirl.modeling.sampling import Sampling

RUN = Sampling(temperature=1.0, top_p=1.0)
USER = [{"role": "user", "content": "1+2="}]


def refused(call, body, param, words):
    with pytest.raises(APIError) as e:
        call(body, RUN)
    assert e.value.status == 400 and e.value.param == param, e.value.body()
    assert words in e.value.message
    body = e.value.body()["error"]
    assert body["type"] == "invalid_request_error" and body["param"] == param


def test_a_chat_call_reads_what_it_may_ask():
    call = chat_call(
        {
            "model": "anything",
            "messages": [
                {
                    "role": "system",
                    "content": [
                        {"type": "text", "text": "Be "},
                        {"type": "text", "text": "brief."},
                    ],
                },
                {"role": "user", "content": "1+2="},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {}}]},
                {"role": "tool", "tool_call_id": "c", "content": "3", "extra": 1},
            ],
            "tools": [{"type": "function", "function": {"name": "calc"}}],
            "tool_choice": "none",
            "n": 3,
            "max_completion_tokens": 7,
            "stop": "\n",
            "logprobs": True,
            "temperature": 1,
            "top_p": 1.0,
            "seed": 5,
            "user": "u",
            "stream": True,
            "parallel_tool_calls": True,
        },
        RUN,
    )
    assert call.messages[0] == {"role": "system", "content": "Be brief."}
    assert call.messages[3] == {"role": "tool", "content": "3", "tool_call_id": "c"}
    assert (call.n, call.max_tokens, call.stop, call.logprobs, call.stream) == (
        3,
        7,
        ("\n",),
        True,
        True,
    )
    assert call.parse_tools is False and call.model == "anything" and len(call.tools) == 1
    plain = chat_call({"messages": USER}, RUN)
    assert (plain.n, plain.max_tokens, plain.stop, plain.tools, plain.parse_tools) == (
        1,
        None,
        (),
        None,
        True,
    )


@pytest.mark.parametrize(
    "change, param, words",
    [
        ({"temperature": 0.7}, "temperature", "engine.temperature=1.0"),
        ({"top_p": 0.9}, "top_p", "engine.top_p=1.0"),
        ({"top_logprobs": 2}, "top_logprobs", "only the sampled token's log-prob"),
        ({"presence_penalty": 0.5}, "presence_penalty", "not supported"),
        ({"logit_bias": {"1": 5}}, "logit_bias", "not supported"),
        ({"n": 0}, "n", "must be in [1, 16]"),
        ({"n": 17}, "n", "must be in [1, 16]"),
        ({"n": True}, "n", "wrong type"),
        ({"max_tokens": 0}, "max_tokens", ">= 1"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "up to 4"),
        ({"stop": [""]}, "stop", "non-empty"),
        ({"tool_choice": "required"}, "tool_choice", "constrained decoding"),
        (
            {"tool_choice": {"type": "function", "function": {"name": "calc"}}},
            "tool_choice",
            "'auto' or 'none'",
        ),
        ({"response_format": {"type": "json_object"}}, "response_format", "not supported"),
        ({"messages": []}, "messages", "non-empty list"),
        ({"messages": [{"content": "x"}]}, "messages[0]", "string 'role'"),
        ({"messages": [{"role": "user"}]}, "messages[0].content", "no content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
            "only text",
        ),
        ({"tools": [1]}, "tools", "function schemas"),
        ({"logprobs": 1}, "logprobs", "wrong type"),
    ],
)
def test_what_a_chat_call_may_not_ask_is_a_400_naming_it(change, param, words):
    refused(chat_call, {"messages": USER, **change}, param, words)


def test_a_completion_call():
    text = completion_call({"prompt": "1+2=", "logprobs": 1, "echo": False}, RUN)
    assert text.prompt == "1+2=" and text.logprobs and text.kind == "completion"
    ids = completion_call({"prompt": [1, 2, 3]}, RUN)
    assert ids.prompt == [1, 2, 3] and not ids.logprobs
    refused(completion_call, {"prompt": ""}, "prompt", "non-empty text")
    refused(completion_call, {"prompt": ["a", "b"]}, "prompt", "token ids")
    refused(completion_call, {"prompt": "x", "logprobs": 5}, "logprobs", "0 or 1")
    refused(completion_call, {"prompt": "x", "echo": True}, "echo", "not supported")
    with pytest.raises(APIError, match="JSON object"):
        completion_call([1], RUN)


def _choice(content="3", calls=()):
    tokens = np.array([5, 6], np.int32)
    return Choice(
        tokens,
        np.array([-0.5, -1.0], np.float32),
        np.zeros(2, np.int32),
        "tool_calls" if calls else "stop",
        "3<eos>",
        content,
        "3",
        list(calls),
        ["3", "<eos>"],
    )


def test_answers_and_streams_have_openais_shape():
    call = chat_call({"messages": USER, "logprobs": True, "model": "m"}, RUN)
    calls = [{"id": "call_0", "type": "function", "function": {"name": "calc", "arguments": "{}"}}]
    body = chat_response(call, "chatcmpl-1", [_choice(), _choice("", calls)], 10)
    assert body["object"] == "chat.completion" and body["model"] == "m"
    first, second = body["choices"]
    assert (
        first["message"] == {"role": "assistant", "content": "3"}
        and first["finish_reason"] == "stop"
    )
    assert [x["logprob"] for x in first["logprobs"]["content"]] == [-0.5, -1.0]
    assert second["message"] == {"role": "assistant", "content": None, "tool_calls": calls}
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
    chunks = stream_chunks(body)
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 5
    assert chunks[3]["choices"][0]["delta"]["tool_calls"][0]["index"] == 0
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [
        None,
        "stop",
        None,
        None,
        "tool_calls",
    ]
    text = completion_response(
        completion_call({"prompt": "x", "logprobs": 1}, RUN), "c", [_choice()], 3
    )
    lp = text["choices"][0]["logprobs"]
    assert (
        text["choices"][0]["text"] == "3"
        and lp["tokens"] == ["3", "<eos>"]
        and lp["text_offset"] == [0, 1]
    )
    assert APIError(409, "busy").body()["error"]["type"] == "conflict_error"
