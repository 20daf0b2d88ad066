"""Agent episodes through the rollout engine: your agent's OpenAI calls, token in, token out.

    runner = AgentRunner(engine, solve, Turns(tokenizer), task, AgentConfig(timeout=60))
    episodes = runner.generate([Request(prompt, sample, max_new_tokens), ...])   # scored Rollouts

Each request is one episode: the runner starts `solve(client, row)` (minirl/agents/user_agent.py)
with a client whose base URL names the episode, and serves its calls (minirl/agents/server.py)
from the engine. A call becomes one engine request per choice (`n`), whose prompt is the
episode's tokens so far plus what the call adds (minirl/agents/episode.py: matched against the
tokens already sampled, never re-tokenized); the answers go back as OpenAI responses, tool calls
read in the model's own format (minirl/envs/tool_calls.py). When `solve` returns, the episode is
one Rollout — the first call's prompt, then every answer (mask 1, the engine's log-probs and
versions) and every later call's new messages (mask 0) — scored by what `solve` returned: a
number, a bool or a Score is the reward; text is the final answer, and None means the last
answer's text, for the task's verifier.

One thread owns the engine and every episode: the one calling `step` (the controller's, or a
worker process's). HTTP handler threads and the agents' event loops only post events to its
queue. `step` is a barrier: first it waits until every live episode's agent has made its next
call or returned (or run out of its time), then it hands the calls to the engine in the order the
episodes were submitted, then it runs one engine step and answers the calls it finished. So which
calls the engine batches together never depends on how fast an agent answered: with a
deterministic agent a lockstep run replays bitwise (exact mode or not), and a run killed with -9
replays the episodes it lost, from their start, to the same tokens. Many more episodes than
engine slots can be in flight: an agent thinking holds no slot (its history is re-run as the
prompt of its next call: no KV cache is held between calls).

Time: each episode may spend `AgentConfig.timeout` seconds in the agent's own code (from an answer
to its next call, summed; time waiting for the engine does not count). Past it the agent is
cancelled and the episode scores 0. An agent that raises scores 0 with the reason; a call that
does not continue the episode (a rewritten history), asks for what the engine cannot do, or
overflows the cache gets a 400 body, and the agent decides what to do with it.

Interrupts: "continue" rebuilds the caches of calls in flight with the new weights (an answer may
mix versions, as any rollout); "discard" restarts every live episode from the start — its agent
cancelled and started again, its calls dropped from the engine — so an episode never mixes
weight versions across its answers (the rule EpisodeRunner keeps), and sampling keys depend only
on (seed, prompt, sample, call, position): a restart under the same weights says the same.

Simplified on purpose: no KV cache between calls (the history's prefill is recomputed per call:
prefix caching would save it); one call at a time per episode (a second concurrent call is a
409); the reward is per episode.
"""

from __future__ import annotations

import dataclasses
import numbers
import queue
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future

import numpy as np

from minirl.agents.episode import AgentEpisode
from minirl.agents.protocol import APIError, Call, Choice, chat_response, completion_response
from minirl.agents.server import Endpoint
from minirl.agents.server import Request as CallRequest
from minirl.agents.user_agent import AgentLoops
from minirl.data.task_api import stable_hash
from minirl.envs import tool_calls
from minirl.envs.episodes import no_turn, run_to_end
from minirl.inference.scheduler import Request
from minirl.types import Rollout, Score
from minirl.verifiers.reward_function import as_reward, row_of


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """Limits of agent episodes (a call's own limit is its max_tokens, at most the request's)."""

    max_turns: int = 4  # model calls per episode
    timeout: float = 60.0  # seconds of the agent's own time per episode (engine time excluded)
    loops: int = 4  # event-loop threads the agents run on
    model: str = "minirl"  # the model name /v1/models lists (any name is accepted in calls)

    def __post_init__(self):
        if self.max_turns < 1 or not self.timeout > 0 or self.loops < 1:
            raise ValueError(f"AgentConfig: max_turns >= 1, timeout > 0, loops >= 1, got {self}")


