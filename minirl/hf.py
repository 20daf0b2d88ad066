"""Hugging Face checkpoints <-> minirl: `config.json` + safetensors for Qwen2, Qwen3 and Llama.

What it is: `load_hf(path)` reads a checkpoint directory as written by `transformers`'
`save_pretrained` (one `model.safetensors`, or shards listed in `model.safetensors.index.json`)
into a `minirl.model.Transformer`; `save_hf(model, cfg, path)` writes one back that
`transformers` loads. The whole translation is two small tables: `config_from_hf` maps
config.json keys to `ModelConfig` fields, and `tensor_names` maps every Hugging Face tensor name
to its place in the model's parameter tree. torch Linear weights are stored [out, in]; minirl
stores dense weights [in, out] (`x @ w`), so those are transposed on the way in and out.

Strict on purpose: a missing tensor, a tensor of the wrong shape or an unexpected tensor raises
`CheckpointError` naming the first few offenders, so a checkpoint is never half-loaded. Two kinds
of extra tensors are known to be harmless and are skipped: `*.rotary_emb.inv_freq` buffers that
old checkpoints carry, and `lm_head.weight` in a checkpoint whose config ties the embeddings
(transformers ties it to the embedding on load too, so the embedding wins).

Simplified on purpose: no torch, no `transformers` import (safetensors' numpy reader, bfloat16
via ml_dtypes); no float16 compute (float16 checkpoints load as float32); no sliding-window
attention, o_proj/MLP biases or RoPE types other than the default and Llama-3's — configs that
need them are refused with a clear error rather than loaded wrongly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from minirl.model import ModelConfig, Transformer

# Hugging Face architecture name -> (model_type, has q/k/v bias, has q/k RMSNorm).
ARCHITECTURES = {
    "Qwen2ForCausalLM": ("qwen2", True, False),
    "Qwen3ForCausalLM": ("qwen3", False, True),
    "LlamaForCausalLM": ("llama", False, False),
}
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_SHOW = 5  # how many offending names an error message lists


class CheckpointError(ValueError):
    """A checkpoint directory cannot be read (or written) as the model minirl implements."""


def _names(names, show: int = _SHOW) -> str:
    names = sorted(names)
    more = f" (and {len(names) - show} more)" if len(names) > show else ""
    return ", ".join(names[:show]) + more


# ----------------------------------------------------------------------------------------------
# Config


def _dtype_name(dtype) -> str:
    name = jnp.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name not in ("float32", "bfloat16"):
        raise CheckpointError(f"minirl computes in float32 or bfloat16, not {name!r}")
    return name


def _rope(hf: dict) -> tuple[float, tuple | None]:
    """(rope_theta, Llama-3 scaling or None) from transformers 5 `rope_parameters` or the older
    top-level `rope_theta` + `rope_scaling`."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind == "llama3":
        keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        missing = [k for k in keys if k not in params]
        if missing:
            raise CheckpointError(f"llama3 rope scaling is missing {missing}")
        factor, low, high, original = (params[k] for k in keys)
        return theta, (float(factor), float(low), float(high), int(original))
    raise CheckpointError(
        f"unsupported rope_type {kind!r}; minirl implements 'default' and 'llama3'"
    )


def config_from_hf(hf: dict, dtype=None) -> ModelConfig:
    """A transformers config.json (as a dict) -> ModelConfig. `dtype` ("float32", "bfloat16" or a
    dtype) sets compute and storage dtype; default: the checkpoint's (float16 -> float32)."""
    arch = architecture_of(hf)
    _, qkv_bias, qk_norm = ARCHITECTURES[arch]
    required = (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
    )
    missing = [k for k in required if hf.get(k) is None]
    if missing:
        raise CheckpointError(f"config.json lacks {missing}")
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"unsupported hidden_act {hf['hidden_act']!r}; minirl uses silu")
    if hf.get("use_sliding_window"):
        raise CheckpointError("sliding-window attention (use_sliding_window) is not implemented")
    if arch != "Qwen2ForCausalLM" and hf.get("attention_bias"):
        raise CheckpointError(
            f"{arch} with attention_bias=true has an o_proj bias, not implemented"
        )
    if hf.get("mlp_bias"):
        raise CheckpointError("mlp_bias=true is not implemented")
    heads = hf["num_attention_heads"]
    theta, scaling = _rope(hf)
    if dtype is None:
        stored = hf.get("dtype") or hf.get("torch_dtype") or "float32"
        dtype = "bfloat16" if stored == "bfloat16" else "float32"
    dtype = _dtype_name(dtype)
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        dim=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        mlp_dim=hf["intermediate_size"],
        rope_theta=theta,
        rope_scaling=scaling,
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qkv_bias=qkv_bias,
        qk_norm=qk_norm,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_seq_len=hf.get("max_position_embeddings", 2048),
        dtype=dtype,
        param_dtype=dtype,
    )


