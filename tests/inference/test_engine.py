"""minirl/inference/engine.py: the rollout engine against slow references.

  greedy engine == a plain greedy loop (full forward per token)
  a request gives the same rollout alone and inside a full batch (counter-based keys)
  behaviour log-probs == the trainer's recomputation: bitwise in exact mode (fp32, bf16),
    within 1e-4 otherwise
  interrupt("continue") tags versions at the switch and rebuilds the cache with the new weights;
    interrupt("discard") re-generates from scratch with one version
  paged cache == contiguous cache (also with preemption); memory reported
  a group's samples share their prompt's prefill; a bf16 decode reads its cache in place
  no recompilation in steady state; finish reasons eos / stop / length

A 2-layer model and a handful of engine settings keep compiles (the cost here) few; engines
with equal settings share their compiled functions.
"""

import collections
import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from minirl.inference import decoding
from minirl.inference import engine as engine_module
from minirl.inference.cache_layout import ContiguousLayout
from minirl.inference.engine import Engine, EngineConfig, Request
from minirl.modeling.model import ModelConfig, Transformer, init_model, token_logprobs
from minirl.modeling.sampling import Sampling
from minirl.types import Prompt

CFG = ModelConfig(
    vocab_size=64,
    dim=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    mlp_dim=128,
    max_seq_len=128,
)
BASE = EngineConfig(slots=4, cache_len=128, prefill_buckets=(32,), prefill_rows=2, decode_chunk=4)
SAMPLED = dataclasses.replace(BASE, temperature=1.0, top_k=40, top_p=0.95)
EXACT = dataclasses.replace(SAMPLED, exact=True)
PAD = 48  # the trainer's padded row length in these tests


def make_prompts(n, seed=0, uid0=0):
    rng = np.random.default_rng(seed)
    return [
        Prompt(
            uid=uid0 + i,
            task="test",
            text="",
            tokens=rng.integers(1, CFG.vocab_size, size=int(rng.integers(2, 15))).astype(np.int32),
        )
        for i in range(n)
    ]


def requests(prompts, max_new=(6, 20), seed=0):
    rng = np.random.default_rng(seed + 100)
    return [
        Request(p, sample_index=int(i % 2), max_new_tokens=int(rng.integers(*max_new)))
        for i, p in enumerate(prompts)
    ]


@pytest.fixture(scope="module")
def params():
    return jax.jit(lambda: nnx.to_pure_dict(nnx.split(init_model(CFG, seed=0))[1]))()


@pytest.fixture(scope="module")
def params_v1(params):
    """A second weight version: every leaf perturbed (numpy: no compiles)."""
    rng = np.random.default_rng(9)
    return jax.tree_util.tree_map(lambda x: x + 0.05 * rng.standard_normal(x.shape), params)


def engine(config, params, version=0):
    e = Engine(CFG, config)
    e.load_weights(version, params)
    return e


@functools.cache
def trainer_logprobs(dtype, exact, temperature, top_k, top_p):
    """The trainer's computation, jitted once per setting: full forward + token_logprobs."""
    cfg = dataclasses.replace(CFG, dtype=dtype)
    graphdef = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(0))))[0]

    @jax.jit
    def logprobs(params, tokens):
        logits = nnx.merge(graphdef, params)(tokens, exact=exact)
        return token_logprobs(
            logits[:, :-1], tokens[:, 1:], Sampling(temperature, top_k, top_p, exact)
        )

    return logprobs


def recompute(params, rollouts, config, dtype="float32", pad=PAD):
    """The trainer's log-probs of each rollout's completion, from right-padded prompt + completion
    rows (always 8 rows, so one compile per setting)."""
    rows = np.zeros((8, pad), np.int32)
    for i, r in enumerate(rollouts):
        seq = np.concatenate([r.prompt.tokens, r.tokens])
        rows[i, : len(seq)] = seq
    fn = trainer_logprobs(
        dtype, config.exact, config.sampling.scoring.temperature, config.top_k, config.top_p
    )
    pure = nnx.to_pure_dict(params) if isinstance(params, nnx.State) else params
    out = np.asarray(fn(pure, jnp.asarray(rows)))
    starts = [len(r.prompt.tokens) - 1 for r in rollouts]
    return [
        out[i, s : s + len(r.tokens)] for i, (s, r) in enumerate(zip(starts, rollouts, strict=True))
    ]


