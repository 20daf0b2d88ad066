"""Training-inference mismatch, one source at a time: RLAX's Fig. 5 / VeXact's ablations in miniature.

    minirl diagnose [--preset NAME] [--set KEY=VALUE ...] [--fast]

generates ONE set of rollouts with the engine in its production setting (fast reductions, the
model's dtype), then scores those same tokens in several ways ("sides") and prints, per mismatch
source, mean / p95 / max of |log p_a - log p_b| over the completion tokens:

  source     rows (a vs b)                                         what it isolates
  recompute  engine log mu vs trainer recompute                    decode vs full forward (what the
                                                                   controller logs as mismatch/*)
             bypass: training forward vs engine log mu             the PPO ratio's first value when
             recompute: training forward vs recomputed prox         prox = mu vs prox recomputed
                                                                   (VeXact §4.1; RLAX §5.1)
  graph      training forward, remat none|dots|nothing, vs         RLAX's "inference-matched graph":
             recompute; exact training forward vs exact decode     does the remat policy move logits?
  batch      recompute in the batch vs each sequence alone,        batch-variant reductions (VeXact
             padded to twice the length (fast, then exact)         §3.1)
  dtype      bf16 engine decode vs fp32 trainer recompute (fast,   the engine's dtype; with exact on
             then exact on both sides)                              both sides it is the dtype alone
  exact      exact decode vs exact recompute, fp32 and bf16        must be 0 (the zero-mismatch path)

The sides:

  ENGINE                         the rollouts' own behaviour log-probs, as the engine reported them
  Decode(dtype, exact)           the engine's computation replayed with teacher forcing
                                 (`decode_logprobs`): prefill the prompt into a KV cache of the
                                 engine's length, then one token per call, rows grouped by the
                                 engine's slot count. Bitwise the engine's numbers in exact mode
                                 (tests/test_mismatch.py); in fast mode only close to them
  Recompute(dtype, exact, alone) `Trainer.recompute_logprobs`: the full causal forward in the
                                 trainer's micro-batches; `alone`: every row in its own micro-batch,
                                 padded to twice the batch length
  Train(remat, exact)            the training forward: the trainer's own forward under
                                 `jax.value_and_grad` with its remat policy, on the same
                                 micro-batches as the recompute (`train_forward_logprobs`)

A bf16 side computes in bfloat16 from the same weights: the engine stores them in bf16 (as
`EngineConfig.dtype` does), the trainer keeps its master weights and casts (model.dtype=bfloat16).

`--fast` (CI) keeps one row per source: the fixture preset, 4 prompts (`builtin_rows` marks them).

Hook for other sources: `register_source(name, fn)` adds `fn(ctx) -> list[Row]` to every table.
scale/ registers "sharding" there: the trainer's recompute on a device mesh against the same
recompute on one device, e.g. `ctx.compare_arrays("sharding", "mesh vs one device", sharded,
ctx.logprobs(Recompute(ctx.base_dtype)))` with `ctx.batch` and `ctx.params` as inputs.

Simplified on purpose: the Train side uses a stand-in loss (the sum of the counted log-probs), not
the run's objective, so XLA may fuse its backward pass differently from a real step's; rewards
are not scored (the table only needs tokens); statistics are per token over one batch (RLAX's
0.044 / 0.020 are p95s over 512 training steps of a per-step mean, on a large model in bf16).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import platform
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from minirl import microbatch as mbt
from minirl.batching import make_batch
from minirl.diagnostics import mismatch_metrics
from minirl.engine import Engine
from minirl.forward import ForwardSpec, logprobs_and_logits
from minirl.model import KVCache, ModelConfig, Transformer, token_logprobs
from minirl.scheduler import Request
from minirl.trainer import Trainer, TrainerConfig
from minirl.types import Batch, Rollout, Score

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

    def __str__(self) -> str:
        return (
            f"{_short(self.dtype)} recompute{' exact' if self.exact else ''}"
            f"{' (alone, 2x pad)' if self.alone else ''}"
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
# Teacher-forced decode: the engine's computation on given tokens


def _prompt_lengths(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[B, T] completion mask -> (prompt length P [B], completion length C [B]). Completion token
    c of row b sits at position P - 1 + c (minirl/batching.py)."""
    has = mask.max(axis=1) > 0
    return np.where(has, np.argmax(mask > 0, axis=1) + 1, 1), (mask > 0).sum(axis=1)


