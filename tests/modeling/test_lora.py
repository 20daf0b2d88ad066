"""LoRA (minirl/modeling/lora.py): the adapted dense by hand, step 0 is the base model bit for bit, the merge
equals the unmerged forward, the knobs, and a LoRA run end to end (adapters trained, base frozen,
the merged export). The trainer's side (adapters only, micro-batching, presets) is in
tests/training/test_trainer.py; exact mode engine == trainer with adapters in tests/diagnose/test_mismatch.py."""

import dataclasses
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from lora_transport import ADAPTER_BYTES, assert_adapters_only_transport, spy_load_weights

from minirl.cli import main
from minirl.configlib import ConfigError
from minirl.modeling import lora
from minirl.modeling.model import ModelConfig, init_model
from minirl.run.presets import make_config
from minirl.store.checkpoints import CheckpointManager
from minirl.store.weights import InMemoryWeightStore

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
TOKENS = np.random.default_rng(0).integers(3, 64, (2, 9)).astype(np.int32)


def _pure(model) -> dict:
    return nnx.to_pure_dict(nnx.split(model)[1])


def test_adapted_dense_by_hand():
    # x = [1, 2]; W = I; A = [[1], [1]] (r = 1); B = [[1, -1]]; alpha = 2: scale 2
    # x W = [1, 2]; x A = [3]; (x A) B = [3, -3]; y = [1, 2] + 2 * [3, -3] = [7, -4]
    m = types.SimpleNamespace(
        w_proj=jnp.eye(2), w_lora_a=jnp.ones((2, 1)), w_lora_b=jnp.array([[1.0, -1.0]])
    )
    x = jnp.array([[1.0, 2.0]])
    for exact in (False, True):
        np.testing.assert_array_equal(lora.project(m, "w", x, 2.0, exact), [[7.0, -4.0]])
    plain = types.SimpleNamespace(w_proj=jnp.eye(2))  # no adapter: x W
    np.testing.assert_array_equal(lora.project(plain, "w", x, 2.0, False), [[1.0, 2.0]])


def test_adapter_dropout_by_hand():
    """set_dropout drops the adapter's input x (never the base product x W), scaling survivors
    by 1 / (1 - p), with the mask `project` draws from the module's key and the target's index."""
    m = types.SimpleNamespace(
        up_proj=jnp.eye(4), up_lora_a=jnp.ones((4, 1)), up_lora_b=jnp.array([[1.0, 0.0, 0.0, 0.0]])
    )
    x = jnp.array([[1.0, 2.0, 3.0, 4.0]])
    key = jax.random.key(7)
    m.lora_dropout, m.lora_dropout_rate = lora.DropoutKey(jax.random.key_data(key)), 0.5
    keep = jax.random.bernoulli(jax.random.fold_in(key, lora._INDEX["up"]), 0.5, x.shape)
    assert 0 < int(keep.sum()) < 4  # this key keeps some inputs and drops others
    want = x + float((x * keep).sum()) * 2.0 * 2.0 * jnp.array([[1.0, 0, 0, 0]])  # 1/(1-p) = 2
    np.testing.assert_array_equal(lora.project(m, "up", x, 2.0, False), want)


@pytest.mark.parametrize("exact", [False, True])
def test_rank_16_at_init_is_the_base_model_bitwise(exact):
    base, adapted = init_model(CFG, seed=3), init_model(dataclasses.replace(CFG, lora_rank=16), 3)
    adapters, rest = lora.partition(_pure(adapted), lora.is_adapter)
    jax.tree.map(np.testing.assert_array_equal, rest, _pure(base))  # the same base weights
    a = adapters["layers"][0]["attn"]["q_lora_a"]
    assert a.shape == (64, 16) and a.dtype == jnp.float32 and float(jnp.abs(a).max()) > 0
    assert 0 < float(jnp.abs(a).max()) <= 1 / 8  # Kaiming-uniform: |A| <= 1 / sqrt(fan_in)
    assert all(
        float(jnp.abs(b).max()) == 0
        for b in lora.partition(adapters, lambda n: n.endswith("_b"))[0]["layers"][1][
            "mlp"
        ].values()
    )
    logits = [
        jax.jit(lambda p, g=nnx.split(m)[0]: nnx.merge(g, p)(TOKENS, exact=exact))(_pure(m))
        for m in (adapted, base)
    ]
    np.testing.assert_array_equal(*logits)


