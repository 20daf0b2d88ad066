"""Routes, routing replay and exact mode on a mixture-of-experts model, engine to trainer.

  the engine records, per position it ran, each MoE layer's experts (uint8 [P+C-1, M, k]);
    in exact mode they are the trainer's own free routing on 100% of positions and the
    behaviour log-probs equal its recompute bitwise: fp32 and bf16, prefill + decode, paged
    cache with preemption, multi-turn (extend), interrupt("continue") (a rebuild replaces them)
  they survive the worker transport; make_batch lays them under the positions that read them
  replay: the trainer runs exactly the engine's experts (100%) where free routing differs
    (perturbed router), and the router still gets a gradient
  routing/* step metrics against hand-computed shares; the load-balancing part adds exactly
    coef x its gradient; a dense model records nothing and refuses replay

One tiny-moe model (2 MoE layers, 8 experts, top-2) and a handful of engine settings.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from minirl.config import RLConfig, RunConfig
from minirl.configlib import ConfigError
from minirl.control.workers import from_plain, to_plain
from minirl.inference.engine import Engine, EngineConfig, Request
from minirl.losses import LossInputs, make_objective
from minirl.modeling import moe
from minirl.modeling.model import ModelConfig, init_model
from minirl.training.batching import make_batch
from minirl.training.forward import ForwardSpec, _forward, accumulate, accumulate_fn
from minirl.training.routing import differs, ran_positions, routing_metrics
from minirl.training.step_losses import NLL
from minirl.training.trainer import Trainer, TrainerConfig
from minirl.types import Prompt, Score

CFG = ModelConfig.preset("tiny-moe", max_seq_len=128)
EXACT = EngineConfig(
    slots=4,
    cache_len=128,
    prefill_buckets=(32,),
    prefill_rows=2,
    decode_chunk=4,
    temperature=1.0,
    exact=True,
)
GRPO = make_objective("grpo", 5.0, 0.0)
FAST = dataclasses.replace(EXACT, exact=False).sampling.scoring  # gradients: compiles quicker


def prompts(n, seed=0, uid0=0):
    rng = np.random.default_rng(seed)
    return [
        Prompt(uid0 + i, "t", "", rng.integers(1, 64, int(rng.integers(2, 15))).astype(np.int32))
        for i in range(n)
    ]


def requests(ps, seed=0, max_new=(6, 24)):
    rng = np.random.default_rng(seed + 100)
    return [Request(p, i % 2, int(rng.integers(*max_new))) for i, p in enumerate(ps)]


@pytest.fixture(scope="module")
def params():
    return jax.jit(lambda: nnx.to_pure_dict(nnx.split(init_model(CFG, seed=0))[1]))()


@pytest.fixture(scope="module")
def params_v1(params):
    rng = np.random.default_rng(9)
    return jax.tree_util.tree_map(lambda x: x + 0.05 * rng.standard_normal(x.shape), params)


def batch_of(rollouts):
    for i, r in enumerate(rollouts):
        r.score = Score(float(i % 2))
    return make_batch(rollouts, pad_id=0)


def trainer(params, routing="free", dtype="float32", sampling=EXACT.sampling.scoring):
    """Micro-batches of <= 256 tokens: several per batch (the routes are gathered and scattered
    with the rows), and under the size where XLA CPU's dot starts to round bf16 differently."""
    cfg = dataclasses.replace(CFG, dtype=dtype)
    tcfg = TrainerConfig(routing=routing, micro_batch_tokens=256)
    return Trainer(cfg, params, GRPO, tcfg, sampling=sampling)


def assert_engine_equals_trainer(params, rollouts, dtype="float32"):
    """Exact mode: the rollouts' routes are the trainer's free routing on every position it
    runs, and their log-probs its recompute, bit for bit."""
    batch = batch_of(rollouts)
    logp, ran, choice = trainer(params, dtype=dtype).routing(batch)
    valid = ran_positions(batch.mask)
    np.testing.assert_array_equal(logp, batch.behaviour_logprobs)
    assert not differs(ran, batch.routes)[valid].any()  # the same expert SETS everywhere
    np.testing.assert_array_equal(ran, choice)
    return batch


# ---- the engine's record ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_exact_engine_routes_and_logprobs_equal_the_trainers(params, dtype):
    reqs = requests(prompts(6))
    e = Engine(CFG, dataclasses.replace(EXACT, dtype=dtype))
    e.load_weights(0, params)
    done = e.generate(reqs)
    for r in done:
        assert r.routes.dtype == np.uint8
        assert r.routes.shape == (len(r.prompt.tokens) + len(r.tokens) - 1, 2, 2)
        assert r.routes.max() < CFG.num_experts
    assert e.stats["route_bytes"] == sum(r.routes.nbytes for r in done) > 0
    assert_engine_equals_trainer(params, done, dtype)


