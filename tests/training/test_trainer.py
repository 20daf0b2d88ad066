"""Trainer, micro-batch packing and make_batch: fast path == slow path, hand-checked layouts,
guards that hold, and two tiny learning problems.

Compiles are the cost here, so every trainer uses one tiny model and a batch whose micro-batch
plans use only a few shapes: (8, 64) for the whole batch, (4, 64) + (4, 32) for two micro-batches
and (2, 64) + (4, 32) for three; the jitted functions are shared between trainers with equal
settings.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from minirl.losses import get_preset
from minirl.measure.diagnostics import first_update_dlogp, mismatch_metrics
from minirl.measure.metrics_log import replayed
from minirl.modeling import lora
from minirl.modeling.model import KVCache, ModelConfig, init_model, token_logprobs
from minirl.modeling.sampling import Sampling
from minirl.store.serialization import from_bytes, to_bytes
from minirl.training import microbatch as mbt
from minirl.training.batching import bucket_length, make_batch
from minirl.training.trainer import Trainer, TrainerConfig, learning_rate
from minirl.types import Batch, Prompt, Rollout, Score

CFG = ModelConfig(
    vocab_size=32,
    dim=32,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    mlp_dim=64,
    max_seq_len=128,
)
BOS, EOS, PAD = 1, 2, 0
# (prompt length, completion length) of the 8 rollouts; rows need P+C-1 positions: 4 rows > 32
# (bucket 64), 4 rows <= 32 (bucket 32)
SHAPES = [(5, 56), (9, 42), (4, 43), (12, 29), (6, 25), (3, 9), (7, 14), (4, 5)]


def _rollout(uid, k, p, c, rng, reward):
    prompt = Prompt(uid, "test", "", np.r_[BOS, rng.integers(3, 32, p - 1)].astype(np.int32))
    tokens = rng.integers(3, 32, c).astype(np.int32)
    logprobs = (-rng.exponential(1.0, c)).astype(np.float32)
    return Rollout(
        prompt, k, tokens, logprobs, np.full(c, 7, np.int32), "length", score=Score(reward)
    )


@pytest.fixture(scope="module")
def params():
    return nnx.to_pure_dict(nnx.split(init_model(CFG, seed=0))[1])


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    rollouts = [
        _rollout(100 + i // 4, i % 4, p, c, rng, float(rng.normal()))
        for i, (p, c) in enumerate(SHAPES)
    ]
    return make_batch(rollouts[::-1], PAD)  # reversed: make_batch must restore the group order


def _tree_max_diff(a, b):
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def _bits(tree):
    return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


# ---- batching and packing (numpy only) --------------------------------------------------------


def test_bucket_lengths():
    assert [bucket_length(n) for n in (0, 1, 32, 33, 64, 200, 256, 257, 300, 513, 1000)] == [
        32,
        32,
        32,
        64,
        64,
        224,
        256,
        320,
        320,
        640,
        1024,
    ]
    assert (
        bucket_length(5, minimum=8) == 8
        and bucket_length(64, minimum=8) == 64
        and bucket_length(70, minimum=8) == 80
    )


def test_make_batch_alignment_by_hand():
    a = Rollout(
        Prompt(9, "t", "", np.array([1, 5, 6], np.int32)),
        1,
        np.array([7, 2], np.int32),
        np.array([-0.5, -0.25], np.float32),
        np.array([3, 4], np.int32),
        "eos",
        score=Score(1.0),
    )
    b = Rollout(
        Prompt(4, "t", "", np.array([1, 8], np.int32)),
        0,
        np.array([10, 11, 2], np.int32),
        np.array([-1.0, -2.0, -3.0], np.float32),
        np.array([5, 5, 5], np.int32),
        "eos",
        score=Score(0.5),
    )
    batch = make_batch([a, b], pad_id=0, bucket_minimum=8)
    # rows sorted by prompt uid: b (uid 4) first; sequences b = 1 8 10 11 2, a = 1 5 6 7 2
    np.testing.assert_array_equal(
        batch.tokens, [[1, 8, 10, 11, 0, 0, 0, 0], [1, 5, 6, 7, 0, 0, 0, 0]]
    )
    np.testing.assert_array_equal(
        batch.targets, [[8, 10, 11, 2, 0, 0, 0, 0], [5, 6, 7, 2, 0, 0, 0, 0]]
    )
    np.testing.assert_array_equal(batch.mask, [[0, 1, 1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(
        batch.behaviour_logprobs, [[0, -1, -2, -3, 0, 0, 0, 0], [0, 0, -0.5, -0.25, 0, 0, 0, 0]]
    )
    np.testing.assert_array_equal(
        batch.versions, [[-1, 5, 5, 5, -1, -1, -1, -1], [-1, -1, 3, 4, -1, -1, -1, -1]]
    )
    np.testing.assert_array_equal(batch.rewards, [0.5, 1.0])
    np.testing.assert_array_equal(batch.group_ids, [0, 1])
    np.testing.assert_array_equal(batch.prompt_uids, [4, 9])
    # completion token c is the target at position P-1+c
    assert batch.targets[1, 2 + 0] == 7 and batch.targets[0, 1 + 2] == 2


def test_make_batch_rejects_bad_input():
    r = Rollout(
        Prompt(1, "t", "", np.array([1], np.int32)),
        0,
        np.array([3], np.int32),
        np.array([-1.0], np.float32),
        np.array([0], np.int32),
        "eos",
    )
    with pytest.raises(ValueError, match="no score"):
        make_batch([r], 0)
    r.score = Score(float("nan"))
    with pytest.raises(ValueError, match="non-finite reward"):
        make_batch([r], 0)
    r.score = Score(1.0)
    r.logprobs = np.zeros(2, np.float32)
    with pytest.raises(ValueError, match="equal lengths"):
        make_batch([r], 0)


def test_pack_rows_by_hand():
    # lengths 40, 10, 33, 5 under 128 tokens: longest first -> 40 opens a [2, 64] micro-batch and
    # 33 joins it; 10 opens a [4, 32] one (capacity 4) and 5 joins it, padded to 2 rows.
    plan = mbt.pack_rows(np.array([40, 10, 33, 5]), 128)
    assert [(mb.rows.tolist(), mb.shape) for mb in plan] == [([0, 2], (2, 64)), ([1, 3], (2, 32))]


@pytest.mark.parametrize("budget", [64, 100, 256, 1000, 4096])
def test_pack_rows_respects_budget_and_keeps_every_row_once(budget):
    rng = np.random.default_rng(budget)
    lengths = rng.integers(0, 60, 37)
    rows = rng.permutation(37)[:29]  # a mini-batch's rows
    plan = mbt.pack_rows(lengths, budget, rows=rows)
    packed = np.concatenate([mb.rows for mb in plan])
    assert sorted(packed.tolist()) == sorted(rows.tolist())  # each selected row exactly once
    for mb in plan:
        assert mb.padded_tokens <= budget
        assert len(mb.rows) <= mb.num_rows and mb.num_rows & (mb.num_rows - 1) == 0  # power of two
        assert lengths[mb.rows].max() <= mb.length
    # first-fit decreasing: rows arrive longest first, so each micro-batch's first row is its longest
    assert all(lengths[mb.rows[0]] == lengths[mb.rows].max() for mb in plan)


def _padding_share(lengths, trainer_cfg) -> tuple[float, set]:
    plan = mbt.pack_rows(lengths, trainer_cfg.micro_batch_tokens, trainer_cfg.bucket_minimum)
    return 1 - lengths.sum() / sum(mb.padded_tokens for mb in plan), {mb.shape for mb in plan}


def test_a_user_models_padding_stays_under_ten_percent_in_few_shapes():
    """Issue #40's work: 8 prompts of 37-46 tokens x 8 samples of 64 new tokens, so rows of
    100-109 positions. With 32-position steps every micro-batch was 128 long (19% of the
    trained positions padding); the `custom` preset's finer buckets (16 above 64 positions)
    pad to 112: under 10%, and 20 batches of the work still use only two micro-batch shapes
    (two compiles, not one per step)."""
    from minirl.run.presets import make_config

    prompts = np.array([37, 41, 46, 39, 44, 38, 42, 40])
    lengths = np.repeat(prompts, 8) + 63  # [64] completion targets end at P + 64 - 1
    share, shapes = _padding_share(lengths, TrainerConfig())
    assert share == pytest.approx(1 - lengths.mean() / 128) and share > 0.18
    assert shapes == {(32, 128)}
    custom = make_config("custom", ["data.train=x.jsonl"]).trainer
    share, shapes = _padding_share(lengths, custom)
    assert share == pytest.approx(1 - lengths.mean() / 112) and share < 0.08
    rng, seen = np.random.default_rng(0), set()
    for _ in range(20):
        share, shapes = _padding_share(np.repeat(rng.integers(37, 47, 8), 8) + 63, custom)
        assert share < 0.10
        seen |= shapes
    assert seen == {(32, 112)}


def test_pack_rows_gives_an_overlong_row_its_own_micro_batch():
    plan = mbt.pack_rows(np.array([100, 3]), 64)
    assert [(mb.rows.tolist(), mb.shape) for mb in plan] == [([0], (1, 128)), ([1], (1, 32))]


def test_gather_and_scatter_round_trip():
    x = np.arange(4 * 6).reshape(4, 6)
    mb = mbt.MicroBatch(np.array([2, 0]), num_rows=4, length=8)
    g = mbt.gather(x, mb, fill=-1)
    np.testing.assert_array_equal(g[:2, :6], x[[2, 0]])
    assert (g[2:] == -1).all() and (g[:, 6:] == -1).all()
    out = np.zeros_like(x)
    mbt.scatter(g, mb, out)
    np.testing.assert_array_equal(out[[2, 0]], x[[2, 0]])
    assert (out[[1, 3]] == 0).all()


def test_trainer_config_validation_and_schedule():
    for bad in (
        dict(learning_rate=0.0),
        dict(schedule="linear"),
        dict(remat="all"),
        dict(schedule="cosine", warmup_steps=10, total_steps=10),
        dict(micro_batch_tokens=0),
        dict(num_minibatches=0),
        dict(logit_chunk_mb=-1.0),
    ):
        with pytest.raises(ValueError, match="TrainerConfig"):
            TrainerConfig(**bad)
    cfg = TrainerConfig(
        learning_rate=1.0, schedule="cosine", warmup_steps=3, total_steps=13, min_lr_ratio=0.2
    )
    assert [learning_rate(cfg, s) for s in (0, 1, 2, 3)] == [0.25, 0.5, 0.75, 1.0]
    assert learning_rate(cfg, 8) == pytest.approx(0.2 + 0.8 * 0.5)  # half-way through the decay
    assert learning_rate(cfg, 13) == pytest.approx(0.2) and learning_rate(cfg, 99) == pytest.approx(
        0.2
    )
    assert learning_rate(TrainerConfig(learning_rate=0.5), 7) == 0.5


def test_trainer_scores_under_a_positive_temperature(params):
    with pytest.raises(ValueError, match="temperature > 0"):
        Trainer(CFG, params, None, sampling=Sampling(0.0))  # a greedy engine's spec, not .scoring
    assert (
        Trainer(CFG, params, None, sampling=Sampling(0.0).scoring)._spec.sampling.temperature == 1
    )


# ---- log-prob recomputation -------------------------------------------------------------------


def test_recompute_logprobs_equals_the_model_forward(params, batch):
    trainer = Trainer(
        CFG,
        params,
        get_preset("grpo"),
        TrainerConfig(micro_batch_tokens=512),
        sampling=Sampling(0.7),
    )
    got = trainer.recompute_logprobs(batch)
    model = nnx.merge(nnx.split(init_model(CFG))[0], params)
    forward = jax.jit(lambda tokens, targets: token_logprobs(model(tokens), targets, Sampling(0.7)))
    want = np.asarray(forward(jnp.asarray(batch.tokens), jnp.asarray(batch.targets)))
    m = batch.mask > 0
    np.testing.assert_allclose(got[m], want[m], rtol=1e-5, atol=1e-5)
    assert (got[~m] == 0).all()


def _engine_style_logprobs(params, batch, temperature):
    """Prefill each row's prompt into a KV cache, then feed its completion one token at a time
    (the rollout engine's computation), exact mode: the behaviour log-probs an exact engine
    would report."""
    graphdef = nnx.split(init_model(CFG))[0]
    # Weights are jit ARGUMENTS, as in the engine: closed-over weights become constants that XLA
    # folds differently, which changes the last bits.
    prefill = jax.jit(
        lambda p, tok, n: nnx.merge(graphdef, p)(
            tok, cache=KVCache.zeros(CFG, 1, 128), num_new=n, exact=True
        )
    )
    decode = jax.jit(lambda p, tok, cache: nnx.merge(graphdef, p)(tok, cache=cache, exact=True))
    logp_fn = jax.jit(
        lambda logits, tgt: token_logprobs(logits, tgt, Sampling(temperature, exact=True))
    )
    out = np.zeros(batch.mask.shape, np.float32)
    for i in range(batch.num_rows):
        pos = np.flatnonzero(batch.mask[i])
        p = pos[0] + 1  # prompt length: the first completion target sits at P-1
        prompt = np.zeros((1, 32), np.int32)
        prompt[0, :p] = batch.tokens[i, :p]
        logits, cache = prefill(params, jnp.asarray(prompt), jnp.array([p], jnp.int32))
        last = logits[:, p - 1 : p]  # [1, 1, V]
        for t in pos:
            out[i, t] = float(logp_fn(last, jnp.asarray(batch.targets[i, t]).reshape(1, 1))[0, 0])
            last, cache = decode(params, jnp.asarray(batch.targets[i, t]).reshape(1, 1), cache)
    return out


@pytest.fixture(scope="module")
def exact_recompute(params, batch):
    """(trainer's exact recompute, engine-style exact log-probs, mask) for a long and a short row,
    which the trainer runs in different shapes ([1, 64] and [1, 32])."""
    rows = [0, 5]
    small = Batch(
        *(
            getattr(batch, f)[rows]
            for f in (
                "tokens",
                "targets",
                "mask",
                "behaviour_logprobs",
                "versions",
                "rewards",
                "group_ids",
                "prompt_uids",
            )
        )
    )
    trainer = Trainer(
        CFG,
        params,
        get_preset("grpo"),
        TrainerConfig(micro_batch_tokens=64),
        sampling=Sampling(0.7, exact=True),
    )
    assert [mb.shape for mb in trainer._plan(small)] == [(1, 64), (1, 32)]
    chunked = Trainer(  # the LM head 5 positions at a time (minirl/modeling/chunked_logprobs.py)
        CFG,
        params,
        None,
        TrainerConfig(micro_batch_tokens=64, logit_chunk_mb=FIVE_POSITIONS_MB),
        sampling=Sampling(0.7, exact=True),
    )
    m = small.mask > 0
    want = _engine_style_logprobs(params, small, 0.7)[m]
    return trainer.recompute_logprobs(small)[m], want, chunked.recompute_logprobs(small)[m]


FIVE_POSITIONS_MB = 5 * 4 * CFG.vocab_size / 2**20  # logit_chunk_mb of 5 positions' logits


def test_exact_recompute_matches_prefill_plus_decode(exact_recompute):
    got, want, _ = exact_recompute
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.gpu
def test_exact_recompute_equals_prefill_plus_decode_bitwise(exact_recompute):
    got, want, _ = exact_recompute
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.gpu
def test_exact_recompute_in_logit_chunks_equals_prefill_plus_decode_bitwise(exact_recompute):
    """The LM head 5 positions at a time ([1, 64] rows: 13 chunks, the last padded) changes no
    bit: exact mode's head and log-softmax do not depend on how many rows they run on."""
    _, want, chunked = exact_recompute
    np.testing.assert_array_equal(chunked.view(np.uint32), want.view(np.uint32))


def test_a_small_vocabulary_compiles_the_very_same_training_forward(params, batch):
    """At the default 64 MiB a chunk holds 524,288 positions of this 32-id vocabulary (55,924 of
    issue #40's 300 ids): every micro-batch fits in one, so the training forward is the program
    of `logit_chunk_mb=0`, op for op (small vocabularies pay nothing for the chunks)."""
    from minirl.training.forward import training_forward_fn

    default = Trainer(CFG, params, None)._spec
    assert default.logit_chunk == 524_288
    args = (params, jnp.asarray(batch.tokens), jnp.asarray(batch.targets))
    programs = [
        training_forward_fn(spec).lower(*args).as_text()
        for spec in (default, default._replace(logit_chunk=0), default._replace(logit_chunk=5))
    ]
    assert programs[0] == programs[1] != programs[2]


def test_logit_chunks_give_the_unchunked_logprobs_entropies_and_gradient(params, batch):
    """The training forward with the LM head in chunks of 5 positions against all 64 x 8 at once:
    log-probs and entropies within 1e-6, the gradient of a weighted log-prob sum plus an entropy
    bonus within 1e-6 of its size in every parameter (fp32; the tied embedding gets both its
    lookup's and the head's gradient)."""
    from minirl.training.forward import ForwardSpec, _forward

    trainer = Trainer(CFG, params, None, TrainerConfig(logit_chunk_mb=FIVE_POSITIONS_MB))
    assert trainer._spec.logit_chunk == 5
    tokens, targets = jnp.asarray(batch.tokens), jnp.asarray(batch.targets)
    weights = jnp.asarray(batch.mask) * jnp.linspace(-1.0, 2.0, batch.tokens.size).reshape(
        batch.tokens.shape
    )

    def outputs(chunk):
        spec = ForwardSpec(CFG, Sampling(0.7), "none", logit_chunk=chunk)

        def loss(p):
            logp, ent, _ = _forward(spec, p, tokens, targets, True, ent=True)
            return jnp.sum(weights * logp) + 0.1 * jnp.sum(ent), (logp, ent)

        return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

    (_, (logp, ent)), grads = outputs(5)
    (_, (want_logp, want_ent)), want_grads = outputs(0)
    np.testing.assert_allclose(logp, want_logp, rtol=0, atol=1e-6)
    np.testing.assert_allclose(ent, want_ent, rtol=0, atol=1e-6)
    for got, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        scale = float(jnp.abs(ref).max())
        assert scale > 0 and float(jnp.abs(got - ref).max()) <= 1e-6 * scale


# ---- the train step ---------------------------------------------------------------------------

# eps = 1 makes Adam's first step ~ lr * g / (|g| + 1), a smooth function of the gradient, so
# comparing the updated parameters compares the gradients (with eps = 1e-8 it would be ~ sign(g)).
GRAD_CFG = dict(learning_rate=1e-2, eps=1.0, max_grad_norm=0.0)


@pytest.fixture(scope="module")
def full_step(params, batch):
    trainer = Trainer(
        CFG, params, get_preset("grpo"), TrainerConfig(micro_batch_tokens=512, **GRAD_CFG)
    )
    metrics = trainer.train_step(batch)
    return trainer, metrics


@pytest.mark.parametrize(  # a second budget compiles its own step (~5 s cold): the slow lane
    "budget, count", [(256, 2), pytest.param(128, 3, marks=pytest.mark.slow)]
)
def test_micro_batched_step_equals_full_batch_step(params, batch, full_step, budget, count):
    full, full_metrics = full_step
    assert full_metrics["micro_batches"] == 1
    trainer = Trainer(
        CFG, params, get_preset("grpo"), TrainerConfig(micro_batch_tokens=budget, **GRAD_CFG)
    )
    plan = trainer._plan(batch)
    assert len(plan) == count and len({mb.length for mb in plan}) == 2  # uneven lengths
    metrics = trainer.train_step(batch)
    moved = _tree_max_diff(full.params(), params)
    assert moved > 1e-4  # the step did something
    assert _tree_max_diff(trainer.params(), full.params()) < 1e-4 * moved
    for key in (
        "loss",
        "grad_norm",
        "ratio_mean",
        "kl_behav_k3",
        "tokens",
        "sequences",
        "clip_fraction",
    ):
        assert metrics[key] == pytest.approx(full_metrics[key], rel=1e-4, abs=1e-6), key


def test_pack_sequences_by_hand():
    """The batch's rows need 60, 50, 46, 40, 30, 11, 20 and 8 positions: one micro-batch of
    length 64, packed first-fit longest first into 5 rows (320 positions, not 8 x 64 = 512):
    60 | 50 + 11 | 46 + 8 | 40 + 20 | 30."""
    lengths = np.array([60, 50, 46, 40, 30, 11, 20, 8])
    (mb,) = mbt.pack_sequences(lengths, 512)
    assert mb.rows.tolist() == [0, 1, 2, 3, 4, 6, 5, 7] and mb.shape == (8, 64)
    slot, offset, p_rows = mb.packing
    assert slot.tolist() == [0, 1, 2, 3, 4, 3, 1, 2] and offset.tolist() == [
        0,
        0,
        0,
        0,
        0,
        40,
        50,
        46,
    ]
    assert p_rows == 5 and mb.padded_tokens == 320
    tokens = np.arange(8 * 64).reshape(8, 64)
    arrays = mbt.packed(mb, lengths, tokens, tokens + 1)
    row = arrays["segments"][3]  # members 4 (40 positions) and 6 (row 6: 20 positions)
    assert (row[:40] == 4).all() and (row[40:60] == 6).all() and (row[60:] == 0).all()
    assert arrays["positions"][3, 38:42].tolist() == [38, 39, 0, 1]  # each row from 0
    assert arrays["source"][5, :3].tolist() == [3 * 64 + 40, 3 * 64 + 41, 3 * 64 + 42]
    assert arrays["source"][5, 20] == -1  # past row 6's 20 positions
    assert arrays["tokens"][1, 50:52].tolist() == [5 * 64, 5 * 64 + 1]  # row 5 behind row 1
    assert arrays["targets"][1, 50] == 5 * 64 + 1


def test_packed_step_equals_the_unpacked_step(params, batch, full_step):
    """trainer.pack: the model runs on 5 packed rows instead of 8 padded ones, each sequence at
    its own positions behind a block-diagonal mask, and the step is the unpacked one (as for
    micro-batches: 1e-4 of the update size); so is the recompute. Exact mode and MoE refuse it."""
    full, full_metrics = full_step
    cfg = TrainerConfig(micro_batch_tokens=512, pack=True, **GRAD_CFG)
    trainer = Trainer(CFG, params, get_preset("grpo"), cfg)
    prox = trainer.recompute_logprobs(batch)
    unpacked = Trainer(CFG, params, None, TrainerConfig(micro_batch_tokens=512))
    np.testing.assert_allclose(prox, unpacked.recompute_logprobs(batch), atol=1e-5)
    metrics = trainer.train_step(batch)
    assert metrics["padded_tokens"] == 320 and full_metrics["padded_tokens"] == 512
    moved = _tree_max_diff(full.params(), params)
    assert _tree_max_diff(trainer.params(), full.params()) < 1e-4 * moved
    for key in ("loss", "grad_norm", "ratio_mean", "kl_behav_k3", "tokens", "sequences"):
        assert metrics[key] == pytest.approx(full_metrics[key], rel=1e-4, abs=1e-6), key
    with pytest.raises(ValueError, match="trainer.pack runs dense models in fast mode only"):
        Trainer(CFG, params, get_preset("grpo"), cfg, sampling=Sampling(exact=True))


@pytest.fixture(scope="module")
def group_batch():
    """Two prompts (5 and 9 tokens) x 4 samples each: a GRPO batch whose groups share prompts."""
    rng = np.random.default_rng(1)
    prompts = [
        Prompt(200 + g, "test", "", np.r_[BOS, rng.integers(3, 32, n)].astype(np.int32))
        for g, n in enumerate((4, 8))
    ]
    rollouts = [
        Rollout(
            prompts[g],
            k,
            rng.integers(3, 32, c).astype(np.int32),
            (-rng.exponential(1.0, c)).astype(np.float32),
            np.full(c, 7, np.int32),
            "length",
            score=Score(float(rng.normal())),
        )
        for g, lengths in enumerate(((56, 42, 43, 29), (25, 9, 14, 5)))
        for k, c in enumerate(lengths)
    ]
    return make_batch(rollouts, PAD)


def test_share_prompts_by_hand(group_batch):
    """Budget 512, buckets of 32: all 8 rows would cost 2 prompts x 32 + 8 rows x 64 = 576, so the
    first group (completions after the prompt: 55, 41, 42, 28 tokens) is one micro-batch, 1 x 32
    + 4 x 64 = 288 padded tokens, and the second (24, 8, 13, 4) another, 1 x 32 + 4 x 32 = 160."""
    plan = mbt.share_prompts(group_batch.tokens, group_batch.mask, 512, 32)
    assert [mb.rows.tolist() for mb in plan] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [(mb.prompts[0].tolist(), *mb.prompts[1:]) for mb in plan] == [
        ([0, 0, 0, 0], 1, 32, 64),
        ([0, 0, 0, 0], 1, 32, 32),
    ]
    assert [mb.padded_tokens for mb in plan] == [288, 160]
    arrays = mbt.shared(plan[1], group_batch.tokens, group_batch.targets, group_batch.mask)
    row = group_batch.tokens[5]  # prompt 9 tokens, then 8 of its completion's 9 read
    assert arrays["prompts"][0, :9].tolist() == row[:9].tolist()
    assert arrays["tokens"][1, :8].tolist() == row[9:17].tolist()
    assert arrays["source"][1, 8:17].tolist() == list(range(33, 42))  # row 1 of [4, 33]


def test_a_shared_prompt_step_equals_the_plain_step(params, group_batch):
    """trainer.share_prompts: each prompt runs once, its keys and values gathered into every
    sample's rows (448 padded tokens, not 512), and the recompute, the step and the metrics are
    the plain trainer's (micro-batch tolerance); in exact mode the log-probs are bitwise equal."""
    plain, shared = (
        Trainer(
            CFG,
            params,
            get_preset("grpo"),
            TrainerConfig(micro_batch_tokens=512, share_prompts=on, **GRAD_CFG),
        )
        for on in (False, True)
    )
    np.testing.assert_allclose(
        shared.recompute_logprobs(group_batch), plain.recompute_logprobs(group_batch), atol=1e-5
    )
    want, got = plain.train_step(group_batch), shared.train_step(group_batch)
    assert (got["padded_tokens"], want["padded_tokens"]) == (448, 512)
    moved = _tree_max_diff(plain.params(), params)
    assert _tree_max_diff(shared.params(), plain.params()) < 1e-4 * moved
    for key in ("loss", "grad_norm", "ratio_mean", "tokens"):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    exact = Sampling(exact=True)
    plain_x, shared_x = (
        Trainer(
            CFG,
            params,
            None,
            TrainerConfig(micro_batch_tokens=512, share_prompts=on),
            sampling=exact,
        )
        for on in (False, True)
    )
    assert (
        shared_x.recompute_logprobs(group_batch) == plain_x.recompute_logprobs(group_batch)
    ).all()
    with pytest.raises(ValueError, match="trainer.share_prompts runs dense models"):
        Trainer(CFG, params, None, TrainerConfig(pack=True, share_prompts=True))


@pytest.mark.slow  # its own compiles (~8 s): the default lane proves sharing without remat
def test_a_shared_prompt_step_with_remat_equals_the_plain_step(params, group_batch):
    """remat="nothing" with shared prompts: each block, caches and all, recomputed in the
    backward; the update is the plain step's (1e-4 of its size; measured 2.5e-5)."""
    cfg = dict(micro_batch_tokens=512, **GRAD_CFG)
    plain = Trainer(CFG, params, get_preset("grpo"), TrainerConfig(**cfg))
    remat = TrainerConfig(share_prompts=True, remat="nothing", **cfg)
    recomputed = Trainer(CFG, params, get_preset("grpo"), remat)
    plain.train_step(group_batch)
    recomputed.train_step(group_batch)
    moved = _tree_max_diff(plain.params(), params)
    assert _tree_max_diff(recomputed.params(), plain.params()) < 1e-4 * moved


def test_first_update_is_on_policy(full_step):
    _, metrics = full_step
    # the training forward sees log pi_prox: the ratio starts at 1 (up to forward/backward fusion)
    assert abs(metrics["ratio_max"] - 1.0) < 1e-5 and abs(metrics["kl_prox_k1"]) < 1e-6


def test_first_update_dlogp_by_hand():
    train = np.array([[0.0, -1.0, -2.0]])
    prox = np.array([[0.0, -1.5, -9.0]])
    behav = np.array([[-1.0, -1.0, -9.0]])
    m = first_update_dlogp(train, prox, behav, np.array([[1, 1, 0]]))
    # with recomputation |train - prox| = (0, 0.5); without |train - mu| = (1, 0); the third
    # token is not counted. p95 of two values interpolates: a + 0.95 (b - a).
    assert m["dlogp_recompute/mean_abs_dlogp"] == 0.25 and m["dlogp_recompute/max_abs_dlogp"] == 0.5
    assert m["dlogp_recompute/p95_abs_dlogp"] == pytest.approx(0.475)
    assert m["dlogp_no_recompute/mean_abs_dlogp"] == 0.5
    assert m["dlogp_no_recompute/p95_abs_dlogp"] == pytest.approx(0.95)
    assert m["dlogp_no_recompute/max_abs_dlogp"] == 1.0


def _fig5_reference(params, batch, rows):
    """What the first update should report: the training forward equals the recompute up to
    fusion (< 1e-5), so "without recomputation" is |prox - mu| over the rows it trained on."""
    prox = Trainer(CFG, params, None, TrainerConfig(micro_batch_tokens=512)).recompute_logprobs(
        batch
    )
    mask = np.zeros_like(batch.mask)
    mask[rows] = batch.mask[rows]
    return mismatch_metrics(batch.behaviour_logprobs, prox, mask)


def _assert_fig5(metrics, want):
    for stat in ("mean_abs_dlogp", "p95_abs_dlogp", "max_abs_dlogp"):
        assert metrics[f"dlogp_no_recompute/{stat}"] == pytest.approx(want[stat], abs=1e-5), stat
    assert 0.0 <= metrics["dlogp_recompute/mean_abs_dlogp"] <= 1e-5
    assert metrics["dlogp_recompute/max_abs_dlogp"] <= 1e-5
    assert want["mean_abs_dlogp"] > 0.1  # the fixture's mu is random: far from the recompute


def test_first_update_logs_rlax_fig5_with_and_without_recompute(params, batch, full_step):
    _assert_fig5(full_step[1], _fig5_reference(params, batch, np.arange(batch.num_rows)))


@pytest.mark.parametrize("remat", ["dots", "nothing"])
def test_remat_policies_give_the_same_step(params, batch, full_step, remat):
    full, _ = full_step
    trainer = Trainer(
        CFG,
        params,
        get_preset("grpo"),
        TrainerConfig(micro_batch_tokens=512, remat=remat, **GRAD_CFG),
    )
    trainer.train_step(batch)
    moved = _tree_max_diff(full.params(), params)
    assert _tree_max_diff(trainer.params(), full.params()) < 1e-4 * moved


@dataclasses.dataclass(frozen=True)
class _RawRewards:
    """A local objective on the two-phase contract: `inner`, except that a reward reaches the
    advantage as is (the real advantages map a non-finite reward to 0), so a nan reward gives a
    nan loss."""

    inner: Any

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def prepare(self, inputs):
        prepared = self.inner.prepare(inputs)
        return prepared.replace(adv=prepared.adv + 0.0 * inputs.rewards[:, None])


def test_nonfinite_loss_skips_the_update_and_keeps_params_bitwise(params, batch):
    objective = _RawRewards(get_preset("grpo"))
    trainer = Trainer(CFG, params, objective, TrainerConfig(micro_batch_tokens=512, **GRAD_CFG))
    trainer.train_step(batch)  # a real first update, so the optimizer state is not all zeros
    before, state_before = _bits(trainer.params()), _bits(trainer.state_dict()["opt_state"])
    poisoned = Batch(
        **{
            **batch.__dict__,
            "rewards": np.where(np.arange(8) == 3, np.nan, batch.rewards).astype(np.float32),
        }
    )
    metrics = trainer.train_step(poisoned)
    assert np.isnan(metrics["loss"])
    assert metrics["skipped_nonfinite"] == 1 and metrics["updates"] == 0
    assert not trainer.last_step_ok and trainer.skipped_nonfinite == 1
    assert (
        _bits(trainer.params()) == before
        and _bits(trainer.state_dict()["opt_state"]) == state_before
    )
    trainer.train_step(batch)  # a good batch afterwards trains again
    assert trainer.last_step_ok and _bits(trainer.params()) != before


def test_nonfinite_gradient_skips_the_update(params, batch):
    # an inf weight makes the forward produce nan logits: the losses' clamps keep the loss finite
    # where they can, but the gradient is nan and the guard must catch it
    bad = jax.tree.map(np.array, params)
    bad["layers"][1]["mlp"]["down_proj"][0, 0] = np.inf
    trainer = Trainer(
        CFG, bad, get_preset("grpo"), TrainerConfig(micro_batch_tokens=512, **GRAD_CFG)
    )
    before = _bits(trainer.params())
    metrics = trainer.train_step(batch)
    assert metrics["skipped_nonfinite"] == 1 and _bits(trainer.params()) == before


def test_ppo_epochs_and_minibatches(params, batch):
    cfg = TrainerConfig(micro_batch_tokens=512, ppo_epochs=2, num_minibatches=2, **GRAD_CFG)
    trainer = Trainer(CFG, params, get_preset("grpo"), cfg)
    metrics = trainer.train_step(batch)
    assert metrics["updates"] == 4 and trainer.last_step_ok
    # prox stays the step's start: after the first update the policy has moved away from it
    assert metrics["kl_prox_k3"] > 1e-7 and metrics["ratio_max"] > 1.0 + 1e-4
    again = Trainer(CFG, params, get_preset("grpo"), cfg)
    first_rows = again._minibatches(batch.num_rows, epoch=0)[0]  # step 0's first mini-batch
    again.train_step(batch)
    assert _bits(again.params()) == _bits(trainer.params())  # shuffles are keyed, not drawn
    # RLAX Fig. 5 metrics: the first update only (the step's start weights, its rows)
    assert len(first_rows) == batch.num_rows // 2
    _assert_fig5(metrics, _fig5_reference(params, batch, first_rows))


def test_state_dict_round_trip_resumes_bitwise(params, batch):
    cfg = TrainerConfig(micro_batch_tokens=512, **GRAD_CFG)
    a = Trainer(CFG, params, get_preset("grpo"), cfg)
    a.train_step(batch)
    state = from_bytes(to_bytes(a.state_dict()), copy=True)
    b = Trainer(CFG, params, get_preset("grpo"), cfg)
    b.load_state_dict(state)
    assert b.step == 1
    views = a.state_dict()  # read-only host views of the device arrays, not copies
    leaves = jax.tree.leaves((views["params"], views["opt_state"]))
    assert all(isinstance(x, np.ndarray) and not x.flags.writeable for x in leaves)
    kept = _bits((views["params"], views["opt_state"]))
    a.train_step(batch)  # donates the optimizer state the views hold: XLA writes elsewhere
    b.train_step(batch)
    assert _bits(a.params()) == _bits(b.params())
    assert _bits((views["params"], views["opt_state"])) == kept  # the views kept their values
    assert _bits(a.state_dict()["opt_state"]) != kept[-len(_bits(views["opt_state"])) :]


def test_bad_params_and_objectives_are_refused(params):
    broken = jax.tree.map(np.array, params)
    broken["embed"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match="embed"):
        Trainer(CFG, broken, get_preset("grpo"))
    with pytest.raises(ValueError, match="no objective"):
        Trainer(CFG, params).train_step(None)


# ---- learning -------------------------------------------------------------------------------


def test_sft_step_decreases_the_loss(params, batch):
    trainer = Trainer(CFG, params, None, TrainerConfig(micro_batch_tokens=512, learning_rate=1e-2))
    losses = [trainer.sft_step(batch)["loss"] for _ in range(8)]
    assert losses[-1] < 0.7 * losses[0] and all(
        b < a for a, b in zip(losses, losses[1:], strict=False)
    )


def test_reinforce_raises_the_logprob_of_rewarded_completions(params):
    # one prompt, G = 4 samples: completions "7 EOS" are rewarded, "9 EOS" are not
    prompt = Prompt(1, "t", "", np.array([BOS, 5], np.int32))
    comps = [([7, EOS], 1.0), ([9, EOS], 0.0), ([7, EOS], 1.0), ([9, EOS], 0.0)]
    rollouts = [
        Rollout(
            prompt,
            k,
            np.array(c, np.int32),
            np.zeros(2, np.float32),
            np.zeros(2, np.int32),
            "eos",
            score=Score(r),
        )
        for k, (c, r) in enumerate(comps)
    ]
    batch = make_batch(rollouts, PAD)
    trainer = Trainer(CFG, params, get_preset("reinforce"), TrainerConfig(learning_rate=3e-3))
    good, bad = batch.rewards > 0, batch.rewards == 0
    start = trainer.recompute_logprobs(batch)[:, 1]  # log pi(first completion token | prompt)
    for _ in range(5):
        prox = trainer.recompute_logprobs(batch)
        on_policy = Batch(**{**batch.__dict__, "behaviour_logprobs": prox})
        trainer.train_step(on_policy, prox_logp=prox)
    end = trainer.recompute_logprobs(batch)[:, 1]
    assert (end[good] > start[good] + 0.5).all() and (end[bad] < start[bad] - 0.5).all()


@pytest.mark.gpu
@pytest.mark.parametrize(  # a remat policy compiles its own step (~8 s cold): "dots" in the slow lane
    "remat", ["none", pytest.param("dots", marks=pytest.mark.slow)]
)
def test_training_forward_logprobs_equal_the_recompute_in_exact_mode(params, batch, remat):
    """The training step's forward (under the gradient, with remat) computes the same numbers
    as the recompute when every reduction has a fixed order: minirl diagnose relies on it."""
    trainer = Trainer(
        CFG,
        params,
        None,
        TrainerConfig(micro_batch_tokens=512, remat=remat),
        sampling=Sampling(0.7, exact=True),
    )
    got = trainer.training_forward_logprobs(batch)
    np.testing.assert_array_equal(got, trainer.recompute_logprobs(batch))
    assert np.count_nonzero(got) == np.count_nonzero(batch.mask)


# ---- LoRA: the trainer differentiates and updates the adapters alone ---------------------------

LORA_CFG = dataclasses.replace(CFG, lora_rank=4)


@pytest.fixture(scope="module")
def lora_params(params):
    return lora.add_adapters(params, LORA_CFG, seed=0)


@pytest.fixture(scope="module")
def lora_step(lora_params, batch):
    cfg = TrainerConfig(micro_batch_tokens=512, **GRAD_CFG)
    trainer = Trainer(LORA_CFG, lora_params, get_preset("grpo"), cfg)  # grpo: a KL term too
    return trainer, trainer.train_step(batch)


def test_lora_step_updates_the_adapters_only(lora_params, lora_step):
    trainer, metrics = lora_step
    assert trainer.last_step_ok and metrics["ratio_max"] == pytest.approx(1.0, abs=1e-5)
    adapters, base = lora.partition(trainer.params(), lora.is_adapter)
    start, start_base = lora.partition(lora_params, lora.is_adapter)
    assert _bits(base) == _bits(start_base)  # the base weights: bitwise unchanged
    assert _tree_max_diff(adapters, start) > 1e-4  # the adapters moved (B from 0, A too)
    # AdamW's moments exist for the adapters alone: same tree, same shapes
    _, adam, _ = trainer.state_dict()["opt_state"]
    for moments in (adam.mu, adam.nu):
        assert jax.tree.structure(moments) == jax.tree.structure(start)
        assert [x.shape for x in jax.tree.leaves(moments)] == [
            x.shape for x in jax.tree.leaves(start)
        ]


def test_lora_micro_batched_step_equals_full_batch_step(lora_params, batch, lora_step):
    full, full_metrics = lora_step
    cfg = TrainerConfig(micro_batch_tokens=256, **GRAD_CFG)
    trainer = Trainer(LORA_CFG, lora_params, get_preset("grpo"), cfg)
    assert len(trainer._plan(batch)) == 2
    metrics = trainer.train_step(batch)
    moved = _tree_max_diff(full.params(), lora_params)
    assert _tree_max_diff(trainer.params(), full.params()) < 1e-4 * moved
    for key in ("loss", "grad_norm", "kl_behav_k3", "tokens"):
        assert metrics[key] == pytest.approx(full_metrics[key], rel=1e-4, abs=1e-6), key


def test_lora_state_dict_round_trip_resumes_bitwise(lora_params, batch):
    cfg = TrainerConfig(micro_batch_tokens=512, ppo_epochs=2, num_minibatches=2, **GRAD_CFG)
    a = Trainer(LORA_CFG, lora_params, get_preset("cispo"), cfg)
    a.train_step(batch)
    state = from_bytes(to_bytes(a.state_dict()), copy=True)
    b = Trainer(LORA_CFG, lora_params, get_preset("cispo"), cfg)
    b.load_state_dict(state)
    a.train_step(batch)
    b.train_step(batch)
    assert _bits(a.params()) == _bits(b.params())
    assert _bits(lora.partition(a.params(), lora.is_adapter)[1]) == _bits(
        lora.partition(lora_params, lora.is_adapter)[1]
    )


@pytest.mark.slow  # its own compile (~5 s cold); the dropout mask by hand: tests/modeling/test_lora.py
def test_lora_dropout_changes_the_step_by_its_keys_alone(lora_params, batch, lora_step):
    """model.lora_dropout: 0 is the step without dropout bit for bit; 0.25 changes the
    update, and two trainers give the same result (keys from (seed, step, update, micro-batch),
    not time); the recompute (log pi_prox) has no dropout: it equals the plain trainer's, and
    it is never skipped in favour of the (dropped-out) training forward."""
    plain, _ = lora_step
    cfg = TrainerConfig(micro_batch_tokens=512, **GRAD_CFG)
    zero = Trainer(
        dataclasses.replace(LORA_CFG, lora_dropout=0.0), lora_params, get_preset("grpo"), cfg
    )
    zero.train_step(batch)
    assert _bits(zero.params()) == _bits(plain.params())
    drop_cfg = dataclasses.replace(LORA_CFG, lora_dropout=0.25)
    a, b = (Trainer(drop_cfg, lora_params, get_preset("grpo"), cfg) for _ in range(2))
    # an on-policy step takes log pi_prox from its training forward only without dropout
    assert plain.skips_recompute(on_policy=True) and not a.skips_recompute(on_policy=True)
    np.testing.assert_array_equal(a.recompute_logprobs(batch), zero_recompute(lora_params, batch))
    a.train_step(batch)
    b.train_step(batch)
    assert _bits(a.params()) == _bits(b.params())
    moved = _tree_max_diff(plain.params(), lora_params)
    assert _tree_max_diff(a.params(), plain.params()) > 0.05 * moved


def test_lora_on_a_bfloat16_base_keeps_float32_adapters_and_learns(lora_params, batch):
    """model.param_dtype=bfloat16 with LoRA: the frozen base is stored in bf16 (half its float32
    bytes), the adapters and AdamW's moments stay float32, the base does not move and five
    supervised steps on one batch lower its loss."""
    cfg = dataclasses.replace(LORA_CFG, param_dtype="bfloat16")
    params = nnx.to_pure_dict(nnx.split(init_model(cfg, seed=0))[1])
    adapters, base = lora.partition(params, lora.is_adapter)
    assert {x.dtype for x in jax.tree.leaves(base)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(adapters)} == {jnp.dtype(jnp.float32)}
    fp32_base = lora.partition(lora_params, lora.is_adapter)[1]
    nbytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))  # noqa: E731
    assert 2 * nbytes(base) == nbytes(fp32_base)
    trainer = Trainer(cfg, params, None, TrainerConfig(micro_batch_tokens=512, **GRAD_CFG))
    losses = [trainer.sft_step(batch)["loss"] for _ in range(5)]
    assert losses == sorted(losses, reverse=True) and losses[-1] < 0.95 * losses[0], losses
    now, now_base = lora.partition(trainer.params(), lora.is_adapter)
    assert _bits(now_base) == _bits(base)  # frozen, still bf16
    assert {x.dtype for x in jax.tree.leaves(now)} == {jnp.dtype(jnp.float32)}
    _, adam, _ = trainer.state_dict()["opt_state"]
    assert {x.dtype for x in jax.tree.leaves((adam.mu, adam.nu))} == {jnp.dtype(jnp.float32)}
    assert jax.tree.structure(adam.mu) == jax.tree.structure(adapters)


