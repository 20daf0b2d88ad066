"""Tests for minirl/hf/model_files.py against Hugging Face `transformers` (torch on CPU).

Tiny random Qwen2 (tied embeddings, q/k/v bias), Qwen3 (q/k norm, head_dim != hidden/heads,
untied) and Llama (Llama-3 RoPE scaling, untied) models are built here with transformers and
saved with `save_pretrained`. minirl must reproduce their float32 logits to LOGIT_TOL, write
checkpoints that load back bit for bit and that transformers loads to the same logits, read
sharded checkpoints, and refuse broken or unsupported ones with errors that name the problem.
Marked `reference` (needs the `reference` extra); part of the default run.
"""

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file, save_file

from minirl.hf.model_files import (
    CheckpointError,
    config_from_hf,
    config_to_hf,
    load_hf,
    open_checkpoint,
    read_model_config,
    save_hf,
    tensor_names,
)
from minirl.modeling.model import ModelConfig, param_shapes, rope_frequencies

pytestmark = pytest.mark.reference
torch.set_num_threads(1)

LOGIT_TOL = 1e-4  # float32, max |minirl - transformers|; measured 4e-6 to 1e-5 at |logits| <= 7
TOKENS = np.random.default_rng(0).integers(0, 100, (2, 16)).astype(np.int32)  # [B, T]
SMALL = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=100,
    rms_norm_eps=1e-6,
)
ARCHS = {
    "qwen2": (
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        dict(tie_word_embeddings=True, rope_theta=1e6),
    ),
    "qwen3": (
        transformers.Qwen3Config,
        transformers.Qwen3ForCausalLM,
        dict(head_dim=32, tie_word_embeddings=False, rope_theta=1e6),
    ),
    # MoE: 4 experts, 2 per token; Qwen2-MoE with its shared expert, unnormalised gates and a
    # dense second layer (mlp_only_layers); Qwen3-MoE renormalised, every layer sparse.
    "qwen2_moe": (
        transformers.Qwen2MoeConfig,
        transformers.Qwen2MoeForCausalLM,
        dict(
            tie_word_embeddings=False,
            rope_theta=1e6,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            norm_topk_prob=False,
            mlp_only_layers=[1],
        ),
    ),
    "qwen3_moe": (
        transformers.Qwen3MoeConfig,
        transformers.Qwen3MoeForCausalLM,
        dict(
            head_dim=32,
            tie_word_embeddings=False,
            rope_theta=1e6,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
        ),
    ),
    "llama": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(
            tie_word_embeddings=False,
            rope_theta=5e5,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
    ),
}


def _torch_logits(model, tokens=TOKENS) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """arch -> (checkpoint dir, transformers model, its logits on TOKENS)."""
    out = {}
    for seed, (arch, (config_cls, model_cls, extra)) in enumerate(ARCHS.items()):
        torch.manual_seed(seed)
        model = model_cls(config_cls(**SMALL, **extra)).eval()
        # Non-trivial norms and biases (transformers starts them at 1 and 0, which would hide a
        # mapping mistake), and weights large enough for logits of a few units.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.copy_(1.0 + 0.2 * torch.randn_like(p))
                else:
                    p.copy_(
                        torch.randn_like(p) * (0.1 if p.ndim == 1 else 1.5 / p.shape[-1] ** 0.5)
                    )
        path = tmp_path_factory.mktemp(arch)
        model.save_pretrained(path)
        out[arch] = (path, model, _torch_logits(model))
    return out


def _forward(model, tokens=TOKENS) -> np.ndarray:
    graphdef, state = nnx.split(model)
    return np.asarray(jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))(state, jnp.asarray(tokens)))


def _params(model) -> dict:
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _assert_same_params(a, b):
    la, ta = jax.tree_util.tree_flatten(_params(a))
    lb, tb = jax.tree_util.tree_flatten(_params(b))
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_logits_match_transformers(checkpoints, arch):
    path, hf_model, ref = checkpoints[arch]
    cfg, model = load_hf(path)
    assert cfg.dtype == "float32"
    assert np.abs(ref).max() > 2.0  # a meaningful range of logits
    err = np.abs(_forward(model) - ref).max()
    assert err <= LOGIT_TOL, f"{arch}: max |logit difference| {err}"
    # RoPE frequencies (with Llama-3 scaling) agree with transformers' own.
    theirs = hf_model.model.rotary_emb.inv_freq.numpy()
    np.testing.assert_allclose(np.asarray(rope_frequencies(cfg)), theirs, rtol=1e-6)


