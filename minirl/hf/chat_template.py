"""Chat templates: a checkpoint's Jinja template turns a list of messages into the prompt text.

A chat model was trained on conversations laid out in one exact way (Qwen's ChatML
`<|im_start|>user\\n...<|im_end|>\\n`, Llama 3's header tokens, ...). The layout ships with the
checkpoint as a Jinja template: `chat_template` in `tokenizer_config.json`, or a
`chat_template.jinja` file beside it (what transformers 5 writes). Prompting the model any other
way puts it off its training distribution, so minirl renders prompts with that template,
`add_generation_prompt=True` (the text ends where the assistant's answer begins).

The rendering follows what `transformers` does, so the same messages give the same text
(tests/hf/test_chat_template.py compares with `apply_chat_template`): a sandboxed, immutable Jinja
environment with `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `tojson`
filter that keeps non-ASCII characters, and the globals `raise_exception` and `strftime_now`.
The template sees `messages`, `add_generation_prompt`, `tools` (a list of OpenAI function
schemas, `{"type": "function", "function": {"name", "description", "parameters"}}`, or None:
the model's native tool-calling prompt, e.g. Qwen's `<tools>` block or Llama 3.1's
"Given the following functions" message), the special-token strings (`bos_token`,
`eos_token`, `pad_token`, `unk_token`) and any keyword arguments given, as transformers'
`apply_chat_template(..., tools=..., **kwargs)` passes them (`data.chat_template_kwargs`, e.g.
Qwen3's `enable_thinking=False`, which writes an empty think block into the prompt). Messages
may carry what tool calling adds: an assistant message's `tool_calls` (its content may then be
None), a tool message's `tool_call_id` and `name`.

Simplified on purpose: no documents or assistant-token masks; the `{% generation %}` tag some
templates use to mark assistant text is accepted and renders its body unchanged.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """Messages the template cannot render, or a template that is not valid Jinja."""


class _Generation(Extension):
    """`{% generation %}...{% endgeneration %}`: renders its body (transformers uses the tag to
    find assistant tokens; minirl does not need them)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """The template compiled once (cached by its text)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ChatTemplateError(
            f"the chat template is not valid Jinja: {e} (line {e.lineno})"
        ) from None


def check_messages(messages) -> list[dict]:
    """A list of {"role": str, "content": str} dicts (an assistant message with `tool_calls` may
    have content None), or a ChatTemplateError saying what is off."""
    if not isinstance(messages, list | tuple) or not messages:
        raise ChatTemplateError(f"messages must be a non-empty list, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ChatTemplateError(f"message {i} is a {type(m).__name__}, not a dict")
        if not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"message {i} needs a string 'role'")
        calls = m.get("tool_calls")
        if not isinstance(m.get("content"), str) and not (m.get("content") is None and calls):
            raise ChatTemplateError(f"message {i} needs a string 'content'")
        if calls is not None and not isinstance(calls, list | tuple):
            raise ChatTemplateError(f"message {i}: 'tool_calls' must be a list")
        out.append(dict(m))
    return out


def check_tools(tools) -> list[dict] | None:
    """None, or a list of tool schemas (dicts); a ChatTemplateError otherwise."""
    if tools is None:
        return None
    if not isinstance(tools, list | tuple) or not all(isinstance(t, dict) for t in tools):
        raise ChatTemplateError("tools must be a list of JSON schemas (dicts)")
    return list(tools)


def render(
    source: str, messages, add_generation_prompt: bool = True, tools=None, **variables
) -> str:
    """`messages` laid out by the template `source`; `tools`: OpenAI function schemas (None =
    no tools); `variables`: the special tokens (bos_token=..., etc.) and any keyword the
    template reads (`enable_thinking=False`)."""
    template = compile_template(source)
    try:
        return template.render(
            messages=check_messages(messages),
            tools=check_tools(tools),
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except jinja2.exceptions.TemplateError as e:  # raise_exception(...) or a sandbox refusal
        raise ChatTemplateError(f"the chat template refused these messages: {e}") from None
    except Exception as e:  # the template's own code failed (e.g. a str + int): its bug, named
        raise ChatTemplateError(
            f"the chat template failed on these messages: {type(e).__name__}: {e}"
        ) from None
