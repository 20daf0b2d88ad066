"""Tests for minirl/modeling/model.py: the KV cache against the full forward, exact mode, log-probs, configs.

The central property: prefill + step-by-step decode through the cache gives the logits of one
full-sequence forward, for every real position of a right-padded batch whose rows have different
lengths. Float32 agrees to FP32_TOL; bfloat16 to BF16_TOL (measured, see docs/model.md); exact
mode (`exact=True`) agrees bitwise in both dtypes, and a row decoded alone, one token at a time,
gives the same bits as that row inside the batch.

Cost: the compiled functions are cached per (dtype, exact) for the whole module; one tiny
2-layer config, three call shapes.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from minirl.modeling import exact as exact_ops
from minirl.modeling.model import KVCache, ModelConfig, Transformer, token_logprobs
from minirl.modeling.model_config import PRESETS
from minirl.modeling.sampling import Sampling

# o_proj contracts over heads * head_dim = 32 (one exact-mode chunk) and the cache holds 64 keys:
# both were shapes where XLA CPU once broke exact mode (minirl/modeling/exact.py, `fusion_barrier`).
CFG = ModelConfig(
    vocab_size=64,
    dim=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=96,
    max_seq_len=64,
)
B, T, S = 4, 12, 64  # batch, sequence length, cache size
LENGTHS = np.array([12, 7, 9, 3])  # real tokens per row; right padding after
PROMPTS = np.array([5, 2, 4, 1])  # tokens prefilled per row; the rest are decoded one at a time
P = int(PROMPTS.max())  # prefill width
# Max |logit difference|, cached vs full, |logits| up to ~4 (docs/model.md has the measurements).
FP32_TOL = 1e-5  # measured <= 1.8e-6 here (8 seeds) and <= 3.5e-6 on the "tiny" preset
# bfloat16: measured 0 here (8 seeds); <= 2**-6 on "tiny" (one bf16 step at |logit| in [2, 4)).
BF16_TOL = 2**-5


def _tokens(seed: int = 0, pad: int = 0) -> np.ndarray:
    tokens = np.random.default_rng(seed).integers(3, CFG.vocab_size, (B, T)).astype(np.int32)
    tokens[np.arange(T)[None, :] >= LENGTHS[:, None]] = pad  # [B, T]
    return tokens


def _real() -> np.ndarray:
    return np.arange(T)[None, :] < LENGTHS[:, None]  # [B, T] bool


@functools.cache
def _compiled(dtype: str, exact: bool):
    """(cfg, params, full, step) for one dtype and mode; compiled once per module run."""
    cfg = dataclasses.replace(CFG, dtype=dtype, param_dtype=dtype)
    graphdef, params = nnx.split(Transformer(cfg, nnx.Rngs(params=0)))

    @jax.jit
    def full(params, tokens):
        return nnx.merge(graphdef, params)(tokens, exact=exact)

    @jax.jit
    def step(params, tokens, cache, num_new):
        return nnx.merge(graphdef, params)(tokens, cache=cache, num_new=num_new, exact=exact)

    return cfg, params, full, step


def _cached_logits(dtype: str, exact: bool, tokens: np.ndarray) -> np.ndarray:
    """Prefill PROMPTS[b] tokens of every row, then decode the rest one token per step (rows
    that are done feed padding with num_new=0). Returns logits [B, T, V] at real positions."""
    cfg, params, _, step = _compiled(dtype, exact)
    out = np.zeros((B, T, cfg.vocab_size), np.float32)
    prefill = np.where(np.arange(P)[None, :] < PROMPTS[:, None], tokens[:, :P], 0)  # [B, P]
    logits, cache = step(params, prefill, KVCache.zeros(cfg, B, S), PROMPTS.astype(np.int32))
    logits = np.asarray(logits)
    for b in range(B):
        out[b, : PROMPTS[b]] = logits[b, : PROMPTS[b]]
    pos = PROMPTS.copy()
    while (pos < LENGTHS).any():
        live = pos < LENGTHS
        fed = np.where(live, tokens[np.arange(B), np.minimum(pos, T - 1)], 0)[:, None]  # [B, 1]
        logits, cache = step(params, fed, cache, live.astype(np.int32))
        out[live, pos[live]] = np.asarray(logits)[live, 0]
        pos += live
    np.testing.assert_array_equal(np.asarray(cache.lengths), LENGTHS)
    return out


def _one_row_alone(dtype: str, exact: bool, row: np.ndarray) -> np.ndarray:
    """Decode a single row from an empty cache, one token per step: logits [len, V]."""
    cfg, params, _, step = _compiled(dtype, exact)
    cache = KVCache.zeros(cfg, 1, S)
    out = []
    for token in row:
        logits, cache = step(params, np.array([[token]], np.int32), cache, np.ones(1, np.int32))
        out.append(np.asarray(logits)[0, 0])
    return np.stack(out)


@pytest.mark.parametrize("dtype, tol", [("float32", FP32_TOL), ("bfloat16", BF16_TOL)])
def test_cached_decode_matches_full_forward(dtype, tol):
    tokens = _tokens()
    _, params, full, _ = _compiled(dtype, False)
    ref = np.asarray(full(params, tokens))  # [B, T, V]
    got = _cached_logits(dtype, False, tokens)
    real = _real()
    assert np.abs(ref[real]).max() > 1.0  # logits are not trivially small
    err = np.abs(got[real] - ref[real]).max()
    assert err <= tol, f"{dtype}: cached vs full differ by {err}"


def test_right_padding_does_not_leak_into_real_positions():
    _, params, full, _ = _compiled("float32", False)
    a = np.asarray(full(params, _tokens(pad=0)))
    b = np.asarray(full(params, _tokens(pad=63)))
    real = _real()
    np.testing.assert_array_equal(a[real], b[real])
    assert not np.array_equal(a[~real], b[~real])  # the padding did change the padded positions


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_exact_mode_is_bitwise(dtype):
    tokens = _tokens()
    _, params, full, _ = _compiled(dtype, True)
    ref = np.asarray(full(params, tokens))
    got = _cached_logits(dtype, True, tokens)
    real = _real()
    assert (got[real] == ref[real]).all(), f"max diff {np.abs(got[real] - ref[real]).max()}"
    # Row 1 decoded alone, token by token, gives the bits it gets inside the batch of 4.
    alone = _one_row_alone(dtype, True, tokens[1, : LENGTHS[1]])
    assert (alone == ref[1, : LENGTHS[1]]).all()


def test_token_logprobs_by_hand():
    logits = jnp.log(jnp.array([[[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]]]))  # [1, 2, 4]
    targets = jnp.array([[2, 0]])
    # softmax(log k) = k / 10  ->  log(3/10), log(4/10)
    want = np.log([[0.3, 0.4]])
    np.testing.assert_allclose(token_logprobs(logits, targets), want, rtol=1e-6)
    np.testing.assert_allclose(
        token_logprobs(logits, targets, Sampling(exact=True)), want, rtol=1e-6
    )
    # temperature 0.5: softmax(2 log k) = k^2 / 30  ->  log(9/30), log(16/30)
    want = np.log([[9 / 30, 16 / 30]])
    np.testing.assert_allclose(token_logprobs(logits, targets, Sampling(0.5)), want, rtol=1e-6)
    np.testing.assert_allclose(
        token_logprobs(logits, targets, Sampling(0.5, exact=True)), want, rtol=1e-6
    )


@pytest.mark.gpu
def test_token_logprobs_exact_is_shape_invariant():
    """Engine (one position per call) and trainer (all positions) get the same bits."""
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(4, 8, 1000)).astype(np.float32) * 3)  # [B, T, V]
    targets = jnp.asarray(rng.integers(0, 1000, (4, 8)).astype(np.int32))
    f = jax.jit(lambda lg, tg: token_logprobs(lg, tg, Sampling(0.7, exact=True)))
    whole = np.asarray(f(logits, targets))
    for t in range(8):
        step = np.asarray(f(logits[:, t : t + 1], targets[:, t : t + 1]))  # [B, 1]
        assert (step[:, 0] == whole[:, t]).all()
        assert np.asarray(f(logits[:1, t : t + 1], targets[:1, t : t + 1]))[0, 0] == whole[0, t]


def test_exact_dense_asks_for_true_float32_products_forward_and_backward():
    """Exact mode's dots ask for HIGHEST precision and float32 accumulation (a GPU runs float32
    dots at default precision in TF32); fast mode leaves XLA its default. The CPU computes
    float32 products either way: its exact bits are unchanged (test_exact_mode_is_bitwise)."""
    x, w = jnp.ones((2, 40), jnp.bfloat16), jnp.ones((40, 3), jnp.bfloat16)

    def dots(fn) -> list[str]:
        text = jax.jit(fn).lower(x, w).as_text()
        return [line for line in text.splitlines() if "dot_general" in line]

    loss = lambda x, w: exact_ops.dense(x, w, exact=True).astype(jnp.float32).sum()
    exact = dots(jax.grad(loss, argnums=(0, 1)))  # the forward and the two backward dots
    assert len(exact) == 3 and all("precision = [HIGHEST, HIGHEST]" in d for d in exact), exact
    assert all("-> tensor<" in d and "xf32>" in d.split("->")[1] for d in exact)
    (fast,) = dots(exact_ops.dense)
    assert "HIGHEST" not in fast


def test_dense_backward_matches_autodiff():
    """minirl.modeling.exact's hand-written dense backward (no transposed copies) == autodiff's."""
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(3, 5, 16)).astype(np.float32))  # [B, T, I]
    w = jnp.asarray(rng.normal(size=(16, 24)).astype(np.float32))  # [I, O]
    c = jnp.asarray(rng.normal(size=(3, 5, 24)).astype(np.float32))  # a cotangent [B, T, O]
    ours = jax.grad(lambda x, w: (exact_ops.dense(x, w) * c).sum(), argnums=(0, 1))(x, w)
    plain = jax.grad(lambda x, w: (jnp.einsum("bti,io->bto", x, w) * c).sum(), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(exact_ops.dense(x, w), jnp.einsum("bti,io->bto", x, w), rtol=1e-6)
    for got, want in zip(ours, plain, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_causal_blocks_equal_one_masked_block():
    """`causal_attention` skips the score blocks above the diagonal: same outputs and gradients
    as the one full masked block (T = 130: blocks of 33, 33, 33 and 31 query rows)."""
    t = 130
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.normal(size=(2, t, 2, 2, 8)).astype(np.float32))  # [B, T, K, G, Dh]
    k, v = (jnp.asarray(rng.normal(size=(2, t, 2, 8)).astype(np.float32)) for _ in range(2))
    visible = jnp.broadcast_to(jnp.arange(t)[None, :] <= jnp.arange(t)[:, None], (2, t, t))

    @functools.partial(jax.jit, static_argnums=0)
    def run(attend, q, k, v):
        out, pullback = jax.vjp(lambda q, k, v: attend(q, k, v, visible), q, k, v)
        return out, pullback(q)  # q doubles as a cotangent [B, T, K, G, Dh]

    (blocked, grads), (one, want) = (
        run(exact_ops.causal_attention, q, k, v),
        run(exact_ops.attention, q, k, v),
    )
    np.testing.assert_allclose(blocked, one, rtol=1e-5, atol=1e-6)
    for got, ref in zip(grads, want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"num_heads": 6, "num_kv_heads": 4}, "multiple of num_kv_heads"),
        ({"dtype": "float16"}, "dtype must be one of"),
        ({"param_dtype": "int8"}, "param_dtype must be one of"),
        ({"head_dim": 15}, "head_dim must be even"),
    ],
)
def test_config_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**overrides)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown model preset 'gpt2'"):
        ModelConfig.preset("gpt2")


def _count(cfg: ModelConfig) -> tuple[int, int]:
    """(all parameters, embedding + LM head parameters) of the model cfg builds, no memory used."""
    model = nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(params=0)))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    total = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    emb = sum(int(np.prod(params[k].shape)) for k in ("embed", "lm_head") if k in params)
    return total, emb


# qwen3-30b-a3b: its 6,144 expert matrices take ~10 s to trace; tiny-moe checks the same formula
# here and tests/modeling/test_moe.py checks that preset against its model card.
COUNTED = {k: v for k, v in PRESETS.items() if k != "qwen3-30b-a3b"}


@pytest.mark.parametrize(
    "cfg", [*COUNTED.values(), ModelConfig(tie_embeddings=False)], ids=[*COUNTED, "tiny-untied"]
)
def test_num_params_counts_the_actual_parameters(cfg):
    total, emb = _count(cfg)
    assert cfg.num_params() == total
    assert cfg.num_params(embeddings=False) == total - emb


@pytest.mark.parametrize(
    "name, total, non_embedding",
    # Sizes published on the model cards, in billions, as intervals around the printed digits
    # (Qwen cards round; the Llama 3.2 card prints 1.23B).
    [
        ("qwen2.5-0.5b", (0.485, 0.495), (0.355, 0.365)),
        ("qwen3-0.6b", (0.55, 0.65), (0.435, 0.445)),
        ("llama-3.2-1b", (1.23, 1.24), None),
    ],
)
def test_public_presets_match_published_sizes(name, total, non_embedding):
    cfg = ModelConfig.preset(name)
    assert total[0] <= cfg.num_params() / 1e9 < total[1]
    if non_embedding is not None:
        assert non_embedding[0] <= cfg.num_params(embeddings=False) / 1e9 < non_embedding[1]
