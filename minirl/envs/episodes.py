"""Multi-turn episodes through the rollout engine: token in, token out, one KV cache per episode.

    runner = EpisodeRunner(engine, make_env, Turns(tokenizer), EpisodeConfig(max_turns=4))
    episodes = runner.generate([Request(prompt, sample_index, max_new_tokens=32), ...])
    batch = make_batch(episodes, pad_id)          # the trainer trains on it unchanged

What one episode is (the loop an agent framework runs, kept to what RL needs):

    prompt  = template([user: env.reset(prompt)])                 tokens, rendered once
    repeat  engine samples a turn (until EOS, a stop sequence, or max_new_tokens)
            step = env.step(turn text)                            reward, done, observation
            observation tokens = what the template appends        checked append-only (turns.py)
            engine.extend(observation tokens)                     the slot's KV cache continues
    until   done, a turn cut by max_new_tokens, max_turns, or the episode's token limit

The episode comes back as ONE `Rollout`: `tokens` are every turn exactly as sampled and every
observation's tokens, `mask` is 1 on the policy's tokens and 0 on observations (so the loss never
sees tool output), `logprobs` / `versions` are the engine's (0 / -1 on observations), and
`score.reward` is the sum of the steps' rewards. `minirl.training.batching.make_batch` turns such
rollouts into an ordinary `Batch`, so every loss preset trains on it unchanged, and the trainer's
recompute sees exactly the tokens the engine saw (tests/envs/test_multiturn.py checks both, and that
exact mode stays bitwise equal across turns).

Restarts: `interrupt("discard")` and a paged pool's preemption send an episode back to its first
turn inside the engine. The runner notices (the engine's episode no longer extends the one it
knows: its observation tokens are gone) and restarts the episode's environment too, from a fresh
`make_env()` and the same prompt, so both sides agree again. `interrupt("continue")` keeps every
token and rebuilds the cache, observations included.

Environments that are your own code (minirl/envs/user_env.py) run with a time limit
(`EpisodeConfig.timeout`, task.timeout): each call on its own thread, the calls of one engine
step side by side, the episode's seconds summed; one that raises, answers nonsense or runs past
the limit ends its episode with reward 0 and the reason, and the run goes on. The runner waits
for every call of a step before the next engine step (never on timing: which episodes the engine
batches together does not depend on how fast an environment answered, so a run still replays).
An environment whose `reset` fails ends its episode before the model wrote anything: a Rollout
with no tokens, reward 0.

In a run: `EpisodeRunner` has the engine's interface (load_weights, submit, step, interrupt,
generate, pending, work_stats), so the controller and the async scheduler drive it as they drive
an `Engine`; the episodes arrive scored, and `EpisodeScores` is the verifier that hands those
scores on. A resumed run issues again the episodes that were in flight (lockstep: none), which
replay to the same tokens (tests/envs/test_multiturn.py: resume through the controller, bitwise).

Simplified on purpose: environments step between engine steps (a slow tool holds up decoding;
the built-in tools run inline in this thread); observations are text (messages); the reward is
per episode (a sum over turns).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future

import numpy as np

from minirl.envs.base import Environment, Step, failed, in_thread, safe_step
from minirl.envs.turns import Turns, as_messages
from minirl.hf.chat_template import ChatTemplateError
from minirl.inference.scheduler import Request
from minirl.types import Rollout, Score


@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
    """Limits of one episode (a turn's own limit is its Request's max_new_tokens)."""

    max_turns: int = 4  # assistant turns per episode
    max_tokens: int = 0  # prompt + every turn and observation; 0 = the engine's cache_len
    observation_role: str = "tool"  # the chat role observations are rendered as
    timeout: float = 0.0  # seconds of environment calls per episode (threads); 0 = inline, no limit

    def __post_init__(self):
        if self.max_turns < 1 or self.max_tokens < 0 or not self.timeout >= 0:
            raise ValueError(
                f"EpisodeConfig: max_turns >= 1, max_tokens >= 0, timeout >= 0, got {self}"
            )


@dataclasses.dataclass
class _Episode:
    """The runner's view of one episode in flight."""

    request: Request  # the engine's: multi-turn, the rendered prompt
    env: Environment
    text: str  # the text the episode's tokens spell, prompt first
    prompt_chars: int  # where the text after the prompt begins
    messages: list[dict]
    tokens: np.ndarray  # [C] int32 after the prompt: turns and observations so far
    mask: np.ndarray  # [C] float32 1.0 on the policy's tokens
    parts: list[tuple[int, str]]  # (first character in `text`, label): for error messages
    tools: list[dict] | None = None  # the environment's tool schemas, shown by the template
    turns: int = 0
    reward: float = 0.0
    reason: str = ""
    seconds: float = math.inf  # left for the environment's calls (EpisodeConfig.timeout)