def zero_recompute(params, batch):
    cfg = TrainerConfig(micro_batch_tokens=512, **GRAD_CFG)
    return Trainer(LORA_CFG, params, get_preset("grpo"), cfg).recompute_logprobs(batch)


# ---- the reference model: bf16 where that is exact ----------------------------------------------


def test_reference_model_is_kept_in_bf16_where_exact_and_scores_the_same_bits(params, batch):
    """Weights loaded from a bf16 checkpoint are float32 values bf16 holds exactly: the trainer
    keeps its reference copy in bf16 (half the bytes) and its log-probs are the fp32 ones, bit
    for bit. Weights bf16 cannot hold stay float32."""
    from minirl.training.forward import reference_fn

    as_bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), params)
    cfg = TrainerConfig(micro_batch_tokens=512, **GRAD_CFG)
    trainer = Trainer(CFG, as_bf16, get_preset("grpo"), cfg)
    assert {x.dtype for x in jax.tree.leaves(trainer._ref_params)} == {jnp.dtype(jnp.bfloat16)}
    plan = trainer._plan(batch)
    ref = trainer._logprobs(trainer._ref_params, batch, plan, reference_fn(trainer._spec))
    np.testing.assert_array_equal(ref, trainer.recompute_logprobs(batch))  # fp32 weights
    assert np.count_nonzero(ref) == np.count_nonzero(batch.mask)
    random = Trainer(CFG, params, get_preset("grpo"), cfg)._ref_params  # norms of ones: exact
    kept = jax.tree.map(lambda x, p: x.dtype == jnp.float32 or (x == p).all(), random, params)
    assert all(jax.tree.leaves(kept)) and random["embed"].dtype == jnp.float32


