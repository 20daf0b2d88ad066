"""One agent episode: the conversation an agent holds with the endpoint, kept as tokens.

The rule is the environments' (minirl/envs/turns.py): the episode's tokens are the first call's
prompt as the chat template renders it, then each answer's tokens exactly as sampled, then what
each later call adds, rendered by the template and checked append-only — never a re-tokenized
history. An agent sends the whole conversation with every call, so each call is matched against
what the episode already holds:

    call 1       messages M1 (+ tools)          -> prompt = template(M1, tools); tokens rendered once
    answer 1     the engine samples n choices   -> returned as OpenAI messages (tool calls parsed)
    call k       messages Mk must be M(k-1) + [one of the returned answers, unchanged] + new ones
                 the answer it names joins the episode (its sampled tokens, mask 1)
                 the new messages: template(history with each answer as its raw text + new)
                 must start with the episode's text; what it adds is encoded (mask 0)
    the end      the agent returns: the episode is everything so far, plus the last call's first
                 answer (choice 0) if no later call named one

A call whose earlier messages differ from what the episode holds — an answer edited, a message
dropped, the tools changed — is answered with a 400 naming the first difference (the lesson-14
rule: a rewritten history is reported, never silently re-tokenized). The answers stay in the
history as their raw text (the calls as the model wrote them), so the template never re-renders a
parsed call with other spacing. `/v1/completions` episodes are the same with text (or token ids):
each prompt must start with the previous prompt plus one returned text.

Tokens are grouped into engine requests by the runner (minirl/agents/runner.py): every call is one
request per choice, whose prompt is the episode's tokens so far plus the new ones.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from minirl.agents.protocol import APIError, Call, Choice
from minirl.envs.turns import appended
from minirl.inference.scheduler import Request
from minirl.types import Prompt, Rollout, Score


def _arguments(value) -> str:
    """Tool-call arguments compared by meaning: JSON text or an object, canonical."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, sort_keys=True)


def _said(m: dict) -> tuple:
    """What a message says, for comparison (tool-call ids and extra fields aside)."""
    calls = tuple(
        (
            (c.get("function") or {}).get("name"),
            _arguments((c.get("function") or {}).get("arguments")),
        )
        for c in m.get("tool_calls") or []
        if isinstance(c, dict)
    )
    return m["role"], m.get("content") or "", calls, m.get("tool_call_id"), m.get("name")


