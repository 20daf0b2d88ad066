"""An episode's conversation as text and tokens: rendered once per turn, checked append-only.

The rule (token in, token out): the tokens of an episode are the prompt's, then each turn's
tokens exactly as the engine sampled them, then each observation's tokens — and nothing is
ever decoded and encoded again. Observations still need the chat template's turn markers
(`<|im_end|>\\n<|im_start|>user\\n...`), so after each turn the whole conversation is rendered
once and compared with the text the episode's tokens already spell:

    before = the episode's text (prompt text + decoded turns + earlier observation texts)
    after  = template(messages + [assistant turn, observation], add_generation_prompt=True)
    after must start with before     -> the observation's tokens are encode(after[len(before):])
    otherwise                        -> ValueError naming the first differing character

The comparison is on text, not on tokens, on purpose: re-encoding a sampled turn may give other
tokens than the ones sampled (a tokenizer has many spellings of one string), which is exactly
the drift this check exists to keep out of the trainer's data. A template that rewrites earlier
turns (one that drops past reasoning, trims or reformats old messages: verl #6501, TRL #5224)
fails the check at the first turn it rewrites, with a clear error, instead of silently training
on tokens the policy never produced.

A turn's message content is its decoded text (special tokens kept as text) without a final EOS
token: the template writes its own end-of-turn marker. A turn that ended on a stop sequence (a
tool call's closing tag) has no EOS; the template's marker then opens the observation (mask 0).

Tools (OpenAI function schemas) go to the template as its `tools` variable, so the model sees
them in its own format; `parse` reads a turn's tool calls in the format the template teaches
(minirl/envs/tool_calls.py: Qwen's <tool_call> blocks, Llama 3.1's JSON, minirl's tags).
A turn's message in the history stays its text as sampled (the calls as the model wrote them),
never a re-rendering of the parsed calls: that keeps the history append-only.

Checkpoint tokenizers use their own chat template; the character tokenizer of the built-in tasks
has none, so `TOY_TEMPLATE` lays turns out plainly: the user's text, the assistant's text, and
each tool output as `\\n= output\\n`. Observations are lower-cased for the character tokenizer
and characters it cannot encode become '?' (`Turns.clean`): a tool may print anything.
"""

from __future__ import annotations

import numpy as np

from minirl.envs.tool_calls import Turn, format_of, parse
from minirl.hf.chat_template import render

TOY_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}{{ '\\n= ' + m.content + '\\n' }}"
    "{%- else -%}{{ m.content }}{%- endif -%}"
    "{%- endfor -%}"
)


def appended(before: str, after: str, parts: list[tuple[int, str]] = ()) -> str:
    """What `after` adds to `before`; ValueError if `after` does not start with `before` (the
    template is not append-only), naming the first differing character and the part of the
    episode it lies in (`parts`: (first character, label) of each part, in order)."""
    if after.startswith(before):
        return after[len(before) :]
    i = next((k for k, (a, b) in enumerate(zip(before, after, strict=False)) if a != b), None)
    i = min(len(before), len(after)) if i is None else i
    where = [label for start, label in parts if start <= i][-1:]
    raise ValueError(
        f"the chat template is not append-only: its new rendering differs from the episode's "
        f"tokens at character {i}{' (in ' + where[0] + ')' if where else ''}: "
        f"{before[max(i - 20, 0) : i + 20]!r} became "
        f"{after[max(i - 20, 0) : i + 20]!r}. minirl trains on the tokens as sampled, so a "
        "template that rewrites earlier turns cannot lay out multi-turn episodes; use one that "
        "renders past turns verbatim"
    )


def as_messages(value, role: str) -> list[dict]:
    """What an environment hands over as chat messages: text (one message in `role`), a message
    dict ({"role": str, "content": str, ...}), or a non-empty list of them; ValueError else."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list | tuple) or not items:
        raise ValueError(f"expected text or chat messages, got {type(value).__name__}")
    for i, m in enumerate(items):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)):
            raise ValueError(f"message {i} is not a dict with a string 'role'")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} ({m['role']}) has no string 'content'")
    return [dict(m) for m in items]


class Turns:
    """Renders an episode's messages and encodes what each turn appends (module docstring).

    `template`: a Jinja chat template; None = the tokenizer's own, or `TOY_TEMPLATE` for a
    tokenizer without one (the character tokenizer)."""

    def __init__(self, tokenizer, template: str | None = None, max_observation_chars: int = 256):
        self.tokenizer = tokenizer
        own = template is None and tokenizer.chat_template is not None
        self.template = None if own else template or TOY_TEMPLATE  # None: the tokenizer's
        self.bos = not own  # a checkpoint's template writes its own BOS text
        self.max_observation_chars = max_observation_chars
        self.format = format_of(tokenizer.chat_template if own else self.template)  # tool calls
        ids = {"eos_token": tokenizer.eos_id, "bos_token": tokenizer.bos_id}
        self.special = {
            k: tokenizer.decode([i], skip_special=False) for k, i in ids.items() if i is not None
        }

    def render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The conversation laid out, ending where the assistant's next turn begins; `tools`
        (OpenAI function schemas) as the template shows them (its `tools` variable)."""
        if self.template is None:
            return self.tokenizer.apply_chat_template(messages, True, tools=tools)
        return render(self.template, messages, True, tools=tools, **self.special)

    def first(self, first, tools: list[dict] | None = None) -> tuple[str, np.ndarray]:
        """The prompt of an episode that starts with `first` (the user's text, or a list of
        messages: `as_messages`): (its text, its tokens)."""
        text = self.render(as_messages(first, "user"), tools)
        return text, self.tokenizer.encode(text, bos=self.bos)

    def turn(self, tokens: np.ndarray) -> tuple[str, str]:
        """A sampled turn -> (the text its tokens spell, its message content: no final EOS)."""
        tokens = np.asarray(tokens)
        spelled = self.tokenizer.decode(tokens, skip_special=False)
        ends = len(tokens) and int(tokens[-1]) in self.tokenizer.eos_ids
        content = self.tokenizer.decode(tokens[:-1] if ends else tokens, skip_special=False)
        return spelled, content

    def parse(self, text: str, tools: list[dict] | None = None) -> Turn:
        """A turn's text (special tokens dropped) with the tool calls in it, read in the format
        the template teaches (minirl/envs/tool_calls.py)."""
        content, calls = parse(self.format, text, tools)
        return Turn(text, content, calls)

    def ends_conversation(self, token: int) -> bool:
        """Did a turn that ended on `token` end the conversation? Yes for an EOS id the template
        cannot write (Qwen's <|endoftext|>, Llama's <|end_of_text|>: the tokenizer's other EOS
        ids; any EOS for a template without `eos_token`, such as TOY_TEMPLATE): the rendering
        after it could not continue the episode's text."""
        ids = self.tokenizer.eos_ids
        silent = self.template is not None and "eos_token" not in self.template
        return token in ids[1:] or (silent and token == ids[0])

    def clean(self, observation: str) -> str:
        """An observation the tokenizer can encode, at most `max_observation_chars` long."""
        text = str(observation)[: self.max_observation_chars]
        alphabet = getattr(self.tokenizer, "alphabet", None)  # the character tokenizer's
        if alphabet is not None:
            text = "".join(ch if ch in alphabet else "?" for ch in text.lower())
        return text

    def observation(self, before: str, messages: list[dict], parts=(), tools=None) -> str:
        """The text the rendering of `messages` appends to the episode's text `before`."""
        return appended(before, self.render(messages, tools), parts)

    def encode(self, text: str) -> np.ndarray:
        return self.tokenizer.encode(text, bos=False)
