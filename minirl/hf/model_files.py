"""Hugging Face checkpoints <-> minirl: `config.json` + safetensors for Qwen2, Qwen3, Llama,
Qwen2-MoE and Qwen3-MoE.

What it is: `load_hf(path)` reads a checkpoint directory as written by `transformers`'
`save_pretrained` (one `model.safetensors`, or shards listed in `model.safetensors.index.json`)
into a `minirl.modeling.model.Transformer`; `save_hf(model, cfg, path)` writes one back that
`transformers` loads. The whole translation is two small tables: `config_from_hf` maps
config.json keys to `ModelConfig` fields (minirl/hf/hf_config.py, with the token ids of
generation_config.json), and `tensor_names` maps every Hugging Face tensor name to its place in
the model's parameter tree. torch Linear weights are stored [out, in]; minirl
stores dense weights [in, out] (`x @ w`), so those are transposed on the way in and out. MoE
checkpoints store each expert as its own Linear (`mlp.experts.{e}.gate_proj.weight`, the layout
on the Hub and what transformers 4 and 5 write); minirl stacks them into one [E, D, F] weight per
projection (`StackedSource`) and splits them again on save.

Strict on purpose: a missing tensor, a tensor of the wrong shape or an unexpected tensor raises
`CheckpointError` naming the file and the first few offenders, so a checkpoint is never
half-loaded; so do a config.json field minirl cannot honour (experts outside Qwen2/3-MoE, sliding windows,
another activation: the error names the field and the file) and a damaged or truncated
safetensors file. `*.rotary_emb.inv_freq` buffers of old checkpoints are skipped. A config that
ties the embeddings but a file that also holds a *different* `lm_head.weight` is loaded untied,
with that head — what transformers 5 does (measured: it warns and unties); an identical copy is
dropped and the model stays tied.

Numerics: minirl keeps float32 master weights whatever the checkpoint's dtype (bf16 checkpoints
are upcast exactly on load): an AdamW step changes a weight by ~lr relative to its size, below
bf16's 8-bit mantissa for any usual learning rate, so bf16 storage would silently drop updates.
The compute dtype is the run's `model.dtype` (derived per machine: docs/your_own_model.md).

Token ids: `read_token_ids(DIR)` gives BOS, padding and EVERY end-of-sequence id the model may
emit (generation_config.json's `eos_token_id` list, e.g. Qwen's `<|im_end|>` and
`<|endoftext|>`); `save_hf(..., token_ids=...)` writes them to config.json and
generation_config.json, so `transformers.generate` on an exported model stops where minirl's
engine stops.

The rest of config.json: `save_hf(..., source=DIR)` keeps every field of DIR's config.json
that minirl does not write itself (an MoE model's `router_aux_loss_coef` and
`output_router_logits`, `initializer_range`, `use_cache`, `layer_types`, ...), so transformers
reloads the export with the source's settings, not its class defaults. What minirl writes over
them: the architecture and every shape, the dtype (an export may convert it), the RoPE fields
(in both transformers 4's and 5's forms) and the tie of the embeddings (untied when the source
file held a different head). A model with no source gets, beside those, what transformers'
MoE config classes would write for the router: `output_router_logits` false and
`router_aux_loss_coef` 0.001 (their defaults; the run's `rl.router_aux_coef` is a setting of
the RL loss, not of the model).

Simplified on purpose: no torch, no `transformers` import (safetensors' numpy reader, bfloat16
via ml_dtypes); no float16 compute (float16 checkpoints load as float32); no sliding-window
attention, o_proj/MLP biases or RoPE types other than the default and Llama-3's — configs that
need them are refused with a clear error rather than loaded wrongly.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np
from flax import nnx
from safetensors import SafetensorError
from safetensors.numpy import save_file

from minirl.hf.hf_config import (
    ARCHITECTURES,
    GENERATION_FILE,
    INDEX_FILE,
    SINGLE_FILE,
    CheckpointError,
    TokenIds,
    architecture_of,
    config_and_files,
    config_from_hf,
    config_to_hf,
    default_architecture,
    open_safetensors,
    read_config,
    read_model_config,
    read_token_ids,
)
from minirl.modeling.model import ModelConfig, Transformer, abstract_model, param_shapes

_SHOW = 5  # how many offending names an error message lists


def _names(names, show: int = _SHOW) -> str:
    names = sorted(names)
    more = f" (and {len(names) - show} more)" if len(names) > show else ""
    return ", ".join(names[:show]) + more


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
        if i in cfg.moe_layers:
            names.update(_moe_names(cfg, hf + "mlp.", me + ("mlp",)))
            continue
        for p in ("gate", "up", "down"):
            names[hf + f"mlp.{p}_proj.weight"] = (me + ("mlp", f"{p}_proj"), True)
    return names


def _moe_names(cfg: ModelConfig, hf: str, me: tuple) -> dict[str, tuple[tuple, bool]]:
    """An MoE layer's tensors. On disk each expert is its own Linear
    (`experts.{e}.gate_proj.weight` [F, D]); minirl stacks them: a path ending in the expert
    index e is row e of the batched weight (gate_proj [E, D, F] etc.)."""
    names = {hf + "gate.weight": (me + ("router",), True)}
    for e in range(cfg.num_experts):
        for p in ("gate", "up", "down"):
            names[hf + f"experts.{e}.{p}_proj.weight"] = (me + (f"{p}_proj", e), True)
    if cfg.shared_expert_dim:
        for p in ("gate", "up", "down"):
            names[hf + f"shared_expert.{p}_proj.weight"] = (
                me + ("shared_expert", f"{p}_proj"),
                True,
            )
        names[hf + "shared_expert_gate.weight"] = (me + ("shared_expert_gate",), True)
    return names


def _get(tree: Mapping, path: tuple):
    for key in path:
        if not isinstance(tree, Mapping):  # an expert's row of a stacked weight
            tree = tree[key]
            continue
        tree = tree[key] if key in tree else tree[str(key)]
    return tree


def _stacked(path: tuple) -> bool:
    """Does `path` (from `tensor_names`) name one expert of a stacked weight?"""
    return isinstance(path[-1], int) and path[-2] != "layers"


def _set(tree: dict, path: tuple, value) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def _ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


# ----------------------------------------------------------------------------------------------
# Load


@dataclasses.dataclass(frozen=True)
class TensorSource:
    """One parameter in a checkpoint: the file and tensor name holding it, its shape in minirl's
    layout, and whether it is stored transposed ([out, in] on disk, [in, out] in minirl)."""

    file: Path
    name: str
    shape: tuple[int, ...]
    transposed: bool

    def read(self, index: tuple = ()) -> np.ndarray:
        """The tensor (or, with `index` — slices in minirl's layout, as
        `jax.make_array_from_callback` passes them — only that block) in minirl's layout. A
        block is read from the memory-mapped file alone: the rest of the tensor is never read."""
        index = tuple(index) + (slice(None),) * (len(self.shape) - len(index))
        with open_safetensors(self.file) as f:
            try:
                block = f.get_slice(self.name)[index[::-1] if self.transposed else index]
            except (SafetensorError, OSError) as e:
                raise CheckpointError(
                    f"{self.file}: tensor {self.name} cannot be read: {e}"
                ) from None
        return block.T if self.transposed else block


@dataclasses.dataclass(frozen=True)
class StackedSource:
    """A batched expert weight [E, ...] whose rows are E tensors of a checkpoint (one per
    expert); `read(index)` reads only the experts and the block `index` selects."""

    parts: tuple[TensorSource, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.parts), *self.parts[0].shape)

    def read(self, index: tuple = ()) -> np.ndarray:
        index = tuple(index) or (slice(None),)
        experts = range(len(self.parts))[index[0]]
        return np.stack([self.parts[e].read(index[1:]) for e in experts])


def open_checkpoint(
    path, dtype=None, hf: dict | None = None, extra: frozenset = frozenset()
) -> tuple[ModelConfig, dict[tuple, TensorSource]]:
    """(config, {path in the parameter tree: where its tensor is}) of a checkpoint directory,
    every check done on the files' headers — a missing, unexpected or misshapen tensor is
    refused before any weight is read. `hf`: config.json as the caller read and edited it
    (default: the file's), `extra`: tensor names the caller reads itself (a reward model's
    head, minirl/hf/reward_model.py)."""
    path = Path(path)
    cfg, files = config_and_files(path, dtype, hf)
    names = tensor_names(cfg)
    missing = names.keys() - files.keys()
    if missing:
        raise CheckpointError(
            f"checkpoint {path} lacks {len(missing)} tensor(s) its config.json "
            f"implies: {_names(missing)}"
        )
    # A tied model's file may hold a copy of the head (equal to the embedding, see above).
    copies = {"lm_head.weight"} if cfg.tie_embeddings else set()
    unexpected = {n for n in files.keys() - names.keys() - copies - extra if not _ignorable(n)}
    if unexpected:
        raise CheckpointError(
            f"checkpoint {path} has {len(unexpected)} tensor(s) minirl does "
            f"not use: {_names(unexpected)}"
        )
    shapes = param_shapes(cfg)
    sources = {}
    for name, (where, transposed) in names.items():
        with open_safetensors(files[name]) as f:
            stored = tuple(f.get_slice(name).get_shape())
        stacked = _stacked(where)
        want = _get(shapes, where[:-1] if stacked else where).shape[stacked:]
        if stored != (want[::-1] if transposed else want):
            flip = (lambda s: s[::-1]) if transposed else (lambda s: s)
            raise CheckpointError(
                f"{files[name]}: tensor {name} has shape {stored}, config.json implies {flip(want)}"
            )
        sources[where] = TensorSource(files[name], name, want, transposed)
    return cfg, _stack_experts(sources)


def _stack_experts(sources: dict[tuple, TensorSource]) -> dict:
    """One StackedSource per batched expert weight in place of its E per-expert sources."""
    out, experts = {}, {}
    for where, source in sources.items():
        if _stacked(where):
            experts.setdefault(where[:-1], {})[where[-1]] = source
        else:
            out[where] = source
    for where, parts in experts.items():
        out[where] = StackedSource(tuple(parts[e] for e in range(len(parts))))
    return out


def build_params(cfg: ModelConfig, sources: dict[tuple, TensorSource], read) -> dict:
    """The model's pure parameter dict with every leaf `read(where, source)` (a host array, or
    a sharded jax.Array built from the source's blocks)."""
    params = param_shapes(cfg)
    for where, source in sources.items():
        _set(params, where, read(where, source))
    return params


