"""Hugging Face config files -> minirl: config.json's fields as a `ModelConfig`, and the token ids.

    cfg = config_from_hf(read_config(DIR), dtype="float32")   # shapes, RoPE, biases, norms
    ids = read_token_ids(DIR)        # BOS, EVERY EOS id (generation_config.json first), padding
    config_to_hf(cfg)                # and back, for save_hf (readable by transformers 4.x and 5.x)

Strict: a field minirl cannot honour is refused with `CheckpointError` naming the file and the
field (mixture-of-experts fields outside Qwen2-MoE / Qwen3-MoE, sliding windows, another
activation, a RoPE type but the default and Llama-3's, a quantized checkpoint, attention dropout,
an unknown architecture or one its `model_type` contradicts, a bad token id), never loaded
wrongly. The tensors are minirl/hf/model_files.py's business; only the index of
which file holds which tensor is read here, for `read_model_config`'s tied-embedding check.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from minirl.configlib import read_json_object
from minirl.modeling.model_config import ModelConfig

# Hugging Face architecture name -> (model_type, has q/k/v bias, has q/k RMSNorm).
ARCHITECTURES = {
    "Qwen2ForCausalLM": ("qwen2", True, False),
    "Qwen3ForCausalLM": ("qwen3", False, True),
    "LlamaForCausalLM": ("llama", False, False),
    "Qwen2MoeForCausalLM": ("qwen2_moe", True, False),  # + a sigmoid-gated shared expert
    "Qwen3MoeForCausalLM": ("qwen3_moe", False, True),
}
MOE_ARCHITECTURES = ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")
GENERATION_FILE = "generation_config.json"
# config.json fields that mean mixture-of-experts layers (Qwen2-MoE, Qwen3-MoE, Mixtral, DeepSeek)
MOE_FIELDS = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "moe_intermediate_size",
    "num_experts_per_tok",
)


class CheckpointError(ValueError):
    """A checkpoint directory cannot be read (or written) as the model minirl implements."""


# ----------------------------------------------------------------------------------------------
# Config


def _dtype_name(dtype) -> str:
    name = jnp.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name not in ("float32", "bfloat16"):
        raise CheckpointError(f"minirl computes in float32 or bfloat16, not {name!r}")
    return name


def _number(hf: dict, field: str, kind: type, source: str, default=None):
    """config.json's `field` as a positive, finite `kind` (int or float); `default` when it is
    absent or null (None: the field is required). Anything else is a CheckpointError naming
    the file and the field, never a bare "could not convert string to float"."""
    value = hf.get(field)
    if value is None and default is not None:
        return default
    numeric = isinstance(value, int | float) if kind is float else isinstance(value, int)
    if not numeric or isinstance(value, bool) or not (math.isfinite(value) and value > 0):
        what = "a positive number" if kind is float else "a positive integer"
        raise CheckpointError(f"{source}: {field} = {value!r}: {what} is required")
    return kind(value)


def _rope(hf: dict, source: str = "config.json") -> tuple[float, tuple | None]:
    """(rope_theta, Llama-3 scaling or None) from transformers 5 `rope_parameters` or the older
    top-level `rope_theta` + `rope_scaling`. A non-null `rope_scaling` wins over
    `rope_parameters`, as in transformers 4 (which reads only it) and 5 (measured: a yarn
    `rope_scaling` added to a config.json that transformers 5 wrote, as Qwen's long-context
    recipe says, replaces its default `rope_parameters`, top-level `rope_theta` kept)."""
    params = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise CheckpointError(f"{source}: rope_parameters / rope_scaling is not an object")
    theta = _number({**hf, **params}, "rope_theta", float, source, 10000.0)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        missing = [k for k in keys if k not in params]
        if missing:
            raise CheckpointError(f"{source}: llama3 rope scaling is missing {missing}")
        kinds = (float, float, float, int)
        return theta, tuple(_number(params, k, t, source) for k, t in zip(keys, kinds, strict=True))
    raise CheckpointError(
        f"{source}: unsupported rope_type {kind!r}; minirl implements 'default' and 'llama3'"
    )


def read_config(path) -> dict:
    """DIR/config.json as a dict, or a CheckpointError naming the file and what is wrong."""
    hf = read_json_object(Path(path) / "config.json", CheckpointError)
    if hf is None:
        raise CheckpointError(f"{path} has no config.json (not a Hugging Face model directory)")
    return hf


def config_from_hf(hf: dict, dtype=None, source: str = "config.json") -> ModelConfig:
    """A transformers config.json (as a dict) -> ModelConfig. `dtype` ("float32", "bfloat16" or a
    dtype) sets compute and storage dtype; default float32 (see the module docstring). `source`
    names the file in error messages."""
    arch = architecture_of(hf, source)
    _, qkv_bias, qk_norm = ARCHITECTURES[arch]
    if arch == "Qwen2MoeForCausalLM":  # its own switch (transformers' default: true)
        qkv_bias = hf.get("qkv_bias", True) is True
    refuse = lambda field, why: CheckpointError(f"{source}: {field} = {hf.get(field)!r}: {why}")
    for field in MOE_FIELDS if arch not in MOE_ARCHITECTURES else ():
        if hf.get(field):
            raise refuse(field, f"mixture-of-experts layers need one of {MOE_ARCHITECTURES}")
    required = (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
    )
    for field in required:
        _number(hf, field, int, source)
    _refuse_what_minirl_lacks(hf, arch, qkv_bias, source)
    heads = hf["num_attention_heads"]
    theta, scaling = _rope(hf, source)
    dtype = _dtype_name("float32" if dtype is None else dtype)
    if not isinstance(hf.get("tie_word_embeddings", False), bool):
        raise refuse("tie_word_embeddings", "true or false is required")
    moe = _moe_fields(hf, arch, source) if arch in MOE_ARCHITECTURES else {}
    try:
        return ModelConfig(
            vocab_size=hf["vocab_size"],
            dim=hf["hidden_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=_number(hf, "num_key_value_heads", int, source, heads),
            head_dim=_number(hf, "head_dim", int, source, hf["hidden_size"] // heads),
            mlp_dim=hf["intermediate_size"],
            rope_theta=theta,
            rope_scaling=scaling,
            norm_eps=_number(hf, "rms_norm_eps", float, source, 1e-6),
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            tie_embeddings=hf.get("tie_word_embeddings", False),
            max_seq_len=_number(hf, "max_position_embeddings", int, source, 2048),
            dtype=dtype,
            param_dtype=dtype,
            **moe,
        )
    except CheckpointError:  # a field's own error (_number), which names the file already
        raise
    except ValueError as e:  # shapes that do not fit together (ModelConfig's own checks)
        raise CheckpointError(f"{source}: {e}") from None


def _refuse_what_minirl_lacks(hf: dict, arch: str, qkv_bias: bool, source: str) -> None:
    """The fields that change what the model computes (or trains) beyond minirl's layers."""
    refuse = lambda field, why: CheckpointError(f"{source}: {field} = {hf.get(field)!r}: {why}")
    if hf.get("hidden_act", "silu") != "silu":
        raise refuse("hidden_act", "minirl's MLP uses silu")
    if hf.get("use_sliding_window"):
        raise refuse("use_sliding_window", "sliding-window attention is not implemented")
    if not qkv_bias and hf.get("attention_bias"):
        raise refuse("attention_bias", f"{arch} with an o_proj bias is not implemented")
    if hf.get("mlp_bias"):
        raise refuse("mlp_bias", "MLP biases are not implemented")
    quantized = hf.get("quantization_config")  # packed or scaled weights, not plain ones
    if quantized is not None:
        method = quantized.get("quant_method") if isinstance(quantized, dict) else quantized
        raise CheckpointError(
            f"{source}: quantization_config (quant_method {method!r}): quantized checkpoints "
            "are not supported; load the unquantized model"
        )
    if hf.get("attention_dropout", 0.0) not in (0, 0.0):  # transformers drops out in training
        raise refuse("attention_dropout", "minirl trains without dropout; set it to 0.0")