@pytest.mark.slow
def test_paged_with_preemption_records_the_same_routes(params):
    reqs = requests(prompts(6, seed=6), seed=6, max_new=(20, 30))
    small = dataclasses.replace(EXACT, paged=True, block_size=8, num_blocks=17)
    e = Engine(CFG, small)
    e.load_weights(0, params)
    done = e.generate(reqs)
    assert e.stats["preempted"] > 0
    assert_engine_equals_trainer(params, done)


@pytest.mark.slow
def test_multi_turn_and_continue_rebuild_keep_routes_aligned(params, params_v1):
    """An episode (turn, observation, turn) and, in another slot, a request interrupted with
    "continue" under new weights: the rebuilt cache's routes replace the old ones, so the whole
    record is the new weights' routing (its early log-probs stay the old weights')."""
    e = Engine(CFG, EXACT)
    e.load_weights(0, params_v1)
    p = prompts(2, seed=3)
    e.submit([Request(p[0], 0, 5, multi_turn=True), Request(p[1], 0, 30)])
    while not (turn := [r for r in e.step() if r.prompt.uid == p[0].uid]):
        pass
    e.load_weights(1, params)
    assert e.interrupt("continue") == 2
    e.extend(p[0].uid, 0, np.array([7, 8, 9], np.int32), 6)
    done = {}
    while len(done) < 2:
        done |= {r.prompt.uid: r for r in e.step()}
    e.release(p[0].uid, 0)
    episode, long = done[p[0].uid], done[p[1].uid]
    assert episode.mask.tolist()[len(turn[0].tokens) : len(turn[0].tokens) + 3] == [0.0] * 3
    assert e.stats["rebuilt"] == 2 and e.stats["extended"] == 1
    batch = batch_of([episode, long])
    _, ran, _ = trainer(params).routing(batch)
    valid = ran_positions(batch.mask)
    np.testing.assert_array_equal(ran[valid], batch.routes[valid])


def test_routes_cross_the_worker_transport_and_land_under_their_positions(params):
    e = Engine(CFG, EXACT)
    e.load_weights(0, params)
    done = e.generate(requests(prompts(2, seed=1), seed=1))
    back = [from_plain(to_plain(r)) for r in done]
    for a, b in zip(done, back, strict=True):
        assert b.routes.dtype == np.uint8
        np.testing.assert_array_equal(a.routes, b.routes)
    batch = batch_of(back)
    for i, r in enumerate(back):  # rows sorted by uid: row i holds rollout i
        n = len(r.prompt.tokens) + len(r.tokens) - 1
        np.testing.assert_array_equal(batch.routes[i, :n], r.routes)
        assert not batch.routes[i, n:].any()
    with pytest.raises(ValueError, match="routes cover"):
        make_batch([dataclasses.replace(back[0], routes=back[0].routes[1:])], 0)
    with pytest.raises(ValueError, match="mix routed"):
        make_batch([back[0], dataclasses.replace(back[1], routes=None)], 0)


# ---- replay ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine_batch(params):
    """Exact fp32 rollouts of the unperturbed model (the engine's routes)."""
    e = Engine(CFG, EXACT)
    e.load_weights(0, params)
    return batch_of(e.generate(requests(prompts(6, seed=2), seed=2)))


@pytest.fixture(scope="module")
def moved_router(params):
    """The same model with every router perturbed: free routing now differs from the record."""
    rng = np.random.default_rng(1)
    moved = jax.tree_util.tree_map(np.asarray, params)
    for i in CFG.moe_layers:
        w = moved["layers"][i]["mlp"]["router"]
        moved["layers"][i]["mlp"]["router"] = w + np.float32(0.05) * rng.standard_normal(
            w.shape, np.float32
        )
    return moved


@pytest.mark.slow
def test_replay_runs_the_engines_experts_where_free_routing_differs(engine_batch, moved_router):
    b, valid = engine_batch, ran_positions(engine_batch.mask)
    _, free, _ = trainer(moved_router, sampling=FAST).routing(b)
    share = differs(free, b.routes)[valid].any(-1).mean()
    assert 0.05 < share < 1.0
    _, ran, choice = trainer(moved_router, "replay", sampling=FAST).routing(b)
    np.testing.assert_array_equal(ran[valid], b.routes[valid])  # 100% of tokens
    np.testing.assert_array_equal(choice[valid][:, 0], free[valid][:, 0])  # layer 0: free
    # the step's metrics: disagreement between the record and the routers' own choice
    m = trainer(moved_router, "replay", sampling=FAST).train_step(b)
    want = routing_metrics(b.routes, choice, valid, CFG.num_experts)
    assert m["routing/disagreement"] == pytest.approx(want["routing/disagreement"])
    assert m["routing/disagreement"] > 0.05
    with pytest.raises(ValueError, match="replay needs the engine's routes"):
        trainer(moved_router, "replay", sampling=FAST).train_step(
            dataclasses.replace(b, routes=None)
        )