def load_hf(path, dtype=None) -> tuple[ModelConfig, Transformer]:
    """Read a Qwen2/Qwen3/Llama checkpoint directory -> (config, model). `dtype` as in
    `config_from_hf`. No random initialisation happens: the model is built from the tensors, one
    at a time (peak memory ~ one copy of the parameters). scale/mesh.py's `load_checkpoint`
    reads the same sources straight into a mesh's layout, each process only its own blocks."""
    cfg, sources = open_checkpoint(path, dtype)
    return cfg, nnx.merge(abstract_model(cfg)[0], read_params(cfg, sources))


def read_params(cfg: ModelConfig, sources: dict[tuple, TensorSource]) -> dict:
    """The pure parameter dict of `open_checkpoint`'s sources, each tensor read whole into a
    device array of cfg's storage dtype."""
    return build_params(cfg, sources, lambda _, s: jnp.asarray(s.read().astype(cfg.storage_dtype)))


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
    source=None,
) -> None:
    """Write config.json + safetensors that transformers (and `load_hf`) read. `model_or_state`
    is a Transformer, its nnx.State or its pure dict. With `max_shard_bytes`, tensors are split
    into `model-0000i-of-0000n.safetensors` files plus `model.safetensors.index.json`. With
    `token_ids`, config.json and a generation_config.json carry the BOS / EOS / padding ids.
    With `source` (the checkpoint directory the weights came from) instead, its
    generation_config.json is copied unchanged and config.json keeps every field of the
    source's (token ids, router settings, ...) but the ones `config_to_hf` writes."""
    path = Path(path)
    hf_config = {**_carried(source, cfg), **config_to_hf(cfg, architecture)}
    path.mkdir(parents=True, exist_ok=True)
    hf_config.update(_token_ids(path, token_ids, source))
    params = jax.tree_util.tree_map(np.asarray, _pure_params(model_or_state))
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


