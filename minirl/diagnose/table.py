"""The mismatch table: one set of rollouts, scored in several ways ("sides"), compared per source.

`diagnose(cfg)` generates ONE set of rollouts with the engine in its production setting (fast
reductions, the model's dtype), computes the log-probs of those same tokens every way a source
needs, and returns one `Row` per comparison: mean / p95 / max of |log p_a - log p_b| over the
completion tokens (`minirl diagnose` prints them; minirl/diagnose/__init__.py lists the sources).

The sides:

  ENGINE                         the rollouts' own behaviour log-probs, as the engine reported them
  Decode(dtype, exact)           the engine's computation replayed with teacher forcing
                                 (`replay.decode_logprobs`)
  Recompute(dtype, exact, alone) `Trainer.recompute_logprobs`: the full causal forward in the
                                 trainer's micro-batches; `alone`: every row in its own micro-batch,
                                 padded to twice the batch length
  Train(remat, exact)            the training forward under `jax.value_and_grad` with its remat
                                 policy (`replay.train_forward_logprobs`)

A bf16 side computes in bfloat16 from the same weights: the engine stores them in bf16 (as
`EngineConfig.dtype` does), the trainer keeps its master weights and casts (model.dtype=bfloat16).

Sources are a registry: `register_source(name, fn)` adds `fn(ctx) -> list[Row]` to every table.
`ctx.compute(side, params=..., row_layout=...)` computes a side with other parameters (e.g. placed
on a device mesh) and `ctx.compare_arrays(...)` makes the row; scale/diagnose.py registers
"sharding" that way (minirl never imports scale/).

Simplified on purpose: rewards are not scored (the table only needs tokens); statistics are per
token over one batch (RLAX's 0.044 / 0.020 are p95s over 512 training steps of a per-step mean, on
a large model in bf16).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from minirl.diagnose.replay import decode_logprobs, train_forward_logprobs
from minirl.inference.engine import Engine
from minirl.inference.scheduler import Request
from minirl.measure.diagnostics import mismatch_metrics
from minirl.measure.metrics_log import format_table as text_table
from minirl.training.batching import make_batch
from minirl.training.routing import differs, ran_positions
from minirl.training.trainer import Trainer
from minirl.types import Rollout, Score

# ---------------------------------------------------------------------------------------------
# The sides: ways to compute log p of the same tokens


@dataclasses.dataclass(frozen=True)
class _Engine:
    def __str__(self) -> str:
        return "engine log mu"


ENGINE = _Engine()  # the behaviour log-probs the engine reported while sampling


@dataclasses.dataclass(frozen=True)
class Decode:
    dtype: str  # "float32" | "bfloat16"
    exact: bool = False

    def __str__(self) -> str:
        return f"{_short(self.dtype)} decode{' exact' if self.exact else ''}"


@dataclasses.dataclass(frozen=True)
class Recompute:
    dtype: str
    exact: bool = False
    alone: bool = False  # every sequence in its own micro-batch, padded to twice the length
    routing: str = "free"  # MoE: "replay" runs the experts the engine recorded

    def __str__(self) -> str:
        return (
            f"{_short(self.dtype)} recompute{' exact' if self.exact else ''}"
            f"{' (alone, 2x pad)' if self.alone else ''}"
            f"{' (replay)' if self.routing == 'replay' else ''}"
        )


@dataclasses.dataclass(frozen=True)
class Train:
    remat: str  # "none" | "dots" | "nothing"
    exact: bool = False

    def __str__(self) -> str:
        return f"training forward (remat={self.remat}{', exact' if self.exact else ''})"


def _short(dtype: str) -> str:
    return {"float32": "fp32", "bfloat16": "bf16"}[dtype]


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table: |log p_a - log p_b| over the completion tokens of the batch."""

    source: str
    compares: str
    mean: float
    p95: float
    max: float
    tokens: int
    expect_zero: bool  # the exact path: anything but 0.0 is a bug

    @property
    def ok(self) -> bool:
        return not self.expect_zero or self.max == 0.0