def test_merge_equals_the_unmerged_forward():
    cfg = dataclasses.replace(CFG, lora_rank=4, lora_alpha=8.0, lora_targets=("q", "o", "up"))
    params = _pure(init_model(cfg, seed=1))
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map_with_path(  # nonzero B, so the adapters matter
        lambda path, x: (
            jnp.asarray(rng.normal(size=x.shape) * 0.1, x.dtype)
            if str(path[-1].key).endswith("_lora_b")
            else x
        ),
        params,
    )
    forward = jax.jit(lambda p: nnx.merge(nnx.split(init_model(cfg))[0], p)(TOKENS))
    base_forward = jax.jit(lambda p: nnx.merge(nnx.split(init_model(CFG))[0], p)(TOKENS))
    unmerged = forward(params)
    merged_params = lora.merge(params, cfg)
    assert not lora.partition(merged_params, lora.is_adapter)[0]  # a plain base model again
    plain = base_forward(lora.partition(params, lora.is_adapter)[1])  # adapters dropped
    assert float(jnp.abs(unmerged - plain).max()) > 1e-2  # the adapters changed the logits
    merged = base_forward(merged_params)
    np.testing.assert_allclose(merged, unmerged, rtol=0, atol=2e-5)


def test_trainable_and_add_adapters():
    cfg = dataclasses.replace(CFG, lora_rank=2, lora_targets=("v",))
    base = _pure(init_model(CFG, seed=0))
    assert lora.trainable(base, CFG) == (base, {})  # LoRA off: everything trains
    params = lora.add_adapters(base, cfg, seed=5)
    train, frozen = lora.trainable(params, cfg)
    jax.tree.map(np.testing.assert_array_equal, frozen, base)
    assert {k for layer in train["layers"].values() for k in layer["attn"]} == {
        "v_lora_a",
        "v_lora_b",
    }
    assert lora.add_adapters(params, cfg, seed=6) is params  # already there: unchanged
    jax.tree.map(np.testing.assert_array_equal, lora.join(train, frozen), params)


def test_the_engine_side_joins_adapters_only_versions_to_the_base_it_was_sent():
    cfg = dataclasses.replace(CFG, lora_rank=2, lora_targets=("v",))
    params = _pure(init_model(cfg, seed=0))
    adapters, base = lora.partition(params, lora.is_adapter)
    keeper = lora.EngineBase()
    with pytest.raises(ValueError, match="no base to join"):
        keeper.whole(adapters)
    whole = keeper.whole(params)  # a whole load, as it came
    jax.tree.map(np.testing.assert_array_equal, whole, params)
    keeper.keep(whole)  # what the engine holds of it
    moved = jax.tree.map(lambda x: x + 1.0, adapters)
    joined = keeper.whole(moved)
    assert (
        lora.partition(joined, lora.is_adapter)[1]["layers"][0]["attn"]["v_proj"]
        is (base["layers"][0]["attn"]["v_proj"])
    )  # the very base arrays: nothing copied
    jax.tree.map(np.testing.assert_array_equal, joined, lora.join(moved, base))


def test_lora_knobs_are_checked_and_parsed():
    assert make_config("fixture", ["model.lora_targets=q,v"]).model.lora_targets == ("q", "v")
    bad_values = ("model.lora_targets=q,x", "model.lora_rank=-1", "model.lora_alpha=0")
    for bad in (*bad_values, "model.lora_dropout=1.0", "model.lora_dropout=-0.1"):
        with pytest.raises((ConfigError, ValueError), match="lora"):
            make_config("fixture", ["model.lora_rank=4", bad])
    with pytest.raises(ConfigError, match="needs lora_rank > 0"):  # dropout of no adapters
        make_config("fixture", ["model.lora_dropout=0.1"])


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """`minirl train --preset fixture --set model.lora_rank=16`, 2 steps, exact mode."""
    run = tmp_path_factory.mktemp("lora") / "run"
    args = ["train", "--preset", "fixture", "--run-dir", str(run), "--quiet"]
    assert main([*args, *(f"--set={s}" for s in RUN_SETS), "--set=rl.export_hf=true"]) == 0
    return run