def _moe_fields(hf: dict, arch: str, source: str) -> dict:
    """ModelConfig's MoE fields from a Qwen2-MoE / Qwen3-MoE config.json (transformers'
    defaults where a field is absent: norm_topk_prob false, decoder_sparse_step 1)."""
    dense = hf.get("mlp_only_layers") or []
    if not (isinstance(dense, list) and all(isinstance(i, int) for i in dense)):
        raise CheckpointError(f"{source}: mlp_only_layers = {dense!r}: a list of layer indices")
    if not isinstance(hf.get("norm_topk_prob", False), bool):
        raise CheckpointError(f"{source}: norm_topk_prob = {hf['norm_topk_prob']!r}: true or false")
    shared = arch == "Qwen2MoeForCausalLM" and "shared_expert_intermediate_size"
    experts = "num_experts" if "num_experts" in hf else "num_local_experts"  # transformers 5's
    return dict(
        num_experts=_number(hf, experts, int, source),
        experts_per_token=_number(hf, "num_experts_per_tok", int, source),
        expert_dim=_number(hf, "moe_intermediate_size", int, source),
        shared_expert_dim=_number(hf, shared, int, source) if shared else 0,
        norm_topk_prob=hf.get("norm_topk_prob", False),
        moe_every=_number(hf, "decoder_sparse_step", int, source, 1),
        dense_layers=tuple(dense),
    )