# ---------------------------------------------------------------------------------------------
# The context: one batch, its log-probs per side (computed once each)


class Context:
    """The rollouts of one diagnosis and every side's log-probs on them (memoised).

    `fast`: the table was asked for in its CI size (a source may then measure less)."""

    def __init__(self, cfg, params, rollouts: list[Rollout], pad_id: int, fast: bool = False):
        self.cfg, self.params, self.rollouts, self.pad_id = cfg, params, rollouts, pad_id
        self.fast = fast
        self.base_dtype = cfg.model.dtype  # the production dtype every "fast" side uses
        self.trainer_cfg = cfg.trainer
        self.scoring = cfg.engine.sampling.scoring  # each side sets its own `exact`
        self.batch = make_batch(rollouts, pad_id, self.trainer_cfg.bucket_minimum)
        self._cache: dict = {}

    def logprobs(self, side) -> np.ndarray:
        """[B, T] log-probs of the batch's targets computed the `side` way."""
        if side not in self._cache:
            self._cache[side] = self.compute(side)
        return self._cache[side]

    def compute(self, side, params=None, row_layout=None) -> np.ndarray:
        """[B, T] log-probs computed the `side` way with `params` (default: the diagnosed
        model's), not memoised. `row_layout` lays out the rows of Recompute sides (the Trainer's
        row-layout hook) and of Decode sides (each call's rows: the engine's slots)."""
        cfg, batch = self.cfg, self.batch
        params = self.params if params is None else params
        if side is ENGINE:
            return np.where(batch.mask > 0, batch.behaviour_logprobs, 0.0).astype(np.float32)
        if isinstance(side, Decode):
            e = cfg.engine
            return decode_logprobs(
                cfg.model,
                params,
                batch,
                sampling=self.scoring._replace(exact=side.exact),
                dtype=side.dtype,
                rows_per_call=e.slots,
                cache_len=e.cache_len,
                buckets=e.buckets,
                row_layout=row_layout,
            )
        if isinstance(side, Recompute):
            model = dataclasses.replace(cfg.model, dtype=side.dtype)  # master weights kept, cast
            tcfg = dataclasses.replace(self.trainer_cfg, routing=side.routing)
            sampling = self.scoring._replace(exact=side.exact)
            if not side.alone:
                trainer = Trainer(
                    model, params, None, tcfg, row_layout=row_layout, sampling=sampling
                )
                return trainer.recompute_logprobs(batch)
            t = batch.tokens.shape[1]
            wide = make_batch(self.rollouts, self.pad_id, bucket_minimum=2 * t)  # [B, 2T]
            assert np.array_equal(wide.tokens[:, :t], batch.tokens), "make_batch row order changed"
            tcfg = dataclasses.replace(tcfg, micro_batch_tokens=2 * t, bucket_minimum=2 * t)
            trainer = Trainer(model, params, None, tcfg, row_layout=row_layout, sampling=sampling)
            return trainer.recompute_logprobs(wide)[:, :t]
        if isinstance(side, Train):
            model = dataclasses.replace(cfg.model, dtype=self.base_dtype)
            tcfg = dataclasses.replace(self.trainer_cfg, remat=side.remat)
            sampling = self.scoring._replace(exact=side.exact)
            return train_forward_logprobs(model, params, batch, tcfg, sampling)
        raise TypeError(f"unknown side {side!r}")

    def compare_arrays(self, source: str, compares: str, a, b, expect_zero: bool = False) -> Row:
        m = mismatch_metrics(b, a, self.batch.mask)  # over the batch's completion tokens
        stats = (m["mean_abs_dlogp"], m["p95_abs_dlogp"], m["max_abs_dlogp"], int(m["tokens"]))
        return Row(source, compares, *stats, expect_zero)

    def compare(
        self, source: str, a, b, expect_zero: bool = False, label: str | None = None
    ) -> Row:
        return self.compare_arrays(
            source, label or f"{a} vs {b}", self.logprobs(a), self.logprobs(b), expect_zero
        )