# ---- correctness against slow references ---------------------------------------------------


def test_greedy_equals_a_plain_greedy_loop(params):
    prompts = make_prompts(6, seed=1)
    greedy = dataclasses.replace(BASE, temperature=0.0)
    outs = engine(greedy, params).generate([Request(p, 0, 12) for p in prompts])
    model = nnx.merge(nnx.split(nnx.eval_shape(lambda: init_model(CFG)))[0], params)
    forward = jax.jit(lambda tokens: model(tokens))
    matched = 0
    for p, r in zip(prompts, outs, strict=True):
        seq = list(p.tokens)
        for c in range(12):
            row = np.zeros((1, PAD), np.int32)
            row[0, : len(seq)] = seq
            logits = np.asarray(forward(jnp.asarray(row)))[0, len(seq) - 1]
            top2 = np.sort(logits)[-2:]
            if r.tokens[c] != int(np.argmax(logits)):
                # only a near-tie may flip in fast mode (decode and full forward round differently)
                assert top2[1] - top2[0] < 1e-4, (p.uid, c)
                break
            seq.append(int(r.tokens[c]))
            matched += 1
        assert r.finish_reason == "length" and len(r.tokens) == 12
    assert matched >= 60  # of 72: near-ties are rare


@pytest.mark.parametrize(  # the fast case (close, not equal: ~8 s of compiles) in the slow lane
    "config",
    [pytest.param(SAMPLED, marks=pytest.mark.slow), pytest.param(EXACT, marks=pytest.mark.gpu)],
    ids=["fast", "exact"],
)
def test_same_request_alone_or_in_a_full_batch(params, config):
    reqs = requests(make_prompts(6, seed=2), max_new=(6, 14), seed=2)
    batch = engine(config, params).generate(reqs)
    e = engine(config, params)
    for i in (0, 5):
        alone = e.generate([reqs[i]])[0]
        np.testing.assert_array_equal(alone.tokens, batch[i].tokens)
        if config.exact:
            np.testing.assert_array_equal(alone.logprobs, batch[i].logprobs)
        else:
            np.testing.assert_allclose(alone.logprobs, batch[i].logprobs, atol=1e-4)


@pytest.mark.gpu
def test_two_engine_replicas_make_the_rollouts_one_engine_makes(params):
    """minirl.control.workers.Replicas: the same requests split over two engines (generate), or dealt
    round-robin and stepped (submit/step, as the async rollout thread drives them), give the
    rollouts one engine gives, bit for bit in exact mode; version tags and counters add up."""
    from minirl.control.workers import InProcessWorker, Replicas

    reqs = requests(make_prompts(6, seed=4), max_new=(6, 14), seed=4)
    single = engine(EXACT, params, version=3)
    one = single.generate(reqs)
    pair = Replicas([InProcessWorker(engine(EXACT, params)) for _ in range(2)])
    pair.call("load_weights", 3, params).result()
    split = pair.call("generate", reqs).result()
    pair.call("submit", reqs).result()
    assert pair.call("pending").result() == len(reqs)
    stepped = []
    while pair.call("pending").result():
        stepped += pair.call("step").result()
    stepped.sort(
        key=lambda r: reqs.index(
            next(
                q for q in reqs if (q.prompt.uid, q.sample_index) == (r.prompt.uid, r.sample_index)
            )
        )
    )
    for rollouts in (split, stepped):
        assert len(rollouts) == len(one)
        for a, b in zip(one, rollouts, strict=True):
            np.testing.assert_array_equal(a.tokens, b.tokens)
            np.testing.assert_array_equal(a.logprobs, b.logprobs)
            np.testing.assert_array_equal(b.versions, np.full(len(b.tokens), 3))
    # kept decode tokens do not depend on batching: the pair did the work twice
    assert pair.call("work_stats").result()["decode_tokens"] == 2 * single.stats["decode_tokens"]