def architecture_of(hf: dict) -> str:
    """The supported architecture name a config.json declares, or a clear error."""
    archs = hf.get("architectures") or []
    by_type = {t: a for a, (t, _, _) in ARCHITECTURES.items()}
    for name in archs:
        if name in ARCHITECTURES:
            return name
    if not archs and hf.get("model_type") in by_type:
        return by_type[hf["model_type"]]
    found = archs or hf.get("model_type")
    raise CheckpointError(
        f"unsupported architecture {found!r}; minirl loads {sorted(ARCHITECTURES)}"
    )


def default_architecture(cfg: ModelConfig) -> str:
    """The one architecture whose layer shapes match cfg (q/k/v bias -> Qwen2, q/k norm -> Qwen3)."""
    for name, (_, qkv_bias, qk_norm) in ARCHITECTURES.items():
        if (cfg.qkv_bias, cfg.qk_norm) == (qkv_bias, qk_norm):
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
    if arch == "Qwen2ForCausalLM":
        hf["use_sliding_window"] = False
    else:
        hf["attention_bias"] = False
    return hf


# ----------------------------------------------------------------------------------------------
# Tensor names


def tensor_names(cfg: ModelConfig) -> dict[str, tuple[tuple, bool]]:
    """Every Hugging Face tensor name -> (path in the model's pure parameter dict, transposed?)."""
    names = {
        "model.embed_tokens.weight": (("embed",), False),
        "model.norm.weight": (("final_norm", "weight"), False),
    }
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = (("lm_head",), True)
    for i in range(cfg.num_layers):
        hf, me = f"model.layers.{i}.", ("layers", i)
        names[hf + "input_layernorm.weight"] = (me + ("attn_norm", "weight"), False)
        names[hf + "post_attention_layernorm.weight"] = (me + ("mlp_norm", "weight"), False)
        for p in ("q", "k", "v", "o"):
            names[hf + f"self_attn.{p}_proj.weight"] = (me + ("attn", f"{p}_proj"), True)
        for p in ("q", "k", "v") if cfg.qkv_bias else ():
            names[hf + f"self_attn.{p}_proj.bias"] = (me + ("attn", f"{p}_bias"), False)
        for p in ("q", "k") if cfg.qk_norm else ():
            names[hf + f"self_attn.{p}_norm.weight"] = (me + ("attn", f"{p}_norm", "weight"), False)
        for p in ("gate", "up", "down"):
            names[hf + f"mlp.{p}_proj.weight"] = (me + ("mlp", f"{p}_proj"), True)
    return names


def _get(tree: Mapping, path: tuple):
    for key in path:
        tree = tree[key] if key in tree else tree[str(key)]
    return tree


def _set(tree: dict, path: tuple, value) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def _ignorable(name: str, cfg: ModelConfig) -> bool:
    return name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and cfg.tie_embeddings)


# ----------------------------------------------------------------------------------------------
# Load


def _tensor_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    if (path / SINGLE_FILE).exists():
        with safe_open(path / SINGLE_FILE, framework="numpy") as f:
            return {name: path / SINGLE_FILE for name in f.keys()}  # noqa: SIM118
    if (path / INDEX_FILE).exists():
        weight_map = json.loads((path / INDEX_FILE).read_text())["weight_map"]
        return {name: path / file for name, file in weight_map.items()}
    raise CheckpointError(f"{path} has neither {SINGLE_FILE} nor {INDEX_FILE}")