def test_loading_keeps_no_reference_to_the_weights(checkpoints):
    """The shared, cached template a load fills in stays a template: filled, it kept the first
    loaded weights alive for the whole process (a 0.5B run: 2 GB after the trainer let go)."""
    import gc
    import weakref

    from minirl.modeling.model import abstract_model

    cfg, model = load_hf(checkpoints["qwen2"][0])
    embed = weakref.ref(nnx.to_pure_dict(nnx.split(model)[1])["embed"])
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(abstract_model(cfg)[1]))
    del model
    gc.collect()
    assert embed() is None


def test_config_fields_per_architecture(checkpoints):
    qwen2, _ = load_hf(checkpoints["qwen2"][0])
    assert (qwen2.qkv_bias, qwen2.qk_norm, qwen2.tie_embeddings, qwen2.head_dim) == (
        True,
        False,
        True,
        16,
    )
    qwen3, _ = load_hf(checkpoints["qwen3"][0])
    assert (qwen3.qkv_bias, qwen3.qk_norm, qwen3.tie_embeddings, qwen3.head_dim) == (
        False,
        True,
        False,
        32,
    )
    llama, _ = load_hf(checkpoints["llama"][0])
    assert llama.rope_scaling == (8.0, 1.0, 4.0, 64) and llama.rope_theta == 5e5
    # The scaling matters at these head dims: without it the frequencies differ.
    plain = rope_frequencies(dataclasses.replace(llama, rope_scaling=None))
    assert not np.allclose(plain, rope_frequencies(llama))


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_round_trip(checkpoints, tmp_path, arch):
    path, hf_model, ref = checkpoints[arch]
    cfg, model = load_hf(path)
    save_hf(model, cfg, tmp_path)
    cfg2, model2 = load_hf(tmp_path)
    assert cfg2 == cfg
    _assert_same_params(model, model2)
    # transformers reads what minirl wrote, and computes the very same logits as before.
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is type(hf_model)
    np.testing.assert_array_equal(_torch_logits(reloaded), ref)


def test_round_trip_bfloat16(checkpoints, tmp_path):
    cfg, model = load_hf(checkpoints["qwen3"][0], dtype="bfloat16")
    assert (cfg.dtype, cfg.param_dtype) == ("bfloat16", "bfloat16")
    assert model.embed[...].dtype == jnp.bfloat16
    save_hf(nnx.state(model, nnx.Param), cfg, tmp_path)  # a State works as well as a model
    assert (
        load_file(tmp_path / "model.safetensors")["model.embed_tokens.weight"].dtype.name
        == "bfloat16"
    )
    cfg2, model2 = load_hf(tmp_path, dtype="bfloat16")
    assert cfg2 == cfg
    _assert_same_params(model, model2)
    # The default is float32 master weights, whatever the file stores: an exact upcast.
    cfg3, model3 = load_hf(tmp_path)
    assert (cfg3.dtype, cfg3.param_dtype) == ("float32", "float32")
    assert model3.embed[...].dtype == jnp.float32
    assert np.array_equal(np.asarray(model3.embed[...]), np.asarray(model.embed[...], np.float32))


# Fields minirl's model does not use, away from transformers' defaults (0.001, false, 0.02,
# true): an export that dropped them would reload with the defaults.
CARRIED = dict(
    router_aux_loss_coef=0.02, output_router_logits=True, initializer_range=0.05, use_cache=False
)