@pytest.mark.slow
def test_replay_still_trains_the_router(engine_batch, moved_router):
    """Under remat ("nothing": every block recomputed in the backward pass) too: the routers'
    record comes out of the checkpointed blocks, and the router gets a gradient."""
    t = trainer(moved_router, "replay", sampling=FAST)
    spec = ForwardSpec(CFG, FAST, "nothing", "replay")
    b, valid = engine_batch, ran_positions(engine_batch.mask)
    part = {"weight": b.mask / b.mask.sum()}
    run = jax.jit(lambda p, *args: accumulate(spec, NLL, p, None, *args))
    (grads, _), _, _, choice = run(t.params(), b.tokens, b.targets, part, None, b.routes)
    np.testing.assert_array_equal(np.asarray(choice)[valid], t.routing(b)[2][valid])
    assert differs(np.asarray(choice), b.routes)[valid].any()  # its own pick, not the replay
    for i in CFG.moe_layers:
        assert float(jnp.abs(grads["layers"][i]["mlp"]["router"]).max()) > 1e-6


# ---- metrics and the load-balancing part -----------------------------------------------------


def test_routing_metrics_by_hand():
    engine = np.array([[[[0, 1], [2, 3]], [[1, 0], [2, 3]]]])  # [1, 2, M=2, k=2]
    other = np.array(
        [[[[1, 0], [2, 3]], [[1, 2], [3, 2]]]]
    )  # token 0: same sets; 1: layer 0 differs
    m = routing_metrics(engine, other, np.ones((1, 2), bool), num_experts=4)
    assert m["routing/disagreement"] == 0.5  # 1 of 2 tokens
    assert m["routing/layer_disagreement"] == 0.25  # 1 of 4 (token, layer) pairs
    # layer 0 ran experts {0, 1, 1, 0}: shares 0.5, 0.5, 0, 0; layer 1 {2, 3, 2, 3}
    assert m["routing/expert_load_min"] == 0.0 and m["routing/expert_load_max"] == 0.5
    m = routing_metrics(engine, other, np.array([[True, False]]), num_experts=4)
    assert m["routing/disagreement"] == 0.0 and m["routing/expert_load_max"] == 0.5


@pytest.mark.slow
def test_router_aux_coef_adds_exactly_coef_times_its_gradient(engine_batch, params):
    """One micro-batch: loss(coef) - loss(0) = coef x aux, and the same for the gradients, aux
    being moe.load_balancing_loss over the counted tokens of this forward."""
    b, coef = engine_batch, 0.25
    spec = ForwardSpec(CFG, FAST, "none", "replay")
    inputs = LossInputs.from_batch(b, b.behaviour_logprobs)
    share, args = b.mask / b.mask.sum(), (b.tokens, b.targets)

    def step(objective):
        part = objective.prepare(inputs)
        return accumulate_fn(spec, objective)(params, None, *args, part, None, b.routes, share)

    (g0, v0), _, _, _ = step(GRPO)
    (g1, v1), m1, _, _ = step(dataclasses.replace(GRPO, router_aux_coef=coef))

    def aux(p):
        _, _, (ran, probs) = _forward(spec, p, *args, False, b.routes)
        return moe.load_balancing_loss(probs, ran, CFG.num_experts, b.mask > 0)

    a, ga = jax.jit(jax.value_and_grad(aux))(params)
    assert float(a) > 2.0  # k = 2 is perfect balance
    assert float(m1["router_aux"]) == pytest.approx(float(a), rel=1e-6)
    assert float(v1 - v0) == pytest.approx(coef * float(a), rel=1e-5)
    diff = jax.tree.map(lambda x, y, z: np.abs(np.asarray(x - y - coef * z)).max(), g1, g0, ga)
    assert max(jax.tree.leaves(diff)) < 1e-6
    assert float(jnp.abs(ga["layers"][0]["mlp"]["router"]).max()) > 1e-4


# ---- dense models ----------------------------------------------------------------------------


def test_dense_models_record_nothing_and_refuse_replay():
    dense = dataclasses.replace(CFG, num_experts=0)
    with pytest.raises(ValueError, match="mixture-of-experts"):
        Trainer(dense, {}, GRPO, TrainerConfig(routing="replay"))
    with pytest.raises(ConfigError, match="trainer.routing=replay needs"):
        RunConfig(trainer=TrainerConfig(routing="replay")).check()
    with pytest.raises(ConfigError, match="rl.router_aux_coef needs"):
        RunConfig(rl=RLConfig(router_aux_coef=0.01)).check()
    with pytest.raises(ValueError, match="routing in"):
        TrainerConfig(routing="sticky")