@functools.lru_cache(maxsize=16)
def _decode_fns(
    cfg: ModelConfig, exact: bool, temperature: float, top_k: int, top_p: float, cache_len: int
):
    """Jitted (prefill, step) for one setting, mirroring the rollout engine's prefill and decode."""
    graphdef = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(params=0))))[0]

    def logp(logits, targets):  # [R, V], [R] -> [R]
        out = token_logprobs(logits[:, None], targets[:, None], temperature, exact, top_k, top_p)
        return out[:, 0]

    def prefill(params, tokens, lengths, targets):
        """tokens [R, Lb] right-padded prompts -> (cache of cache_len positions, log p [R])."""
        model = nnx.merge(graphdef, params)
        rows, width = tokens.shape
        logits, fresh = model(
            tokens, cache=KVCache.zeros(cfg, rows, width), num_new=lengths, exact=exact
        )  # [R, Lb, V]
        last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]  # [R, V]
        pad = lambda x: jnp.pad(x, ((0, 0), (0, cache_len - width), (0, 0), (0, 0)))
        cache = KVCache(tuple(map(pad, fresh.k)), tuple(map(pad, fresh.v)), lengths)
        return cache, logp(last, targets)

    def step(params, cache, tokens, targets, live):
        """One decode step: tokens [R] -> log p of targets [R]; rows with live 0 do not advance."""
        model = nnx.merge(graphdef, params)
        logits, cache = model(tokens[:, None], cache=cache, num_new=live, exact=exact)
        return cache, logp(logits[:, 0], targets)

    return jax.jit(prefill), jax.jit(step, donate_argnums=(1,))


def decode_logprobs(
    model_cfg: ModelConfig,
    params,
    batch: Batch,
    *,
    exact: bool,
    dtype: str | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    rows_per_call: int = 8,
    cache_len: int = 256,
    buckets: tuple[int, ...] = (32, 64, 128),
) -> np.ndarray:
    """log p of `batch.targets` as the rollout engine computes it: [B, T] float32, 0 off the mask.

    Rows are processed `rows_per_call` at a time (the engine's slot count): the prompt is
    prefilled (right-padded to a bucket length) into a cache of `cache_len` positions, then each
    completion token is fed back one per call, teacher-forced. `dtype` overrides the compute
    and storage dtype as `EngineConfig.dtype` does (weights cast to it once).
    """
    dtype = dtype or model_cfg.dtype
    cfg = dataclasses.replace(model_cfg, dtype=dtype, param_dtype=dtype)
    params = jax.tree.map(lambda x: jnp.asarray(x, cfg.storage_dtype), params)
    mask = np.asarray(batch.mask)
    plen, clen = _prompt_lengths(mask)  # [B], [B]
    need = int((plen + clen - 1).max())
    if need > cache_len:
        raise ValueError(
            f"decode_logprobs: a row needs {need} cache positions, cache_len is {cache_len}"
        )
    prefill, step = _decode_fns(cfg, exact, float(temperature), int(top_k), float(top_p), cache_len)
    lengths_allowed = sorted({b for b in buckets if b < cache_len} | {cache_len})
    out = np.zeros(mask.shape, np.float32)  # [B, T]
    for start in range(0, mask.shape[0], rows_per_call):
        rows = np.arange(start, min(start + rows_per_call, mask.shape[0]))
        r = rows_per_call
        p = np.ones(r, np.int32)
        c = np.zeros(r, np.int32)
        p[: len(rows)], c[: len(rows)] = plen[rows], clen[rows]
        width = next(b for b in lengths_allowed if b >= p.max())
        tokens = np.zeros((r, width), np.int32)
        first = np.zeros(r, np.int32)
        for k, b in enumerate(rows):
            tokens[k, : p[k]] = batch.tokens[b, : p[k]]
            first[k] = batch.targets[b, p[k] - 1]
        cache, lp = prefill(params, tokens, p, first)
        got = [np.asarray(lp)]
        for j in range(int(c.max()) - 1):  # completion token j goes in, token j + 1 is scored
            live = (j < c - 1).astype(np.int32)
            tok, tgt = np.zeros(r, np.int32), np.zeros(r, np.int32)
            for k, b in enumerate(rows):
                if live[k]:
                    tok[k], tgt[k] = batch.tokens[b, p[k] + j], batch.targets[b, p[k] + j]
            cache, lp = step(params, cache, tok, tgt, live)
            got.append(np.asarray(lp))
        got = np.stack(got, axis=1)  # [R, max C]
        for k, b in enumerate(rows):
            out[b, p[k] - 1 : p[k] - 1 + c[k]] = got[k, : c[k]]
    return np.where(mask > 0, out, 0.0).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# The training forward: the trainer's own forward, under value_and_grad, with its remat policy