@pytest.mark.parametrize("arch", ["qwen2_moe", "qwen3_moe", "qwen3"])
def test_save_with_a_source_keeps_its_config_fields(checkpoints, tmp_path, arch):
    """`save_hf(..., source=DIR)` had written config.json from minirl's fields alone: a Qwen MoE
    export lost router_aux_loss_coef and output_router_logits (and any other field minirl does
    not read), and transformers reloaded it with its class defaults. Every field of the
    source's config.json comes back as it was; only the dtype follows the weights written."""
    path = _edited_copy(checkpoints[arch][0], tmp_path / "src")
    source = {**json.loads((path / "config.json").read_text()), **CARRIED}
    custom = {"AutoConfig": "modeling_custom.CustomConfig"}  # code the export does not copy
    (path / "config.json").write_text(json.dumps({**source, "auto_map": custom}))
    cfg, model = load_hf(path, dtype="bfloat16")  # a dtype other than the file's float32
    save_hf(model, cfg, tmp_path / "out", source=path)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "auto_map" not in written  # trust_remote_code=True would look for modeling_custom.py
    assert (written["dtype"], source["dtype"]) == ("bfloat16", "float32")
    assert {k: v for k, v in written.items() if k in source and k != "dtype"} == {
        k: v for k, v in source.items() if k != "dtype"
    }
    theirs = transformers.AutoConfig.from_pretrained(tmp_path / "out")
    for key, value in CARRIED.items():
        assert getattr(theirs, key) == value, key
    assert load_hf(tmp_path / "out", dtype="bfloat16")[0] == cfg


