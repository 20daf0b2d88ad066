"""The user's path, end to end (issue #15): a Hugging Face model directory and a dataset file in,
RL from the command line, a Hugging Face checkpoint out.

Tiny random Qwen2 (GQA, q/k/v biases, tied), Qwen3 (q/k norm, tied) and Qwen3-MoE directories with a
`tokenizers` BPE tokenizer, a ChatML chat template and two EOS ids in generation_config.json
(tests/hf_tiny.py) are trained for 2 RL steps by `minirl train --model DIR --data FILE`; then
`minirl export` writes a directory that `transformers` loads with logits equal to minirl's, with
the same EOS ids. A resumed `--model` run ends bitwise equal to an uninterrupted one.
Marked `reference` (needs transformers/torch).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from hf_tiny import make_model_dir

from minirl import cli
from minirl.hf.model_files import load_hf
from minirl.store.checkpoints import CheckpointManager

pytestmark = pytest.mark.reference
torch.set_num_threads(1)

# Small shapes for every run here (one set of compiled shapes, shared through JAX's cache).
SMALL_RUN = [
    "rl.steps=2",
    "rl.prompts_per_step=4",
    "rl.group_size=2",
    "rl.checkpoint_every=1",
    "eval.prompts=4",
    "eval.samples=2",
    "engine.slots=8",
    "engine.cache_len=96",
    "engine.prefill_buckets=(64,)",
    "engine.prefill_rows=4",
    "engine.decode_chunk=4",
    "data.max_new_tokens=16",
    "trainer.learning_rate=1e-3",
]


def _sets(items):
    return [a for item in items for a in ("--set", item)]


def _problems(n, offset):
    rows = []
    for i in range(offset, offset + n):
        a, b = i % 7 + 1, i % 5 + 2
        rows.append(
            {
                "question": f"Tom has {a} apples and buys {b} more. How many now?",
                "answer": f"{a} + {b} = {a + b}\n#### {a + b}",
            }
        )
    return rows


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    train, test = d / "train.jsonl", d / "test.jsonl"
    lines = [json.dumps(r) for r in _problems(24, 0)]
    lines.insert(3, "{not json")  # a bad row: counted, never fatal
    train.write_text("\n".join(lines) + "\n")
    test.write_text("".join(json.dumps(r) + "\n" for r in _problems(6, 100)))
    return train, test


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return {
        arch: make_model_dir(tmp_path_factory.mktemp(arch), arch=arch)
        for arch in ("qwen2", "qwen3", "qwen3_moe")
    }


def _train(model_dir, data, run_dir, extra=()):
    train, test = data
    argv = [
        "train",
        "--model",
        str(model_dir),
        "--data",
        str(train),
        "--eval-data",
        str(test),
        "--verifier",
        "math",
        "--run-dir",
        str(run_dir),
        "--quiet",
        *_sets([*SMALL_RUN, *extra]),
    ]
    assert cli.main(argv) == 0


def _minirl_logits(path, tokens):
    _, model = load_hf(path)
    graphdef, state = nnx.split(model)
    return np.asarray(jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))(state, jnp.asarray(tokens)))


@pytest.mark.parametrize(
    "arch",  # qwen2 in the default lane; qwen3 and its MoE compile their own (~14 s cold each)
    ["qwen2", *(pytest.param(a, marks=pytest.mark.slow) for a in ("qwen3", "qwen3_moe"))],
)
def test_train_then_export_loads_in_transformers(arch, model_dirs, data, tmp_path):
    model_dir = model_dirs[arch]
    run_dir, out = tmp_path / "run", tmp_path / "exported"
    _train(model_dir, data, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary) >= {"before", "after"} and 0 <= summary["after"]["pass@1"] <= 1
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["inputs"]["model"]["path"] == str(model_dir.resolve())
    assert len(meta["inputs"]["data"]["train"]["sha256"]) == 64

    assert cli.main(["export", str(run_dir), "--out", str(out)]) == 0
    tokens = np.random.default_rng(0).integers(0, 200, (2, 12)).astype(np.int32)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        hf = hf_model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    mine = _minirl_logits(out, tokens)
    assert np.abs(hf - mine).max() <= 1e-4

    # The exported weights are the run's last checkpoint, and they moved away from the start.
    ckpt = CheckpointManager(run_dir).restore()
    assert ckpt.step == 2
    assert np.abs(mine - _minirl_logits(model_dir, tokens)).max() > 1e-6

    # EOS ids, BOS and padding travel with it: transformers.generate stops where minirl does.
    src = json.loads((model_dir / "generation_config.json").read_text())
    gen = transformers.GenerationConfig.from_pretrained(out)
    want = src["eos_token_id"] if isinstance(src["eos_token_id"], list) else [src["eos_token_id"]]
    got = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
    assert got == want and gen.pad_token_id == src.get("pad_token_id", gen.pad_token_id)
    src_tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    out_tok = transformers.AutoTokenizer.from_pretrained(out)
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    assert out_tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    ) == src_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    # The run wrote its own export at the end too (rl.export_hf, on in the `custom` preset).
    assert np.array_equal(_minirl_logits(run_dir / "hf", tokens), mine)


@pytest.mark.slow  # ~20 s cold: three runs; bitwise resume stays in the default lane (tests/control, tests/run)
def test_resumed_model_run_equals_uninterrupted(model_dirs, data, tmp_path):
    model_dir = model_dirs["qwen2"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    _train(model_dir, data, whole, ["rl.steps=3"])
    _train(model_dir, data, parts, ["rl.steps=2"])
    _train(model_dir, data, parts, ["rl.steps=3"])  # same run directory: resumes at step 2
    a, b = CheckpointManager(whole).restore(), CheckpointManager(parts).restore()
    assert a.step == b.step == 3
    leaves_a, leaves_b = jax.tree.leaves(a.params), jax.tree.leaves(b.params)
    assert all(np.array_equal(x, y) for x, y in zip(leaves_a, leaves_b, strict=True))
    rows = lambda d: [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward/mean"] for r in rows(whole)] == [r["reward/mean"] for r in rows(parts)]


def test_export_refuses_clearly(tmp_path, capsys):
    assert cli.main(["export", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "not a minirl run directory" in capsys.readouterr().err


def test_careless_input_is_a_one_line_error(model_dirs, data, tmp_path, capsys):
    train, test = data
    model = str(model_dirs["qwen2"])

    def error(*argv):
        assert cli.main(["train", "--quiet", "--run-dir", str(tmp_path / "r"), *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("minirl train: error:") and "Traceback" not in err
        return err

    assert "model.dim comes from" in error(
        "--model", model, "--data", str(train), "--set", "model.dim=64"
    )
    assert "no dataset file" in error("--model", model, "--data", str(tmp_path / "nope.jsonl"))
    assert "unknown dataset format '.csv'" in error(
        "--model", model, "--data", str(tmp_path / "x.csv")
    )
    assert "data.verifier='nope'" in error(
        "--model", model, "--data", str(train), "--verifier", "nope"
    )
    assert "has no config.json" in error("--model", str(tmp_path), "--data", str(train))
    moe = tmp_path / "moe"
    moe.mkdir()
    config = json.loads((model_dirs["qwen2"] / "config.json").read_text())
    (moe / "config.json").write_text(json.dumps({**config, "num_experts": 8}))
    assert "num_experts = 8: mixture-of-experts" in error("--model", str(moe), "--data", str(train))
    assert "data.eval does nothing without a dataset" in error("--set", f"data.eval={test}")


def test_resume_refuses_changed_data_and_export_never_replaces_its_inputs(
    model_dirs, data, tmp_path, capsys
):
    train, test = data
    copy = tmp_path / "train.jsonl"
    copy.write_bytes(train.read_bytes())
    _train(model_dirs["qwen2"], (copy, test), tmp_path / "run", ["rl.steps=1"])
    copy.write_bytes(train.read_bytes() + b'{"question": "one more?", "answer": "1"}\n')
    assert (
        cli.main(["train", "--quiet", "--resume", str(tmp_path / "run"), "--set", "rl.steps=2"])
        == 2
    )
    assert "started on other data or model files" in capsys.readouterr().err
    # `minirl export --force` replaces --out: never the run, the model directory or the data
    before = sorted(p.name for p in model_dirs["qwen2"].iterdir())
    for out in (tmp_path / "run", tmp_path, model_dirs["qwen2"]):
        assert cli.main(["export", str(tmp_path / "run"), "--out", str(out), "--force"]) == 2
        assert "which the export reads" in capsys.readouterr().err
    assert (tmp_path / "run" / "checkpoints").is_dir() and copy.exists()
    assert sorted(p.name for p in model_dirs["qwen2"].iterdir()) == before


def test_lora_knobs_stay_settable_beside_a_model_directory(model_dirs, data):
    from minirl.configlib import ConfigError
    from minirl.run.presets import make_config

    sets = [f"model.path={model_dirs['qwen2']}", f"data.train={data[0]}"]
    sets += ["model.lora_rank=8", "model.lora_targets=q,v"]
    model = make_config("custom", sets).model
    assert (model.lora_rank, model.lora_targets, model.dim) == (8, ("q", "v"), 64)
    with pytest.raises(ConfigError, match="model.dim comes from"):  # shapes still are not
        make_config("custom", [*sets, "model.dim=32"])


@pytest.mark.slow  # ~10 s: a 2-step run, an export and peft
def test_a_lora_model_run_exports_a_peft_adapter_for_the_model_directory(
    model_dirs, data, tmp_path
):
    """`minirl train --model DIR --set model.lora_rank=8`: the LoRA knobs stay settable beside a
    model directory, the base stays the directory's weights bit for bit, and the PEFT export
    loads onto DIR itself in transformers with minirl's logits."""
    import peft

    from minirl.modeling import lora
    from minirl.modeling.model import init_model
    from minirl.run.run_dir import load_config

    model_dir = model_dirs["qwen2"]
    run_dir, out = tmp_path / "run", tmp_path / "adapter"
    _train(model_dir, data, run_dir, ["model.lora_rank=8", "model.lora_targets=q,v,down"])
    ckpt, cfg = CheckpointManager(run_dir).restore(), load_config(run_dir).model
    _, start = load_hf(model_dir)
    base = lora.partition(ckpt.params, lora.is_adapter)[1]
    jax.tree.map(np.testing.assert_array_equal, base, nnx.to_pure_dict(nnx.state(start)))
    assert cli.main(["export", str(run_dir), "--out", str(out), "--adapter"]) == 0
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(model_dir.resolve())
    assert config["target_modules"] == ["q_proj", "v_proj", "down_proj"] and config["r"] == 8
    tokens = np.random.default_rng(0).integers(0, 200, (2, 12)).astype(np.int32)
    graphdef = nnx.split(init_model(cfg))[0]
    mine = np.asarray(nnx.merge(graphdef, ckpt.params)(jnp.asarray(tokens)))
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        hf = peft.PeftModel.from_pretrained(hf_model, out)(torch.tensor(tokens)).logits.numpy()
    assert np.abs(mine - _minirl_logits(model_dir, tokens)).max() > 1e-6  # the adapters moved
    assert np.abs(hf - mine).max() <= 1e-4
