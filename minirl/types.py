"""The currency between minirl's parts: Prompt -> Rollout -> (scored) Rollout -> Batch.

Data flows one way (see docs/design.md): the data layer makes `Prompt`s, the rollout engine turns
them into `Rollout`s, verifiers attach a `Score`, and the trainer packs scored rollouts into a
`Batch` of padded numpy arrays. These are plain dataclasses of numpy arrays and Python values —
no JAX, no behaviour beyond small derived properties — so they cross process boundaries
(msgpack) and are easy to print.

Axis letters used in shape comments throughout minirl (also in the README glossary):
  B batch rows (sequences)   T sequence positions   P prompt tokens   C completion tokens
  D model width   V vocabulary   H query heads   K key/value heads   Dh head width
  F MLP hidden width   L layers   S cache positions   G group size (samples per prompt)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One task instance. `uid` is stable and unique: every random draw about this prompt is
    keyed on it (counter-based RNG), so results never depend on batch composition.

    `meta` holds what the verifier needs, by documented keys:
      math-style tasks:  {"answer": "42"}
      code tasks:        {"tests": <sha256 of a test-case file in the verifier's repository>}
    """

    uid: int
    task: str
    text: str
    tokens: np.ndarray  # [P] int32, BOS included
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Score:
    """A verifier's judgement of one rollout: the reward and a short, human-readable reason
    ("correct", "wrong answer", "no answer found", "time limit", ...)."""

    reward: float
    reason: str = ""


@dataclasses.dataclass
class Rollout:
    """One sampled completion of a prompt.

    `logprobs[c]` is the behaviour log-prob log mu of `tokens[c]` under the distribution the
    engine actually sampled from (temperature applied); `versions[c]` is the weight version that
    produced it. `text` is filled by whoever decodes (the controller), `score` by a verifier.

    A multi-turn episode (minirl/envs/) is one Rollout: `tokens` are every assistant turn and
    every observation after the prompt, in order, and `mask[c]` is 1.0 where the policy sampled
    `tokens[c]` and 0.0 on observation tokens (which carry log-prob 0 and version -1). `mask`
    None means every token is the policy's (a single turn).

    `routes` (mixture-of-experts models only; None otherwise): the experts each of the M MoE
    layers sent each position the engine ran to, in the order the router chose them: the prompt
    and every completion token but the last, i.e. exactly the positions a training row reads
    (minirl/training/batching.py). uint8 (uint16 past 256 experts).
    """

    prompt: Prompt
    sample_index: int  # which of the G samples of this prompt (keys the RNG)
    tokens: np.ndarray  # [C] int32
    logprobs: np.ndarray  # [C] float32
    versions: np.ndarray  # [C] int32
    finish_reason: str  # "eos" | "stop" | "length"
    text: str = ""
    score: Score | None = None
    mask: np.ndarray | None = None  # [C] float32 1.0 on the policy's tokens; None = all
    routes: np.ndarray | None = None  # [P + C - 1, M, k] expert ids (MoE); None = dense

    @property
    def oldest_version(self) -> int:
        """The weight version of the oldest policy token: what staleness (lag) is measured
        from (observation tokens, version -1, were produced by no policy)."""
        versions = self.versions if self.mask is None else self.versions[self.mask > 0]
        return int(versions.min()) if len(versions) else -1


@dataclasses.dataclass
class Batch:
    """Scored rollouts packed for the trainer: each row is prompt + completion, right-padded.

    Position t predicts `targets[:, t]` from `tokens[:, :t+1]`; `mask` is 1.0 exactly where
    `targets` is a completion token that counts. Rows are ordered so groups (same prompt) are
    contiguous and whole.
    """

    tokens: np.ndarray  # [B, T] int32 model input
    targets: np.ndarray  # [B, T] int32 next token at each position
    mask: np.ndarray  # [B, T] float32 1.0 on completion targets
    behaviour_logprobs: np.ndarray  # [B, T] float32 log mu (0 where mask == 0)
    versions: np.ndarray  # [B, T] int32 weight version of each completion token
    rewards: np.ndarray  # [B] float32
    group_ids: np.ndarray  # [B] int32 rows with the same id share a prompt
    prompt_uids: np.ndarray  # [B] int64
    routes: np.ndarray | None = None  # [B, T, M, k] the engine's experts (MoE; 0 on padding)
    teacher_logprobs: np.ndarray | None = None  # [B, T] float32 log pi_T of the targets under a
    # distillation teacher (minirl/training/teacher.py), 0 where mask == 0; None without one

    @property
    def num_rows(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum())