def test_a_moe_model_made_from_nothing_states_the_router_fields(tmp_path):
    """No source: the router fields of transformers' MoE config classes, at their defaults."""
    cfg = ModelConfig.preset("tiny-moe")
    zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), param_shapes(cfg))
    save_hf(zeros, cfg, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert (written["output_router_logits"], written["router_aux_loss_coef"]) == (False, 0.001)
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    assert type(theirs) is transformers.Qwen3MoeConfig
    defaults = transformers.Qwen3MoeConfig()
    assert theirs.router_aux_loss_coef == defaults.router_aux_loss_coef
    assert theirs.output_router_logits == defaults.output_router_logits


def test_sharded_checkpoints(checkpoints, tmp_path):
    path, hf_model, ref = checkpoints["llama"]
    _, single = load_hf(path)
    hf_model.save_pretrained(tmp_path / "hf", max_shard_size="40KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    assert len(list((tmp_path / "hf").glob("model-*.safetensors"))) > 1
    _assert_same_params(single, load_hf(tmp_path / "hf")[1])
    # minirl writes shards too, and both readers accept them.
    cfg, _ = load_hf(path)
    save_hf(single, cfg, tmp_path / "ours", max_shard_bytes=40_000)
    index = json.loads((tmp_path / "ours" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert set(index["weight_map"]) == set(tensor_names(cfg))
    _assert_same_params(single, load_hf(tmp_path / "ours")[1])
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours").eval()
    np.testing.assert_array_equal(_torch_logits(reloaded), ref)


def _edited_copy(src, dst, drop=(), add=None):
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    tensors = load_file(src / "model.safetensors")
    for name in drop:
        del tensors[name]
    tensors.update(add or {})
    save_file(tensors, dst / "model.safetensors")
    return dst


def test_missing_tensor_is_named(checkpoints, tmp_path):
    gone = ["model.layers.1.mlp.up_proj.weight", "model.layers.0.self_attn.q_norm.weight"]
    path = _edited_copy(checkpoints["qwen3"][0], tmp_path, drop=gone)
    with pytest.raises(CheckpointError, match="lacks 2 tensor") as err:
        load_hf(path)
    assert all(name in str(err.value) for name in gone)


def test_unexpected_tensor_is_named(checkpoints, tmp_path):
    extra = {"model.layers.0.self_attn.o_proj.bias": np.zeros(64, np.float32)}
    path = _edited_copy(checkpoints["llama"][0], tmp_path, add=extra)
    with pytest.raises(
        CheckpointError,
        match=r"1 tensor\(s\) minirl does not use: "
        r"model\.layers\.0\.self_attn\.o_proj\.bias",
    ):
        load_hf(path)


def test_harmless_extra_tensors_are_skipped(checkpoints, tmp_path):
    path, _, ref = checkpoints["qwen2"]  # tied embeddings
    embed = load_file(path / "model.safetensors")["model.embed_tokens.weight"]
    extra = {
        "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32),
        "lm_head.weight": embed.copy(),  # a tied model's head saved as well: a copy, dropped
    }
    cfg, model = load_hf(_edited_copy(path, tmp_path, add=extra))
    assert cfg.tie_embeddings
    _assert_same_params(model, load_hf(path)[1])


def test_tied_config_with_a_different_head_matches_transformers(checkpoints, tmp_path):
    # Measured with transformers 5.24: it warns, unties, and uses the file's lm_head.weight.
    path, _, _ = checkpoints["qwen2"]  # tie_word_embeddings=true
    head = np.random.default_rng(1).normal(0, 0.2, (100, 64)).astype(np.float32)
    edited = _edited_copy(path, tmp_path, add={"lm_head.weight": head})
    theirs = transformers.AutoModelForCausalLM.from_pretrained(edited).eval()
    cfg, model = load_hf(edited)
    assert not cfg.tie_embeddings
    assert np.abs(_forward(model) - _torch_logits(theirs)).max() <= LOGIT_TOL
    assert np.abs(_forward(model) - _forward(load_hf(path)[1])).max() > 1.0  # the head matters


def test_wrong_shape_is_named(checkpoints, tmp_path):
    path = _edited_copy(checkpoints["llama"][0], tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["intermediate_size"] = 96
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError,
        match=r"model\.safetensors: tensor model\.layers\.\d\.mlp\.\w+_proj\.weight has "
        r"shape \((128, 64|64, 128)\), config.json implies",
    ):
        load_hf(path)


def test_unknown_architecture(checkpoints, tmp_path):
    path = _edited_copy(checkpoints["llama"][0], tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["architectures"], config["model_type"] = ["MistralForCausalLM"], "mistral"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError,
        match=r"config.json: unsupported architectures \['MistralForCausalLM'\]"
        r".*LlamaForCausalLM",
    ):
        load_hf(path)


def test_rope_scaling_wins_over_rope_parameters_as_in_transformers(checkpoints, tmp_path):
    """A `rope_scaling` written into a config.json that transformers 5 saved (with its default
    `rope_parameters`), as Qwen's long-context recipe says: transformers uses rope_scaling, so
    minirl must too (it used the default RoPE, silently)."""
    path, _, ref = checkpoints["llama"]  # llama3 scaling, saved as rope_parameters
    edited = _edited_copy(path, tmp_path / "llama3")
    config = json.loads((edited / "config.json").read_text())
    config["rope_scaling"] = config["rope_parameters"]
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    (edited / "config.json").write_text(json.dumps(config))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(edited).eval()
    assert np.abs(_torch_logits(theirs) - ref).max() <= LOGIT_TOL  # transformers' own reading
    assert np.abs(_forward(load_hf(edited)[1]) - ref).max() <= LOGIT_TOL
    config["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    (edited / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="unsupported rope_type 'yarn'"):
        load_hf(edited)


def test_a_model_type_that_contradicts_the_architecture_is_refused(checkpoints, tmp_path):
    # transformers builds the model_type's model (Llama: the q/k/v biases dropped, with a warning)
    path = _edited_copy(checkpoints["qwen2"][0], tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(
        CheckpointError,
        match=r"model_type 'llama' does not match architectures \['Qwen2ForCausalLM'\]",
    ):
        load_hf(path)


def test_missing_files(tmp_path):
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json is not valid JSON"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="config.json must hold a JSON object"):
        load_hf(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], **SMALL})
    )
    with pytest.raises(CheckpointError, match="neither model.safetensors nor"):
        load_hf(tmp_path)


def test_damaged_files_are_named(checkpoints, tmp_path):
    path, hf_model, _ = checkpoints["llama"]
    cut = _edited_copy(path, tmp_path / "cut")
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(
        CheckpointError, match=r"cut/model\.safetensors.*(truncated|cannot be read)"
    ):
        load_hf(cut)
    (cut / "model.safetensors").write_bytes(b"\xff" * 64)  # garbage header
    with pytest.raises(CheckpointError, match=r"cut/model\.safetensors is not a readable"):
        load_hf(cut)
    sharded = tmp_path / "sharded"
    hf_model.save_pretrained(sharded, max_shard_size="40KB")
    shard = sorted(sharded.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"{shard.name} is missing"):
        load_hf(sharded)
    (sharded / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(CheckpointError, match="index.json is not a safetensors index"):
        load_hf(sharded)


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_experts", 8),
        ("num_local_experts", 8),
        ("n_routed_experts", 64),
        ("moe_intermediate_size", 768),
    ],
)
def test_mixture_of_experts_is_refused(checkpoints, tmp_path, field, value):
    path = _edited_copy(checkpoints["qwen2"][0], tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(
        CheckpointError, match=f"config.json: {field} = {value}: mixture-of-experts"
    ):
        load_hf(path)


@pytest.mark.parametrize(
    "arch, field, held", [("llama", "num_hidden_layers", 2), ("qwen3_moe", "num_experts", 4)]
)
def test_absurd_counts_are_refused_before_anything_loops_over_them(
    checkpoints, tmp_path, arch, field, held
):
    """A broken or hostile config.json claiming 10**9 layers or experts: one line at once (the
    per-layer tensor names were enumerated first: it hung)."""
    path = _edited_copy(checkpoints[arch][0], tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, field: 10**9}))
    words = f"config.json: {field} = 1000000000, but the checkpoint's tensors hold {held}$"
    for read in (read_model_config, load_hf):  # the config alone, then the whole checkpoint
        with pytest.raises(CheckpointError, match=words):
            read(path)


def test_token_ids_are_read_and_written(checkpoints, tmp_path):
    from minirl.hf.model_files import TokenIds, read_token_ids

    path, _, _ = checkpoints["qwen2"]
    src = _edited_copy(path, tmp_path / "src")
    (src / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [7, 9], "pad_token_id": 3, "bos_token_id": None})
    )
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "eos_token_id": 11, "bos_token_id": 1}))
    ids = read_token_ids(src)
    assert ids == TokenIds(bos=1, eos=(7, 9, 11), pad=3)  # generation_config.json's first

    cfg, model = load_hf(src)
    save_hf(model, cfg, tmp_path / "out", token_ids=TokenIds(bos=None, eos=(7, 9), pad=3))
    assert read_token_ids(tmp_path / "out") == TokenIds(bos=None, eos=(7, 9), pad=3)
    gen = transformers.GenerationConfig.from_pretrained(tmp_path / "out")
    assert (gen.eos_token_id, gen.pad_token_id) == ([7, 9], 3)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert theirs.config.eos_token_id == [7, 9]

    (src / "generation_config.json").write_text(json.dumps({"eos_token_id": "7"}))
    with pytest.raises(CheckpointError, match="generation_config.json: eos_token_id = '7'"):
        read_token_ids(src)
    (src / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 1000]}))
    with pytest.raises(CheckpointError, match=r"in \[0, vocab_size=100\)"):
        read_token_ids(src)


