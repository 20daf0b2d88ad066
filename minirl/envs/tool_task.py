"""A built-in task as a multi-turn episode with tools: call a tool, read its output, answer.

    env = ToolTaskEnv(countdown_task, [Calculator()])
    env.reset(prompt)                      -> prompt.text  ("3 5 7 -> 22:")
    env.step("<calc>3*5+7</calc>")         -> Step("22", 0.0, False)     a tool call
    env.step("3*5+7")                      -> Step("", 1.0, True)        the answer, scored

A turn is a tool call when it ends with a call `<name>argument</name>` (closing tags are the
engine's stop sequences, `stop_sequences(tools, tokenizer)`, so a turn ends right after its
call); the tool's output is the observation. Any other turn is the final answer: the task's own
verifier scores it (reward 1.0 for a correct countdown expression, ...) and the episode ends.
Tools are shown nothing but their argument, and answer errors as text (minirl/envs/base.py).

Warm start: `demonstration_episode` lays a task's demonstration out exactly as EpisodeRunner
lays out an episode — with a tool the task knows how to use (`task.tool_demonstration(prompt)`,
e.g. arithmetic's one calculator call), the call, its output (mask 0) and the answer turn;
otherwise the task's own demonstration as one turn — so supervised steps teach the format the
RL episodes will have.

`demonstration_turns` is the same demonstration as turns alone (the call, the answer), for a
scripted policy (minirl/envs/scripted.py) to say to your own environment or agent: the warm
start of `--env` / `--agent` runs, whose episodes only your code knows how to lay out.

Why countdown with a calculator: the task is to hit a target with + - * / over given numbers;
a calculator lets the model test a candidate before committing — the reason agents use tools.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from minirl.envs.base import Step, Tool
from minirl.types import Prompt, Rollout, Score


def stop_sequences(tools: Sequence[Tool], tokenizer) -> tuple[tuple[int, ...], ...]:
    """The engine's stop sequences that end a turn after a tool call: each closing tag."""
    return tuple(tuple(tokenizer.encode(f"</{t.name}>", bos=False).tolist()) for t in tools)


class ToolTaskEnv:
    """A `Task` (its prompts and verifier) with `tools`; one instance per episode."""

    def __init__(self, task, tools: Sequence[Tool]):
        self.task, self.by_name = task, {t.name: t for t in tools}
        self.prompt: Prompt | None = None

    def reset(self, prompt: Prompt) -> str:
        self.prompt = prompt
        return prompt.text

    def step(self, turn_text: str) -> Step:
        call = self._call(turn_text)
        if call is not None:
            name, argument = call
            return Step(self.by_name[name](argument), 0.0, False, {"reason": f"called {name}"})
        empty = np.zeros(0, np.int32)
        answer = Rollout(self.prompt, 0, empty, empty.astype(np.float32), empty, "eos")
        answer.text = turn_text
        score = self.task.verifier.score([answer])[0]
        return Step("", score.reward, True, {"reason": score.reason})

    def _call(self, text: str) -> tuple[str, str] | None:
        """(tool name, argument) if `text` ends with a call `<name>argument</name>`."""
        text = text.rstrip()
        for name in self.by_name:
            open_tag, close_tag = f"<{name}>", f"</{name}>"
            if text.endswith(close_tag) and open_tag in text:
                start = text.rindex(open_tag) + len(open_tag)
                return name, text[start : -len(close_tag)]
        return None


def demonstration_episode(task, prompt: Prompt, turns, tools: Sequence[Tool], sample: int = 0):
    """One demonstration episode as a Rollout (module docstring): the prompt rendered as an
    episode's first message, then [call, observation (mask 0), answer + EOS] when the task has a
    tool demonstration for one of `tools`, else [the task's demonstration + EOS]."""
    tok, by_name = turns.tokenizer, {t.name: t for t in tools}
    text, prompt_tokens = turns.first(prompt.text)
    prompt = dataclasses.replace(prompt, tokens=prompt_tokens)
    demo = getattr(task, "tool_demonstration", None)
    name, argument, answer = demo(prompt) if demo is not None else (None, "", "")
    if name not in by_name:  # one turn: the task's own demonstration
        parts = [tok.encode(task.demonstration(prompt, sample=sample), bos=False, eos=True)]
        policy = [1.0]
    else:  # call, observation (the template's markers and the tool's output), answer
        call = f"<{name}>{argument}</{name}>"
        messages = [
            {"role": "user", "content": prompt.text},
            {"role": "assistant", "content": call},
            {"role": "tool", "content": turns.clean(by_name[name](argument))},
        ]
        observation = turns.encode(turns.observation(text + call, messages))
        parts = [tok.encode(call, bos=False), observation, tok.encode(answer, bos=False, eos=True)]
        policy = [1.0, 0.0, 1.0]
    tokens = np.concatenate(parts).astype(np.int32)
    mask = np.concatenate(
        [np.full(len(p), m, np.float32) for p, m in zip(parts, policy, strict=True)]
    )
    zeros = np.zeros(len(tokens), np.float32)
    return Rollout(
        prompt, 0, tokens, zeros, zeros.astype(np.int32), "eos", score=Score(0.0), mask=mask
    )


def demonstration_turns(task, prompt: Prompt, turns, sample: int = 0) -> list[np.ndarray]:
    """A task's demonstration as the policy's turns: [the call `<name>argument</name>`, the
    answer + EOS] when the task has a tool demonstration and the template knows no tool calling
    of its own (the `tags` format of minirl/envs/tool_calls.py, whose call needs no parameter
    name), else [the task's demonstration + EOS]."""
    tok = turns.tokenizer
    demo = getattr(task, "tool_demonstration", None)
    if demo is not None and turns.format == "tags":
        name, argument, answer = demo(prompt)
        call = tok.encode(f"<{name}>{argument}</{name}>", bos=False)
        return [call, tok.encode(answer, bos=False, eos=True)]
    return [tok.encode(task.demonstration(prompt, sample=sample), bos=False, eos=True)]