@dataclasses.dataclass
class _Live:
    """A live episode: its conversation, its agent, its clock, its call in the engine."""

    episode: AgentEpisode
    attempt: int
    agent: tuple[int, Future]  # (event loop, the agent's future)
    seconds: float  # left for the agent's own time
    since: float | None  # when the agent got the turn; None while the engine has a call
    call: CallRequest | None = None  # the call the engine is answering
    answers: dict[int, Rollout] = dataclasses.field(default_factory=dict)


class AgentRunner:
    """Drives agent episodes through an `Engine` (module docstring); the engine's interface:
    submit, step -> finished episodes, interrupt, load_weights, pending, generate."""

    def __init__(self, engine, agent: Callable, turns, task, config: AgentConfig = AgentConfig()):
        self.engine, self.agent, self.task = engine, agent, task
        self.turns, self.config = turns, config
        self._events: queue.Queue = queue.Queue()
        self._live: dict[str, _Live] = {}
        self._ended: list[Rollout] = []
        self._in_engine: dict[tuple[int, int], str] = {}  # engine request -> episode id
        self._order = 0
        self._open_ids: set[str] = set()  # live episodes, for the endpoint's threads to read
        self._endpoint: Endpoint | None = None  # started at the first submit
        self._loops = AgentLoops(config.loops)
        self.stats = {"calls": 0, "refused": 0, "timed_out": 0, "restarted": 0}

    # ---- the engine's interface ----------------------------------------------------------

    def submit(self, requests: Iterable[Request]) -> None:
        if self._endpoint is None:
            self._endpoint = Endpoint(
                self._post_call,
                self._open_ids.__contains__,
                self.engine.config.sampling,
                self.config.model,
            ).start()
        for r in requests:
            self._start(r, attempt=0)

    def step(self) -> list[Rollout]:
        """The barrier, then one engine step; returns the episodes that ended."""
        self._gather()
        for rollout in self.engine.step() if self._in_engine else []:
            self._answer(rollout)
        ended, self._ended = self._ended, []
        return ended

    def interrupt(self, policy: str) -> int:
        n = self.engine.interrupt(policy)
        if policy == "discard":
            for live in list(self._live.values()):
                self._drop(live, "the episode restarted (weights changed)")
                self._start(live.episode.request, live.attempt + 1)
                self.stats["restarted"] += 1
        return n

    def load_weights(self, version: int, params) -> None:
        self.engine.load_weights(version, params)

    def pending(self) -> int:
        return len(self._live) + len(self._ended)

    def work_stats(self) -> dict[str, int]:
        return {**self.engine.work_stats(), **{f"agent_{k}": v for k, v in self.stats.items()}}

    def generate(self, requests: Iterable[Request], progress=None) -> list[Rollout]:
        return run_to_end(self, requests, progress)

    def close(self) -> None:
        """Stop the endpoint and the agents (calls still waiting are answered with a 503)."""
        for live in list(self._live.values()):
            self._drop(live, "the run is over")
        if self._endpoint is not None:
            self._endpoint.close()
        self._loops.close()

    # ---- episodes start and end ----------------------------------------------------------

    def _start(self, request: Request, attempt: int) -> None:
        eid = f"{request.prompt.uid:x}-{request.sample_index}-{attempt}"
        episode = AgentEpisode(request, eid, self._order)
        self._order += 1
        self._open_ids.add(eid)  # before the agent runs: its first call may come at once
        agent = self._loops.start(self.agent, self._endpoint.url(eid), row_of(request.prompt))
        agent[1].add_done_callback(
            lambda f, eid=eid: self._events.put(("end", eid, f, time.monotonic()))
        )
        self._live[eid] = _Live(episode, attempt, agent, self.config.timeout, time.monotonic())

    def _drop(self, live: _Live, why: str) -> None:
        """Forget a live episode: its agent cancelled, its call answered 503 and dropped."""
        eid = live.episode.id
        del self._live[eid]
        self._open_ids.discard(eid)
        self._loops.stop(*live.agent)
        for key in [k for k, e in self._in_engine.items() if e == eid]:
            self.engine.cancel(*key)
            del self._in_engine[key]
        if live.call is not None and not live.call.future.done():
            live.call.future.set_result((503, APIError(503, why).body(), False))

    def _end(self, live: _Live, score: Score) -> None:
        """The episode is over: one scored Rollout, returned by the next step."""
        self._drop(live, "the episode is over")
        ep = live.episode
        if ep.pieces or ep.choices:
            self._ended.append(ep.rollout(score))
            return
        why = score.reason or f"it returned {score.reward}"  # the policy wrote nothing: reward 0
        self._ended.append(no_turn(ep.request, f"no answer from the model ({why})"))

    def _score(self, live: _Live, future: Future) -> Score:
        """What the agent's return value is worth (module docstring)."""
        if future.cancelled():
            return Score(0.0, "agent cancelled")
        if future.exception() is not None:
            e = future.exception()
            return Score(0.0, f"agent raised {type(e).__name__}: {e}"[:300])
        value = future.result()
        if value is None or isinstance(value, str):
            answer = live.episode.final_answer() if value is None else value
            return self._verify(live.episode, answer)
        if isinstance(value, Score | bool | numbers.Real):
            return as_reward(value, who="agent")
        return Score(0.0, f"agent returned a {type(value).__name__}: not a reward, text or None")

    def _verify(self, ep: AgentEpisode, answer: str) -> Score:
        empty = np.zeros(0, np.int32)
        rollout = Rollout(ep.request.prompt, 0, empty, empty.astype(np.float32), empty, "stop")
        rollout.text = answer
        try:
            return self.task.verifier.score([rollout])[0]
        except Exception as e:  # noqa: BLE001 - a verifier that raises scores 0, named
            return Score(0.0, f"verifier error: {type(e).__name__}: {e}"[:300])

    # ---- the barrier ---------------------------------------------------------------------

    def _post_call(self, request: CallRequest) -> None:
        """From an HTTP handler thread: a call for the runner's thread."""
        self._events.put(("call", request.episode, request, time.monotonic()))

    def _gather(self) -> None:
        """Wait until no live episode waits on its agent (each within its time), then hand the
        calls made meanwhile to the engine, in submission order."""
        calls: list[tuple[_Live, list[Request]]] = []
        while True:
            waiting = [x for x in self._live.values() if x.since is not None]
            deadline = min((x.since + x.seconds for x in waiting), default=None)
            try:
                if deadline is None:
                    event = self._events.get_nowait()
                else:
                    event = self._events.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                if deadline is None:
                    break
                self._expire()
                continue
            self._event(event, calls)
        for live, requests in sorted(calls, key=lambda c: c[0].episode.order):
            if self._live.get(live.episode.id) is live:  # not ended while the others came
                self.engine.submit(requests)

    def _expire(self) -> None:
        now = time.monotonic()
        for live in [x for x in self._live.values() if x.since is not None]:
            if now >= live.since + live.seconds:
                self.stats["timed_out"] += 1
                why = (
                    f"agent timed out (its own time took over task.timeout={self.config.timeout}s)"
                )
                self._end(live, Score(0.0, why))

    def _event(self, event: tuple, calls: list) -> None:
        kind, eid, payload, at = event  # `at`: when it happened (the agent's time ends there)
        live = self._live.get(eid)
        if kind == "end":
            if live is not None:
                self._clock(live, at)
                self._end(live, self._score(live, payload))
            return
        if live is None:
            why = f"episode {eid} is over (or was restarted): no more calls"
            payload.future.set_result((404, APIError(404, why).body(), False))
        elif live.since is None:
            why = f"a call of episode {eid} is already waiting for the engine: one call at a time"
            payload.future.set_result((409, APIError(409, why).body(), False))
        else:
            try:
                calls.append((live, self._requests(live, payload.call)))
                self._clock(live, at)
                live.call, live.answers = payload, {}
            except APIError as e:
                self.stats["refused"] += 1
                payload.future.set_result((e.status, e.body(), False))

    def _clock(self, live: _Live, at: float) -> None:
        """The agent's turn ended at `at` (not when the runner got to its event: a slow engine
        step is not the agent's time)."""
        if live.since is not None:
            live.seconds -= at - live.since
            live.since = None

    # ---- a call in the engine ------------------------------------------------------------

    def _requests(self, live: _Live, call: Call) -> list[Request]:
        """The engine requests answering `call` (one per choice), or APIError. The call is laid
        out on a copy of the episode, kept only when the call is accepted: a refused call leaves
        the episode as it was, so the agent may send a corrected one."""
        ep, tok = live.episode.copy(), self.turns.tokenizer
        if ep.turns >= self.config.max_turns:
            raise APIError(
                400,
                f"episode {ep.id} reached its turn limit (task.max_turns={self.config.max_turns})",
            )
        try:
            if ep.kind is None:
                ep.begin(call, self.turns)
            else:
                ep.follow(call, self.turns)
            tokens = np.concatenate([ep.prompt.tokens, ep.tokens]).astype(np.int32)
            stops = tuple(tuple(tok.encode(s, bos=False).tolist()) for s in call.stop)
            if call.kind == "chat" and call.parse_tools:  # the `tags` format: a call ends a turn
                stops += tool_calls.stop_sequences(self.turns.format, call.tools, tok)
        except (ValueError, OverflowError, RecursionError) as e:  # what the agent sent: text the
            # tokenizer cannot encode, an id past int32, arguments nested past the JSON parser
            raise APIError(400, f"{type(e).__name__}: {e}"[:1000]) from None
        room = self.engine.config.cache_len - len(tokens)
        if room < 1 or tokens.min() < 0 or tokens.max() >= tok.vocab_size:
            raise APIError(
                400,
                f"the episode's {len(tokens)} tokens leave no room in engine.cache_len={self.engine.config.cache_len}"
                if room < 1
                else "token ids outside the vocabulary",
                "messages",
            )
        budget = min(call.max_tokens or ep.request.max_new_tokens, room)
        uid = stable_hash("agent call", ep.request.prompt.uid, ep.request.sample_index, ep.turns)
        meta = {"episode": [ep.request.prompt.uid, ep.request.sample_index], "turn": ep.turns}
        prompt = dataclasses.replace(ep.request.prompt, uid=uid, text="", tokens=tokens, meta=meta)
        self.stats["calls"] += 1
        live.episode = ep  # accepted
        for j in range(call.n):
            self._in_engine[(uid, j)] = ep.id
        return [
            Request(prompt, j, budget, stop=tuple(s for s in stops if s)) for j in range(call.n)
        ]

    def _answer(self, rollout: Rollout) -> None:
        """An engine request finished; once all of a call's choices have, answer the call."""
        eid = self._in_engine.pop((rollout.prompt.uid, rollout.sample_index), None)
        live = self._live.get(eid)
        if live is None or live.call is None:
            return  # its episode ended meanwhile
        live.answers[rollout.sample_index] = rollout
        call = live.call.call
        if len(live.answers) < call.n:
            return
        ep = live.episode
        choices = [self._choice(ep, call, live.answers[j]) for j in range(call.n)]
        ep.choices, ep.turns = choices, ep.turns + 1
        respond = chat_response if call.kind == "chat" else completion_response
        body = respond(call, f"chatcmpl-{ep.id}-{ep.turns}", choices, len(rollout.prompt.tokens))
        live.call.future.set_result((200, body, call.stream))
        live.call, live.since = None, time.monotonic()

    def _choice(self, ep: AgentEpisode, call: Call, rollout: Rollout) -> Choice:
        """One answer as the endpoint reports it: tool calls read, stop string cut."""
        tok, tokens = self.turns.tokenizer, rollout.tokens
        spelled, raw = self.turns.turn(tokens)
        if len(tokens) and self.turns.ends_conversation(int(tokens[-1])):
            raw = spelled  # an EOS the template cannot write: the history keeps it as text
        text = tok.decode(tokens)
        cut = next(
            (s for s in call.stop if rollout.finish_reason == "stop" and text.endswith(s)), ""
        )
        text = text[: len(text) - len(cut)]
        content, calls = text, []
        if call.kind == "chat" and call.tools and call.parse_tools:
            content, calls = (
                self.turns.parse(text, call.tools).content,
                self.turns.parse(text, call.tools).tool_calls,
            )
        for k, c in enumerate(calls):
            c["id"] = f"call_{ep.turns}_{k}"
        finish = (
            "tool_calls" if calls else "length" if rollout.finish_reason == "length" else "stop"
        )
        pieces = [tok.decode([t], skip_special=False) for t in tokens.tolist()]
        return Choice(
            tokens,
            rollout.logprobs,
            rollout.versions,
            finish,
            spelled,
            content,
            raw,
            calls,
            pieces,
            rollout.routes,
        )
