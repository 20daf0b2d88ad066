"""Knobs derived from your model and the work (minirl/run/derived.py), with hand-computed values.

The `custom` preset (what `--model DIR --data FILE` starts from) has prefill buckets
(64, 128, 256), data.max_new_tokens 256, 16 prompts x 8 samples a step, 200 steps and an
evaluation of 128 prompts x 8 samples. The tiny model directories (tests/hf_tiny.py) have 256
positions unless made with more. Marked `reference` (the directories are made with transformers).
The slow test is the 2-step smoke run of a tiny model with Qwen's 152k vocabulary (issue #34).
"""

import json
import time

import numpy as np
import pytest
from hf_tiny import make_model_dir

from minirl import cli
from minirl.configlib import ConfigError, config_hash
from minirl.run import runner
from minirl.run.presets import make_config
from minirl.run.run_dir import RESUMABLE_CHANGES, load_config, open_run_dir
from minirl.run.runner import Run
from minirl.run.starting_point import make_engine

pytestmark = pytest.mark.reference


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("derived")
    data = root / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {
                    "question": f"Tom has {i} apples and buys 2 more. How many now?",
                    "answer": f"#### {i + 2}",
                }
            )
            + "\n"
            for i in range(40)
        )
    )
    return {
        "short": make_model_dir(root / "short"),  # 256 positions
        "long": make_model_dir(root / "long", max_positions=4096),
        "data": data,
    }


def _config(dirs, model, *sets):
    return make_config(
        "custom",
        [f"model.path={dirs[model]}", f"data.train={dirs['data']}", "task.name=file", *sets],
    )


def _derived(cfg):
    return (cfg.data.max_new_tokens, cfg.engine.cache_len, cfg.engine.slots, cfg.eval.prompts)


def test_a_model_with_few_positions_gets_a_cache_and_budget_that_fit(dirs, tmp_path):
    """256 positions: the budget is min(256, 256 // 2) = 128, the cache min(256, 256 + 128 ->
    384) = 256, so prompts keep 128 positions; slots min(16 x 8, 64) = 64; 200 steps x 128
    rollouts // (2 x 8) = 1600 >= 128 evaluation prompts. Before, the engine refused the
    preset's 512-position cache and every row was skipped for length."""
    cfg = _config(dirs, "short")
    assert _derived(cfg) == (128, 256, 64, 128)
    run = Run(cfg, tmp_path, progress=False)
    assert len(run.task.train) > 30  # the rows fit (cache 256 - budget 128 for the prompt)
    make_engine(cfg, run.tokenizer)  # no "cache_len exceeds the model's max_seq_len"


def test_the_work_sets_slots_and_a_short_run_evaluates_less(dirs):
    """4096 positions: budget 256, cache 256 + 256 = 512. A 2-step run makes 2 x 16 x 8 = 256
    rollouts, so each evaluation gets 256 // (2 x 8) = 16 prompts; 4 x 2 rollouts a step
    decode in 8 slots; a tiny run still evaluates 8 prompts (the floor)."""
    assert _derived(_config(dirs, "long", "rl.steps=2")) == (256, 512, 64, 16)
    small = _config(dirs, "long", "rl.steps=2", "rl.prompts_per_step=4", "rl.group_size=2")
    assert _derived(small) == (256, 512, 8, 8)
    # a budget of 40 with one 64-token bucket: 64 + 40 = 104 -> 128 positions
    tight = _config(dirs, "long", "data.max_new_tokens=40", "engine.prefill_buckets=(64,)")
    assert tight.engine.cache_len == 128 and tight.data.max_new_tokens == 40


def test_what_you_set_wins_and_config_json_keeps_the_derived_values(dirs, tmp_path):
    sets = ["engine.slots=16", "engine.cache_len=200", "eval.prompts=100", "rl.steps=2"]
    cfg = _config(dirs, "long", *sets)
    assert _derived(cfg) == (100, 200, 16, 100)  # the budget: min(256, 200 // 2)
    derived = _config(dirs, "short", "rl.steps=2")
    open_run_dir(derived, tmp_path / "run")  # writes config.json as a fresh run does
    assert load_config(tmp_path / "run") == derived  # what --resume continues with
    assert _derived(load_config(tmp_path / "run")) == (128, 256, 64, 16)
    with pytest.raises(ConfigError, match="leaves no room for a prompt in the model's 256"):
        _config(dirs, "short", "data.max_new_tokens=300")


def test_a_budget_as_long_as_the_cache_you_set_is_one_line_before_the_rows_are_read(dirs, tmp_path):
    """Both set by hand, nothing derived: a 200-token budget in a 200-position cache leaves a
    prompt no room. It used to skip every row as "longer than 0 (engine.cache_len -
    data.max_new_tokens)" (-56 with a 256-token budget) and then report no good row."""
    cfg = _config(dirs, "long", "engine.cache_len=200", "data.max_new_tokens=200", "rl.steps=2")
    with pytest.raises(ConfigError, match="data.max_new_tokens=200 leaves no room for a prompt"):
        Run(cfg, tmp_path, progress=False)