# ---------------------------------------------------------------------------------------------
# The sources


def builtin_rows(ctx: Context) -> list[tuple]:
    """Every built-in comparison: (source, a, b, expect_zero, in --fast, note)."""
    d, remat = ctx.base_dtype, ctx.trainer_cfg.remat
    fast, train = Recompute(d), Train(remat)
    bf16, fp32 = "bfloat16", "float32"
    return [
        ("recompute", ENGINE, fast, False, True, "decode vs forward, = mismatch/*"),
        ("recompute", train, ENGINE, False, True, "bypass"),
        ("recompute", train, fast, False, True, "recompute"),
        ("graph", Train("none"), fast, False, False, ""),
        ("graph", Train("dots"), fast, False, False, ""),
        ("graph", Train("nothing"), fast, False, True, ""),
        ("graph", Train(remat, True), Decode(d, True), True, False, ""),
        ("batch", fast, Recompute(d, alone=True), False, True, ""),
        ("batch", Recompute(d, True), Recompute(d, True, alone=True), True, False, ""),
        ("dtype", Decode(bf16), Recompute(fp32), False, True, ""),
        ("dtype", Decode(bf16, True), Recompute(fp32, True), False, False, "the dtype alone"),
        ("exact", Decode(fp32, True), Recompute(fp32, True), True, True, ""),
        ("exact", Decode(bf16, True), Recompute(bf16, True), True, False, ""),
    ]


def routing_rows(ctx: Context) -> list[Row]:
    """The "routing" source (mixture-of-experts models): engine log mu vs the trainer's
    recompute with its own (free) routing, whose label gives the share of tokens whose top-k
    expert set differs from the engine's record in some MoE layer, and vs the recompute that
    replays the engine's experts (trainer.routing=replay). Rows for the production dtype and,
    if that is bf16, for an fp32 trainer too (the usual bf16-engine / fp32-trainer split)."""
    rows = []
    for dtype in dict.fromkeys((ctx.base_dtype, "float32")):
        free = Recompute(dtype)
        model = dataclasses.replace(ctx.cfg.model, dtype=dtype)
        sampling = ctx.scoring._replace(exact=False)
        trainer = Trainer(model, ctx.params, None, ctx.trainer_cfg, sampling=sampling)
        logp, ran, _ = trainer.routing(ctx.batch)
        ctx._cache.setdefault(free, logp)  # the same numbers as the free recompute side
        share = differs(ran, ctx.batch.routes)[ran_positions(ctx.batch.mask)].any(-1).mean()
        label = f"free routing (top-k sets differ on {share:.2%} of tokens): {ENGINE} vs {free}"
        rows.append(ctx.compare("routing", ENGINE, free, label=label))
        rows.append(ctx.compare("routing", ENGINE, Recompute(dtype, routing="replay")))
    return rows


BUILTIN_SOURCES = ("recompute", "graph", "batch", "dtype", "exact", "routing")
# name -> fn(ctx) -> list[Row]: sources added from outside (scale/ adds "sharding").
EXTRA_SOURCES: dict[str, Callable[[Context], list[Row]]] = {}


def register_source(name: str, fn: Callable[[Context], list[Row]]) -> None:
    """Add a mismatch source to every table (e.g. scale/'s "sharding"). Registering a name
    again replaces its function."""
    if not name or name in BUILTIN_SOURCES or not callable(fn):
        raise ValueError("register_source needs a new name and a function ctx -> list[Row]")
    EXTRA_SOURCES[name] = fn


def source_names() -> list[str]:
    return [*BUILTIN_SOURCES, *EXTRA_SOURCES]


# ---------------------------------------------------------------------------------------------
# The diagnosis