RUN_SETS = ["eval.prompts=8", "eval.samples=2", "rl.steps=2", "model.lora_rank=16"]
RUN_SETS += ["engine.exact=true"]


@pytest.mark.slow  # ~40 s cold: a whole LoRA run (module fixture)
def test_a_lora_run_trains_the_adapters_only_and_exports_the_merged_model(lora_run, tmp_path):
    """`minirl train --set model.lora_rank=16`, 2 steps in exact mode: the checkpoint's base
    weights are the warm start's bit for bit, its adapters moved, its optimizer state holds
    adapters only; the export (rl.export_hf) is the merged model; the engine's log-probs equal
    the trainer's bit for bit at both steps (~7 s: it is also the LoRA exact-mode test)."""
    run, sets = lora_run, RUN_SETS
    ckpt = CheckpointManager(run).restore()
    assert ckpt.step == 2
    cfg = make_config("fixture", sets)
    adapters, base = lora.partition(ckpt.params, lora.is_adapter)
    from minirl.run.runner import Run

    r = Run(cfg, tmp_path / "probe", progress=False, log=lambda *a: None)
    from minirl.run.warmstart import warm_start

    start = warm_start(cfg, r.tokenizer, r.task, progress=False, log=lambda *a: None)[0]
    start_adapters, start_base = lora.partition(start, lora.is_adapter)
    jax.tree.map(np.testing.assert_array_equal, base, start_base)
    b = adapters["layers"][0]["attn"]["q_lora_b"]
    assert (
        float(np.abs(b).max())
        > 0
        == float(np.abs(start_adapters["layers"][0]["attn"]["q_lora_b"]).max())
    )
    opt_paths = [
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(ckpt.opt_state)
    ]
    assert any("lora" in p for p in opt_paths)
    assert not [p for p in opt_paths if "_proj" in p or "embed" in p or "norm" in p]
    from minirl.hf.model_files import load_hf

    _, exported = load_hf(run / "hf")
    merged = lora.merge(ckpt.params, cfg.model)
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=0, atol=1e-6), _pure(exported), merged
    )
    assert json.loads((run / "summary.json").read_text())["stopped"] == "steps"
    # the store holds the adapters alone per version
    adapter_bytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(adapters))
    assert adapter_bytes < sum(np.asarray(x).nbytes for x in jax.tree.leaves(base))
    # exact mode: engine == trainer bitwise with adapters (step 2 rolls out with moved ones)
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        assert r["store/version_bytes"] == adapter_bytes == ADAPTER_BYTES
        assert r["mismatch/tokens"] > 0 and r["mismatch/max_abs_dlogp"] == 0.0, r["step"]
        assert r["train/dlogp_recompute/max_abs_dlogp"] == 0.0, r["step"]


def test_an_async_lora_run_reloads_its_engine_from_adapter_versions(tmp_path, monkeypatch):
    """rl.scheduler=async: the rollout thread reloads the engine from the store, whose versions
    hold the adapters alone, and the engine gets them alone (it joins them to its own base)."""
    from minirl.control.controller import Controller
    from minirl.run.runner import Run

    sets = ["eval.prompts=8", "eval.samples=2", "rl.steps=3", "model.lora_rank=16"]
    cfg = make_config("fixture", [*sets, "rl.scheduler=async"], staleness="one_step_off")
    loads = []
    original = Controller.engine_weights

    def spy(self, version=None):
        got = original(self, version)
        loads.append((lora.partition(self.store.get(version)[1], lora.is_adapter), got[1]))
        return got

    monkeypatch.setattr(Controller, "engine_weights", spy)
    puts = []  # (version, whether it held a base weight), every version the store got
    put = InMemoryWeightStore.put
    monkeypatch.setattr(
        InMemoryWeightStore,
        "put",
        lambda self, v, p: (
            puts.append((v, bool(lora.partition(p, lora.is_adapter)[1]))) or put(self, v, p)
        ),
    )
    evaluated = []  # whether the held-out engines got host copies (numpy) of the weights
    engine = Run.engine
    monkeypatch.setattr(
        Run,
        "engine",
        lambda self, v, p: (
            evaluated.append(any(isinstance(x, np.ndarray) for x in jax.tree.leaves(p)))
            or engine(self, v, p)
        ),
    )
    Run(cfg, tmp_path / "run", progress=False, log=lambda *a: None).train()
    assert puts[0] == (0, False) and not any(base for _, base in puts)  # the start too
    assert evaluated == [False, False]  # before and after RL: the trainer's arrays, no copy
    assert loads  # the engine did reload from the store
    for (stored_adapters, stored_base), sent in loads:
        assert stored_adapters and not stored_base  # the store held the adapters alone
        assert not lora.partition(sent, lora.is_adapter)[1]  # and the engine got them alone
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {r["store/version_bytes"] for r in records} == {
        sum(np.asarray(x).nbytes for x in jax.tree.leaves(loads[0][0][0]))
    }


