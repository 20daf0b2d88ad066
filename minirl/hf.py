"""Hugging Face checkpoints <-> minirl: `config.json` + safetensors for Qwen2, Qwen3 and Llama.

What it is: `load_hf(path)` reads a checkpoint directory as written by `transformers`'
`save_pretrained` (one `model.safetensors`, or shards listed in `model.safetensors.index.json`)
into a `minirl.model.Transformer`; `save_hf(model, cfg, path)` writes one back that
`transformers` loads. The whole translation is two small tables: `config_from_hf` maps
config.json keys to `ModelConfig` fields, and `tensor_names` maps every Hugging Face tensor name
to its place in the model's parameter tree. torch Linear weights are stored [out, in]; minirl
stores dense weights [in, out] (`x @ w`), so those are transposed on the way in and out.

Strict on purpose: a missing tensor, a tensor of the wrong shape or an unexpected tensor raises
`CheckpointError` naming the file and the first few offenders, so a checkpoint is never
half-loaded; so do a config.json field minirl cannot honour (mixture-of-experts, sliding windows,
another activation: the error names the field and the file) and a damaged or truncated
safetensors file. `*.rotary_emb.inv_freq` buffers of old checkpoints are skipped. A config that
ties the embeddings but a file that also holds a *different* `lm_head.weight` is loaded untied,
with that head — what transformers 5 does (measured: it warns and unties); an identical copy is
dropped and the model stays tied.

Numerics: minirl trains with float32 master weights and float32 compute by default, whatever
the checkpoint's dtype (bf16 checkpoints are upcast exactly on load). An AdamW step changes a
weight by ~lr relative to its size, below bf16's 8-bit mantissa for any usual learning rate, so
bf16 storage would silently drop updates; and XLA on CPU runs bf16 matmuls no faster than fp32
(BENCHMARKING.md). `dtype="bfloat16"` is the explicit opt-in; a bf16 engine with fp32 trainer is
`engine.dtype=bfloat16`.

Token ids: `read_token_ids(DIR)` gives BOS, padding and EVERY end-of-sequence id the model may
emit (generation_config.json's `eos_token_id` list, e.g. Qwen's `<|im_end|>` and
`<|endoftext|>`); `save_hf(..., token_ids=...)` writes them to config.json and
generation_config.json, so `transformers.generate` on an exported model stops where minirl's
engine stops.

Simplified on purpose: no torch, no `transformers` import (safetensors' numpy reader, bfloat16
via ml_dtypes); no float16 compute (float16 checkpoints load as float32); no sliding-window
attention, o_proj/MLP biases or RoPE types other than the default and Llama-3's — configs that
need them are refused with a clear error rather than loaded wrongly.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
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
GENERATION_FILE = "generation_config.json"
# config.json fields that mean mixture-of-experts layers (Qwen2-MoE, Qwen3-MoE, Mixtral, DeepSeek)
MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size",
              "num_experts_per_tok")
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


def read_config(path) -> dict:
    """DIR/config.json as a dict, or a CheckpointError naming the file and what is wrong."""
    file = Path(path) / "config.json"
    if not file.exists():
        raise CheckpointError(f"{path} has no config.json (not a Hugging Face model directory)")
    try:
        hf = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(hf, dict):
        raise CheckpointError(f"{file} must hold a JSON object, not {type(hf).__name__}")
    return hf


def config_from_hf(hf: dict, dtype=None, source: str = "config.json") -> ModelConfig:
    """A transformers config.json (as a dict) -> ModelConfig. `dtype` ("float32", "bfloat16" or a
    dtype) sets compute and storage dtype; default float32 (see the module docstring). `source`
    names the file in error messages."""
    arch = architecture_of(hf, source)
    _, qkv_bias, qk_norm = ARCHITECTURES[arch]
    refuse = lambda field, why: CheckpointError(f"{source}: {field} = {hf.get(field)!r}: {why}")
    for field in MOE_FIELDS:
        if hf.get(field):
            raise refuse(field, "mixture-of-experts layers are not implemented")
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "vocab_size")
    for field in required:
        if isinstance(hf.get(field), bool) or not isinstance(hf.get(field), int) or hf[field] < 1:
            raise refuse(field, "a positive integer is required")
    if hf.get("hidden_act", "silu") != "silu":
        raise refuse("hidden_act", "minirl's MLP uses silu")
    if hf.get("use_sliding_window"):
        raise refuse("use_sliding_window", "sliding-window attention is not implemented")
    if arch != "Qwen2ForCausalLM" and hf.get("attention_bias"):
        raise refuse("attention_bias", f"{arch} with an o_proj bias is not implemented")
    if hf.get("mlp_bias"):
        raise refuse("mlp_bias", "MLP biases are not implemented")
    heads = hf["num_attention_heads"]
    theta, scaling = _rope(hf)
    dtype = _dtype_name("float32" if dtype is None else dtype)
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


def architecture_of(hf: dict, source: str = "config.json") -> str:
    """The supported architecture name a config.json declares, or a clear error."""
    archs = hf.get("architectures") or []
    by_type = {t: a for a, (t, _, _) in ARCHITECTURES.items()}
    if not isinstance(archs, list):
        raise CheckpointError(f"{source}: architectures = {archs!r} is not a list")
    for name in archs:
        if name in ARCHITECTURES:
            return name
    if not archs and hf.get("model_type") in by_type:
        return by_type[hf["model_type"]]
    field = "architectures" if archs else "model_type"
    raise CheckpointError(
        f"{source}: unsupported {field} {hf.get(field)!r}; minirl loads {sorted(ARCHITECTURES)} "
        f"(model_type {sorted(by_type)})"
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


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


# ----------------------------------------------------------------------------------------------
# Load


def _open(file: Path):
    """safe_open, with a damaged or truncated file reported by name."""
    if not file.exists():
        raise CheckpointError(f"{file} is missing (named by {INDEX_FILE})")
    try:
        return safe_open(file, framework="numpy")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file} is not a readable safetensors file "
                              f"(truncated or damaged?): {e}") from None


def _tensor_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it."""
    if (path / SINGLE_FILE).exists():
        with _open(path / SINGLE_FILE) as f:
            return {name: path / SINGLE_FILE for name in f.keys()}  # noqa: SIM118
    if (path / INDEX_FILE).exists():
        try:
            weight_map = json.loads((path / INDEX_FILE).read_text())["weight_map"]
            return {name: path / file for name, file in weight_map.items()}
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{path / INDEX_FILE} is not a safetensors index "
                                  f"(a JSON object with a 'weight_map'): {e!r}") from None
    raise CheckpointError(f"{path} has neither {SINGLE_FILE} nor {INDEX_FILE}")


