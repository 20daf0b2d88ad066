"""`minirl export`: what it refuses to delete, and what it carries over from the source model.

Run directories are made without training (config.json + one checkpoint of the start weights),
so nothing here compiles. The refusals use the built-in fixture model; the carried-over
settings use tiny Hugging Face directories (tests/hf_tiny.py, marked `reference`).
"""

import json
import os

import numpy as np
import pytest

from minirl import cli
from minirl.modeling.model import param_shapes
from minirl.run.presets import make_config
from minirl.run.run_dir import record_config
from minirl.store.checkpoints import CheckpointManager


def _run_dir(path, cfg, params=None):
    """A run directory as `minirl train` leaves it: config.json and a checkpoint of step 1."""
    if params is None:  # any values: what is checked here is where files go
        params = _zeros(param_shapes(cfg.model))
    path.mkdir(parents=True)
    record_config(cfg, path)
    CheckpointManager(path).save(1, params, {}, {})
    return path


def _zeros(tree):
    if isinstance(tree, dict):
        return {k: _zeros(v) for k, v in tree.items()}
    return np.zeros(tree.shape, tree.dtype)


def _export(run, out, *extra) -> int:
    """minirl export's exit code."""
    return cli.main(["export", str(run), "--out", str(out), *extra])


def test_force_never_deletes_the_run_its_inputs_or_foreign_files(tmp_path, capsys):
    """Issue #34: `--out RUN/checkpoints --force` replaced the run's checkpoints. Every --out
    that is, holds or lies inside the run directory (symbolic links resolved) or a dataset file
    is refused, --force or not; --force replaces only an earlier export."""
    run = _run_dir(tmp_path / "run", make_config("fixture"))
    (tmp_path / "link").symlink_to(run / "checkpoints")
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    for out in (
        run / "checkpoints",  # inside the run
        run / "checkpoints" / "new",  # deeper inside
        run,  # the run itself
        tmp_path,  # holds the run
        tmp_path / "link",  # a link into the run
    ):
        assert _export(run, out, "--force") == 2
        err = capsys.readouterr().err
        assert "which the export reads; choose another directory" in err, (out, err)
        assert len(err.splitlines()) == 1
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before

    foreign = tmp_path / "mine"  # somebody's files: --force is not enough
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    assert _export(run, foreign, "--force") == 2
    assert "holds files that minirl export did not write" in capsys.readouterr().err
    assert (foreign / "notes.txt").read_text() == "keep me"

    out = tmp_path / "exported"  # an earlier export is replaced; the run's own hf/ is allowed
    assert _export(run, out) == 0
    assert _export(run, out) == 2 and "pass --force" in capsys.readouterr().err
    assert _export(run, out, "--force") == 0
    assert _export(run, run / "hf") == 0 and (run / "hf" / "minirl_export.json").is_file()
    assert sorted(os.listdir(out)) == [
        "config.json",
        "generation_config.json",
        "minirl_export.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_dataset_files_and_their_links_are_never_replaced(tmp_path, capsys):
    data = tmp_path / "data" / "train.jsonl"
    data.parent.mkdir()
    data.write_text(
        "".join(json.dumps({"question": f"{i}+1?", "answer": "2"}) + "\n" for i in range(9))
    )
    (tmp_path / "data_link").symlink_to(data.parent)
    cfg = make_config("fixture", [f"data.train={data}", "task.name=file"])
    run = _run_dir(tmp_path / "run", cfg)
    for out in (data, data.parent, tmp_path / "data_link", tmp_path / "data_link" / "train.jsonl"):
        assert _export(run, out, "--force") == 2
        assert "which the export reads" in capsys.readouterr().err
    assert data.is_file()
    assert _export(run, tmp_path / "data" / "exported") == 0  # beside the data file is fine


# What Llama 3 and Qwen ship (the settings only; ids are the tiny tokenizer's): sampling
# settings a chat model is tuned for, Llama 3 with no padding token at all.
LLAMA3_GENERATION = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "max_length": 4096}
QWEN_GENERATION = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20}


