"""The OpenAI wire format the endpoint speaks: request bodies in, response bodies out.

    call = chat_call(body, sampling)        # a checked /v1/chat/completions request, or APIError
    call = completion_call(body, sampling)  # a checked /v1/completions request
    chat_response(...), completion_response(...), stream_chunks(...)   the answers
    APIError(400, "...", param="n").body()  {"error": {"message", "type", "param", "code"}}

What is honoured: `messages` (system, user, assistant with `tool_calls`, tool), `tools` (function
schemas), `tool_choice` ("auto", "none"), `n`, `max_tokens` / `max_completion_tokens`, `stop`
(up to 4 strings), `logprobs` (the sampled token's log-prob under the distribution it was drawn
from), `stream` (the whole answer as server-sent events once it is done), and for completions
`prompt` as text or token ids. What is refused with a 400 body naming the parameter, because
minirl cannot do it and a silent no would change what the agent believes it got:
`temperature` / `top_p` other than the run's (the trainer scores tokens under the engine's one
sampling distribution: set engine.temperature instead), `top_logprobs` > 0 (the engine keeps only
the sampled token's log-prob), `tool_choice` "required" or a named function (no constrained
decoding), penalties, `logit_bias`, `response_format` other than text, `echo`, `best_of`,
`suffix`. `model`, `user`, `seed`, `metadata` and `parallel_tool_calls` are accepted and change
nothing (every call is sampled with the episode's counter-based keys: already reproducible).

Simplified on purpose: no audio, images or content parts other than text; streaming sends the
finished answer, not token by token.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

MAX_N = 16
MAX_STOP = 4
_TYPES = {400: "invalid_request_error", 404: "not_found_error", 409: "conflict_error"}
_REFUSED = {  # parameter: (value that changes nothing, why minirl cannot honour another)
    "top_logprobs": (0, "the engine keeps only the sampled token's log-prob"),
    "presence_penalty": (0, "the engine samples from the policy's own distribution"),
    "frequency_penalty": (0, "the engine samples from the policy's own distribution"),
    "logit_bias": ({}, "the engine samples from the policy's own distribution"),
    "echo": (False, "the prompt's log-probs are not computed"),
    "best_of": (1, "use n"),
    "suffix": (None, "no infilling"),
}


class APIError(Exception):
    """A request the endpoint answers with an OpenAI-style error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = _TYPES.get(
            self.status, "server_error" if self.status >= 500 else "invalid_request_error"
        )
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        }


@dataclasses.dataclass(frozen=True)
class Call:
    """One checked request: what the episode runner needs of it."""

    kind: str  # "chat" | "completion"
    messages: list[dict] | None  # chat
    prompt: str | list[int] | None  # completion
    tools: list[dict] | None
    parse_tools: bool  # tool_choice != "none": read tool calls from the answer
    n: int
    max_tokens: int | None
    stop: tuple[str, ...]
    logprobs: bool
    stream: bool
    model: str


def _get(body: dict, name: str, types, default=None):
    """body[name] checked to be of `types` (a bool is not a number here); `default` if absent."""
    value = body.get(name)
    if value is None:
        return default
    allowed = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        raise APIError(400, f"'{name}' has the wrong type ({type(value).__name__})", name)
    return value


def _common(body: dict, sampling) -> dict:
    """The sampling parameters chat and completions share, checked."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    for name, (neutral, why) in _REFUSED.items():
        if body.get(name, neutral) not in (neutral, None):
            raise APIError(400, f"'{name}' is not supported: {why}", name)
    for name, have, knob in (
        ("temperature", sampling.temperature, "engine.temperature"),
        ("top_p", sampling.top_p, "engine.top_p"),
    ):
        value = _get(body, name, (int, float))
        if value is not None and not math.isclose(float(value), have):
            raise APIError(
                400,
                f"'{name}'={value}: this endpoint samples at the run's {knob}={have} (the trainer "
                f"scores every token under the distribution it was drawn from); omit it, or set "
                f"{knob}",
                name,
            )
    n = _get(body, "n", int, 1)
    if not 1 <= n <= MAX_N:
        raise APIError(400, f"'n' must be in [1, {MAX_N}], got {n}", "n")
    max_tokens = _get(body, "max_completion_tokens", int) or _get(body, "max_tokens", int)
    if max_tokens is not None and max_tokens < 1:
        raise APIError(400, f"'max_tokens' must be >= 1, got {max_tokens}", "max_tokens")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOP
        or not all(isinstance(s, str) and s for s in stop)
    ):
        raise APIError(
            400, f"'stop' must be a string or up to {MAX_STOP} non-empty strings", "stop"
        )
    model = _get(body, "model", str, "")
    stream = _get(body, "stream", bool, False)
    return dict(n=n, max_tokens=max_tokens, stop=tuple(stop), stream=stream, model=model)


def _message(i: int, m) -> dict:
    """A request message as the template reads it: content as text (text parts joined)."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise APIError(
            400, f"messages[{i}] must be an object with a string 'role'", f"messages[{i}]"
        )
    content = m.get("content")
    if isinstance(content, list):
        if not all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        ):
            raise APIError(
                400,
                f"messages[{i}]: only text content parts are supported",
                f"messages[{i}].content",
            )
        content = "".join(p["text"] for p in content)
    calls = m.get("tool_calls") or None
    if content is None and not (m["role"] == "assistant" and calls):
        raise APIError(400, f"messages[{i}] ({m['role']}) has no content", f"messages[{i}].content")
    if content is not None and not isinstance(content, str):
        raise APIError(400, f"messages[{i}].content must be text", f"messages[{i}].content")
    if calls is not None and not isinstance(calls, list):
        raise APIError(400, f"messages[{i}].tool_calls must be a list", f"messages[{i}].tool_calls")
    out = {"role": m["role"], "content": content}
    out.update({k: m[k] for k in ("tool_call_id", "name") if isinstance(m.get(k), str)})
    if calls:
        out["tool_calls"] = calls
    return out


