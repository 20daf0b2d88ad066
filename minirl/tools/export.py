"""`minirl export RUN_DIR --out DIR [--step N]`: a run's weights as a Hugging Face checkpoint.

The directory it writes is what `transformers.AutoModelForCausalLM.from_pretrained(DIR)` and
vLLM load: `config.json` (with the bos/eos/pad ids), `model.safetensors`, `generation_config.json`
(every EOS id, so `generate` stops where minirl's engine stops) and the tokenizer files
(`tokenizer.json`, `tokenizer_config.json` with the chat template). Logits equal minirl's
(tests/test_export.py). The architecture is the model directory's (Qwen2, Qwen3 or Llama) for a
run started with --model, else the one whose layer shapes match (minirl/tools/hf.py).

The checkpoint is written to `DIR.partial` and renamed into place, so a crash never leaves a
half-written DIR that looks complete. An existing, non-empty DIR is refused unless `force`; a DIR
that is (or holds) the run directory, the model directory or a dataset file is always refused.
Simplified on purpose: one safetensors file (or shards of `max_shard_bytes`), weights in the
run's float32 unless `dtype="bfloat16"` is asked for.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp

from minirl.checkpoints import CheckpointManager
from minirl.config import RunConfig
from minirl.configlib import ConfigError


def export_run(
    run_dir, out, step: int | None = None, dtype: str | None = None, force: bool = False
) -> Path:
    """Write the checkpoint of `step` (default: the latest) of the run in `run_dir` to `out`."""
    from minirl.tools.inputs import load_tokenizer
    from minirl.tools.run_dir import load_config

    run_dir = Path(run_dir)
    if not (run_dir / "config.json").exists():
        raise ConfigError(f"{run_dir} is not a minirl run directory (no config.json)")
    cfg = load_config(run_dir)
    ckpts = CheckpointManager(run_dir)
    if step is not None and step not in ckpts.all_steps():
        raise ConfigError(f"{run_dir} has no checkpoint of step {step}; it has {ckpts.all_steps()}")
    ckpt = ckpts.restore(step=step)
    if ckpt is None:
        raise ConfigError(f"{run_dir} has no checkpoint to export")
    source = {"run_dir": str(run_dir.resolve()), "step": ckpt.step}
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
    """Write `params` (a pure dict) of a run with config `cfg` and its tokenizer to `out`."""
    from minirl.tools.hf import TokenIds, architecture_of, read_config, save_hf

    out = Path(out)
    inputs = [cfg.model.path, cfg.data.train, cfg.data.eval, (source or {}).get("run_dir")]
    for kept in (Path(p).resolve() for p in inputs if p):
        if out.resolve() == kept or out.resolve() in kept.parents:  # --force would delete it
            raise ConfigError(
                f"--out {out} is or holds {kept}, which the export reads; choose another directory"
            )
    if out.exists() and any(out.iterdir()) and not force:
        raise ConfigError(f"{out} exists and is not empty; choose another --out or pass --force")
    model_cfg = cfg.model
    if dtype is not None and dtype != model_cfg.param_dtype:
        model_cfg = _with_dtype(model_cfg, dtype)
        params = jax.tree.map(lambda a: jnp.asarray(a, model_cfg.storage_dtype), params)
    arch = architecture_of(read_config(cfg.model.path)) if cfg.model.path else None
    token_ids = TokenIds(bos=tokenizer.bos_id, eos=tuple(tokenizer.eos_ids), pad=tokenizer.pad_id)

    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    save_hf(params, model_cfg, partial, architecture=arch, token_ids=token_ids)
    tokenizer.save(partial)
    (partial / "minirl_export.json").write_text(json.dumps(source or {}, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)
    return out


def _with_dtype(model_cfg, dtype: str):
    import dataclasses

    return dataclasses.replace(model_cfg, dtype=dtype, param_dtype=dtype)