class EpisodeScores:
    """The verifier of episodes: their environments already scored them (a Verifier)."""

    def score(self, rollouts: Sequence[Rollout]) -> list[Score]:
        return [r.score if r.score is not None else Score(0.0, "not an episode") for r in rollouts]


def no_turn(request: Request, reason: str) -> Rollout:
    """The Rollout of an episode that ended before the model wrote anything (its environment or
    agent failed first): the request's prompt, no tokens, reward 0 with the reason."""
    empty = np.zeros(0, np.int32)
    return Rollout(
        request.prompt,
        request.sample_index,
        empty,
        empty.astype(np.float32),
        empty,
        "stop",
        score=Score(0.0, reason),
        mask=empty.astype(np.float32),
    )


def run_to_end(runner, requests: Iterable[Request], progress=None) -> list[Rollout]:
    """`generate` of a runner with the engine's interface (submit, step, pending): submit, step
    until nothing is pending, the episodes in request order."""
    requests = list(requests)
    runner.submit(requests)
    done: dict[tuple[int, int], Rollout] = {}
    while runner.pending():
        finished = runner.step()
        done |= {(r.prompt.uid, r.sample_index): r for r in finished}
        if progress is not None and finished:
            progress(len(finished))
    return [done[(q.prompt.uid, q.sample_index)] for q in requests]