@pytest.mark.reference
@pytest.mark.parametrize("style", ["llama", "qwen"])
def test_export_carries_the_source_settings_unchanged(style, tmp_path):
    """Issue #34: generation_config.json was written from scratch (temperature, top_k, top_p,
    max_length and Qwen's bos id lost) and Llama 3 got a padding token it does not have. The
    source's generation_config.json, config.json token ids and special tokens travel as they
    are; transformers reads the same settings back."""
    import transformers
    from flax import nnx
    from hf_tiny import make_model_dir

    from minirl.hf.model_files import load_hf

    model = make_model_dir(tmp_path / "model", arch="qwen2", style=style)
    config = json.loads((model / "config.json").read_text())
    generation = json.loads((model / "generation_config.json").read_text())
    if style == "llama":  # as Llama 3 ships: no pad_token_id anywhere, sampling settings
        del config["pad_token_id"], generation["pad_token_id"]
        generation.update(LLAMA3_GENERATION)
    else:
        generation.update(QWEN_GENERATION, bos_token_id=generation["pad_token_id"])
    (model / "config.json").write_text(json.dumps(config))
    (model / "generation_config.json").write_text(json.dumps(generation, indent=1))
    source_tokenizer = json.loads((model / "tokenizer_config.json").read_text())
    blobs = tmp_path / "blobs"  # a Hugging Face cache: the model's files link into blobs/
    blobs.mkdir()
    (model / "model.safetensors").rename(blobs / "3f2a")
    (model / "model.safetensors").symlink_to(blobs / "3f2a")
    (tmp_path / "model_link").symlink_to(model)
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1 + 1?", "answer": "2"}\n')
    cfg = make_config("custom", [f"model.path={model}", f"data.train={data}"])
    _, weights = load_hf(model)
    run = _run_dir(tmp_path / "run", cfg, nnx.to_pure_dict(nnx.state(weights, nnx.Param)))

    for bad in (model, model / "sub", tmp_path / "model_link", blobs, tmp_path):
        assert _export(run, bad, "--force") == 2  # the model directory and what it links to
    assert (blobs / "3f2a").stat().st_size > 0 and (model / "config.json").is_file()
    out = tmp_path / "exported"
    assert _export(run, out) == 0
    assert (out / "generation_config.json").read_bytes() == (
        model / "generation_config.json"
    ).read_bytes()
    written = json.loads((out / "config.json").read_text())
    for field in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert written.get(field, "absent") == config.get(field, "absent"), field
    assert json.loads((out / "tokenizer_config.json").read_text()) == source_tokenizer
    theirs = transformers.GenerationConfig.from_pretrained(out)
    for key, value in generation.items():
        assert getattr(theirs, key) == value, key
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    want_pad = None if style == "llama" else "<|endoftext|>"
    assert tokenizer.pad_token == want_pad


@pytest.mark.reference
def test_a_moe_export_keeps_the_source_config(tmp_path):
    """`minirl export` of a run on a Qwen3-MoE directory had dropped the source config.json's
    router_aux_loss_coef and output_router_logits (set here away from transformers' defaults,
    0.001 and false): transformers reloaded the export with the defaults. Now transformers
    reads back the source's config, field for field."""
    import transformers
    from flax import nnx
    from hf_tiny import make_model_dir

    from minirl.hf.model_files import load_hf

    model = make_model_dir(tmp_path / "model", arch="qwen3_moe")
    config = json.loads((model / "config.json").read_text())
    config.update(router_aux_loss_coef=0.02, output_router_logits=True)
    (model / "config.json").write_text(json.dumps(config))
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1 + 1?", "answer": "2"}\n')
    cfg = make_config("custom", [f"model.path={model}", f"data.train={data}"])
    _, weights = load_hf(model)
    run = _run_dir(tmp_path / "run", cfg, nnx.to_pure_dict(nnx.state(weights, nnx.Param)))
    assert _export(run, tmp_path / "out") == 0
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert {k: written[k] for k in config} == config
    theirs, source = (
        transformers.AutoConfig.from_pretrained(d).to_dict() for d in (tmp_path / "out", model)
    )
    del theirs["_name_or_path"], source["_name_or_path"]
    assert theirs == source
    assert (theirs["router_aux_loss_coef"], theirs["output_router_logits"]) == (0.02, True)


def test_a_built_in_run_still_gets_its_tokenizer_ids(tmp_path):
    """No source directory: generation_config.json comes from the character tokenizer."""
    from minirl.modeling.tokenizer import CharTokenizer

    run = _run_dir(tmp_path / "run", make_config("fixture"))
    assert _export(run, tmp_path / "out") == 0
    tok = CharTokenizer()
    gen = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    eos = tok.eos_ids[0] if len(tok.eos_ids) == 1 else list(tok.eos_ids)
    assert gen == {
        "bos_token_id": tok.bos_id,
        "eos_token_id": eos,
        "pad_token_id": tok.pad_id,
        "do_sample": True,
    }