def generate_rollouts(cfg, params, prompts: int, samples: int) -> tuple[list[Rollout], int]:
    """`prompts` x `samples` rollouts from the configured engine in its production setting (fast
    reductions, the model's dtype), on the run's first training prompts. Returns (rollouts, pad id)."""
    from minirl.data.mixture import Mixture
    from minirl.modeling.tokenizer import CharTokenizer
    from minirl.tasks import get_task

    tokenizer = CharTokenizer()
    task = get_task(cfg.task.name, **cfg.task.args)
    engine_cfg = dataclasses.replace(
        cfg.engine, exact=False, dtype=None, eos_ids=cfg.engine.eos_ids or tokenizer.eos_ids
    )
    engine = Engine(cfg.model, engine_cfg, seed=cfg.rl.seed)
    engine.load_weights(0, params)
    chosen = Mixture({task.name: task}, seed=cfg.rl.seed).next_prompts(prompts)
    rollouts = engine.generate(
        [Request(p, i, task.max_new_tokens) for p in chosen for i in range(samples)]
    )
    for r in rollouts:
        r.score = Score(0.0, "not scored: the mismatch table only needs tokens")
    return rollouts, tokenizer.pad_id


def diagnose(
    cfg,
    *,
    prompts: int = 16,
    samples: int | None = None,
    sources=None,
    params=None,
    fast: bool = False,
    log=print,
) -> list[Row]:
    """The mismatch table of `cfg` (a `RunConfig`): one `Row` per comparison, for the `sources`
    named (default: `source_names()`), on `prompts` x `samples` (default rl.group_size) rollouts
    of the warm-started model (or of `params`, a pure dict). `fast`: one row per source."""
    names = source_names() if sources is None else list(sources)
    unknown = [n for n in names if n not in source_names()]
    if unknown:
        hint = (
            " ('sharding' needs scale/: python -m scale.diagnose)" if "sharding" in unknown else ""
        )
        raise ValueError(f"unknown mismatch source(s) {unknown}; known: {source_names()}{hint}")
    if prompts < 1 or (samples is not None and samples < 1):
        raise ValueError("prompts and samples must be >= 1")
    if params is None:
        from minirl.modeling.tokenizer import CharTokenizer
        from minirl.run.warmstart import warm_start
        from minirl.tasks import get_task

        task = get_task(cfg.task.name, **cfg.task.args)
        params, _ = warm_start(cfg, CharTokenizer(), task, progress=False, log=log)
    if sources is not None and "routing" in names and not cfg.model.num_experts:
        raise ValueError("the routing source needs a mixture-of-experts model (model.num_experts)")
    rollouts, pad_id = generate_rollouts(cfg, params, prompts, samples or cfg.rl.group_size)
    ctx = Context(cfg, params, rollouts, pad_id, fast=fast)
    rows = [
        ctx.compare(source, a, b, zero, f"{note}: {a} vs {b}" if note else None)
        for source, a, b, zero, in_fast, note in builtin_rows(ctx)
        if source in names and (in_fast or not fast)
    ]
    if "routing" in names and cfg.model.num_experts:
        rows += routing_rows(ctx)
    return rows + [
        row for name in names if name in EXTRA_SOURCES for row in EXTRA_SOURCES[name](ctx)
    ]


TABLE = (  # (column title, Row field, format)
    ("source", "source", "{}"),
    ("compares (a vs b)", "compares", "{}"),
    ("mean|dlogp|", "mean", "{:.3e}"),
    ("p95|dlogp|", "p95", "{:.3e}"),
    ("max|dlogp|", "max", "{:.3e}"),
    ("tokens", "tokens", "{:d}"),
    ("expect", "expect", "{}"),
)


def format_table(rows: list[Row]) -> str:
    """The rows as the text table `minirl diagnose` prints; exact rows say "0 ok" or "0 FAILED"."""

    def expect(r: Row) -> str:
        return ("0 ok" if r.ok else "0 FAILED") if r.expect_zero else ">= 0"

    return text_table([{**dataclasses.asdict(r), "expect": expect(r)} for r in rows], TABLE)