def _carried(source, cfg: ModelConfig) -> dict:
    """The config.json fields an export keeps: with `source`, all of the source's (minirl's own
    fields are written over them: shapes, dtype, RoPE, architecture); without, the fields of
    transformers' config class that minirl's model does not set, at transformers' defaults.
    A source's `auto_map` (custom model code beside its weights) is left out: the export is
    transformers' own architecture, and the code it names is not copied with it."""
    if source is not None:
        return {k: v for k, v in read_config(source).items() if k != "auto_map"}
    return dict(output_router_logits=False, router_aux_loss_coef=0.001) if cfg.num_experts else {}


def _token_ids(path: Path, token_ids: TokenIds | None, source) -> dict:
    """config.json's token id fields, writing generation_config.json on the way: the source's
    (copied unchanged; its config.json's ids travel with the rest of it, `_carried`), or one
    made of `token_ids`, or none."""
    if source is not None:
        if (Path(source) / GENERATION_FILE).is_file():
            shutil.copyfile(Path(source) / GENERATION_FILE, path / GENERATION_FILE)
        return {}
    if token_ids is None:
        return {}
    ids = {
        "bos_token_id": token_ids.bos,
        "eos_token_id": token_ids.eos[0] if len(token_ids.eos) == 1 else list(token_ids.eos),
        "pad_token_id": token_ids.pad,
    }
    generation = {**ids, "do_sample": True}
    (path / GENERATION_FILE).write_text(json.dumps(generation, indent=2) + "\n")
    return ids


__all__ = [  # the config side is re-exported from minirl.hf.hf_config
    "ARCHITECTURES",
    "GENERATION_FILE",
    "CheckpointError",
    "TokenIds",
    "config_from_hf",
    "read_config",
    "read_model_config",
    "read_token_ids",
    "config_to_hf",
    "load_hf",
    "open_checkpoint",
    "build_params",
    "read_params",
    "TensorSource",
    "StackedSource",
    "save_hf",
    "tensor_names",
    "architecture_of",
    "default_architecture",
]