@pytest.mark.parametrize(
    "config,dtype",
    [
        (SAMPLED, None),
        pytest.param(EXACT, None, marks=pytest.mark.gpu),
        # bf16 compiles its own engine and trainer (~13 s cold): the slow lane runs it
        pytest.param(EXACT, "bfloat16", marks=[pytest.mark.gpu, pytest.mark.slow]),
    ],
    ids=["fast-fp32", "exact-fp32", "exact-bf16"],
)
def test_behaviour_logprobs_equal_the_trainers_recomputation(params, config, dtype):
    config = dataclasses.replace(config, dtype=dtype)
    outs = engine(config, params).generate(
        requests(make_prompts(5, seed=3), max_new=(8, 16), seed=3)
    )
    ref = recompute(params, outs, config, dtype or "float32")
    delta = np.concatenate([np.abs(r.logprobs - x) for r, x in zip(outs, ref, strict=True)])
    assert len(delta) > 40
    if config.exact:
        assert delta.max() == 0.0, f"exact mode mismatch: max |dlogp| = {delta.max()}"
    else:
        assert delta.max() < 1e-4
    for r in outs:
        assert np.all(r.logprobs <= 0) and r.versions.tolist() == [0] * len(r.tokens)


@pytest.mark.gpu
def test_decode_window_grows_past_64_positions_exactly(params):
    # 10 prompt + 80 new tokens: decode attends over the first 64 cache positions, then 128
    prompt = Prompt(uid=77, task="test", text="", tokens=np.arange(1, 11, dtype=np.int32))
    out = engine(EXACT, params).generate([Request(prompt, 0, 80)])[0]
    assert len(out.tokens) == 80 and EXACT.windows == (64, 128)
    assert (out.logprobs == recompute(params, [out], EXACT, pad=96)[0]).all()


@pytest.mark.gpu
def test_a_groups_samples_share_their_prompts_prefill_bitwise(params):
    """G samples of one prompt run its prefill once (the rows reuse one forward row) and still
    sample with their own keys: in exact mode each sample's log-probs are the trainer's, bitwise."""
    prompts = make_prompts(2, seed=11)
    reqs = [Request(p, sample_index=s, max_new_tokens=10) for p in prompts for s in (0, 1)]
    e = engine(EXACT, params)  # 2 rows per prefill call: each call is one prompt's two samples
    outs = e.generate(reqs)
    assert (e.stats["prefill_rows"], e.stats["prefill_shared"]) == (4, 2)
    for got, want in zip(outs, recompute(params, outs, EXACT), strict=True):
        np.testing.assert_array_equal(got.logprobs, want)
    assert outs[0].tokens.tolist() != outs[1].tokens.tolist()  # own keys: different samples


def test_a_bf16_decode_reads_its_cache_in_place():
    """The decode chunk neither copies its window out of the cache nor upcasts a bf16 cache:
    the cache is float32 on a CPU and no array of the window's shape is made (each was a third
    of the decode step at 25M parameters, docs/engine.md)."""
    from minirl.inference.cache_layout import ContiguousLayout, cache_dtype
    from minirl.inference.decoding import Settings, compiled

    cfg = dataclasses.replace(CFG, dtype="bfloat16", param_dtype="bfloat16")
    assert cache_dtype(cfg) == jnp.float32
    layout = ContiguousLayout(cfg, BASE)
    cache = layout.empty()
    fn = compiled(Settings(cfg, SAMPLED.sampling, BASE.decode_chunk, ContiguousLayout)).decode
    pure = jax.eval_shape(lambda: nnx.to_pure_dict(nnx.split(init_model(cfg))[1]))
    slots, ints = (BASE.slots,), jnp.zeros((BASE.slots,), jnp.int32)
    ids = jnp.zeros((*slots, 3), jnp.uint32)
    hlo = fn.lower(pure, cache, ints, ints, ids, ints, jnp.uint32(0), width=64).compile().as_text()
    made, fused, name = {}, set(), ""  # the arrays each computation makes; fusion bodies
    for line in hlo.splitlines():
        if line.endswith("{") and not line.startswith(" "):  # a computation's header
            name = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
        elif " = " in line:
            made.setdefault(name, []).append(line)
            fused.update(re.findall(r" fusion\(.*calls=%([\w.\-]+)", line))
    program = [line for c, lines in made.items() if c not in fused for line in lines]
    kv = f"{CFG.num_kv_heads},{CFG.head_dim}]"
    assert any(f"f32[{BASE.slots},128,{kv}" in line for line in program)  # the cache itself
    assert not [line for line in program if f"[{BASE.slots},64,{kv}" in line]  # no window array
    converts = [
        line for line in program if "convert" in line.split(" = ")[0] or " convert(" in line
    ]
    assert not [line for line in converts if f"[{BASE.slots},128,{kv}" in line]  # no upcast copy