# ---- work the step does not need: the on-policy recompute, the reference forward -----------------


def _count_forwards(monkeypatch) -> list:
    """Record every log-prob forward outside the update (the recompute and the reference one)."""
    calls, original = [], Trainer._logprobs

    def counted(self, params, *args, **kwargs):
        calls.append("ref" if params is self._ref_params else "prox")  # grpo: the same at step 0
        return original(self, params, *args, **kwargs)

    monkeypatch.setattr(Trainer, "_logprobs", counted)
    return calls


class _AlwaysSkips(Trainer):
    """Skips the recompute in exact mode too, where the training forward equals the recompute
    bitwise (test_training_forward_logprobs_equal_the_recompute_in_exact_mode)."""

    def skips_recompute(self, on_policy):
        return on_policy


def test_on_policy_skip_gives_the_recompute_path_update_bitwise(params, batch, monkeypatch):
    """Where the training forward and the recompute agree bitwise (exact mode), the skipped path
    IS the recompute path: same parameters and optimizer state bit for bit, same metrics; and it
    ran no log-prob forward besides the update (kl_coef=0: no reference forward either)."""
    from minirl.losses import with_kl_coef

    calls = _count_forwards(monkeypatch)
    objective = with_kl_coef(get_preset("grpo"), 0.0)
    make = lambda cls: cls(
        CFG, params, objective, TrainerConfig(micro_batch_tokens=512, **GRAD_CFG),
        sampling=Sampling(0.7, exact=True),
    )  # fmt: skip
    recomputed, skipped = make(Trainer), make(_AlwaysSkips)
    start = recomputed._logprobs(recomputed.params(), batch, recomputed._plan(batch))
    calls.clear()
    want = recomputed.train_step(batch, on_policy=True)  # exact mode: Trainer recomputes
    assert calls == ["prox"]
    got, prox = skipped.train_step_with_prox(batch, on_policy=True)
    assert calls == ["prox"]  # no forward of its own
    assert _bits(skipped.state_dict()) == _bits(recomputed.state_dict())
    np.testing.assert_array_equal(prox, start)
    assert replayed(got) == replayed(want)  # all but the step's clocks
    assert got["ratio_max"] == 1.0 and got["dlogp_recompute/max_abs_dlogp"] == 0.0