def architecture_of(hf: dict, source: str = "config.json") -> str:
    """The supported architecture name a config.json declares, or a clear error."""
    archs = hf.get("architectures") or []
    by_type = {t: a for a, (t, _, _) in ARCHITECTURES.items()}
    if not isinstance(archs, list):
        raise CheckpointError(f"{source}: architectures = {archs!r} is not a list")
    for name in archs:
        if name in ARCHITECTURES:
            # transformers' AutoModel builds the model of `model_type`, whatever `architectures`
            # says (measured: Qwen2's q/k/v biases dropped under model_type llama): both or none.
            if hf.get("model_type", ARCHITECTURES[name][0]) != ARCHITECTURES[name][0]:
                raise CheckpointError(
                    f"{source}: model_type {hf['model_type']!r} does not match architectures "
                    f"{archs!r} (model_type {ARCHITECTURES[name][0]!r})"
                )
            return name
    if not archs and hf.get("model_type") in by_type:
        return by_type[hf["model_type"]]
    field = "architectures" if archs else "model_type"
    raise CheckpointError(
        f"{source}: unsupported {field} {hf.get(field)!r}; minirl loads {sorted(ARCHITECTURES)} "
        f"(model_type {sorted(by_type)})"
    )


def default_architecture(cfg: ModelConfig) -> str:
    """The one architecture whose layer shapes match cfg (q/k/v bias -> Qwen2, q/k norm -> Qwen3;
    with experts: a shared expert -> Qwen2-MoE, q/k norm and none -> Qwen3-MoE)."""
    if cfg.num_experts:
        if cfg.shared_expert_dim and not cfg.qk_norm:
            return "Qwen2MoeForCausalLM"
        if cfg.qk_norm and not (cfg.shared_expert_dim or cfg.qkv_bias):
            return "Qwen3MoeForCausalLM"
        raise CheckpointError(
            "no MoE architecture fits: Qwen2-MoE has a shared expert and no "
            "q/k norm, Qwen3-MoE q/k norm, no shared expert, no q/k/v bias"
        )
    for name, (_, qkv_bias, qk_norm) in ARCHITECTURES.items():
        if name not in MOE_ARCHITECTURES and (cfg.qkv_bias, cfg.qk_norm) == (qkv_bias, qk_norm):
            return name
    raise CheckpointError("no supported architecture has both q/k/v bias and q/k norm")