def load_hf(path, dtype=None) -> tuple[ModelConfig, Transformer]:
    """Read a Qwen2/Qwen3/Llama checkpoint directory -> (config, model). `dtype` as in
    `config_from_hf`. No random initialisation happens: the model is built from the tensors."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise CheckpointError(f"{path} has no config.json")
    cfg = config_from_hf(json.loads((path / "config.json").read_text()), dtype)
    names = tensor_names(cfg)
    files = _tensor_files(path)
    missing = names.keys() - files.keys()
    if missing:
        raise CheckpointError(
            f"checkpoint {path} lacks {len(missing)} tensor(s) the config "
            f"implies: {_names(missing)}"
        )
    unexpected = {n for n in files.keys() - names.keys() if not _ignorable(n, cfg)}
    if unexpected:
        raise CheckpointError(
            f"checkpoint {path} has {len(unexpected)} tensor(s) minirl does "
            f"not use: {_names(unexpected)}"
        )

    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(0))))
    params = nnx.to_pure_dict(state)  # shapes only, filled below
    by_file: dict[Path, list[str]] = {}
    for name in names:
        by_file.setdefault(files[name], []).append(name)
    for file, file_names in by_file.items():
        with safe_open(file, framework="numpy") as f:
            for name in file_names:
                where, transposed = names[name]
                array = f.get_tensor(name)
                array = array.T if transposed else array
                want = _get(params, where).shape
                if array.shape != want:
                    flip = (lambda s: s[::-1]) if transposed else (lambda s: s)
                    raise CheckpointError(
                        f"tensor {name} has shape {flip(array.shape)}, the "
                        f"config implies {flip(want)}"
                    )
                _set(params, where, jnp.asarray(array.astype(cfg.storage_dtype)))
    nnx.replace_by_pure_dict(state, params)
    return cfg, nnx.merge(graphdef, state)


# ----------------------------------------------------------------------------------------------
# Save


def _pure_params(model_or_state) -> Mapping:
    if isinstance(model_or_state, nnx.Module):
        model_or_state = nnx.state(model_or_state, nnx.Param)
    if isinstance(model_or_state, nnx.State):
        return nnx.to_pure_dict(model_or_state)
    return model_or_state


def save_hf(
    model_or_state,
    cfg: ModelConfig,
    path,
    architecture: str | None = None,
    max_shard_bytes: int | None = None,
) -> None:
    """Write config.json + safetensors that transformers (and `load_hf`) read. `model_or_state`
    is a Transformer, its nnx.State or its pure dict. With `max_shard_bytes`, tensors are split
    into `model-0000i-of-0000n.safetensors` files plus `model.safetensors.index.json`."""
    path = Path(path)
    hf_config = config_to_hf(cfg, architecture)
    params = _pure_params(model_or_state)
    tensors = {}
    for name, (where, transposed) in tensor_names(cfg).items():
        try:
            array = np.asarray(_get(params, where))
        except KeyError:
            raise CheckpointError(
                f"parameters lack {'.'.join(map(str, where))} (for {name})"
            ) from None
        tensors[name] = np.ascontiguousarray(array.T if transposed else array)

    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, array in tensors.items():
        if max_shard_bytes and size and size + array.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = array
        size += array.nbytes
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    meta = {"format": "pt"}  # transformers refuses safetensors files without it
    # Remove the other layout's entry file, so the directory holds exactly one checkpoint.
    (path / (INDEX_FILE if len(shards) == 1 else SINGLE_FILE)).unlink(missing_ok=True)
    if len(shards) == 1:
        save_file(shards[0], str(path / SINGLE_FILE), metadata=meta)
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / file), metadata=meta)
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(a.nbytes for a in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


__all__ = [
    "ARCHITECTURES",
    "CheckpointError",
    "config_from_hf",
    "config_to_hf",
    "load_hf",
    "save_hf",
    "tensor_names",
    "architecture_of",
    "default_architecture",
]