def _read(files: dict[str, Path], name: str) -> np.ndarray:
    with _open(files[name]) as f:
        try:
            return f.get_tensor(name)
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{files[name]}: tensor {name} cannot be read: {e}") from None


def _untie_if_needed(cfg: ModelConfig, files: dict[str, Path]) -> ModelConfig:
    """A tied config whose files hold a different lm_head.weight: untied, as transformers does."""
    if not (cfg.tie_embeddings and "lm_head.weight" in files and "model.embed_tokens.weight" in files):
        return cfg
    if np.array_equal(_read(files, "lm_head.weight"), _read(files, "model.embed_tokens.weight")):
        return cfg
    return dataclasses.replace(cfg, tie_embeddings=False)


def read_model_config(path, dtype=None) -> ModelConfig:
    """The ModelConfig `load_hf(path, dtype)` builds, without reading the weights (but for the
    tie check above)."""
    path = Path(path)
    cfg = config_from_hf(read_config(path), dtype, source=str(path / "config.json"))
    return _untie_if_needed(cfg, _tensor_files(path))


def load_hf(path, dtype=None) -> tuple[ModelConfig, Transformer]:
    """Read a Qwen2/Qwen3/Llama checkpoint directory -> (config, model). `dtype` as in
    `config_from_hf`. No random initialisation happens: the model is built from the tensors, one
    file at a time (peak memory ~ one copy of the parameters)."""
    path = Path(path)
    hf = read_config(path)
    files = _tensor_files(path)
    cfg = _untie_if_needed(config_from_hf(hf, dtype, str(path / "config.json")), files)
    names = tensor_names(cfg)
    missing = names.keys() - files.keys()
    if missing:
        raise CheckpointError(
            f"checkpoint {path} lacks {len(missing)} tensor(s) its config.json "
            f"implies: {_names(missing)}"
        )
    # A tied model's file may hold a copy of the head (equal to the embedding, see above).
    copies = {"lm_head.weight"} if cfg.tie_embeddings else set()
    unexpected = {n for n in files.keys() - names.keys() - copies if not _ignorable(n)}
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
        with _open(file) as f:
            for name in file_names:
                where, transposed = names[name]
                try:
                    array = f.get_tensor(name)
                except (SafetensorError, OSError) as e:
                    raise CheckpointError(f"{file}: tensor {name} cannot be read: {e}") from None
                array = array.T if transposed else array
                want = _get(params, where).shape
                if array.shape != want:
                    flip = (lambda s: s[::-1]) if transposed else (lambda s: s)
                    raise CheckpointError(
                        f"{file}: tensor {name} has shape {flip(array.shape)}, "
                        f"config.json implies {flip(want)}"
                    )
                _set(params, where, jnp.asarray(array.astype(cfg.storage_dtype)))
    nnx.replace_by_pure_dict(state, params)
    return cfg, nnx.merge(graphdef, state)


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
            raise CheckpointError(f"{file}: {field} = {value!r}: token ids must be integers in "
                                  f"[0, vocab_size={vocab})")
    return values