# ---- weight reload -------------------------------------------------------------------------


def run_with_switch(config, params, params_v1, policy):
    """Generate 4 requests, switch to version 1 after the first step, finish."""
    e = engine(config, params)
    reqs = requests(make_prompts(4, seed=4), max_new=(14, 20), seed=4)
    e.submit(reqs)
    done = e.step()
    before = {(s.request.prompt.uid): len(s.tokens) for s in e._sched.slots if s is not None}
    e.load_weights(1, params_v1)
    if policy is not None:
        assert e.interrupt(policy) == len(before)
    while e.num_queued or e.num_active:
        done += e.step()
    return reqs, done, before


def test_continue_tags_versions_at_the_switch_and_rebuilds_the_cache(params, params_v1):
    reqs, done, before = run_with_switch(EXACT, params, params_v1, "continue")
    assert len(done) == 4 and len(before) == 4
    old, new = recompute(params, done, EXACT), recompute(params_v1, done, EXACT)
    for r, lp_old, lp_new in zip(done, old, new, strict=True):
        n0 = before[r.prompt.uid]
        assert 0 < n0 < len(r.tokens)
        assert r.versions.tolist() == [0] * n0 + [1] * (len(r.tokens) - n0)
        np.testing.assert_array_equal(r.logprobs[:n0], lp_old[:n0])  # sampled from v0
        np.testing.assert_array_equal(r.logprobs[n0:], lp_new[n0:])  # v1 with a rebuilt cache


def test_reload_without_interrupt_keeps_the_stale_cache(params, params_v1):
    _, done, before = run_with_switch(EXACT, params, params_v1, None)
    new = recompute(params_v1, done, EXACT)
    stale = np.concatenate(
        [
            np.abs(r.logprobs[before[r.prompt.uid] :] - lp[before[r.prompt.uid] :])
            for r, lp in zip(done, new, strict=True)
        ]
    )
    assert stale.max() > 1e-3  # the KV cache still holds version-0 keys: not reproducible
    assert all(r.versions[-1] == 1 for r in done)


def test_discard_regenerates_every_rollout_with_one_version(params, params_v1):
    reqs, done, before = run_with_switch(EXACT, params, params_v1, "discard")
    fresh = {r.prompt.uid: r for r in engine(EXACT, params_v1, version=1).generate(reqs)}
    assert len(done) == 4
    for r in done:
        assert r.versions.tolist() == [1] * len(r.tokens)
        np.testing.assert_array_equal(r.tokens, fresh[r.prompt.uid].tokens)
        np.testing.assert_array_equal(r.logprobs, fresh[r.prompt.uid].logprobs)


# ---- paged cache ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_paged_equals_contiguous_with_preemption_and_reports_memory(params):
    reqs = requests(make_prompts(6, seed=6), max_new=(20, 30), seed=6)
    small = dataclasses.replace(EXACT, paged=True, block_size=8, num_blocks=17)  # 16 real blocks
    contiguous, paged = engine(EXACT, params), engine(small, params)
    a, b = contiguous.generate(reqs), paged.generate(reqs)
    assert paged.stats["preempted"] > 0  # the pool holds 128 positions, 4 slots want up to 176
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.tokens, y.tokens)
        np.testing.assert_array_equal(x.logprobs, y.logprobs)
        np.testing.assert_array_equal(x.versions, y.versions)
    m, c = paged.memory_stats(), contiguous.memory_stats()
    per_token = 2 * 2 * 2 * 16 * 4  # (k, v) x L x K x Dh x 4 bytes
    assert c["allocated"] == 4 * 128 * per_token and m["allocated"] == 17 * 8 * per_token
    assert m["used"] == 0 and c["used"] == 0  # everything finished
    assert 0 < m["peak_used"] <= 16 * 8 * per_token and 0 < c["peak_used"] <= c["allocated"]