@dataclasses.dataclass
class AgentEpisode:
    """The endpoint's view of one episode (module docstring)."""

    request: Request  # the controller's: its prompt (uid, meta) and sample index
    id: str  # in the URL: /episodes/<id>/v1
    order: int  # submission order: calls at one barrier reach the engine in this order
    kind: str | None = None  # "chat" | "completion", fixed by the first call
    prompt: Prompt | None = None  # the first call's prompt, rendered
    text: str = ""  # what the episode's tokens spell, prompt first
    messages: list[dict] = dataclasses.field(default_factory=list)  # as the agent sent them
    history: list[dict] = dataclasses.field(default_factory=list)  # as the template renders them
    tools: list[dict] | None = None
    parts: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    pieces: list[tuple] = dataclasses.field(default_factory=list)  # (tokens, mask, logp, versions)
    choices: list[Choice] | None = None  # the last call's answers, none named yet
    turns: int = 0  # calls answered
    routes: object = None  # MoE: the last named answer's request's routes (every position)
    finish: str = "stop"  # the last named answer's: "length" if cut at its max_tokens
    _returned_text: str = ""  # completions: the prompts and answers as the agent sees them

    def copy(self) -> AgentEpisode:
        """A copy a call can be laid out on without changing this episode (runner.py keeps it
        only if the call is accepted)."""
        lists = ("messages", "history", "parts", "pieces")
        return dataclasses.replace(self, **{k: list(getattr(self, k)) for k in lists})

    @property
    def tokens(self) -> np.ndarray:
        return np.concatenate([p[0] for p in self.pieces]) if self.pieces else np.zeros(0, np.int32)

    # ---- a call --------------------------------------------------------------------------

    def begin(self, call: Call, turns) -> np.ndarray:
        """The first call: the prompt's tokens (rendered by the template, or the raw prompt)."""
        self.kind, tok = call.kind, turns.tokenizer
        if call.kind == "chat":
            self.messages, self.tools = list(call.messages), call.tools
            self.history = list(call.messages)
            try:
                text, tokens = turns.first(self.history, self.tools)
            except ValueError as e:  # the template refused the messages
                raise APIError(400, str(e), "messages") from None
        elif isinstance(call.prompt, str):
            text, tokens = call.prompt, tok.encode(call.prompt, bos=True)
        else:
            tokens = np.asarray(call.prompt, np.int32)
            text = tok.decode(tokens, skip_special=False)
        self.text = self._returned_text = text
        self.parts.append((0, "the prompt"))
        self.prompt = dataclasses.replace(self.request.prompt, text=text, tokens=tokens)
        return np.zeros(0, np.int32)

    def follow(self, call: Call, turns) -> np.ndarray:
        """A later call: name the answer it continues from, return the new tokens (mask 0)."""
        if call.kind != self.kind:
            raise APIError(400, f"episode {self.id} is a {self.kind} episode; one kind per episode")
        if call.kind == "chat":
            return self._follow_chat(call, turns)
        return self._follow_completion(call, turns)

    def _follow_chat(self, call: Call, turns) -> np.ndarray:
        known, sent = self.messages, call.messages
        if (call.tools or None) != (self.tools or None):
            raise APIError(400, self._rewritten("the tools differ from the first call's"), "tools")
        for i, (a, b) in enumerate(zip(known, sent, strict=False)):
            if _said(a) != _said(b):
                raise APIError(
                    400,
                    self._rewritten(
                        f"messages[{i}] ({a['role']}) changed: {_said(a)[1]!r} became {_said(b)[1]!r}"
                    ),
                    "messages",
                )
        if len(sent) <= len(known):
            raise APIError(
                400,
                self._rewritten(
                    f"it has {len(sent)} messages, the episode {len(known)} and an answer"
                ),
                "messages",
            )
        j = self._named(lambda c: _said(c.message()) == _said(sent[len(known)]))
        if j is None:
            gave, got = _said(self.choices[0].message())[1:3], _said(sent[len(known)])[1:3]
            what = f"messages[{len(known)}] is not an answer minirl gave ({gave} became {got})"
            raise APIError(400, self._rewritten(what), "messages")
        new = sent[len(known) + 1 :]
        if not new or new[-1]["role"] == "assistant":
            raise APIError(
                400,
                "a call must end with a new message that is not the assistant's (no prefill)",
                "messages",
            )
        self._name(j, sent[len(known)], {"role": "assistant", "content": self.choices[j].raw})
        try:
            rendered = turns.render([*self.history, *new], self.tools)
            added = appended(self.text, rendered, self.parts)
        except ValueError as e:  # not append-only, or the template refused the messages
            raise APIError(400, str(e), "messages") from None
        self.messages += new
        self.history += new
        return self._observe(added, turns.encode(added))

    def _follow_completion(self, call: Call, turns) -> np.ndarray:
        tok = turns.tokenizer
        if isinstance(call.prompt, str):
            j = self._named(lambda c: call.prompt.startswith(self._returned_text + c.content))
            rest = (
                None
                if j is None
                else call.prompt[len(self._returned_text + self.choices[j].content) :]
            )
        else:
            ids = list(call.prompt)
            known = [int(t) for t in self.prompt.tokens] + self.tokens.tolist()
            j = self._named(
                lambda c: ids[: len(known) + len(c.tokens)] == known + c.tokens.tolist()
            )
            rest = None if j is None else ids[len(known) + len(self.choices[j].tokens) :]
        if j is None:
            raise APIError(
                400,
                self._rewritten(
                    "the prompt does not start with the episode's prompt and one answer minirl gave"
                ),
                "prompt",
            )
        returned = self._returned_text + self.choices[j].content
        self._name(j, None, None)
        self._returned_text = returned
        if not rest:
            raise APIError(400, "the prompt adds nothing after the answer it continues", "prompt")
        if isinstance(rest, str):
            self._returned_text += rest
            return self._observe(rest, tok.encode(rest, bos=False))
        return self._observe(tok.decode(rest, skip_special=False), np.asarray(rest, np.int32))

    def _named(self, matches) -> int | None:
        """The first of the last call's answers that `matches`, or None."""
        return next((j for j, c in enumerate(self.choices or []) if matches(c)), None)

    def _name(self, j: int, message: dict | None, rendered: dict | None) -> None:
        """Answer j of the last call joins the episode: its tokens as sampled, mask 1."""
        c = self.choices[j]
        self.parts.append((len(self.text), f"answer {self.turns}"))
        self.text += c.spelled
        self.pieces.append((c.tokens, np.ones(len(c.tokens), np.float32), c.logprobs, c.versions))
        self.routes, self.choices = c.routes, None
        self.finish = "length" if c.finish == "length" else "stop"
        if message is not None:
            self.messages.append(message)
            self.history.append(rendered)

    def _observe(self, text: str, tokens: np.ndarray) -> np.ndarray:
        self.parts.append((len(self.text), f"call {self.turns + 1}'s new messages"))
        self.text += text
        zeros = np.zeros(len(tokens), np.float32)
        self.pieces.append((tokens, zeros, zeros, np.full(len(tokens), -1, np.int32)))
        return tokens

    def _rewritten(self, what: str) -> str:
        return (
            f"{what}: this call does not continue episode {self.id} (minirl trains on the "
            "tokens as sampled: send the conversation back unchanged and add to it; a rewritten "
            "history would be re-tokenized into tokens the policy never produced)"
        )

    # ---- the end -------------------------------------------------------------------------

    def rollout(self, score: Score) -> Rollout:
        """The episode as one Rollout (prompt: the first call's; every answer and new message
        after it; mask 1 on the answers), the last call's first answer included if unnamed."""
        if self.choices:
            self._name(0, None, None)
        while self.pieces and not self.pieces[-1][1].any():  # new messages nobody answered
            self.pieces.pop()  # (the agent ended while its call waited for the engine)
        tokens, mask, logprobs, versions = (
            np.concatenate(x) for x in zip(*self.pieces, strict=True)
        )
        rollout = Rollout(
            self.prompt,
            self.request.sample_index,
            tokens.astype(np.int32),
            logprobs.astype(np.float32),
            versions.astype(np.int32),
            self.finish,
            text=self.text[len(self.prompt.text) :],
            score=score,
            mask=mask.astype(np.float32),
            routes=self.routes,
        )
        return rollout

    def final_answer(self) -> str:
        """The text of the last answer the agent got (choice 0 if it named none)."""
        if self.choices:
            return self.choices[0].content
        return next(
            (m.get("content") or "" for m in reversed(self.messages) if m["role"] == "assistant"),
            "",
        )
