"""The prompt mixture: weighted draws over several datasets from counter-based RNG streams.

Draw number i (0, 1, 2, ... over the whole run) picks a dataset with probability proportional
to its weight, using a uniform number that is a pure function of (seed, i). The dataset then
yields its next item by its own counter c:

  * a Task yields `task.prompt(c, split)` (tasks are already random by index);
  * a finite list of Prompts is read in epochs: epoch e = c // len is a permutation keyed on
    (seed, dataset name, e), so every prompt is seen once per epoch, in a fresh order each
    epoch, and the list cycles forever (`shuffle=False` keeps file order).

So the i-th prompt depends only on (seed, i) — not on the batch sizes of earlier calls — and the
whole state is a small JSON-able dict: {seed, position i, per-dataset counters, ...}. RLAX
stores exactly this in each controller snapshot; restoring it replays the same prompts
bitwise (RLAX §"deterministic recovery").

Simplification: weights are fixed for a run (no curriculum schedule); a resumed run must use
the same datasets and weights, and `load_state` refuses a state that does not match.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from minirl.data.task_api import SPLITS, Task, stable_hash, stream
from minirl.types import Prompt

STATE_VERSION = 1


class Mixture:
    """Weighted, resumable prompt stream over named datasets (Tasks or lists of Prompts)."""

    def __init__(
        self,
        datasets: Mapping[str, Task | Sequence[Prompt]],
        weights: Mapping[str, float] | None = None,
        seed: int = 0,
        split: str = "train",
        shuffle: bool = True,
    ):
        if not datasets:
            raise ValueError("Mixture needs at least one dataset")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        weights = {name: 1.0 for name in datasets} if weights is None else dict(weights)
        if set(weights) != set(datasets):
            raise ValueError(
                f"weights must name exactly the datasets {sorted(datasets)}, got {sorted(weights)}"
            )
        for name, w in weights.items():
            if not (np.isfinite(w) and w >= 0):
                raise ValueError(f"weight of {name!r} must be finite and >= 0, got {w}")
        if sum(weights.values()) <= 0:
            raise ValueError("at least one weight must be > 0")
        for name, d in datasets.items():
            if not isinstance(d, Task) and len(d) == 0:
                raise ValueError(f"dataset {name!r} is an empty list")
        self.datasets = dict(datasets)
        self.names = sorted(datasets)  # fixed order: the draw does not depend on dict order
        self.weights = {name: float(weights[name]) for name in self.names}
        self.seed, self.split, self.shuffle = int(seed), split, shuffle
        total = sum(self.weights.values())
        self._cdf = np.cumsum([self.weights[n] / total for n in self.names])
        self.position = 0
        self.counters = {name: 0 for name in self.names}
        self._is_task = {n: isinstance(d, Task) for n, d in self.datasets.items()}
        self._perms: dict[str, tuple[int, np.ndarray]] = {}  # name -> (epoch, permutation)

    # -- drawing

    def choose(self, i: int) -> str:
        """The dataset of draw i: a pure function of (seed, i)."""
        u = (stable_hash("mixture", self.seed, i) >> 10) / 2.0**53  # uniform in [0, 1)
        k = int(np.searchsorted(self._cdf, u, side="right"))
        return self.names[min(k, len(self.names) - 1)]

    def _item(self, name: str, c: int) -> Prompt:
        data = self.datasets[name]
        if self._is_task[name]:
            return data.prompt(c, self.split)
        epoch, j = divmod(c, len(data))
        if self.shuffle:
            if name not in self._perms or self._perms[name][0] != epoch:  # a derived cache
                perm = stream("mixture-epoch", self.seed, name, epoch).permutation(len(data))
                self._perms[name] = (epoch, perm)
            j = int(self._perms[name][1][j])
        prompt = data[j]
        return (
            prompt if epoch == 0 else replace(prompt, uid=stable_hash("epoch", prompt.uid, epoch))
        )

    def next_prompts(self, n: int) -> list[Prompt]:
        """The next n prompts of the stream; advances the position and counters."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        out = []
        for _ in range(n):
            name = self.choose(self.position)
            out.append(self._item(name, self.counters[name]))
            self.counters[name] += 1
            self.position += 1
        return out

    def epochs(self) -> dict[str, float]:
        """How many passes over each finite list have been made (for logs)."""
        return {
            n: self.counters[n] / len(d) for n, d in self.datasets.items() if not self._is_task[n]
        }

    # -- state

    def state(self) -> dict:
        """Everything needed to continue the stream exactly: small and JSON-able."""
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "split": self.split,
            "shuffle": self.shuffle,
            "weights": dict(self.weights),
            "position": self.position,
            "counters": dict(self.counters),
        }

    def load_state(self, state: Mapping) -> None:
        """Continue from a saved state; refuses a state from a different mixture."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"mixture state version {state.get('version')} != {STATE_VERSION}")
        if sorted(state["counters"]) != self.names:
            raise ValueError(
                f"saved mixture has datasets {sorted(state['counters'])}, this one {self.names}"
            )
        for key in ("seed", "split", "shuffle", "weights"):
            if state[key] != getattr(self, key):
                raise ValueError(f"saved mixture {key} {state[key]!r} != {getattr(self, key)!r}")
        if sum(state["counters"].values()) != state["position"]:
            raise ValueError("corrupt mixture state: counters do not add up to position")
        self.position = int(state["position"])
        self.counters = {name: int(c) for name, c in state["counters"].items()}

    @classmethod
    def restore(cls, datasets: Mapping[str, Task | Sequence[Prompt]], state: Mapping) -> Mixture:
        """A mixture over `datasets` continuing from `state` (weights, seed, split from state)."""
        mixture = cls(
            datasets,
            weights=state["weights"],
            seed=state["seed"],
            split=state["split"],
            shuffle=state["shuffle"],
        )
        mixture.load_state(state)
        return mixture