@functools.lru_cache(maxsize=16)
def _train_forward_fn(s: ForwardSpec):
    def run(params, tokens, targets, mask):
        def loss(p):
            logp = logprobs_and_logits(s, p, tokens, targets, remat=True)[0]  # [R, Tb]
            return jnp.sum(jnp.where(mask > 0, logp, 0.0)), logp

        (_, logp), grads = jax.value_and_grad(loss, has_aux=True)(params)
        # Return something of the gradient, or XLA drops the backward pass and the remat with it.
        return logp, optax.tree.norm(grads)

    return jax.jit(run)


def train_forward_logprobs(
    model_cfg: ModelConfig, params, batch: Batch, cfg: TrainerConfig
) -> np.ndarray:
    """log pi_theta of `batch.targets` as the training step's forward computes it (its remat
    policy, its micro-batches, inside `jax.value_and_grad`): [B, T] float32, 0 off the mask."""
    fn = _train_forward_fn(ForwardSpec.of(model_cfg, cfg))
    plan = mbt.pack_rows(
        mbt.row_lengths(batch.mask),
        cfg.micro_batch_tokens,
        cfg.bucket_minimum,
        max_length=batch.tokens.shape[1],
    )
    out = np.zeros(batch.mask.shape, np.float32)  # [B, T]
    for mb in plan:
        logp, _ = fn(
            params,
            mbt.gather(batch.tokens, mb),
            mbt.gather(batch.targets, mb),
            mbt.gather(batch.mask, mb),
        )
        mbt.scatter(np.asarray(logp), mb, out)
    return np.where(batch.mask > 0, out, 0.0).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# The context: one batch, its log-probs per side (computed once each)


class Context:
    """The rollouts of one diagnosis and every side's log-probs on them (memoised)."""

    def __init__(self, cfg, params, rollouts: list[Rollout], pad_id: int):
        self.cfg, self.params, self.rollouts, self.pad_id = cfg, params, rollouts, pad_id
        self.base_dtype = cfg.model.dtype  # the production dtype every "fast" side uses
        self.trainer_cfg = dataclasses.replace(cfg.trainer_config(), exact=False)
        self.batch = make_batch(rollouts, pad_id, self.trainer_cfg.bucket_minimum)
        self._cache: dict = {}

    def logprobs(self, side) -> np.ndarray:
        """[B, T] log-probs of the batch's targets computed the `side` way."""
        if side not in self._cache:
            self._cache[side] = self._compute(side)
        return self._cache[side]

    def _compute(self, side) -> np.ndarray:
        cfg, batch = self.cfg, self.batch
        if side is ENGINE:
            return np.where(batch.mask > 0, batch.behaviour_logprobs, 0.0).astype(np.float32)
        if isinstance(side, Decode):
            e = cfg.engine
            return decode_logprobs(
                cfg.model,
                self.params,
                batch,
                exact=side.exact,
                dtype=side.dtype,
                temperature=e.logprob_temperature,
                top_k=e.top_k,
                top_p=e.top_p,
                rows_per_call=e.slots,
                cache_len=e.cache_len,
                buckets=e.buckets,
            )
        if isinstance(side, Recompute):
            model = dataclasses.replace(cfg.model, dtype=side.dtype)  # master weights kept, cast
            tcfg = dataclasses.replace(self.trainer_cfg, exact=side.exact)
            if not side.alone:
                return Trainer(model, self.params, None, tcfg).recompute_logprobs(batch)
            t = batch.tokens.shape[1]
            wide = make_batch(self.rollouts, self.pad_id, bucket_minimum=2 * t)  # [B, 2T]
            assert np.array_equal(wide.tokens[:, :t], batch.tokens), "make_batch row order changed"
            tcfg = dataclasses.replace(tcfg, micro_batch_tokens=2 * t, bucket_minimum=2 * t)
            return Trainer(model, self.params, None, tcfg).recompute_logprobs(wide)[:, :t]
        if isinstance(side, Train):
            model = dataclasses.replace(cfg.model, dtype=self.base_dtype)
            tcfg = dataclasses.replace(self.trainer_cfg, exact=side.exact, remat=side.remat)
            return train_forward_logprobs(model, self.params, batch, tcfg)
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


BUILTIN_SOURCES = ("recompute", "graph", "batch", "dtype", "exact")
# name -> fn(ctx) -> list[Row]: sources added from outside (scale/ adds "sharding").
EXTRA_SOURCES: dict[str, Callable[[Context], list[Row]]] = {}