@pytest.mark.slow
def test_a_lora_run_with_its_engine_in_a_process_sends_adapters_only(
    lora_run, tmp_path, monkeypatch
):
    """rl.workers=process: the engine process gets the base once, then each new version's
    adapters alone (131 KB here, not 444 KB), and the run ends with the in-process run's weights
    bit for bit (~30 s: the engine and verifier processes start and compile)."""
    from minirl.control import workers
    from minirl.run.runner import Run
    from minirl.store.trees import assert_trees_equal

    sizes = spy_load_weights(monkeypatch, workers)
    cfg = make_config("fixture", [*RUN_SETS, "rl.workers=process"])
    Run(cfg, tmp_path / "run", progress=False, log=lambda *a: None).train()
    assert_adapters_only_transport(sizes, steps=2)
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["store/version_bytes"] for r in records] == [ADAPTER_BYTES] * 2
    got, want = (CheckpointManager(d).restore() for d in (tmp_path / "run", lora_run))
    assert_trees_equal(got.params, want.params)


@pytest.mark.parametrize("exact", [False])
def test_the_engine_samples_from_the_adapted_model(exact):
    """Both modes apply the adapters unmerged, as the trainer does (exact mode bitwise: the run
    test above, and `exact=True` here passes with atol 0 too, ~7 s), decoding with the caller's
    base arrays themselves (no merged copy); its behaviour log-probs are the adapted model's
    forward to float rounding."""
    from minirl.inference.engine import Engine, EngineConfig, Request
    from minirl.modeling.model import token_logprobs
    from minirl.modeling.sampling import Sampling
    from minirl.types import Prompt

    cfg = dataclasses.replace(CFG, lora_rank=4, lora_targets=("q", "v", "down"))
    params = _pure(init_model(cfg, seed=2))
    rng = np.random.default_rng(1)
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: (
            jnp.asarray(rng.normal(size=x.shape) * 0.3, x.dtype)
            if str(path[-1].key).endswith("_lora_b")
            else x
        ),
        params,
    )
    ecfg = EngineConfig(
        slots=2, cache_len=32, prefill_buckets=(8,), prefill_rows=2, decode_chunk=4, exact=exact
    )
    engine = Engine(cfg, ecfg)
    engine.load_weights(0, params)
    held, given = (
        jax.tree.leaves(lora.partition(p, lora.is_adapter)[1]) for p in (engine._given, params)
    )
    assert all(x is y for x, y in zip(held, given, strict=True))  # the base itself, no merged copy
    prompt = Prompt(0, "t", "", TOKENS[0, :5])
    (out,) = engine.generate([Request(prompt, 0, 8)])
    seq = np.r_[prompt.tokens, out.tokens][None, :].astype(np.int32)
    logits = nnx.merge(nnx.split(init_model(cfg))[0], params)(seq, exact=exact)
    want = token_logprobs(logits[:, 4:-1], seq[:, 5:], Sampling(exact=exact))[0]
    base = _pure(init_model(CFG, seed=2))  # the same base without adapters: far from it
    plain = token_logprobs(nnx.merge(nnx.split(init_model(CFG))[0], base)(seq)[:, 4:-1], seq[:, 5:])
    assert float(np.abs(np.asarray(plain[0]) - want).max()) > 1e-2
    np.testing.assert_allclose(out.logprobs, want, rtol=0, atol=0 if exact else 2e-5)
    # model.lora_dropout is the training forward's alone: the engine samples the same, bitwise
    dropping = Engine(dataclasses.replace(cfg, lora_dropout=0.5), ecfg)
    dropping.load_weights(0, params)
    (same,) = dropping.generate([Request(prompt, 0, 8)])
    np.testing.assert_array_equal(same.tokens, out.tokens)
    np.testing.assert_array_equal(same.logprobs, out.logprobs)
    # a bf16 engine's base: the caller's JAX arrays kept as given (cast while it has work:
    # tests/inference/test_engine.py); a base sent as numpy (another process) cast once, at the
    # whole load, but for the token embedding: a JAX array as given (XLA CPU widens a bf16 table
    # whole to look rows up: docs/engine.md). Either samples the same bits.
    bf16, outs = dataclasses.replace(cfg, dtype="bfloat16"), []
    adapters, base = lora.partition(params, lora.is_adapter)
    for weights in (params, jax.tree.map(np.asarray, params)):
        e = Engine(bf16, ecfg)
        e.load_weights(0, weights)
        outs.append(e.generate([Request(prompt, 0, 8)])[0])
    kept = e._lora.base  # the numpy-fed engine's
    assert isinstance(kept["embed"], jax.Array) and kept["embed"].dtype == jnp.float32
    np.testing.assert_array_equal(kept["embed"], base["embed"])
    rest = [x.dtype for x in jax.tree.leaves({**kept, "embed": None})]
    assert set(rest) == {jnp.dtype(jnp.bfloat16)} and len(rest) == len(jax.tree.leaves(base)) - 1
    e.load_weights(1, jax.tree.map(lambda x: np.asarray(x) + 1.0, adapters))
    again = e._lora.base  # the next adapters-only version joins the same cast base
    assert again["layers"][0]["attn"]["v_proj"] is kept["layers"][0]["attn"]["v_proj"]
    np.testing.assert_array_equal(outs[0].tokens, outs[1].tokens)
    np.testing.assert_array_equal(outs[0].logprobs, outs[1].logprobs)


