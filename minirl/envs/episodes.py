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

In a run: `EpisodeRunner` has the engine's interface (load_weights, submit, step, interrupt,
generate, pending, work_stats), so the controller and the async scheduler drive it as they drive
an `Engine`; the episodes arrive scored, and `EpisodeScores` is the verifier that hands those
scores on. A resumed run issues again the episodes that were in flight (lockstep: none), which
replay to the same tokens (tests/envs/test_multiturn.py: resume through the controller, bitwise).

Simplified on purpose: environments step in this thread, between engine steps (a slow tool
holds up decoding); observations are text; the reward is per episode (a sum over turns).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from minirl.envs.base import Environment, safe_step
from minirl.envs.turns import Turns
from minirl.inference.scheduler import Request
from minirl.types import Rollout, Score


@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
    """Limits of one episode (a turn's own limit is its Request's max_new_tokens)."""

    max_turns: int = 4  # assistant turns per episode
    max_tokens: int = 0  # prompt + every turn and observation; 0 = the engine's cache_len
    observation_role: str = "tool"  # the chat role observations are rendered as

    def __post_init__(self):
        if self.max_turns < 1 or self.max_tokens < 0:
            raise ValueError(f"EpisodeConfig: max_turns >= 1 and max_tokens >= 0, got {self}")


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
    turns: int = 0
    reward: float = 0.0
    reason: str = ""


class EpisodeScores:
    """The verifier of episodes: their environments already scored them (a Verifier)."""

    def score(self, rollouts: Sequence[Rollout]) -> list[Score]:
        return [r.score if r.score is not None else Score(0.0, "not an episode") for r in rollouts]


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

    def submit(self, requests: Iterable[Request]) -> None:
        """Start an episode per request: the request's prompt is the task's; the environment
        writes the first message, which the template lays out into the engine's prompt."""
        self.engine.submit([self._start(r).request for r in requests])

    def step(self) -> list[Rollout]:
        """One engine step; every turn it finished is answered. Returns finished episodes."""
        return [e for e in map(self._on_turn, self.engine.step()) if e is not None]

    def interrupt(self, policy: str) -> int:
        return self.engine.interrupt(policy)  # restarted episodes are noticed in _on_turn

    def load_weights(self, version: int, params) -> None:
        self.engine.load_weights(version, params)

    def pending(self) -> int:
        return len(self._episodes)

    def work_stats(self) -> dict[str, int]:
        return self.engine.work_stats()

    def generate(self, requests: Iterable[Request], progress=None) -> list[Rollout]:
        """Run `requests`' episodes to the end; episodes in request order (`progress(n)`: as
        Engine.generate's, n episodes finished)."""
        requests = list(requests)
        self.submit(requests)
        done: dict[tuple[int, int], Rollout] = {}
        while self._episodes:
            finished = self.step()
            done |= {(r.prompt.uid, r.sample_index): r for r in finished}
            if progress is not None and finished:
                progress(len(finished))
        return [done[(q.prompt.uid, q.sample_index)] for q in requests]

    # ---- one episode ---------------------------------------------------------------------

    def _start(self, request: Request) -> _Episode:
        """A fresh environment and episode; `request` becomes the engine's (multi-turn, the
        rendered prompt). A restart gives the same prompt tokens (environments are
        deterministic in their prompt), which is checked."""
        env = self.make_env()
        first = env.reset(request.prompt)
        text, tokens = self.turns.first(first)
        old = self._episodes.get((request.prompt.uid, request.sample_index))
        if old is not None and not np.array_equal(old.request.prompt.tokens, tokens):
            raise RuntimeError(f"prompt {request.prompt.uid}: env.reset is not deterministic")
        prompt = dataclasses.replace(request.prompt, tokens=tokens)
        request = dataclasses.replace(request, prompt=prompt, multi_turn=True)
        none = np.zeros(0, np.int32)
        messages = [{"role": "user", "content": first}]
        ep = _Episode(request, env, text, len(text), messages, none, none.astype(np.float32), [])
        ep.parts.append((0, "the prompt"))
        self._episodes[(prompt.uid, request.sample_index)] = ep
        return ep

    def _on_turn(self, rollout: Rollout) -> Rollout | None:
        """A turn finished: let the environment answer; extend the episode or end it."""
        key = (rollout.prompt.uid, rollout.sample_index)
        ep, n = self._episodes[key], len(self._episodes[key].tokens)
        if len(rollout.tokens) < n or not np.array_equal(rollout.mask[:n], ep.mask):
            ep, n = self._start(ep.request), 0  # the engine restarted it (discard, preemption)
        if not np.array_equal(rollout.tokens[:n], ep.tokens):
            raise RuntimeError(f"prompt {key[0]}: the engine changed an episode's tokens")
        turn = rollout.tokens[n:]
        spelled, content = self.turns.turn(turn)
        ep.parts.append((len(ep.text), f"assistant turn {ep.turns + 1}"))
        ep.text += spelled
        ep.messages.append({"role": "assistant", "content": content})
        ep.tokens, ep.mask = rollout.tokens, rollout.mask
        step = safe_step(ep.env, self.turns.tokenizer.decode(turn))
        ep.turns, ep.reward = ep.turns + 1, ep.reward + step.reward
        ep.reason = step.info.get("reason", ep.reason)
        observation = None if step.done else self._observe(ep, step.observation, rollout)
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

    def _observe(self, ep: _Episode, observation: str, rollout: Rollout) -> np.ndarray | None:
        """The observation's tokens (turn markers included), or None if a limit ends the
        episode here (ep.reason says which)."""
        c, limit = self.config, self.engine.config.cache_len
        limit = min(limit, c.max_tokens or limit)
        if rollout.finish_reason == "length":
            ep.reason = f"turn {ep.turns} cut at max_new_tokens"
            return None
        if rollout.tokens[-1] in self.turns.tokenizer.eos_ids[1:]:  # not the template's EOS
            ep.reason = f"turn {ep.turns} ended the conversation (EOS id {rollout.tokens[-1]})"
            return None
        if ep.turns >= c.max_turns:
            ep.reason = f"turn limit ({c.max_turns})"
            return None
        message = {"role": c.observation_role, "content": self.turns.clean(observation)}
        added = self.turns.observation(ep.text, [*ep.messages, message], ep.parts)
        tokens = self.turns.encode(added)
        used = len(ep.request.prompt.tokens) + len(ep.tokens) + len(tokens)
        if not len(tokens) or used + ep.request.max_new_tokens > limit:
            ep.reason = f"episode token limit ({limit})"
            return None
        ep.parts.append((len(ep.text), f"observation {ep.turns}"))
        ep.text += added
        ep.messages.append(message)
        return tokens