def test_the_same_command_again_keeps_what_was_derived(dirs, tmp_path, monkeypatch):
    """A 4-step run evaluates max(8, 4 x 16 x 8 // (2 x 8)) = 32 prompts; the same command
    with rl.steps=5 would derive 40, but continuing the run directory keeps 32 (the evaluation
    before RL was of 32), so the config hash still matches and the run resumes."""
    sets = ["rl.steps=4"]
    started = _config(dirs, "long", *sets)
    assert started.eval.prompts == 32 and _config(dirs, "long", "rl.steps=5").eval.prompts == 40
    open_run_dir(started, tmp_path / "run")

    class Stop(Exception):
        pass

    def capture(cfg, run_dir, progress):
        raise Stop(cfg)

    monkeypatch.setattr(runner, "Run", capture)
    argv = ["train", "--model", str(dirs["long"]), "--data", str(dirs["data"])]
    with pytest.raises(Stop) as got:
        cli.main([*argv, "--run-dir", str(tmp_path / "run"), "--set", "rl.steps=5"])
    cfg = got.value.args[0]
    assert cfg.rl.steps == 5 and cfg.eval.prompts == 32
    assert config_hash(cfg, ignore=RESUMABLE_CHANGES) == config_hash(
        started, ignore=RESUMABLE_CHANGES
    )
    with pytest.raises(Stop) as got:  # what you set still wins
        cli.main([*argv, "--run-dir", str(tmp_path / "run"), "--set", "eval.prompts=12"])
    assert got.value.args[0].eval.prompts == 12


def test_a_user_models_compute_dtype_follows_the_machine(dirs, monkeypatch):
    """model.dtype is derived (bf16 where the CPU multiplies bf16 natively: minirl/modeling/
    precision.py; the suite pins float32), the weights stay float32 and keep the checkpoint's
    bits under bf16 compute; what you set wins."""
    from safetensors.numpy import load_file

    from minirl.run.starting_point import initial_params

    assert _config(dirs, "short").model.dtype == "float32"  # pinned by tests/conftest.py
    monkeypatch.setenv("MINIRL_COMPUTE_DTYPE", "bfloat16")
    cfg = _config(dirs, "short")
    # the engine computes as the model does (None): its bf16 decode is the faster one on a CPU
    assert (cfg.model.dtype, cfg.model.param_dtype, cfg.engine.dtype) == (
        "bfloat16",
        "float32",
        None,
    )
    assert _config(dirs, "short", "model.dtype=float32").model.dtype == "float32"
    assert _config(dirs, "short", "engine.exact=true").engine.dtype is None  # the model's: bitwise
    assert _config(dirs, "short", "model.dtype=bfloat16").engine.dtype is None
    params = initial_params(cfg, seed=0)
    stored = load_file(str(dirs["short"] / "model.safetensors"))["model.embed_tokens.weight"]
    assert params["embed"].dtype == np.float32 and (np.asarray(params["embed"]) == stored).all()


@pytest.mark.slow
def test_smoke_run_of_a_152k_vocabulary_model_is_quick(tmp_path, capsys):
    """`minirl train --model DIR --data FILE --set rl.steps=2` plus the quick settings of
    docs/your_own_model.md, on a 2-layer model with Qwen's vocabulary (151,643 tokens, 151,680
    ids): it finishes, with knobs sized to the run: 4 x 8 rollouts a step in 32 slots, a
    256 + 64 -> 320-position cache, 2 x 4 x 8 // (2 x 8) = 4 -> 8 (the floor) evaluation
    prompts, and the final weights exported."""
    model = make_model_dir(tmp_path / "m", vocab_tokens=151_643, max_positions=32768)
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"What is {i} + 2?", "answer": f"#### {i + 2}"}) + "\n"
            for i in range(64)
        )
    )
    t0 = time.perf_counter()
    argv = ["train", "--model", str(model), "--data", str(data), "--run-dir", str(tmp_path / "r")]
    quick = ["rl.steps=2", "rl.prompts_per_step=4", "data.max_new_tokens=64"]
    assert cli.main([*argv, *[a for s in quick for a in ("--set", s)]]) == 0
    seconds = time.perf_counter() - t0
    cfg = load_config(tmp_path / "r")
    assert (cfg.engine.slots, cfg.engine.cache_len, cfg.eval.prompts) == (32, 320, 8)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["counters"]["steps"] == 2 and "after" in summary
    assert (tmp_path / "r" / "hf" / "model.safetensors").is_file()
    assert "eval" in capsys.readouterr().err  # the evaluation's progress bar
    with capsys.disabled():  # the figure docs/your_own_model.md quotes (nothing asserted on it)
        print(f"\nsmoke run: {seconds:.0f} s")


def test_a_large_model_recomputes_each_block_unless_told(dirs):
    """trainer.remat derives "nothing" from REMAT_FROM_PARAMS parameters on (the 0.5B shape's
    peak 11.25 -> 9.75 GB for a 1.04x step time, docs/trainer.md); a small model keeps the
    preset's "none", and a value you set is kept."""
    import dataclasses

    from minirl.run.derived import REMAT_FROM_PARAMS, derive_for_model

    cfg = _config(dirs, "short")
    assert cfg.trainer.remat == "none" and cfg.model.num_params() < REMAT_FROM_PARAMS
    vocab = REMAT_FROM_PARAMS // cfg.model.dim + 1  # the embedding alone crosses the line
    big = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab))
    assert big.model.num_params() >= REMAT_FROM_PARAMS
    assert derive_for_model(big).trainer.remat == "nothing"
    assert derive_for_model(big, ["trainer.remat=none"]).trainer.remat == "none"
    assert _config(dirs, "short", "trainer.remat=dots").trainer.remat == "dots"


def test_a_groups_prompt_runs_once_unless_told(dirs):
    """trainer.share_prompts derives on where a group's samples share a prompt (the trainer's
    step equals the plain one: tests/training/test_trainer.py); off for one sample per prompt
    or with trainer.pack, and a value you set is kept."""
    assert _config(dirs, "short").rl.group_size > 1
    assert _config(dirs, "short").trainer.share_prompts is True
    assert _config(dirs, "short", "rl.group_size=1").trainer.share_prompts is False
    assert _config(dirs, "short", "trainer.pack=true").trainer.share_prompts is False
    assert _config(dirs, "short", "trainer.share_prompts=false").trainer.share_prompts is False