# ---- scheduling, compilation, finish reasons -----------------------------------------------


def test_a_finished_slot_is_refilled_at_the_next_step(params):
    e = engine(dataclasses.replace(BASE, temperature=0.0), params)
    prompts = make_prompts(6, seed=12)
    lengths = [5, 20, 20, 20, 20, 20]  # the first finishes in the first step (1 + 4 tokens)
    e.submit([Request(p, 0, n) for p, n in zip(prompts, lengths, strict=True)])
    first = e.step()
    assert [r.prompt.uid for r in first] == [0] and (e.num_active, e.num_queued) == (3, 2)
    assert e.step() == [] and (e.num_active, e.num_queued) == (4, 1)  # refilled, not waiting


def test_occupancy_counts_the_decode_work_that_produced_tokens(params):
    """4 slots x 4-step chunks; lengths 5 and 9 (greedy, no EOS). Prefill gives each its first
    token; chunk 1 decodes 4 + 4 tokens, chunk 2 the last 4 of the long one: 12 of 2 x 16.
    `progress` hears of each rollout in the step that finished it (an evaluation's bar)."""
    e = engine(dataclasses.replace(BASE, temperature=0.0), params)
    prompts = make_prompts(2, seed=13)
    finished = []
    e.generate([Request(prompts[0], 0, 5), Request(prompts[1], 0, 9)], progress=finished.append)
    assert finished == [1, 1]
    assert (e.stats["tokens"], e.stats["decode_tokens"], e.stats["slot_steps"]) == (14, 12, 32)
    assert e.occupancy() == 12 / 32


def test_no_recompilation_in_steady_state(params):
    """After a warm-up that meets every shape, more work traces (and so compiles) nothing.
    Traces are counted with JAX's own monitoring events, which fire whether or not the
    process-wide cache of compiled calls (bounded, shared by a whole test session) still
    holds these functions."""
    traces = collections.Counter()

    def on_event(event, duration, fun_name="", **kwargs):
        if event == "/jax/core/compile/jaxpr_trace_duration":
            traces[fun_name] += 1

    jax.monitoring.register_event_duration_secs_listener(on_event)
    try:
        e = engine(SAMPLED, params)
        e.generate(requests(make_prompts(12, seed=7), seed=7))  # warm-up: every shape once
        warm = dict(traces)
        for seed in (8, 9):
            e.generate(requests(make_prompts(12, seed=seed, uid0=100 * seed), seed=seed))
            assert dict(traces) == warm
    finally:
        jax.monitoring.unregister_event_duration_listener(on_event)
    assert warm.get("decode", 0) <= 1 and warm.get("prefill", 0) <= 2 * len(SAMPLED.buckets)
    assert e.stats["decode_calls"] > 0 and e.num_queued == 0 and e.num_active == 0


def test_finish_reasons(params):
    greedy = dataclasses.replace(BASE, temperature=0.0)
    prompt = make_prompts(1, seed=10)[0]
    ref = engine(greedy, params).generate([Request(prompt, 0, 12)])[0].tokens.tolist()
    assert len(ref) == 12

    stop = (ref[3], ref[4])
    end = next(i for i in range(1, 12) if (ref[i - 1], ref[i]) == stop) + 1
    out = engine(dataclasses.replace(greedy, stop_sequences=(stop,)), params).generate(
        [Request(prompt, 0, 12)]
    )[0]
    assert out.finish_reason == "stop" and out.tokens.tolist() == ref[:end]

    eos = ref[6]
    out = engine(dataclasses.replace(greedy, eos_ids=(eos,)), params).generate(
        [Request(prompt, 0, 12)]
    )[0]
    assert out.finish_reason == "eos" and out.tokens.tolist() == ref[: ref.index(eos) + 1]
    # Several EOS ids (generation_config.json lists e.g. <|im_end|> and <|endoftext|>): any ends it.
    unused = next(i for i in range(64) if i not in ref)
    out = engine(dataclasses.replace(greedy, eos_ids=(unused, ref[8])), params).generate(
        [Request(prompt, 0, 12)]
    )[0]
    assert out.finish_reason == "eos" and out.tokens.tolist() == ref[: ref.index(ref[8]) + 1]

    e = engine(greedy, params)
    short, one = e.generate([Request(prompt, 0, 5), Request(prompt, 1, 1)])
    assert short.finish_reason == "length" and short.tokens.tolist() == ref[:5]
    assert one.finish_reason == "length" and one.tokens.tolist() == ref[:1]
    assert len(one.logprobs) == len(one.versions) == 1