def read_token_ids(path) -> TokenIds:
    """BOS / EOS / padding ids from generation_config.json, then config.json. EOS is every id
    either file lists (generation_config.json's first); missing files or keys give None / ()."""
    path = Path(path)
    hf = read_config(path)
    vocab = hf.get("vocab_size") or 2**31
    sources = []
    gen_file = path / GENERATION_FILE
    if gen_file.exists():
        try:
            gen = json.loads(gen_file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{gen_file} is not valid JSON: {e}") from None
        if not isinstance(gen, dict):
            raise CheckpointError(f"{gen_file} must hold a JSON object")
        sources.append((gen, gen_file))
    sources.append((hf, path / "config.json"))
    found = {field: [] for field in ("bos_token_id", "eos_token_id", "pad_token_id")}
    for data, file in sources:
        for field, ids in found.items():
            ids += _ids(data.get(field), field, file, vocab)
    first = lambda ids: ids[0] if ids else None
    return TokenIds(bos=first(found["bos_token_id"]), eos=tuple(dict.fromkeys(found["eos_token_id"])),
                    pad=first(found["pad_token_id"]))


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
    token_ids: TokenIds | None = None,
) -> None:
    """Write config.json + safetensors that transformers (and `load_hf`) read. `model_or_state`
    is a Transformer, its nnx.State or its pure dict. With `max_shard_bytes`, tensors are split
    into `model-0000i-of-0000n.safetensors` files plus `model.safetensors.index.json`. With
    `token_ids`, config.json and a generation_config.json carry the BOS / EOS / padding ids."""
    path = Path(path)
    hf_config = config_to_hf(cfg, architecture)
    path.mkdir(parents=True, exist_ok=True)
    if token_ids is not None:
        ids = {"bos_token_id": token_ids.bos,
               "eos_token_id": token_ids.eos[0] if len(token_ids.eos) == 1 else list(token_ids.eos),
               "pad_token_id": token_ids.pad}
        hf_config.update(ids)
        generation = {**ids, "do_sample": True}
        (path / GENERATION_FILE).write_text(json.dumps(generation, indent=2) + "\n")
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
    "TokenIds",
    "config_from_hf",
    "read_config",
    "read_model_config",
    "read_token_ids",
    "config_to_hf",
    "load_hf",
    "save_hf",
    "tensor_names",
    "architecture_of",
    "default_architecture",
]