def test_skip_only_on_policy_with_one_update(params, batch, full_step, monkeypatch):
    """Off-policy batches, several updates, rejection and exact mode keep the recompute. The
    skip itself (float32 fusion: the training forward is the recompute within 1e-5) makes the
    full step's update within rounding, with the ratio exactly 1 instead of 1 +- 1e-6."""
    base = TrainerConfig(micro_batch_tokens=512, **GRAD_CFG)
    make = lambda loss="grpo", cfg=base, sampling=Sampling(): Trainer(
        CFG, params, get_preset(loss), cfg, sampling=sampling
    )
    assert make().skips_recompute(True) and not make().skips_recompute(False)
    assert not make(cfg=dataclasses.replace(base, ppo_epochs=2)).skips_recompute(True)
    assert not make(cfg=dataclasses.replace(base, num_minibatches=2)).skips_recompute(True)
    assert not make("grpo_mis").skips_recompute(True)
    assert not make(sampling=Sampling(exact=True)).skips_recompute(True)
    assert make("grpo_tis").skips_recompute(True)  # c = pi_prox/mu comes from the forward itself

    calls = _count_forwards(monkeypatch)
    trainer = make()
    metrics, prox = trainer.train_step_with_prox(batch, on_policy=True)
    assert len(calls) == 1  # grpo's KL term: the reference forward only
    full, full_metrics = full_step
    moved = _tree_max_diff(full.params(), params)
    assert _tree_max_diff(trainer.params(), full.params()) < 1e-4 * moved
    assert metrics["ratio_max"] == 1.0 and metrics["kl_prox_k1"] == 0.0
    assert metrics["loss"] == pytest.approx(full_metrics["loss"], rel=1e-4, abs=1e-6)
    assert metrics["kl_behav_k3"] == pytest.approx(full_metrics["kl_behav_k3"], rel=1e-4)
    np.testing.assert_allclose(prox, make().recompute_logprobs(batch), rtol=0, atol=1e-5)
    calls.clear()
    make().train_step(batch, on_policy=False)
    assert len(calls) == 2  # the recompute and the reference forward


