"""`minirl export RUN_DIR --out DIR [--step N]`: a run's weights as a Hugging Face checkpoint.

The directory it writes is what `transformers.AutoModelForCausalLM.from_pretrained(DIR)` and
vLLM load: `config.json`, `model.safetensors`, `generation_config.json` and the tokenizer files
(`tokenizer.json`, `tokenizer_config.json` with the chat template). Logits equal minirl's
(tests/test_user_model.py). For a run started with --model, the source directory's settings
travel unchanged: its generation_config.json (temperature, top_k, top_p, every EOS id, ...) is
copied as it is, config.json keeps every field of the source's that minirl does not write
itself (its bos/eos/pad ids, an MoE model's router_aux_loss_coef and output_router_logits, ...;
minirl/hf/model_files.py says which it writes), and the tokenizer's special tokens are the
source's (no padding token is invented); training changes none of them. The architecture is
the source's (Qwen2, Qwen3, Llama, Qwen2-MoE or Qwen3-MoE); a built-in run gets the one whose
layer shapes match and its tokenizer's ids.

Nothing the export reads is ever deleted: an --out that is, holds or lies inside the run
directory (but for the run's own `RUN_DIR/hf`), the model directory (or a file it links to)
or a dataset file is refused, symbolic links resolved. The checkpoint is written to
`DIR.partial` and renamed into place, so a crash never leaves a half-written DIR that looks
complete. An existing, non-empty DIR is refused unless `force`, and `force` replaces only an
earlier export (a directory holding minirl_export.json), never a directory of other files.
Simplified on purpose: one safetensors file (or shards of `max_shard_bytes`), weights in the
run's float32 unless `dtype="bfloat16"` is asked for.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from minirl.config import RunConfig
from minirl.configlib import ConfigError
from minirl.modeling import lora
from minirl.store.checkpoints import CheckpointManager

MARKER = "minirl_export.json"  # what the export came from; marks a directory as an export


def export_run(
    run_dir,
    out,
    step: int | None = None,
    dtype: str | None = None,
    force: bool = False,
    adapter: bool = False,
) -> Path:
    """Write the checkpoint of `step` (default: the latest) of the run in `run_dir` to `out`
    (`adapter`: a LoRA run's adapters as a PEFT directory, `export_adapter`)."""
    from minirl.run.run_dir import load_config
    from minirl.run.starting_point import load_tokenizer

    run_dir = Path(run_dir)
    if not (run_dir / "config.json").exists():
        raise ConfigError(f"{run_dir} is not a minirl run directory (no config.json)")
    cfg = load_config(run_dir)
    ckpts = CheckpointManager(run_dir)
    if step is not None and step not in ckpts.all_steps():
        raise ConfigError(f"{run_dir} has no checkpoint of step {step}; it has {ckpts.all_steps()}")
    ckpt = ckpts.restore(step=step, opt_state=False)  # the weights alone
    if ckpt is None:
        raise ConfigError(f"{run_dir} has no checkpoint to export")
    source = {"run_dir": str(run_dir.resolve()), "step": ckpt.step}
    if adapter:
        return export_adapter(ckpt.params, cfg, load_tokenizer(cfg), out, force, source)
    return export_params(ckpt.params, cfg, load_tokenizer(cfg), out, dtype, force, source)


def export_params(
    params,
    cfg: RunConfig,
    tokenizer,
    out,
    dtype: str | None = None,
    force: bool = False,
    source: dict | None = None,
) -> Path:
    """Write `params` (a pure dict) of a run with config `cfg` and its tokenizer to `out`
    (a LoRA run's adapters merged into the base weights: W + A B alpha / r)."""
    from minirl.hf.model_files import TokenIds, architecture_of, read_config, save_hf

    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    for path in (out, partial):  # both are deleted if they exist
        _refuse_inputs(path, cfg, (source or {}).get("run_dir"))
    _check_replaceable(out, force)
    _check_replaceable(partial, force=True)  # a crashed export's leftover, or refused
    model_cfg = lora.base_config(cfg.model)  # a LoRA run's adapters folded into the base
    params = lora.merge(params, cfg.model)
    if dtype is not None and dtype != model_cfg.param_dtype:
        model_cfg = _with_dtype(model_cfg, dtype)
        params = jax.tree.map(lambda a: jnp.asarray(a, model_cfg.storage_dtype), params)
    arch = architecture_of(read_config(cfg.model.path)) if cfg.model.path else None
    token_ids = TokenIds(bos=tokenizer.bos_id, eos=tuple(tokenizer.eos_ids), pad=tokenizer.pad_id)

    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    (partial / MARKER).write_text(json.dumps(source or {}, indent=2) + "\n")  # ours, from now
    if cfg.model.path:  # the source's generation settings and token ids, unchanged
        save_hf(params, model_cfg, partial, architecture=arch, source=cfg.model.path)
    else:
        save_hf(params, model_cfg, partial, token_ids=token_ids)
    tokenizer.save(partial)
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)
    return out