# Published config.json files (the fields minirl reads), in transformers 4.x layout.
QWEN25_05B = dict(
    architectures=["Qwen2ForCausalLM"],
    hidden_size=896,
    intermediate_size=4864,
    num_attention_heads=14,
    num_hidden_layers=24,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
    torch_dtype="bfloat16",
    use_sliding_window=False,
    vocab_size=151936,
    hidden_act="silu",
)
QWEN3_06B = dict(
    architectures=["Qwen3ForCausalLM"],
    attention_bias=False,
    head_dim=128,
    hidden_size=1024,
    intermediate_size=3072,
    max_position_embeddings=40960,
    num_attention_heads=16,
    num_hidden_layers=28,
    num_key_value_heads=8,
    rms_norm_eps=1e-6,
    rope_scaling=None,
    rope_theta=1000000,
    hidden_act="silu",
    tie_word_embeddings=True,
    torch_dtype="bfloat16",
    use_sliding_window=False,
    vocab_size=151936,
)
# Qwen/Qwen3-30B-A3B's config.json (its MoE fields included)
QWEN3_30B_A3B = {
    **QWEN3_06B,
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_attention_heads": 32,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_experts": 128,
    "num_experts_per_tok": 8,
}
LLAMA32_1B = dict(
    architectures=["LlamaForCausalLM"],
    attention_bias=False,
    head_dim=64,
    hidden_size=2048,
    intermediate_size=8192,
    max_position_embeddings=131072,
    mlp_bias=False,
    num_attention_heads=32,
    num_hidden_layers=16,
    num_key_value_heads=8,
    rms_norm_eps=1e-5,
    hidden_act="silu",
    rope_scaling=dict(
        factor=32.0,
        high_freq_factor=4.0,
        low_freq_factor=1.0,
        original_max_position_embeddings=8192,
        rope_type="llama3",
    ),
    rope_theta=500000.0,
    tie_word_embeddings=True,
    torch_dtype="bfloat16",
    vocab_size=128256,
)