def config_to_hf(cfg: ModelConfig, architecture: str | None = None) -> dict:
    """ModelConfig -> config.json dict, readable by transformers 4.x and 5.x."""
    arch = architecture or default_architecture(cfg)
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"unsupported architecture {arch!r}; known: {sorted(ARCHITECTURES)}")
    if arch != default_architecture(cfg):
        raise CheckpointError(
            f"{arch} cannot express qkv_bias={cfg.qkv_bias}, "
            f"qk_norm={cfg.qk_norm}; use {default_architecture(cfg)}"
        )
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        factor, low, high, original = cfg.rope_scaling
        rope = {
            "rope_type": "llama3",
            "rope_theta": cfg.rope_theta,
            "factor": factor,
            "low_freq_factor": low,
            "high_freq_factor": high,
            "original_max_position_embeddings": original,
        }
    hf = {
        "architectures": [arch],
        "model_type": ARCHITECTURES[arch][0],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.mlp_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
        "max_position_embeddings": cfg.max_seq_len,
        "tie_word_embeddings": cfg.tie_embeddings,
        "rope_parameters": rope,  # transformers >= 5
        "rope_theta": cfg.rope_theta,  # transformers 4.x
        "rope_scaling": None if cfg.rope_scaling is None else rope,  # transformers 4.x
        "dtype": cfg.param_dtype,
        "torch_dtype": cfg.param_dtype,
    }
    if arch in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM"):
        hf["use_sliding_window"] = False
    else:
        hf["attention_bias"] = False
    if arch in MOE_ARCHITECTURES:
        hf.update(
            num_experts=cfg.num_experts,
            num_experts_per_tok=cfg.experts_per_token,
            moe_intermediate_size=cfg.expert_dim,
            norm_topk_prob=cfg.norm_topk_prob,
            decoder_sparse_step=cfg.moe_every,
            mlp_only_layers=list(cfg.dense_layers),
        )
    if arch == "Qwen2MoeForCausalLM":
        hf.update(shared_expert_intermediate_size=cfg.shared_expert_dim, qkv_bias=cfg.qkv_bias)
    return hf


# ----------------------------------------------------------------------------------------------
# Token ids


@dataclasses.dataclass(frozen=True)
class TokenIds:
    """The special token ids a checkpoint declares: BOS, every EOS (primary first), padding."""

    bos: int | None = None
    eos: tuple[int, ...] = ()
    pad: int | None = None


def _ids(value, field: str, file: Path, vocab: int) -> list[int]:
    values = value if isinstance(value, list) else [] if value is None else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab:
            raise CheckpointError(
                f"{file}: {field} = {value!r}: token ids must be integers in "
                f"[0, vocab_size={vocab})"
            )
    return values


def read_token_ids(path) -> TokenIds:
    """BOS / EOS / padding ids from generation_config.json, then config.json. EOS is every id
    either file lists (generation_config.json's first); missing files or keys give None / ()."""
    path = Path(path)
    hf = read_config(path)
    vocab = hf.get("vocab_size") or 2**31
    gen_file = path / GENERATION_FILE
    gen = read_json_object(gen_file, CheckpointError)
    sources = [(gen, gen_file)] if gen is not None else []
    sources.append((hf, path / "config.json"))
    found = {field: [] for field in ("bos_token_id", "eos_token_id", "pad_token_id")}
    for data, file in sources:
        for field, ids in found.items():
            ids += _ids(data.get(field), field, file, vocab)
    first = lambda ids: ids[0] if ids else None
    return TokenIds(
        bos=first(found["bos_token_id"]),
        eos=tuple(dict.fromkeys(found["eos_token_id"])),
        pad=first(found["pad_token_id"]),
    )