def chat_call(body: dict, sampling) -> Call:
    """A /v1/chat/completions body, checked (APIError names what is wrong)."""
    common = _common(body, sampling)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty list", "messages")
    messages = [_message(i, m) for i, m in enumerate(messages)]
    tools = body.get("tools") or None
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise APIError(400, "'tools' must be a list of function schemas", "tools")
    choice = body.get("tool_choice", "auto")
    if choice not in ("auto", "none"):
        raise APIError(
            400,
            "'tool_choice' must be 'auto' or 'none': forcing a call needs constrained decoding, "
            "which minirl's engine does not do",
            "tool_choice",
        )
    if body.get("response_format", {"type": "text"}) not in ({"type": "text"}, None):
        raise APIError(400, "'response_format' other than text is not supported", "response_format")
    logprobs = _get(body, "logprobs", bool, False)
    return Call("chat", messages, None, tools, choice == "auto", logprobs=logprobs, **common)


def completion_call(body: dict, sampling) -> Call:
    """A /v1/completions body, checked: `prompt` is text or a list of token ids."""
    common = _common(body, sampling)
    prompt = body.get("prompt")
    ids = (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    )
    if not (isinstance(prompt, str) and prompt) and not ids:
        raise APIError(
            400, "'prompt' must be non-empty text or a list of token ids (one prompt)", "prompt"
        )
    logprobs = _get(body, "logprobs", int)
    if logprobs not in (None, 0, 1):
        raise APIError(
            400, "'logprobs' must be 0 or 1: the engine keeps only the sampled token's", "logprobs"
        )
    return Call("completion", None, prompt, None, False, logprobs=logprobs is not None, **common)


@dataclasses.dataclass
class Choice:
    """One answer of a call: what the model said and how the endpoint reports it."""

    tokens: Any  # np.ndarray [C] int32, as sampled
    logprobs: Any  # [C] float32
    versions: Any  # [C] int32
    finish: str  # "stop" | "length" | "tool_calls"
    spelled: str  # the text its tokens spell (special tokens kept)
    content: str  # what is reported (no final EOS, no stop string, no tool-call text)
    raw: str  # its message content in the history (no final EOS): what the template renders
    tool_calls: list[dict]
    pieces: list[str]  # the text of each token (logprobs)
    routes: Any = None  # MoE: the experts of every position of its request

    def message(self) -> dict:
        out = {"role": "assistant", "content": self.content or (None if self.tool_calls else "")}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


def _logprobs(choice: Choice) -> dict:
    content = [
        {"token": t, "logprob": float(lp), "bytes": list(t.encode()), "top_logprobs": []}
        for t, lp in zip(choice.pieces, choice.logprobs, strict=True)
    ]
    return {"content": content}


def chat_response(call: Call, call_id: str, choices: list[Choice], prompt_tokens: int) -> dict:
    return {
        "id": call_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": call.model or "minirl",
        "choices": [
            {
                "index": i,
                "message": c.message(),
                "finish_reason": c.finish,
                "logprobs": _logprobs(c) if call.logprobs else None,
            }
            for i, c in enumerate(choices)
        ],
        "usage": _usage(prompt_tokens, choices),
    }


def completion_response(
    call: Call, call_id: str, choices: list[Choice], prompt_tokens: int
) -> dict:
    def logprobs(c: Choice):
        offsets = [sum(len(p) for p in c.pieces[:k]) for k in range(len(c.pieces))]
        lps = [float(x) for x in c.logprobs]
        return {
            "tokens": c.pieces,
            "token_logprobs": lps,
            "top_logprobs": None,
            "text_offset": offsets,
        }

    return {
        "id": call_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": call.model or "minirl",
        "choices": [
            {
                "index": i,
                "text": c.content,
                "finish_reason": c.finish,
                "logprobs": logprobs(c) if call.logprobs else None,
            }
            for i, c in enumerate(choices)
        ],
        "usage": _usage(prompt_tokens, choices),
    }


def _usage(prompt_tokens: int, choices: list[Choice]) -> dict:
    completion = sum(len(c.tokens) for c in choices)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def stream_chunks(response: dict) -> list[dict]:
    """A finished response as the chunks of a stream (server-sent events carry each)."""
    chat = response["object"] == "chat.completion"
    base = {k: response[k] for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk" if chat else "text_completion"
    chunks = []
    for c in response["choices"]:
        if not chat:
            chunks.append({**base, "choices": [{**c}]})
            continue
        m, i = c["message"], c["index"]
        delta = {"role": "assistant", "content": m["content"] or ""}
        chunks.append(
            {
                **base,
                "choices": [
                    {"index": i, "delta": delta, "logprobs": c["logprobs"], "finish_reason": None}
                ],
            }
        )
        if m.get("tool_calls"):
            calls = [{"index": k, **call} for k, call in enumerate(m["tool_calls"])]
            chunks.append(
                {
                    **base,
                    "choices": [
                        {"index": i, "delta": {"tool_calls": calls}, "finish_reason": None}
                    ],
                }
            )
        chunks.append(
            {**base, "choices": [{"index": i, "delta": {}, "finish_reason": c["finish_reason"]}]}
        )
    return chunks


def models(name: str) -> dict:
    """The /v1/models list: the one model the endpoint serves."""
    return {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": 0, "owned_by": "minirl"}],
    }