def test_load_weights_accepts_state_pure_dict_and_numpy(params):
    greedy = dataclasses.replace(BASE, temperature=0.0)
    state = nnx.split(nnx.merge(nnx.split(nnx.eval_shape(lambda: init_model(CFG)))[0], params))[1]
    assert isinstance(state, nnx.State)
    as_numpy = jax.tree_util.tree_map(np.asarray, params)
    as_numpy["layers"] = {str(i): layer for i, layer in as_numpy["layers"].items()}  # msgpack-style
    req = [Request(make_prompts(1, seed=11)[0], 0, 6)]
    outs = [engine(greedy, p, version=3).generate(req)[0] for p in (params, state, as_numpy)]
    for out in outs:
        np.testing.assert_array_equal(out.tokens, outs[0].tokens)
        assert out.versions.tolist() == [3] * 6


def test_a_bf16_engine_holds_its_cast_copy_only_while_work_is_in_flight(
    params, params_v1, monkeypatch
):
    """A bf16 engine computes with its own cast copy of the weights (half the fp32 bytes; the
    token embedding stays as given, cast where it is read: the same bits as a bf16 table). Given
    JAX arrays (in one process, the trainer's own) it keeps them as given, casts them when work
    comes and lets the copy and the KV cache go once nothing is in flight, so a trainer stepping
    between two generate calls never holds its step beside them (1 GB at the 0.5B shape).
    Given numpy (from another process) it casts at the load, the version before dropped first;
    a tree that does not fit is refused before anything is dropped. Same tokens either way."""
    bf16 = dataclasses.replace(SAMPLED, dtype="bfloat16")
    casts, cast, work = [], engine_module.cast_params, decoding.work_params
    reqs = [Request(p, 0, 6) for p in make_prompts(3, seed=2)]
    e = engine(bf16, params)
    monkeypatch.setattr(
        engine_module, "cast_params", lambda p, c: casts.append(e._params) or cast(p, c)
    )
    monkeypatch.setattr(decoding, "work_params", lambda p, c: casts.append(e._params) or work(p, c))
    given = jax.tree.leaves(e._given)
    assert all(x is y for x, y in zip(given, jax.tree.leaves(params), strict=True))
    assert casts == [] and e._params is None  # nothing cast before there is work
    first = e.generate(reqs)
    assert casts == [None] and e._params is None and e._cache is None  # idle: both gone
    again = e.generate(reqs)  # cast again when the next work comes: the same bits
    assert casts == [None, None] and e._params is None
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.logprobs, b.logprobs)

    on_host = engine(bf16, jax.tree.map(np.asarray, params))  # numpy: cast at the load
    all_bf16 = engine(bf16, jax.tree.map(lambda x: x.astype(jnp.bfloat16), params))
    for other in (on_host, all_bf16):  # the embedding cast where it is read: the same bits
        for a, b in zip(first, other.generate(reqs), strict=True):
            np.testing.assert_array_equal(a.tokens, b.tokens)
            np.testing.assert_array_equal(a.logprobs, b.logprobs)
    casts.clear()
    e.load_weights(1, jax.tree.map(np.asarray, params_v1))
    assert casts == [None]  # cast at the load, nothing of version 0 held meanwhile
    casts.clear()
    kept = e._given  # all bf16 but the token embedding (as given: the docstring)
    rest = {k: v for k, v in kept.items() if k != "embed"}
    assert kept["embed"].dtype == jnp.float32
    assert {x.dtype for x in jax.tree.leaves(rest)} == {jnp.dtype(jnp.bfloat16)}
    with pytest.raises(ValueError, match="params do not match the model"):
        e.load_weights(2, {"embed": params["embed"]})
    assert e._given is kept and e.version == 1  # version 1 still there
    e.generate(reqs)
    assert e._given is kept and casts == [None]  # its own cast copy: kept between calls


