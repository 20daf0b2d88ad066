"""The simulated workload: prompts, completion lengths, and a verifier that only takes time.

Every draw is keyed by (seed, prompt uid, sample index), as the real engine's sampling is, so
a request's length never depends on when or beside what it runs: a simulated trace is a
function of the seed and the settings alone.

Length specs (`Lengths.parse`):

    lognormal:MU,SIGMA   exp(N(MU, SIGMA^2)) tokens, clipped to [1, max_new_tokens]: the long
                         tail of reasoning completions (AReaL Fig. 1)
    fixed:N              every completion N tokens
    RUN_DIR              the lengths a real minirl run logged (RUN_DIR/samples.jsonl), drawn
                         uniformly; a run directory is the only input read from disk
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from minirl.types import Prompt, Score

_STREAM = {"length": 1, "reward": 2, "verify": 3, "solvable": 4}


def draw(seed: int, stream: str, *key: int) -> np.random.Generator:
    """A generator for one (stream, key): counter-based, independent of call order."""
    return np.random.default_rng([seed, _STREAM[stream], *key])


class Lengths:
    """Completion length of each (prompt uid, sample index), before the max_new_tokens cap."""

    def __init__(self, kind: str, values=(), seed: int = 0, table: Mapping | None = None):
        self.kind, self.values, self.seed = kind, tuple(values), seed
        self.table = dict(table or {})  # (uid, sample) -> length: a real run's own lengths

    @classmethod
    def parse(cls, spec: str, seed: int = 0) -> Lengths:
        kind, _, args = spec.partition(":")
        try:
            if kind == "lognormal":
                mu, sigma = (float(x) for x in args.split(","))
                if not (math.isfinite(mu) and math.isfinite(sigma) and sigma >= 0):
                    raise ValueError
                return cls("lognormal", (mu, sigma), seed)
            if kind == "fixed" and int(args) >= 1:
                return cls("fixed", (int(args),), seed)
        except ValueError:
            pass
        path = Path(spec) / "samples.jsonl"
        if kind not in ("lognormal", "fixed") and path.is_file():
            return cls.from_run(Path(spec), seed)
        raise ValueError(
            f"lengths {spec!r}: expected lognormal:MU,SIGMA (finite, SIGMA >= 0), fixed:N (N >= 1) or a "
            "run directory with samples.jsonl"
        )

    @classmethod
    def from_run(cls, run_dir: Path, seed: int = 0) -> Lengths:
        lengths = []
        for line in (Path(run_dir) / "samples.jsonl").read_text().splitlines():
            try:
                n = int(json.loads(line)["length"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn or foreign line: skipped, never fatal
            if n >= 1:
                lengths.append(n)
        if not lengths:
            raise ValueError(f"{run_dir}/samples.jsonl holds no completion lengths")
        return cls("empirical", lengths, seed)

    def __call__(self, uid: int, sample: int, cap: int) -> int:
        if (uid, sample) in self.table:
            return max(1, min(cap, int(self.table[(uid, sample)])))
        rng = draw(self.seed, "length", uid, sample)
        if self.kind == "fixed":
            n = self.values[0]
        elif self.kind == "lognormal":
            n = math.ceil(math.exp(min(rng.normal(*self.values), math.log(cap) + 1)))
        else:
            n = self.values[int(rng.integers(len(self.values)))]
        return max(1, min(cap, int(n)))


class SimPrompts:
    """An endless stream of prompts of `prompt_len` tokens (the Mixture interface)."""

    def __init__(self, prompt_len: int = 64, seed: int = 0):
        self.prompt_len, self.seed, self.issued = prompt_len, seed, 0

    def next_prompts(self, n: int) -> list[Prompt]:
        out = [self._prompt(self.issued + i) for i in range(max(n, 0))]
        self.issued += len(out)
        return out

    def _prompt(self, uid: int) -> Prompt:
        return Prompt(uid, "sim", "", np.ones(self.prompt_len, np.int32))

    def state(self) -> dict:
        return {"issued": self.issued}

    def load_state(self, state: Mapping) -> None:
        self.issued = int(state["issued"])


class SimVerifier:
    """Rewards 1 with probability `p` per rollout, except on the share `unsolved` of prompts that
    no sample solves (their groups are all-equal: what DAPO's dynamic filter drops and samples
    again for). Each call takes `base_s` plus a log-normal `per_rollout_s` per rollout (a
    sandboxed checker's latency), charged to the caller's clock."""

    def __init__(
        self,
        clock,
        p: float = 0.5,
        base_s: float = 0.0,
        per_rollout_s: float = 0.0,
        sigma: float = 0.0,
        seed: int = 0,
        unsolved: float = 0.0,
    ):
        self.clock, self.p, self.base_s, self.per_s = clock, p, base_s, per_rollout_s
        self.sigma, self.seed, self.unsolved = sigma, seed, unsolved

    def latency(self, rollouts) -> float:
        total = self.base_s
        for r in rollouts:
            rng = draw(self.seed, "verify", r.prompt.uid, r.sample_index)
            total += self.per_s * math.exp(rng.normal(0.0, self.sigma) - self.sigma**2 / 2)
        return total

    def score(self, rollouts) -> list[Score]:
        self.clock.advance(self.latency(rollouts))
        return [Score(self._reward(r.prompt.uid, r.sample_index)) for r in rollouts]

    def _reward(self, uid: int, sample: int) -> float:
        if draw(self.seed, "solvable", uid).random() < self.unsolved:
            return 0.0
        return float(draw(self.seed, "reward", uid, sample).random() < self.p)
