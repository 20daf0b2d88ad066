"""A scripted policy: an engine that says given turns instead of sampling them.

    engine = ScriptedEngine({prompt_uid: [turn 1 tokens, turn 2 tokens, ...]}, eos_ids, cache_len)
    episodes = EpisodeRunner(engine, make_env, turns).generate(requests)

It has the interface the episode runner (minirl/envs/episodes.py) and the agent runner
(minirl/agents/runner.py) drive an `Engine` through: `submit`, `step`, `extend`, `release`,
`interrupt`, `cancel`, `load_weights`. Each step answers every waiting request with its episode's next
scripted turn (a turn after the last one is a lone EOS). So the episodes that come back are laid
out exactly as your environment or agent lays out the real ones — its first message, its
observations, its template markers, the loss mask — with the policy's turns replaced by the
script. Two users:

  the warm start   demonstrations of a task (arithmetic: one `calc` call, then the answer) laid
                   out by your own environment or agent, so supervised steps teach the format
                   the RL episodes will have (minirl/run/warmstart.py)
  tests            an episode's tokens checked against transformers' rendering of the same
                   conversation, with tool calls in each model family's format, without a model

The agent runner's requests are single turns (each model call is one request); they name their
episode and turn in `prompt.meta` ("episode": [uid, sample], "turn": k), which is how the script
finds the turn. Log-probs are 0, versions the loaded version (0 by default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

from minirl.inference.scheduler import Request
from minirl.modeling.sampling import Sampling
from minirl.types import Rollout


@dataclasses.dataclass(frozen=True)
class _Limits:
    cache_len: int
    sampling: Sampling  # what an agent's call may ask for (minirl/agents/protocol.py)


@dataclasses.dataclass
class _Scripted:
    request: Request
    turn: int  # the next scripted turn's index
    tokens: list[int]  # multi-turn: every turn and observation so far
    mask: list[float]
    ready: bool = True  # has a turn to say at the next step


class ScriptedEngine:
    """An engine that answers requests with scripted turns (module docstring)."""

    def __init__(
        self,
        script: dict[int, Sequence],
        eos_ids: Sequence[int],
        cache_len: int = 1 << 20,
        sampling: Sampling = Sampling(),
    ):
        self.script, self.eos_ids = script, tuple(eos_ids)
        self.config = _Limits(cache_len, sampling)
        self.version = 0
        self._live: dict[tuple[int, int], _Scripted] = {}

    def load_weights(self, version: int, params) -> None:
        self.version = int(version)

    def submit(self, requests: Iterable[Request]) -> None:
        for r in requests:
            meta = r.prompt.meta
            turn = int(meta.get("turn", 0))  # an agent's model call: its episode's turn k
            self._live[(r.prompt.uid, r.sample_index)] = _Scripted(r, turn, [], [])

    def step(self) -> list[Rollout]:
        out = []
        for key, s in list(self._live.items()):
            if not s.ready:
                continue
            turn = self._turn(s)
            cut = len(turn) > s.request.max_new_tokens  # as the engine cuts a turn
            turn = turn[: s.request.max_new_tokens]
            s.tokens += turn
            s.mask += [1.0] * len(turn)
            s.turn, s.ready = s.turn + 1, False
            if not s.request.multi_turn:
                del self._live[key]
            out.append(self._rollout(s, cut))
        return out

    def extend(self, uid: int, sample_index: int, tokens, max_new_tokens: int) -> None:
        s = self._live[(uid, sample_index)]
        s.tokens += np.asarray(tokens).tolist()
        s.mask += [0.0] * len(tokens)
        s.ready = True

    def release(self, uid: int, sample_index: int) -> None:
        del self._live[(uid, sample_index)]

    def cancel(self, uid: int, sample_index: int) -> None:
        self._live.pop((uid, sample_index), None)

    def interrupt(self, policy: str) -> int:
        return 0  # nothing is ever in the middle of a turn

    def pending(self) -> int:
        return len(self._live)

    def work_stats(self) -> dict[str, int]:
        return {}

    def _turn(self, s: _Scripted) -> list[int]:
        """The next scripted turn of `s`'s episode (a lone EOS past the script)."""
        meta = s.request.prompt.meta
        uid = meta["episode"][0] if "episode" in meta else s.request.prompt.uid
        turns = self.script.get(uid, [])
        return np.asarray(turns[s.turn] if s.turn < len(turns) else self.eos_ids[:1]).tolist()

    def _rollout(self, s: _Scripted, cut: bool) -> Rollout:
        """The request's rollout: the episode so far (multi-turn) or the one turn."""
        n, r = len(s.tokens), s.request
        reason = "length" if cut else "eos" if s.tokens[-1] in self.eos_ids else "stop"
        return Rollout(
            r.prompt,
            r.sample_index,
            np.asarray(s.tokens, np.int32),
            np.zeros(n, np.float32),
            np.where(np.asarray(s.mask) > 0, self.version, -1).astype(np.int32),
            reason,
            mask=np.asarray(s.mask, np.float32) if r.multi_turn else None,
        )