# ----------------------------------------------------------------------------------------------
# The tensor index (which file holds which tensor), for the tie check and the loader (minirl/hf/model_files.py)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def open_safetensors(file: Path):
    """safe_open, with a damaged or truncated file reported by name."""
    from safetensors import SafetensorError, safe_open

    if not file.exists():
        raise CheckpointError(f"{file} is missing (named by {INDEX_FILE})")
    try:
        return safe_open(file, framework="numpy")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(
            f"{file} is not a readable safetensors file (truncated or damaged?): {e}"
        ) from None


def tensor_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    if (path / SINGLE_FILE).exists():
        with open_safetensors(path / SINGLE_FILE) as f:
            return {name: path / SINGLE_FILE for name in f.keys()}  # noqa: SIM118
    if (path / INDEX_FILE).exists():
        try:
            weight_map = json.loads((path / INDEX_FILE).read_text())["weight_map"]
            return {name: path / file for name, file in weight_map.items()}
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(
                f"{path / INDEX_FILE} is not a safetensors index "
                f"(a JSON object with a 'weight_map'): {e!r}"
            ) from None
    raise CheckpointError(f"{path} has neither {SINGLE_FILE} nor {INDEX_FILE}")


def _read(files: dict[str, Path], name: str) -> np.ndarray:
    from safetensors import SafetensorError

    with open_safetensors(files[name]) as f:
        try:
            return f.get_tensor(name)
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{files[name]}: tensor {name} cannot be read: {e}") from None


def untie_if_needed(cfg: ModelConfig, files: dict[str, Path]) -> ModelConfig:
    """A tied config whose files hold a different lm_head.weight: untied, as transformers does."""
    if not (
        cfg.tie_embeddings and "lm_head.weight" in files and "model.embed_tokens.weight" in files
    ):
        return cfg
    if np.array_equal(_read(files, "lm_head.weight"), _read(files, "model.embed_tokens.weight")):
        return cfg
    return dataclasses.replace(cfg, tie_embeddings=False)


def read_model_config(path, dtype=None, hf: dict | None = None) -> ModelConfig:
    """The ModelConfig `load_hf(path, dtype)` builds, without reading the weights (but for the
    tie check above); `hf`: config.json as the caller read and edited it (default: the file's).
    Its layer and expert counts are checked against the tensors the files hold first, before
    anything loops over them: a config.json claiming 10**9 layers is one line, not a hang (a
    directory without weight files is left to the loader, which says so)."""
    return config_and_files(path, dtype, hf)[0]


def config_and_files(path, dtype=None, hf: dict | None = None) -> tuple[ModelConfig, dict]:
    """`read_model_config`'s config and the `tensor_files` it was checked against."""
    path, source = Path(path), str(Path(path) / "config.json")
    hf = read_config(path) if hf is None else hf
    cfg = config_from_hf(hf, dtype, source=source)
    files = tensor_files(path)
    layers, experts = _held(files)
    claims = [("num_hidden_layers", cfg.num_layers, layers)]
    if cfg.num_experts:
        field = "num_experts" if "num_experts" in hf else "num_local_experts"
        claims.append((field, cfg.num_experts, experts))
    for field, claimed, held in claims:
        if files and claimed > held:  # no weights at all: the loader names what is missing
            raise CheckpointError(
                f"{source}: {field} = {claimed}, but the checkpoint's tensors hold {held}"
            )
    return untie_if_needed(cfg, files), files


def _held(files: dict[str, Path]) -> tuple[int, int]:
    """How many decoder layers (model.layers.{i}.) and experts (model.layers.{i}.mlp.experts.{e}.)
    the tensor names hold."""
    layers, experts = set(), set()
    for parts in (name.split(".") for name in files):
        if parts[:2] == ["model", "layers"] and len(parts) > 3:
            layers.add(parts[2])
            if parts[3:5] == ["mlp", "experts"] and len(parts) > 6:
                experts.add(parts[5])
    return len(layers), len(experts)