@pytest.mark.slow  # shares the LoRA run above
@pytest.mark.reference
def test_the_peft_adapter_loads_onto_the_base_with_equal_logits(lora_run, tmp_path):
    """`minirl export RUN --out DIR --adapter`: peft loads DIR onto DIR/base (a built-in run's
    frozen base) in transformers, and the logits equal minirl's adapted model's."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from minirl.run.run_dir import load_config

    out = tmp_path / "adapter"
    assert main(["export", str(lora_run), "--out", str(out), "--adapter"]) == 0
    cfg, ckpt = load_config(lora_run).model, CheckpointManager(lora_run).restore()
    tokens = np.random.default_rng(0).integers(3, cfg.vocab_size, (2, 9))
    want = nnx.merge(nnx.split(init_model(cfg))[0], ckpt.params)(jnp.asarray(tokens, jnp.int32))
    base = transformers.AutoModelForCausalLM.from_pretrained(out / "base", dtype=torch.float32)
    with torch.no_grad():
        plain = base(torch.tensor(tokens)).logits.numpy()
        got = peft.PeftModel.from_pretrained(base, out)(torch.tensor(tokens)).logits.numpy()
    off = float(np.abs(plain - np.asarray(want)).max())
    assert off > 1e-4  # the adapters matter
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)  # measured 1.9e-6 (off: 0.30)


@pytest.mark.slow  # ~11 s cold; the adapters' state-dict round trip is in tests/training (default)
def test_a_resumed_lora_run_equals_the_uninterrupted_one(tmp_path):
    """3 steps at once, or 2 then a resume to 3 in the same run directory: the same adapters,
    base and optimizer state, bit for bit."""
    from minirl.run.runner import Run
    from minirl.store.trees import assert_trees_equal

    def run(path, steps):
        sets = ["eval.prompts=8", "eval.samples=2", f"rl.steps={steps}", "model.lora_rank=16"]
        Run(make_config("fixture", sets), path, progress=False, log=lambda *a: None).train()
        return CheckpointManager(path).restore()

    whole = run(tmp_path / "whole", 3)
    run(tmp_path / "parts", 2)
    parts = run(tmp_path / "parts", 3)
    assert whole.step == parts.step == 3
    assert_trees_equal(parts.params, whole.params)
    assert_trees_equal(parts.opt_state, whole.opt_state)