@pytest.mark.parametrize(
    "hf, preset",
    [
        (QWEN25_05B, "qwen2.5-0.5b"),
        (QWEN3_06B, "qwen3-0.6b"),
        (LLAMA32_1B, "llama-3.2-1b"),
        (QWEN3_30B_A3B, "qwen3-30b-a3b"),
    ],
)
def test_published_configs_give_the_presets(hf, preset):
    assert config_from_hf(hf, dtype="bfloat16") == ModelConfig.preset(preset)
    # transformers 5.x moves rope_theta and the scaling into rope_parameters: same result.
    rope = {**(hf.get("rope_scaling") or {"rope_type": "default"}), "rope_theta": hf["rope_theta"]}
    v5 = {k: v for k, v in hf.items() if k not in ("rope_theta", "rope_scaling", "torch_dtype")}
    assert config_from_hf(
        {**v5, "rope_parameters": rope, "dtype": "bfloat16"}, dtype="bfloat16"
    ) == ModelConfig.preset(preset)
    assert config_from_hf(hf).param_dtype == "float32"  # float32 master weights by default


@pytest.mark.parametrize(
    "change, message",
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "unsupported rope_type 'yarn'"),
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 4.0}},
            "llama3 rope scaling is missing",
        ),
        ({"attention_bias": True}, "o_proj bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act = 'gelu': minirl's MLP uses silu"),
        ({"use_sliding_window": True}, "sliding-window"),
        # a rope_scaling beside transformers 5's rope_parameters is the one transformers uses
        (
            {"rope_parameters": {"rope_type": "default"}, "rope_scaling": {"type": "linear"}},
            "unsupported rope_type 'linear'",
        ),
        (
            {"quantization_config": {"quant_method": "fp8"}},
            "quantization_config .quant_method 'fp8'.: quantized checkpoints are not supported",
        ),
        ({"attention_dropout": 0.1}, "attention_dropout = 0.1: minirl trains without dropout"),
        ({"attention_dropout": 0.0}, None),
        ({"model_type": "qwen2"}, r"model_type 'qwen2' does not match architectures"),
        ({"model_type": "llama"}, None),
        ({"hidden_size": None}, "hidden_size = None: a positive integer is required"),
        ({"torch_dtype": "float16"}, None),  # loads, as float32
        # every number names the file and the field, never "could not convert string to float"
        ({"rms_norm_eps": "tiny"}, "m/config.json: rms_norm_eps = 'tiny': a positive number"),
        ({"rms_norm_eps": -1e-6}, "rms_norm_eps = -1e-06: a positive number"),
        ({"rope_theta": "big"}, "m/config.json: rope_theta = 'big': a positive number"),
        ({"max_position_embeddings": 1.5}, "max_position_embeddings = 1.5: a positive integer"),
        ({"num_key_value_heads": "2"}, "num_key_value_heads = '2': a positive integer"),
        ({"head_dim": True}, "head_dim = True: a positive integer"),
        ({"max_position_embeddings": 0}, "^m/config.json: max_position_embeddings = 0: a pos"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings = 'yes': true or false"),
        ({"num_key_value_heads": 3}, "m/config.json: .*num_heads"),  # shapes that do not fit
        (
            {"rope_scaling": {**LLAMA32_1B["rope_scaling"], "factor": "x"}},
            "m/config.json: factor = 'x': a positive number",
        ),
    ],
)
def test_config_errors(change, message):
    hf = {**LLAMA32_1B, **change}
    if message is None:
        assert config_from_hf(hf).dtype == "float32"
        return
    with pytest.raises(CheckpointError, match=message):
        config_from_hf(hf, source="m/config.json")


def test_moe_configs_by_architecture(tmp_path):
    """Qwen2-MoE's shared expert, q/k/v bias switch and dense layers; transformers 5's
    num_local_experts; the MoE config written back; what neither MoE architecture can hold."""
    qwen2 = {
        **QWEN25_05B,
        "architectures": ["Qwen2MoeForCausalLM"],
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
    }
    cfg = config_from_hf(qwen2)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.expert_dim) == (60, 4, 1408)
    assert (cfg.shared_expert_dim, cfg.norm_topk_prob, cfg.qkv_bias) == (5632, False, True)
    assert cfg.moe_layers == tuple(i for i in range(1, 24, 2) if i != 3)
    assert config_from_hf({**qwen2, "qkv_bias": False}).qkv_bias is False
    back = config_to_hf(cfg)
    assert back["architectures"] == ["Qwen2MoeForCausalLM"] and back["mlp_only_layers"] == [3]
    assert config_from_hf({**qwen2, **back}) == cfg
    v5 = {k: v for k, v in QWEN3_30B_A3B.items() if k != "num_experts"}
    assert config_from_hf({**v5, "num_local_experts": 128}).num_experts == 128
    with pytest.raises(CheckpointError, match="mlp_only_layers = 'all': a list of layer"):
        config_from_hf({**qwen2, "mlp_only_layers": "all"})
    with pytest.raises(CheckpointError, match="num_experts_per_tok = None: a positive integer"):
        config_from_hf({**qwen2, "num_experts_per_tok": None})
    with pytest.raises(CheckpointError, match="no MoE architecture fits"):
        config_to_hf(ModelConfig.preset("tiny-moe", qk_norm=False))