def _refuse_inputs(out: Path, cfg: RunConfig, run_dir: str | None) -> None:
    """A ConfigError if `out` (symbolic links resolved) is, holds or lies inside something the
    export reads: the run directory (its own `hf` export excepted), the model directory and
    the files it links to (a Hugging Face cache links into a blobs folder), a dataset file."""
    target = out.resolve()
    kept: list[Path] = [Path(p).resolve() for p in (cfg.data.train, cfg.data.eval) if p]
    if cfg.model.path and Path(cfg.model.path).is_dir():
        model = Path(cfg.model.path)
        kept += [model.resolve(), *(f.resolve() for f in model.iterdir())]
    own = Path(run_dir or ".") / "hf"  # the run's own export (rl.export_hf) and its partial
    if run_dir and target not in (own.resolve(), own.with_name("hf.partial").resolve()):
        kept.append(Path(run_dir).resolve())
    for path in kept:
        inside = path.is_dir() and path in target.parents
        if target == path or target in path.parents or inside:
            raise ConfigError(
                f"--out {out} is, holds or is inside {path}, which the export reads; "
                "choose another directory"
            )


def _check_replaceable(out: Path, force: bool) -> None:
    """Only an empty directory, or with `force` an earlier export, may be replaced."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        what = "a symbolic link" if out.is_symlink() else "not a directory"
        raise ConfigError(f"--out {out} is {what}; choose another --out")
    if not out.exists() or not any(out.iterdir()):
        return
    if not force:
        raise ConfigError(f"{out} exists and is not empty; choose another --out or pass --force")
    if not (out / MARKER).is_file():
        raise ConfigError(
            f"{out} holds files that minirl export did not write (no {MARKER}); --force "
            "replaces only an earlier export: choose another --out"
        )


def _with_dtype(model_cfg, dtype: str):
    import dataclasses

    return dataclasses.replace(model_cfg, dtype=dtype, param_dtype=dtype)


def export_adapter(params, cfg: RunConfig, tokenizer, out, force=False, source=None) -> Path:
    """A LoRA run's adapters as a PEFT adapter directory (`minirl export RUN --out DIR
    --adapter`): adapter_config.json + adapter_model.safetensors, which
    `peft.PeftModel.from_pretrained(base, DIR)` loads onto the base model: the run's model
    directory, or for a built-in run the frozen base written beside them in DIR/base (a plain
    Hugging Face checkpoint). A and B are stored as PEFT stores them, [r, in] and [out, r]."""
    from safetensors.numpy import save_file

    from minirl.hf.model_files import tensor_names

    m = cfg.model
    if not m.lora_rank:
        raise ConfigError("--adapter needs a LoRA run (model.lora_rank > 0)")
    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    for path in (out, partial):
        _refuse_inputs(path, cfg, (source or {}).get("run_dir"))
    _check_replaceable(out, force)
    _check_replaceable(partial, force=True)
    if partial.exists():
        shutil.rmtree(partial)
    adapters, base = lora.partition(params, lora.is_adapter)
    if m.path:
        base_path = str(Path(m.path).resolve())
        partial.mkdir(parents=True)
    else:  # the base lives nowhere else: write it (export_params makes `partial`)
        export_params(base, cfg, tokenizer, partial / "base", force=True, source=source)
        base_path = str((out / "base").resolve())
    (partial / MARKER).write_text(json.dumps(source or {}, indent=2) + "\n")
    tensors = {}
    for name, (where, _) in tensor_names(lora.base_config(m)).items():
        proj = str(where[-1])
        target = proj[: -len("_proj")] if where[0] == "layers" and proj.endswith("_proj") else None
        if target in m.lora_targets:
            leaves = adapters["layers"][where[1]][where[2]]
            prefix = "base_model.model." + name[: -len(".weight")]
            a, b = (np.asarray(leaves[f"{target}_lora_{x}"], np.float32) for x in "ab")
            tensors[prefix + ".lora_A.weight"] = np.ascontiguousarray(a.T)  # [r, in]
            tensors[prefix + ".lora_B.weight"] = np.ascontiguousarray(b.T)  # [out, r]
    save_file(tensors, str(partial / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_path,
        "r": m.lora_rank,
        "lora_alpha": m.lora_alpha,
        "lora_dropout": m.lora_dropout,
        "target_modules": [f"{t}_proj" for t in m.lora_targets],
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "inference_mode": True,
    }
    (partial / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)
    return out