class EpisodeRunner:
    """Drives multi-turn episodes through an `Engine` (module docstring). Mirrors the engine's
    interface: submit, step -> finished episodes, interrupt, generate."""

    def __init__(
        self,
        engine,
        make_env: Callable[[], Environment],
        turns: Turns,
        config: EpisodeConfig = EpisodeConfig(),
    ):
        self.engine, self.make_env, self.turns, self.config = engine, make_env, turns, config
        self._episodes: dict[tuple[int, int], _Episode] = {}
        self._ended: list[Rollout] = []  # episodes that ended at their start: the next step's

    def submit(self, requests: Iterable[Request]) -> None:
        """Start an episode per request: the request's prompt is the task's; the environment
        writes the first message(s), which the template lays out into the engine's prompt."""
        resets = [(r, *self._reset(r)) for r in requests]  # side by side when time-limited
        started = [self._start(*reset) for reset in resets]
        self._ended += [s for s in started if isinstance(s, Rollout)]
        self.engine.submit([s.request for s in started if isinstance(s, _Episode)])

    def step(self) -> list[Rollout]:
        """One engine step; every turn it finished is answered (the environments' calls side
        by side when time-limited). Returns finished episodes."""
        ended, self._ended = self._ended, []
        answers = [self._take_turn(r) for r in self.engine.step()]
        done = [self._answer(*a) for a in answers if isinstance(a, tuple)]
        return ended + [a for a in answers if isinstance(a, Rollout)] + [e for e in done if e]

    def interrupt(self, policy: str) -> int:
        return self.engine.interrupt(policy)  # restarted episodes are noticed in _take_turn

    def load_weights(self, version: int, params) -> None:
        self.engine.load_weights(version, params)

    def pending(self) -> int:
        return len(self._episodes) + len(self._ended)

    def work_stats(self) -> dict[str, int]:
        return self.engine.work_stats()

    def generate(self, requests: Iterable[Request], progress=None) -> list[Rollout]:
        """Run `requests`' episodes to the end; episodes in request order (`progress(n)`: as
        Engine.generate's, n episodes finished)."""
        return run_to_end(self, requests, progress)

    # ---- calls into the environment ------------------------------------------------------

    def _call(self, fn, *args) -> tuple[Future, float]:
        """`fn(*args)` inline, or (EpisodeConfig.timeout) on its own thread: (future, start)."""
        if self.config.timeout:
            return in_thread(fn, *args), time.monotonic()
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as e:  # noqa: BLE001 - reported as the episode's failure
            future.set_exception(e)
        return future, time.monotonic()

    def _wait(self, ep_seconds: float, future: Future, start: float) -> tuple[object, float]:
        """(the call's result, the episode's seconds left after it); raises the call's error,
        or TimeoutError past the episode's seconds."""
        if not self.config.timeout:
            return future.result(), ep_seconds
        value = future.result(timeout=max(start + ep_seconds - time.monotonic(), 0.0))
        return value, start + ep_seconds - future.finished_at

    def _token_limit(self) -> int:
        """Tokens an episode may hold: the engine's cache_len, or EpisodeConfig.max_tokens."""
        limit = self.engine.config.cache_len
        return min(limit, self.config.max_tokens or limit)

    def _timed_out(self) -> str:
        return f"environment timed out (its calls took over task.timeout={self.config.timeout}s)"

    # ---- one episode ---------------------------------------------------------------------

    def _reset(self, request: Request) -> tuple[Future, float]:
        """A fresh environment's reset on `request`'s prompt, started: (first messages and
        tools, or the error), from `_first`."""
        return self._call(self._first, request)

    def _first(self, request: Request):
        env = self.make_env()
        first = as_messages(env.reset(request.prompt), "user")
        tools = getattr(env, "tools", None)  # OpenAI function schemas, shown by the template
        text, tokens = self.turns.first(first, tools)
        return env, first, tools, text, tokens

    def _start(self, request: Request, future: Future, start: float) -> _Episode | Rollout:
        """The episode of `request` once its environment's reset answered (or a Rollout of
        reward 0 if it failed, its first message leaves no room for a turn, or a restart gave
        other prompt tokens: environments must be deterministic in their prompt, since the
        engine replays the episode from the prompt it has); `request` becomes the engine's
        (multi-turn, the rendered prompt)."""
        seconds = self.config.timeout or math.inf
        try:
            (env, first, tools, text, tokens), seconds = self._wait(seconds, future, start)
        except concurrent.futures.TimeoutError:
            return no_turn(request, failed(self._timed_out()).info["reason"])
        except Exception as e:  # noqa: BLE001 - the user's environment; the run goes on
            why = f"environment reset failed: {type(e).__name__}: {e}"
            return no_turn(request, failed(why).info["reason"])
        old = self._episodes.get((request.prompt.uid, request.sample_index))
        if old is not None and not np.array_equal(old.request.prompt.tokens, tokens):
            why = "environment reset is not deterministic: the restarted episode's prompt differs"
            return no_turn(request, failed(why).info["reason"])
        if len(tokens) + request.max_new_tokens > self._token_limit():
            why = (
                f"environment reset: its first message is {len(tokens)} tokens, and with a turn "
                f"of {request.max_new_tokens} over the episode token limit ({self._token_limit()})"
            )
            return no_turn(request, failed(why).info["reason"])
        prompt = dataclasses.replace(request.prompt, tokens=tokens)
        request = dataclasses.replace(request, prompt=prompt, multi_turn=True)
        none = np.zeros(0, np.int32)
        ep = _Episode(request, env, text, len(text), first, none, none.astype(np.float32), [])
        ep.parts.append((0, "the prompt"))
        ep.tools, ep.seconds = tools, seconds
        self._episodes[(prompt.uid, request.sample_index)] = ep
        return ep

    def _take_turn(self, rollout: Rollout):
        """A turn finished: record it and start the environment's step on it. Returns (episode,
        the engine's rollout, the step started) or, if the episode could not go on, its end."""
        key = (rollout.prompt.uid, rollout.sample_index)
        ep, n = self._episodes[key], len(self._episodes[key].tokens)
        if len(rollout.tokens) < n or not np.array_equal(rollout.mask[:n], ep.mask):
            ep, n = self._start(ep.request, *self._reset(ep.request)), 0  # restarted by the engine
            if isinstance(ep, Rollout):  # (discard, preemption); its environment failed now
                self.engine.release(*key)
                del self._episodes[key]
                return ep
        if not np.array_equal(rollout.tokens[:n], ep.tokens):
            raise RuntimeError(f"prompt {key[0]}: the engine changed an episode's tokens")
        turn = rollout.tokens[n:]
        spelled, content = self.turns.turn(turn)
        ep.parts.append((len(ep.text), f"assistant turn {ep.turns + 1}"))
        ep.text += spelled
        ep.messages.append({"role": "assistant", "content": content})
        ep.tokens, ep.mask = rollout.tokens, rollout.mask
        turn = self.turns.parse(self.turns.tokenizer.decode(turn), ep.tools)  # calls read
        return ep, rollout, self._call(safe_step, ep.env, turn)

    def _answer(self, ep: _Episode, rollout: Rollout, call) -> Rollout | None:
        """The environment answered a turn (or failed, or ran out of time): extend the episode
        with the observation, or end it (returned)."""
        try:
            step, ep.seconds = self._wait(ep.seconds, *call)
        except concurrent.futures.TimeoutError:
            step = failed(self._timed_out())
        except Exception as e:  # noqa: BLE001 - safe_step raised past itself (a BaseException)
            step = failed(f"environment error: {e}")
        ep.turns, ep.reward = ep.turns + 1, ep.reward + step.reward
        ep.reason = step.info.get("reason", ep.reason)
        if step.info.get("failed"):
            ep.reward = 0.0  # an environment that failed earns its episode nothing
        observation = None if step.done else self._observe(ep, step, rollout)
        key = (rollout.prompt.uid, rollout.sample_index)
        if observation is None:
            self.engine.release(*key)
            del self._episodes[key]
            rollout.text = ep.text[ep.prompt_chars :]
            rollout.score = Score(ep.reward, ep.reason or "done")
            return rollout
        self.engine.extend(*key, observation, ep.request.max_new_tokens)
        ep.tokens = np.concatenate([ep.tokens, observation])
        ep.mask = np.concatenate([ep.mask, np.zeros(len(observation), np.float32)])
        return None

    def _observe(self, ep: _Episode, step: Step, rollout: Rollout) -> np.ndarray | None:
        """The observation's tokens (turn markers included), or None if a limit ends the
        episode here (ep.reason says which)."""
        c, limit = self.config, self._token_limit()
        if rollout.finish_reason == "length":
            ep.reason = f"turn {ep.turns} cut at max_new_tokens"
            return None
        if ep.turns >= c.max_turns:
            ep.reason = f"turn limit ({c.max_turns})"
            return None
        if self.turns.ends_conversation(int(rollout.tokens[-1])):  # an EOS it cannot write
            ep.reason = f"turn {ep.turns} ended the conversation (EOS id {rollout.tokens[-1]})"
            return None
        try:
            messages = as_messages(step.observation, c.observation_role)
        except ValueError as e:
            ep.reason, ep.reward = f"environment error: its observation: {e}", 0.0
            return None
        messages = [{**m, "content": self.turns.clean(m["content"])} for m in messages]
        try:
            added = self.turns.observation(ep.text, [*ep.messages, *messages], ep.parts, ep.tools)
        except ChatTemplateError as e:  # e.g. a role the template does not know
            ep.reason, ep.reward = f"environment error: its observation: {e}", 0.0
            return None
        tokens = self.turns.encode(added)
        used = len(ep.request.prompt.tokens) + len(ep.tokens) + len(tokens)
        if not len(tokens) or used + ep.request.max_new_tokens > limit:
            ep.reason = f"episode token limit ({limit})"
            return None
        ep.parts.append((len(ep.text), f"observation {ep.turns}"))
        ep.text += added
        ep.messages += messages
        return tokens