def test_kl_coef_zero_drops_the_reference_model(params, batch, monkeypatch):
    """rl.kl_coef = 0: grpo without its KL term, no reference model, no reference forward, the
    same update as the preset with the term removed by hand; other values set beta."""
    from minirl.config import RLConfig
    from minirl.losses import make_objective, with_kl_coef

    grpo = get_preset("grpo")
    assert make_objective("grpo", 0) == grpo  # unset: the preset's 0.04
    (kl,) = make_objective("grpo", 0, 0.01).regularizers
    assert kl.beta == 0.01 and grpo.regularizers[0].beta == 0.04
    by_hand = dataclasses.replace(grpo, regularizers=())
    assert make_objective("grpo", 0, 0.0) == by_hand
    assert make_objective("dr_grpo", 0, 0.0) == get_preset("dr_grpo")
    with pytest.raises(ValueError, match="rl.kl_coef=0.1: loss 'dr_grpo' has no KL term"):
        RLConfig(loss="dr_grpo", kl_coef=0.1)
    with pytest.raises(ValueError, match="KL coefficient must be >= 0"):
        with_kl_coef(grpo, -1.0)

    calls = _count_forwards(monkeypatch)
    cfg = TrainerConfig(micro_batch_tokens=512, **GRAD_CFG)
    trainer = Trainer(CFG, params, make_objective("grpo", 0, 0.0), cfg)
    assert trainer._ref_params is None
    trainer.train_step(batch)
    assert calls == ["prox"]
    manual = Trainer(CFG, params, by_hand, cfg)
    manual.train_step(batch)
    assert _bits(trainer.params()) == _bits(manual.params())


def test_new_lengths_within_the_buckets_compile_nothing(params, batch, full_step):
    """Steps on batches of other row lengths, in the same buckets, reuse every compiled
    function: the step's cost does not include a compile per new length mix."""
    from minirl.training import optimizer
    from minirl.training.forward import accumulate_fn, forward_fn

    trainer, _ = full_step
    rng = np.random.default_rng(1)
    shorter = [(p, c - 1 - i % 3) for i, (p, c) in enumerate(SHAPES)]  # same buckets: 64 and 32
    other = make_batch(
        [
            _rollout(200 + i // 4, i % 4, p, c, rng, float(i % 2))
            for i, (p, c) in enumerate(shorter)
        ],
        PAD,
    )
    assert [mb.shape for mb in trainer._plan(other)] == [mb.shape for mb in trainer._plan(batch)]
    fns = (
        accumulate_fn(trainer._spec, trainer.objective),
        forward_fn(trainer._spec),
        optimizer.compiled(trainer._opt)[1],
    )
    sizes = [f._cache_size() for f in fns]
    trainer.train_step(other)
    assert [f._cache_size() for f in fns] == sizes
