"""Tests for minirl/modeling/moe.py: routing by hand, the layer against a per-token loop, the
balancing loss by hand, routing replay, the routing record, and exact mode on an MoE model.

Cost: one `tiny-moe` model (2 MoE layers, 8 experts, a shared expert added), compiled per
(dtype, exact) once for the module.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from minirl.modeling import moe
from minirl.modeling.model import KVCache, ModelConfig, Transformer

# The preset plus Qwen2-MoE's shared expert: every path of the layer in one model.
CFG = ModelConfig.preset("tiny-moe", shared_expert_dim=32, max_seq_len=64)
B, T, S = 4, 10, 64
LENGTHS = np.array([10, 6, 8, 3])  # real tokens per row
PROMPTS = np.array([4, 2, 5, 1])  # prefilled; the rest decoded one token per step


def _tokens(seed: int = 0) -> np.ndarray:
    tokens = np.random.default_rng(seed).integers(3, CFG.vocab_size, (B, T)).astype(np.int32)
    tokens[np.arange(T)[None, :] >= LENGTHS[:, None]] = 0
    return tokens


def test_route_by_hand_with_ties():
    # One token, E = 4: probabilities 0.1, 0.3, 0.3, 0.3. Top-2 keeps the two lower indices of
    # the three-way tie, in index order.
    probs = jnp.array([[0.1, 0.3, 0.3, 0.3]])
    chosen, gates = moe.route(probs, 2, norm_topk_prob=False)
    np.testing.assert_array_equal(chosen, [[1, 2]])
    np.testing.assert_allclose(gates, [[0.3, 0.3]], rtol=1e-6)
    chosen, gates = moe.route(probs, 2, norm_topk_prob=True, exact=True)
    np.testing.assert_array_equal(chosen, [[1, 2]])
    np.testing.assert_allclose(gates, [[0.5, 0.5]], rtol=1e-6)
    # Largest first: 0.2, 0.5, 0.3 -> experts 1 then 2; renormalised 0.5/0.8, 0.3/0.8.
    chosen, gates = moe.route(jnp.array([[0.2, 0.5, 0.3]]), 2, norm_topk_prob=True)
    np.testing.assert_array_equal(chosen, [[1, 2]])
    np.testing.assert_allclose(gates, [[0.625, 0.375]], rtol=1e-6)
    # Replayed: the set comes from `routes`, the values from the probabilities.
    chosen, gates = moe.route(jnp.array([[0.2, 0.5, 0.3]]), 2, True, routes=jnp.array([[0, 2]]))
    np.testing.assert_array_equal(chosen, [[0, 2]])
    np.testing.assert_allclose(gates, [[0.4, 0.6]], rtol=1e-6)


def _layer(cfg, seed=0):
    model = Transformer(cfg, nnx.Rngs(params=seed))
    return model.layers[0].mlp


def _reference(layer, x: np.ndarray, cfg) -> np.ndarray:
    """The layer, token by token, in float64 numpy: softmax, top-k, k SwiGLU experts."""
    silu = lambda z: z / (1 + np.exp(-z))
    p = lambda w: np.asarray(w[...], np.float64)
    out = np.zeros_like(x, np.float64)
    for n, row in enumerate(x.astype(np.float64)):
        logits = row @ p(layer.router)
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        chosen = np.argsort(-probs, kind="stable")[: cfg.experts_per_token]
        gates = probs[chosen] / (probs[chosen].sum() if cfg.norm_topk_prob else 1.0)
        for e, g in zip(chosen, gates, strict=True):
            h = silu(row @ p(layer.gate_proj)[e]) * (row @ p(layer.up_proj)[e])
            out[n] += g * (h @ p(layer.down_proj)[e])
        if cfg.shared_expert_dim:
            sh = layer.shared_expert
            h = silu(row @ p(sh.gate_proj)) * (row @ p(sh.up_proj))
            gate = 1 / (1 + np.exp(-(row @ p(layer.shared_expert_gate))[0]))
            out[n] += gate * (h @ p(sh.down_proj))
    return out


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("norm, shared", [(True, 0), (False, 32)], ids=["qwen3", "qwen2"])
def test_layer_equals_a_per_token_loop(norm, shared, exact):
    cfg = dataclasses.replace(CFG, norm_topk_prob=norm, shared_expert_dim=shared)
    layer = _layer(cfg)
    x = np.random.default_rng(1).normal(size=(5, cfg.dim)).astype(np.float32)
    got = np.asarray(layer(jnp.asarray(x)[None], exact=exact))[0]
    want = _reference(layer, x, cfg)
    assert np.abs(want).max() > 0.1
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_zero_router_ties_everything_and_the_lowest_experts_win():
    layer = _layer(CFG)
    layer.router[...] = jnp.zeros_like(layer.router[...])
    x = jnp.ones((1, 3, CFG.dim))
    layer(x)
    chosen, probs = layer.routes[...], layer.router_probs[...]
    np.testing.assert_array_equal(chosen, np.tile([0, 1], (1, 3, 1)))
    np.testing.assert_array_equal(probs, np.full((1, 3, 8), 1 / 8, np.float32))


def test_load_balancing_loss_by_hand():
    # Two tokens, E = 4, k = 2.
    probs = jnp.array([[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]])
    routes = jnp.array([[0, 1], [3, 2]])
    # f = (1/2, 1/2, 1/2, 1/2), P = (1/4, ...): 4 * 4 * 1/8 = 2 (= k: balanced).
    np.testing.assert_allclose(moe.load_balancing_loss(probs, routes, 4), 2.0, rtol=1e-6)
    # Token 1 masked out: f = (1, 1, 0, 0), P = (0.4, 0.3, 0.2, 0.1): 4 * 0.7 = 2.8.
    loss = moe.load_balancing_loss(probs, routes, 4, mask=jnp.array([1, 0]))
    np.testing.assert_allclose(loss, 2.8, rtol=1e-6)
    # Leading axes [B, T, M] with a [B, T] mask: the layers pool, as transformers does.
    stacked = moe.load_balancing_loss(
        probs[None, :, None], routes[None, :, None], 4, jnp.ones((1, 2))
    )
    np.testing.assert_allclose(stacked, 2.0, rtol=1e-6)
    # d loss / d P_e = E * f_e / N: the gradient pushes probability away from crowded experts.
    grad = jax.grad(lambda p: moe.load_balancing_loss(p, routes, 4, jnp.array([1, 0])))(probs)
    np.testing.assert_allclose(grad, [[4.0, 4.0, 0, 0], [0, 0, 0, 0]], atol=1e-6)


@functools.cache
def _compiled(dtype: str, exact: bool):
    # Exact mode on one layer (router, experts, shared expert: every exact path, half the compile)
    cfg = dataclasses.replace(CFG, dtype=dtype, param_dtype=dtype, num_layers=1 if exact else 2)
    graphdef, params = nnx.split(Transformer(cfg, nnx.Rngs(params=0)))

    @jax.jit
    def full(params, tokens, routes=None):
        model = nnx.merge(graphdef, params)
        return model(tokens, exact=exact, routes=routes), moe.collect(model)

    @jax.jit
    def step(params, tokens, cache, num_new):
        return nnx.merge(graphdef, params)(tokens, cache=cache, num_new=num_new, exact=exact)

    return cfg, params, full, step


def test_the_record_and_replay_of_the_models_own_routes():
    """collect gives [B, T, M, k] routes and [B, T, M, E] probabilities; replaying the model's
    own routes gives its logits bit for bit; other routes change them, and the gradient still
    reaches the router."""
    cfg, params, full, _ = _compiled("float32", False)
    tokens = _tokens()
    logits, (routes, probs) = full(params, tokens)
    assert routes.shape == (B, T, 2, 2) and routes.dtype == jnp.int32
    assert probs.shape == (B, T, 2, 8) and probs.dtype == jnp.float32
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    top = np.argsort(-np.asarray(probs), axis=-1, kind="stable")[..., :2]
    np.testing.assert_array_equal(routes, top)
    replayed, (again, _) = full(params, tokens, routes)
    np.testing.assert_array_equal(replayed, logits)
    np.testing.assert_array_equal(again, routes)
    other = (routes + 1) % 8  # distinct experts still
    changed, (recorded, _) = full(params, tokens, other)
    np.testing.assert_array_equal(recorded, other)
    assert np.abs(np.asarray(changed) - np.asarray(logits)).max() > 1e-3
    graphdef = nnx.graphdef(Transformer(cfg, nnx.Rngs(params=0)))
    loss = lambda p: nnx.merge(graphdef, p)(tokens, routes=other)[:, :, :8].sum()
    grads = nnx.to_pure_dict(jax.jit(jax.grad(loss))(params))
    for i in cfg.moe_layers:
        assert np.abs(np.asarray(grads["layers"][i]["mlp"]["router"])).max() > 0


def test_a_dense_model_records_nothing():
    model = Transformer(dataclasses.replace(CFG, num_experts=0, num_layers=1), nnx.Rngs(params=0))
    assert not model.layers[0].sparse and moe.collect(model) == (None, None)


def _cached_logits(dtype, exact, tokens):
    """Prefill PROMPTS[b] tokens, decode the rest one token per step: logits [B, T, V]."""
    cfg, params, _, step = _compiled(dtype, exact)
    out = np.zeros((B, T, cfg.vocab_size), np.float32)
    p = int(PROMPTS.max())
    prefill = np.where(np.arange(p)[None, :] < PROMPTS[:, None], tokens[:, :p], 0)
    logits, cache = step(params, prefill, KVCache.zeros(cfg, B, S), PROMPTS.astype(np.int32))
    for b in range(B):
        out[b, : PROMPTS[b]] = np.asarray(logits)[b, : PROMPTS[b]]
    pos = PROMPTS.copy()
    while (pos < LENGTHS).any():
        live = pos < LENGTHS
        fed = np.where(live, tokens[np.arange(B), np.minimum(pos, T - 1)], 0)[:, None]
        logits, cache = step(params, fed, cache, live.astype(np.int32))
        out[live, pos[live]] = np.asarray(logits)[live, 0]
        pos += live
    return out


@pytest.mark.gpu
@pytest.mark.parametrize(  # bf16 (~9 s cold) in the slow lane; dense bf16 stays in test_model
    "dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)]
)
def test_exact_mode_is_bitwise_on_moe(dtype):
    """Exact mode: prefill + decode (4 rows), the full forward and a row decoded alone agree to
    the bit — the batch a token shares does not change which experts it gets or their output."""
    tokens = _tokens()
    cfg, params, full, step = _compiled(dtype, True)
    ref = np.asarray(full(params, tokens)[0])
    got = _cached_logits(dtype, True, tokens)
    real = np.arange(T)[None, :] < LENGTHS[:, None]
    assert (got[real] == ref[real]).all(), f"max diff {np.abs(got[real] - ref[real]).max()}"
    cache, alone = KVCache.zeros(cfg, 1, S), []
    for token in tokens[2, : LENGTHS[2]]:
        logits, cache = step(params, np.array([[token]], np.int32), cache, np.ones(1, np.int32))
        alone.append(np.asarray(logits)[0, 0])
    assert (np.stack(alone) == ref[2, : LENGTHS[2]]).all()


def test_moe_config_checks_and_lora_on_attention():
    for overrides, message in [
        ({"experts_per_token": 9}, "experts_per_token must be in 1..num_experts=8"),
        ({"moe_every": 0}, "moe_every must be >= 1 and expert_dim, shared_expert_dim >= 0"),
        ({"dense_layers": (2,)}, "dense_layers must be layer indices < 2"),
        ({"lora_rank": 4}, "LoRA on a mixture-of-experts model adapts attention only"),
    ]:
        with pytest.raises(ValueError, match=message):
            ModelConfig.preset("tiny-moe", **overrides)
    # expert_dim 0 = mlp_dim, resolved when the experts are switched on (any override order)
    assert ModelConfig(num_experts=4).expert_dim == ModelConfig().mlp_dim == 768
    assert ModelConfig(num_experts=0).expert_dim == 0
    cfg = ModelConfig.preset("tiny-moe", lora_rank=4, lora_targets=("q", "v"))
    graphdef, params = nnx.split(Transformer(cfg, nnx.Rngs(params=0)))
    assert nnx.to_pure_dict(params)["layers"][0]["attn"]["q_lora_a"].shape == (64, 4)
    forward = lambda p: nnx.merge(graphdef, p)(jnp.asarray(_tokens()))
    assert jax.eval_shape(forward, params).shape == (B, T, 64)  # traced, not compiled


def test_which_layers_are_sparse_and_the_counts():
    cfg = ModelConfig.preset("tiny-moe", num_layers=4, moe_every=2, dense_layers=(3,))
    assert cfg.moe_layers == (1,)  # (i + 1) % 2 == 0 -> 1, 3; 3 kept dense
    assert ModelConfig(num_experts=0).moe_layers == ()
    # tiny-moe by hand: embedding 64 * 64; per layer attention 64*64*2 + 64*32*2 = 12288, q/k
    # norms 2 * 16, two norms 128; the MoE: router 64 * 8, experts 3 * 8 * 64 * 64; final norm 64.
    layer = 12288 + 32 + 128 + 64 * 8
    total = 64 * 64 + 2 * (layer + 3 * 8 * 64 * 64) + 64
    active = 64 * 64 + 2 * (layer + 3 * 2 * 64 * 64) + 64
    tiny = ModelConfig.preset("tiny-moe")
    assert (tiny.num_params(), tiny.active_params()) == (total, active)
    # Qwen3-30B-A3B: "30.5B total, 3.3B activated" (the model card); 29.9B without embeddings.
    big = ModelConfig.preset("qwen3-30b-a3b")
    assert 30.45e9 < big.num_params() < 30.55e9 and 3.3e9 < big.active_params() < 3.4e9
    assert 29.85e9 < big.num_params(embeddings=False) < 29.95e9


def test_collect_before_a_call_is_a_clear_error():
    model = Transformer(dataclasses.replace(CFG, num_layers=1), nnx.Rngs(params=0))
    with pytest.raises(ValueError, match="no routing record: call the model before collect"):
        moe.collect(model)


def test_a_model_called_inside_a_loop_it_was_not_merged_in_records_nothing():
    """The engine's decode loop merges outside jax.lax.fori_loop: the model still runs (no
    record); merged inside the loop body, it records."""
    cfg = dataclasses.replace(CFG, num_layers=1)
    graphdef, params = nnx.split(Transformer(cfg, nnx.Rngs(params=0)))
    tokens = jnp.ones((1, 2), jnp.int32)

    @jax.jit
    def outside(params):
        model = nnx.merge(graphdef, params)
        logits = jax.lax.fori_loop(0, 2, lambda i, acc: acc + model(tokens), jnp.zeros((1, 2, 64)))
        with pytest.raises(ValueError, match="records nothing inside it"):
            moe.collect(model)
        return logits

    @jax.jit
    def inside(params):
        def body(i, acc):
            model = nnx.merge(graphdef, params)
            logits = model(tokens)
            assert logits.shape == (1, 2, 64)
            return acc + moe.collect(model)[0].sum()

        return jax.lax.fori_loop(0, 2, body, jnp.zeros((), jnp.int32))

    @jax.jit
    def once(params):
        model = nnx.merge(graphdef, params)
        model(tokens)
        return moe.collect(model)[0].sum()

    assert outside(params).shape == (1, 2, 64)
    assert int(inside(params)) == 2 * int(once(params))


def test_an_moe_block_gets_a_dense_blocks_arguments_unless_routes_are_replayed():
    """Free routing calls every block with the dense block's six arguments, so a wrapper written
    for them (the trainer's remat) runs an MoE model unchanged; replay adds the seventh."""
    seen = []

    class Wrapper(nnx.Module):
        def __init__(self, block):
            self.block = block

        def __call__(self, *args):
            seen.append(len(args))
            return self.block(*args)

    model = Transformer(dataclasses.replace(CFG, num_layers=1), nnx.Rngs(params=0))
    model.layers = nnx.List([Wrapper(b) for b in model.layers])
    tokens = jnp.ones((1, 2), jnp.int32)
    jax.eval_shape(lambda: model(tokens))  # traced only
    jax.eval_shape(lambda: model(tokens, routes=jnp.zeros((1, 2, 1, 2), jnp.int32)))
    assert seen == [6, 7]