def test_a_bf16_engine_lays_a_tied_head_out_once_per_work_not_at_every_call():
    """A tied head is the token embedding read transposed, [D, V]. Kept as the embedding is
    (float32, [V, D]), every prefill and decode call would cast and transpose the whole table
    (0.55 GB of a decode's scratch at a 152k vocabulary). Below float32 `work_params` lays it
    out once per work, cast, and the compiled functions run the model untied, reading it in
    place. The lookup reads the embedding as given. Exact mode keeps the trainer's bits
    (tests/diagnose/test_mismatch.py's bf16 run; the slow lane's exact-bf16 case above)."""
    f32 = dataclasses.replace(CFG, vocab_size=8192)  # the head: 1 MB in bf16
    p = nnx.to_pure_dict(nnx.split(init_model(f32))[1])
    cfg = dataclasses.replace(f32, dtype="bfloat16", param_dtype="bfloat16")  # as an engine's
    assert decoding.head_laid_out(cfg) and not decoding.head_laid_out(f32)
    work = decoding.work_params(decoding.check_params(p, cfg), cfg)
    np.testing.assert_array_equal(work["lm_head"], p["embed"].astype(jnp.bfloat16).T)
    assert work["embed"] is p["embed"]
    tied = {k: v for k, v in work.items() if k != "lm_head"}
    untied = dataclasses.replace(cfg, tie_embeddings=False)
    cache = ContiguousLayout(cfg, BASE).empty()
    b, ids = np.zeros(BASE.slots, np.int32), np.zeros((BASE.slots, 3), np.uint32)
    scratch = []
    for model, w in ((untied, work), (cfg, tied)):
        fns = decoding.compiled(decoding.Settings(model, Sampling(), 4, ContiguousLayout))
        lowered = fns.decode.lower(w, cache, b, b, ids, b + 4, np.uint32(0), width=32)
        scratch.append(lowered.compile().memory_analysis().temp_size_in_bytes)
    head_bytes = cfg.vocab_size * cfg.dim * 2
    assert scratch[1] - scratch[0] >= head_bytes, scratch  # no copy of the head per call
    assert Engine(f32, dataclasses.replace(BASE, dtype="bfloat16"))._static.model == untied
    assert Engine(f32, BASE)._static.model == f32  # float32: tied, the table read in place


def test_bad_input_gets_clear_errors(params):
    e = Engine(CFG, BASE)
    with pytest.raises(RuntimeError, match="load_weights"):
        e.submit([Request(make_prompts(1)[0], 0, 4)])
        e.step()
    with pytest.raises(ValueError, match="cache_len"):
        e.submit([Request(make_prompts(1)[0], 0, 120)])
    with pytest.raises(ValueError, match="do not match"):
        e.load_weights(0, {"embed": np.zeros((64, 64))})
    bad = jax.tree_util.tree_map(lambda x: x, params)
    bad["embed"] = np.zeros((3, 3))
    with pytest.raises(ValueError, match="shape"):
        e.load_weights(0, bad)
    with pytest.raises(ValueError, match="policy"):
        e.interrupt("pause")
    with pytest.raises(ValueError, match="top_k"):
        EngineConfig(temperature=0.0, top_k=5)
    with pytest.raises(ValueError, match="multiple of block_size"):
        EngineConfig(paged=True, cache_len=100, block_size=16)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        e.submit([Request(Prompt(0, "t", "", np.array([1, 99], np.int32)), 0, 4)])
    v = CFG.vocab_size
    for ids, bad in (({"eos_ids": (v,)}, v), ({"stop_sequences": ((3, v + 5),)}, v + 5)):
        with pytest.raises(ValueError, match=rf"stop_sequences: \[{bad}\] are outside the vocab"):
            Engine(CFG, dataclasses.replace(BASE, **ids))  # such a stop could never match