def register_source(name: str, fn: Callable[[Context], list[Row]]) -> None:
    """Add a mismatch source to every table (e.g. scale/'s "sharding")."""
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
    from minirl.data import get_task
    from minirl.data.mixture import Mixture
    from minirl.tokenizer import CharTokenizer

    tokenizer = CharTokenizer()
    task = get_task(cfg.task.name, **cfg.task.args)
    engine_cfg = dataclasses.replace(
        cfg.engine, exact=False, dtype=None, eos_id=tokenizer.eos_id, seed=cfg.rl.seed
    )
    engine = Engine(cfg.model, engine_cfg)
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
        raise ValueError(f"unknown mismatch source(s) {unknown}; known: {source_names()}")
    if prompts < 1 or (samples is not None and samples < 1):
        raise ValueError("prompts and samples must be >= 1")
    if params is None:
        from minirl.data import get_task
        from minirl.tokenizer import CharTokenizer
        from minirl.warmstart import warm_start

        task = get_task(cfg.task.name, **cfg.task.args)
        params, _ = warm_start(cfg, CharTokenizer(), task, progress=False, log=log)
    rollouts, pad_id = generate_rollouts(cfg, params, prompts, samples or cfg.rl.group_size)
    ctx = Context(cfg, params, rollouts, pad_id)
    rows = [
        ctx.compare(source, a, b, zero, f"{note}: {a} vs {b}" if note else None)
        for source, a, b, zero, in_fast, note in builtin_rows(ctx)
        if source in names and (in_fast or not fast)
    ]
    return rows + [
        row for name in names if name in EXTRA_SOURCES for row in EXTRA_SOURCES[name](ctx)
    ]


def format_table(rows: list[Row]) -> str:
    width = max(len(r.compares) for r in rows)
    head = f"{'source':10s} {'compares (a vs b)':{width}s} {'mean|dlogp|':>11s} {'p95|dlogp|':>11s} {'max|dlogp|':>11s} {'tokens':>7s}  expect"
    lines = [head, "-" * len(head)]
    for r in rows:
        expect = ("0 ok" if r.ok else "0 FAILED") if r.expect_zero else ">= 0"
        lines.append(
            f"{r.source:10s} {r.compares:{width}s} {r.mean:11.3e} {r.p95:11.3e} {r.max:11.3e} "
            f"{r.tokens:7d}  {expect}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The command


def add_diagnose_parser(subparsers):
    """`minirl diagnose`: add the subcommand to an argparse subparsers object."""
    from minirl.config import PRESETS

    p = subparsers.add_parser(
        "diagnose",
        help="training-inference mismatch per source on the same rollouts (a table)",
        description=__doc__.split("\n\n")[0]
        + " "
        + "Each source is studied alone; exact rows must be 0.",
    )
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="run configuration (default: countdown; with --fast: fixture)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one knob (repeatable; `minirl config` lists them)",
    )
    p.add_argument(
        "--fast",
        action="store_true",
        help="a small table for CI: fixture preset, 4 prompts, one row per source",
    )
    p.add_argument(
        "--prompts", type=int, default=None, help="prompts to roll out (default 16; --fast 4)"
    )
    p.add_argument(
        "--samples", type=int, default=None, help="samples per prompt (default rl.group_size)"
    )
    p.add_argument(
        "--sources", default=None, help=f"comma-separated subset of: {', '.join(source_names())}"
    )
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    p.set_defaults(fn=cmd_diagnose)
    return p


def cmd_diagnose(args) -> int:
    from minirl.config import DEFAULT_PRESET, make_config

    preset = args.preset or ("fixture" if args.fast else DEFAULT_PRESET)
    cfg = make_config(preset, args.overrides)
    sources = args.sources.split(",") if args.sources else None
    prompts = args.prompts or (4 if args.fast else 16)
    t0 = time.perf_counter()
    rows = diagnose(
        cfg,
        prompts=prompts,
        samples=args.samples,
        sources=sources,
        fast=args.fast,
        log=lambda *a: None,
    )
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
    else:
        print(
            f"minirl diagnose: preset {preset}, {prompts} prompts x "
            f"{args.samples or cfg.rl.group_size} samples, model {cfg.model.dtype}, "
            f"{platform.machine()} {jax.devices()[0].platform}, {time.perf_counter() - t0:.0f}s"
        )
        print(format_table(rows))
    return 0 if all(r.ok for r in rows) else 1