def test_save_refuses_an_architecture_that_cannot_hold_the_model(tmp_path):
    cfg = ModelConfig(
        vocab_size=32,
        dim=64,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        mlp_dim=64,
        qk_norm=True,
    )
    with pytest.raises(CheckpointError, match="LlamaForCausalLM cannot express"):
        save_hf({}, cfg, tmp_path, architecture="LlamaForCausalLM")
    with pytest.raises(CheckpointError, match="parameters lack embed"):
        save_hf({}, cfg, tmp_path)


def test_a_block_of_a_tensor_is_read_alone(checkpoints):
    """`TensorSource.read(index)` — what each process of a mesh reads (scale.mesh.load_checkpoint)
    — is that block of the whole tensor in minirl's layout, for transposed tensors too, and
    equals the tensor transformers holds."""
    path, model, _ = checkpoints["qwen2"]
    theirs = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    _, sources = open_checkpoint(path)
    assert any(s.transposed for s in sources.values()) and any(
        not s.transposed for s in sources.values()
    )
    for source in sources.values():
        whole = source.read()
        want = theirs[source.name].T if source.transposed else theirs[source.name]
        np.testing.assert_array_equal(whole, want)
        index = tuple(slice(n // 2, n) for n in source.shape)  # the last half of every axis
        np.testing.assert_array_equal(source.read(index), whole[index])


@pytest.mark.parametrize("arch", ["qwen2_moe", "qwen3_moe"])
def test_moe_greedy_decode_equals_generate(checkpoints, arch):
    """minirl's engine (prefill, then cached decode steps routing each new token) decodes the
    tokens transformers' greedy `generate` does."""
    from minirl.inference.engine import Engine, EngineConfig, Request
    from minirl.types import Prompt

    path, hf_model, _ = checkpoints[arch]
    cfg, model = load_hf(path)
    engine = Engine(cfg, EngineConfig(slots=2, cache_len=64, prefill_buckets=(16,), temperature=0))
    engine.load_weights(0, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    prompts = [TOKENS[0, :9], TOKENS[1, :5]]
    outs = engine.generate([Request(Prompt(i, "t", "", p), 0, 10) for i, p in enumerate(prompts)])
    for prompt, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            ids = hf_model.generate(
                torch.tensor(prompt[None], dtype=torch.long),
                max_new_tokens=10,
                min_new_tokens=10,
                do_sample=False,
                pad_token_id=0,
            )
        np.testing.assert_array_equal(np.asarray(out.tokens), ids[0, len(prompt) :].numpy())


def test_a_block_of_stacked_experts_is_read_alone(checkpoints):
    """A StackedSource reads only the experts (and the block) asked for, in minirl's layout,
    equal to the experts transformers holds (fused there: gate_up_proj [E, 2F, D])."""
    path, model, _ = checkpoints["qwen3_moe"]
    _, sources = open_checkpoint(path)
    experts = model.model.layers[0].mlp.experts
    gate_up, down = experts.gate_up_proj.detach().numpy(), experts.down_proj.detach().numpy()
    gate = sources[("layers", 0, "mlp", "gate_proj")]
    assert gate.shape == (4, 64, 32) and len(gate.parts) == 4
    np.testing.assert_array_equal(gate.read(), gate_up[:, :32].transpose(0, 2, 1))
    block = (slice(1, 3), slice(32, 64), slice(None))  # experts 1 and 2, the second half of D
    np.testing.assert_array_equal(gate.read(block), gate_up[1:3, :32, 32:].transpose(0, 2, 1))
    stacked_down = sources[("layers", 0, "mlp", "down_proj")].read()  # [E, F, D]
    np.testing.assert_array_equal(stacked_down, down.transpose(0, 2, 1))
