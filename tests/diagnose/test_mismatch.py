"""minirl.diagnose and exact mode end to end.

Each mismatch source is non-zero where it should be (bf16 engine, bypass) and exactly zero where
it must be (exact mode); `minirl diagnose --fast` runs in-process; an exact on-policy RL run
logs mismatch/max_abs_dlogp == 0.0 at every step, in fp32 and in bf16.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import io
import json

import jax
import numpy as np
import pytest
from flax import nnx

from minirl.diagnose import (
    ENGINE,
    EXTRA_SOURCES,
    Row,
    add_diagnose_parser,
    cmd_diagnose,
    decode_logprobs,
    diagnose,
    format_table,
    register_source,
    source_names,
)
from minirl.diagnose.replay import _prompt_lengths
from minirl.inference.engine import Engine
from minirl.inference.scheduler import Request
from minirl.measure.metrics_log import read_metrics
from minirl.modeling.model import init_model
from minirl.modeling.tokenizer import CharTokenizer
from minirl.run.presets import make_config
from minirl.run.runner import Run
from minirl.store.checkpoints import CheckpointManager
from minirl.tasks import get_task
from minirl.training.batching import make_batch
from minirl.types import Score

# ---------------------------------------------------------------------------------------------
# The table, fast mode, in-process


def _parse(argv):
    parser = argparse.ArgumentParser(prog="minirl")
    add_diagnose_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


@pytest.fixture(scope="module")
def fast_table():
    """`minirl diagnose --fast --json`, with one extra registered source (the hook)."""

    def probe(ctx):  # a source added from outside: the engine's log-probs against themselves
        mu = ctx.logprobs(ENGINE)
        return [ctx.compare_arrays("probe", "engine vs itself", mu, mu.copy(), expect_zero=True)]

    register_source("probe", probe)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            rc = cmd_diagnose(_parse(["diagnose", "--fast", "--json"]))
    finally:
        del EXTRA_SOURCES["probe"]
    return rc, [Row(**r) for r in json.loads(out.getvalue())]


def _row(rows, source, contains):
    found = [r for r in rows if r.source == source and contains in r.compares]
    assert len(found) == 1, f"expected one {source!r} row containing {contains!r}, got {found}"
    return found[0]


@pytest.mark.gpu
def test_fast_table_covers_every_source_and_exact_rows_are_zero(fast_table):
    rc, rows = fast_table
    assert rc == 0
    assert {r.source for r in rows} == set(source_names()) - {"routing"} | {"probe"}  # dense
    assert all(r.tokens > 0 for r in rows)
    exact = [r for r in rows if r.expect_zero]
    assert {r.source for r in exact} == {"exact", "probe"}
    for r in exact:
        assert r.mean == r.p95 == r.max == 0.0, r


def test_bf16_engine_mismatch_is_at_bf16_precision(fast_table):
    r = _row(fast_table[1], "dtype", "bf16 decode vs fp32 recompute")
    # bf16 keeps 8 bits of mantissa: log-probs move by ~1e-3 .. 1e-1, not 1e-7 and not 1.
    assert 1e-4 < r.mean < r.max < 1.0


def test_fast_fp32_decode_and_bypass_see_rounding_mismatch(fast_table):
    rows = fast_table[1]
    decode = _row(rows, "recompute", "engine log mu vs")
    bypass = _row(rows, "recompute", "bypass:")
    assert decode.max > 0.0  # fast fp32 decode and full forward reduce in different orders
    assert bypass.max > 0.0  # prox = mu: the PPO ratio starts away from 1
    # fp32 rounding noise, not bf16-sized: a few ulps of log-probs around -4
    assert bypass.max < 1e-4 and decode.max < 1e-4


def test_format_table_flags_a_nonzero_exact_row():
    rows = [
        Row("exact", "a vs b", 0.0, 0.0, 0.0, 5, True),
        Row("exact", "c vs d", 1e-7, 1e-7, 2e-7, 5, True),
        Row("dtype", "e vs f", 1e-2, 2e-2, 3e-2, 5, False),
    ]
    text = format_table(rows).splitlines()
    assert text[2].endswith("0 ok") and text[3].endswith("0 FAILED") and text[4].endswith(">= 0")
    assert [r.ok for r in rows] == [True, False, True]


def test_unknown_or_clashing_sources_are_clear_errors():
    with pytest.raises(ValueError, match="unknown mismatch source"):
        diagnose(make_config("fixture"), sources=["recompute", "nope"])
    with pytest.raises(ValueError, match="new name"):
        register_source("dtype", lambda ctx: [])


def test_prompt_lengths_from_the_mask():
    # batching.py layout: completion token c of a row with prompt length P sits at P - 1 + c
    mask = np.array([[0, 0, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]], np.float32)
    plen, clen = _prompt_lengths(mask)
    assert plen.tolist() == [3, 1, 1] and clen.tolist() == [3, 2, 0]


# ---------------------------------------------------------------------------------------------
# The teacher-forced decode is the engine's computation (bitwise, in exact mode)


@pytest.mark.gpu
def test_decode_replay_equals_the_exact_engine_bitwise():
    cfg = make_config("fixture")
    tok = CharTokenizer()
    task = get_task(cfg.task.name)
    params = nnx.to_pure_dict(nnx.split(init_model(cfg.model, seed=3))[1])
    ecfg = dataclasses.replace(
        cfg.engine, exact=True, slots=8, eos_ids=tok.eos_ids, temperature=0.8
    )
    engine = Engine(cfg.model, ecfg)
    engine.load_weights(0, params)
    prompts = [task.prompt(i, "train") for i in range(5)]
    rollouts = engine.generate(
        [Request(p, s, task.max_new_tokens) for p in prompts for s in range(3)]
    )
    for r in rollouts:
        r.score = Score(0.0)
    batch = make_batch(rollouts, tok.pad_id)
    replay = decode_logprobs(
        cfg.model,
        params,
        batch,
        sampling=ecfg.sampling,
        rows_per_call=8,
        cache_len=ecfg.cache_len,
        buckets=ecfg.buckets,
    )
    assert batch.mask.sum() > 0
    np.testing.assert_array_equal(replay, np.where(batch.mask > 0, batch.behaviour_logprobs, 0.0))


# ---------------------------------------------------------------------------------------------
# Exact mode end to end: an on-policy RL run with zero mismatch at every step

EXACT_RUNS = {
    # fp32 engine and trainer
    "fp32": ["engine.exact=true"],
    # everything in bf16: the trainer's params and compute, and the engine (which would follow
    # model.dtype anyway; engine.dtype makes it explicit)
    "bf16": [
        "engine.exact=true",
        "model.dtype=bfloat16",
        "model.param_dtype=bfloat16",
        "engine.dtype=bfloat16",
    ],
}
SLOW_EXACT_RUNS = {
    # mixed precision: fp32 master weights, bf16 compute; the engine casts the weights to bf16
    "bf16_fp32_master": ["engine.exact=true", "model.dtype=bfloat16"],
    # sampling knobs: tempered, truncated distributions on both sides
    "fp32_sampling": [
        "engine.exact=true",
        "engine.temperature=0.7",
        "engine.top_k=20",
        "engine.top_p=0.9",
    ],
}
MISMATCH_RUNS = {
    # mismatch by design, fast mode: a bf16 engine samples for an fp32 trainer
    "bf16_engine": ["engine.dtype=bfloat16"],
}
SMALL_RUN = [
    "rl.steps=3",
    "rl.prompts_per_step=4",
    "rl.group_size=4",
    "rl.checkpoint_every=3",
    "engine.slots=16",
    "eval.prompts=2",
    "eval.samples=2",
]
FIG5 = ("train/dlogp_recompute", "train/dlogp_no_recompute")


@functools.cache
def _exact_run(name: str, root: str) -> list[dict]:
    overrides = {**EXACT_RUNS, **SLOW_EXACT_RUNS, **MISMATCH_RUNS}[name]
    cfg = make_config("fixture", SMALL_RUN + overrides)
    Run(cfg, f"{root}/{name}", log=lambda *a: None, progress=False).train()
    return read_metrics(f"{root}/{name}")


@pytest.fixture(scope="module")
def run_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("exact_runs"))


def _assert_zero_mismatch(records):
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["mismatch/tokens"] > 0 and r["mismatch/nonfinite_tokens"] == 0
        assert r["mismatch/max_abs_dlogp"] == 0.0, (r["step"], r["mismatch/max_abs_dlogp"])
        assert r["train/skipped_nonfinite"] == 0
        for prefix in FIG5:  # the training forward of the first update is exact too
            assert r[f"{prefix}/max_abs_dlogp"] == 0.0, (r["step"], prefix)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name",  # bf16 compiles its own programs (~25 s cold): the slow lane runs it
    [pytest.param(n, marks=pytest.mark.slow) if n == "bf16" else n for n in EXACT_RUNS],
)
def test_exact_run_has_zero_mismatch_every_step(name, run_root):
    _assert_zero_mismatch(_exact_run(name, run_root))


def test_rlax_fig5_series_separate_recompute_from_the_engine(run_root):
    # A bf16 engine for an fp32 trainer: without recomputation the PPO ratio's denominator is
    # the engine's bf16 log mu (bf16-sized gap); with it, the trainer's own fp32 recompute (fp32
    # rounding noise at most).
    for r in _exact_run("bf16_engine", run_root):
        with_, without = (r[f"{p}/mean_abs_dlogp"] for p in FIG5)
        assert r["train/dlogp_recompute/max_abs_dlogp"] < 1e-5
        assert without > 1e-4 and without > 100 * with_
        # per token | |pi - mu| - |prox - mu| | <= |pi - prox|, so the means obey it too
        assert abs(without - r["mismatch/mean_abs_dlogp"]) <= with_ + 1e-12


@pytest.mark.slow  # runs the all-bf16 exact run, which is in the slow lane
def test_the_bf16_run_really_trains_bf16_weights(run_root):
    # Not a vacuous zero: the all-bf16 run's checkpoint holds bf16 weights (the fp32 run's fp32).
    for name, dtype in (("bf16", "bfloat16"), ("fp32", "float32")):
        _exact_run(name, run_root)
        params = CheckpointManager(f"{run_root}/{name}").restore().params
        assert {np.asarray(x).dtype.name for x in jax.tree.leaves(params)} == {dtype}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SLOW_EXACT_RUNS))
def test_exact_run_has_zero_mismatch_every_step_slow(name, run_root):
    _assert_zero_mismatch(_exact_run(name, run_root))


# ---------------------------------------------------------------------------------------------
# The routing source (mixture-of-experts models)


@pytest.mark.slow
def test_routing_source_measures_the_routers_disagreement_and_replay():
    """A bf16 engine on a tiny MoE: a bf16 trainer routes every token as the engine did, an
    fp32 trainer does not (its label says on what share); replaying the engine's experts is
    never further from the engine than free routing. A dense model refuses the source."""
    cfg = make_config("fixture", ["model.expert_dim=32", "model.num_experts=8"])
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype="bfloat16"))
    params = nnx.to_pure_dict(nnx.split(init_model(cfg.model, seed=0))[1])
    rows = diagnose(cfg, prompts=4, samples=2, sources=["routing"], params=params, log=None)
    assert [r.source for r in rows] == ["routing"] * 4 and all(r.tokens > 0 for r in rows)
    bf16_free, bf16_replay, fp32_free, fp32_replay = rows
    assert "differ on 0.00% of tokens" in bf16_free.compares
    assert "bf16 recompute (replay)" in bf16_replay.compares
    share = float(fp32_free.compares.split("differ on ")[1].split("%")[0])
    assert 0.0 < share < 50.0
    assert fp32_replay.max <= fp32_free.max and bf16_replay.max <= bf16_free.max
    assert 1e-4 < fp32_free.mean < 0.1  # the bf16 engine against an fp32 trainer
    with pytest.raises(ValueError, match="routing source needs a mixture-of-experts"):
        diagnose(make_config("fixture"), sources=["routing"], params=params)
