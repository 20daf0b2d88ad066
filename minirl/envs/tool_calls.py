"""The model's own tool calls: read from a turn in the format its chat template teaches.

Tools are declared as OpenAI function schemas, `{"type": "function", "function": {"name",
"description", "parameters": <JSON schema>}}` (the bare `{"name", ...}` form too); the chat
template shows them to the model (minirl/hf/chat_template.py, `tools=`), and the model answers
with calls in its family's own format. `format_of(template)` tells which:

  hermes   Qwen2.5 / Qwen3 (and Hermes-style templates): any number of
           `<tool_call>\\n{"name": "calc", "arguments": {"expression": "1+2"}}\\n</tool_call>`
           blocks, text before them is the message's content; the turn ends with <|im_end|>
  llama    Llama 3.1 / 3.2 / 3.3 JSON tool calling: the whole turn is one
           `{"name": "calc", "parameters": {"expression": "1+2"}}` (after an optional
           <|python_tag|>); the turn ends with <|eot_id|>
  tags     minirl's own, for templates that know no tools (the character tokenizer's
           TOY_TEMPLATE): a turn ending in `<calc>1+2</calc>` calls `calc` with its one
           parameter set to "1+2" (lesson 14's format); the closing tag ends the turn

`parse(fmt, text, tools) -> (content, calls)` gives the calls in OpenAI's form, `{"id",
"type": "function", "function": {"name", "arguments": <JSON text>}}`, ids `call_<k>` (the
caller may rename them). Text that looks like a call but is not valid JSON with a name and an
object of arguments stays content (never an error: it is what the model wrote).
`render_call(fmt, name, arguments)` is the text a model writes for a call, as the template
renders one (`tool_call.arguments | tojson`): what warm-start demonstrations say, so that the
episode a template renders for a structured call and the episode the model samples are the same
characters (tests/envs/test_tool_calls.py checks both against transformers).

`Turn` is what an environment's `step` is handed: the turn's text (a `str`, so string tests
keep working) that also carries `.content` and `.tool_calls`.

Simplified on purpose: no streaming parse; Llama's built-in tools (brave_search,
wolfram_alpha, code_interpreter with <|python_tag|> code) and several JSON calls in one Llama
turn are not parsed; `tool_choice` cannot force a call (no constrained decoding).
"""

from __future__ import annotations

import json
import re

FORMATS = ("hermes", "llama", "tags")
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class Turn(str):
    """An assistant turn's text, with the tool calls read from it (`tool_calls`, OpenAI's form;
    [] if none) and the rest of its text (`content`)."""

    content: str
    tool_calls: list[dict]

    def __new__(cls, text: str, content: str | None = None, tool_calls=()):
        turn = super().__new__(cls, text)
        turn.content = text if content is None else content
        turn.tool_calls = list(tool_calls)
        return turn


def format_of(template: str | None) -> str:
    """Which format a chat template (its Jinja source; None = minirl's TOY_TEMPLATE) teaches."""
    if template and "<tool_call>" in template:
        return "hermes"
    if template and '"parameters": ' in template:
        return "llama"
    return "tags"


def _field(value, key: str):
    """value[key] if `value` is a dict, else None: tool schemas come from your code or an HTTP
    request, and a schema of the wrong shape declares no tool rather than stopping the run."""
    return value.get(key) if isinstance(value, dict) else None


def tool_name(schema: dict) -> str | None:
    """The function name of a tool schema (OpenAI's nested form or the bare one)."""
    name = _field(_field(schema, "function") or schema, "name")
    return name if isinstance(name, str) else None


def only_parameter(schema: dict | None) -> str | None:
    """The name of a tool's parameter when it has exactly one (what a `tags` call sets)."""
    inner = _field(schema, "function") or schema
    properties = _field(_field(inner, "parameters"), "properties")
    return next(iter(properties)) if isinstance(properties, dict) and len(properties) == 1 else None


def call(k: int, name: str, arguments: dict) -> dict:
    """One tool call in OpenAI's form (arguments as JSON text, as OpenAI sends them)."""
    text = json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{k}", "type": "function", "function": {"name": name, "arguments": text}}


def _named(obj, key: str) -> tuple[str, dict] | None:
    """(name, arguments) of a decoded call object, or None if it is not one."""
    if isinstance(obj, dict) and isinstance(obj.get("name"), str):
        arguments = obj.get(key, obj.get("arguments"))
        if isinstance(arguments, dict):
            return obj["name"], arguments
    return None


def _loads(text: str):
    """The JSON value of `text`, or None (not JSON; nested too deep for the parser)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def parse(fmt: str, text: str, tools: list[dict] | None = None) -> tuple[str, list[dict]]:
    """(content, tool calls) of a turn's text (special tokens dropped) in format `fmt`."""
    if fmt == "hermes":
        found = [(m, _named(_loads(m.group(1)), "arguments")) for m in _HERMES.finditer(text)]
        found = [(m, c) for m, c in found if c is not None]
        if not found:
            return text, []
        calls = [call(k, *c) for k, (_, c) in enumerate(found)]
        return text[: found[0][0].start()].rstrip(), calls
    if fmt == "llama":
        body = text.strip().removeprefix("<|python_tag|>").strip()
        named = _named(_loads(body), "parameters") if body.startswith("{") else None
        return (text, []) if named is None else ("", [call(0, *named)])
    if fmt != "tags":
        raise ValueError(f"unknown tool-call format {fmt!r}; one of {FORMATS}")
    stripped = text.rstrip()
    for schema in tools or []:
        name, parameter = tool_name(schema), only_parameter(schema)
        opened, closed = f"<{name}>", f"</{name}>"
        if name and parameter and stripped.endswith(closed) and opened in stripped:
            start = stripped.rindex(opened)
            argument = stripped[start + len(opened) : -len(closed)]
            return stripped[:start].rstrip(), [call(0, name, {parameter: argument})]
    return text, []


def render_call(fmt: str, name: str, arguments: dict) -> str:
    """The text of one call as the format's template renders it (`tojson` of the arguments)."""
    args = json.dumps(arguments, ensure_ascii=False)
    if fmt == "hermes":
        return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
    if fmt == "llama":
        return f'{{"name": "{name}", "parameters": {args}}}'
    (value,) = arguments.values()  # tags: the tool's one parameter
    return f"<{name}>{value}</{name}>"


def stop_sequences(fmt: str, tools: list[dict] | None, tokenizer) -> tuple[tuple[int, ...], ...]:
    """Token sequences that end a turn after a call: the closing tags of the `tags` format (the
    other formats end a call's turn with the template's own end-of-turn token)."""
    if fmt != "tags":
        return ()
    names = [tool_name(t) for t in tools or [] if tool_name(t)]
    return tuple(tuple(tokenizer.encode(f"</{n}>", bos=False).tolist()) for n in names)
