"""On-policy distillation from the command line (issue #48): `minirl train --teacher DIR`.

A user's two models of one family, a small student and a larger teacher (tiny random Qwen2s with
the same byte-level BPE tokenizer, made by tests/hf_tiny.py), and a dataset file:

- `minirl train --model S --data F --teacher T` trains the student with the `distill` loss; every
  step's metrics.jsonl line holds `train/distill/reverse_kl`, `train/distill/teacher_logp` and
  `time/teacher`, and TensorBoard has the same numbers; meta.json records the teacher.
- A teacher with another vocabulary (a Llama-style tokenizer) is one line on stderr, exit 2.
- Slow lane: the student distilled from ITSELF in exact mode sees a reverse KL of exactly 0
  (the engine's decode and the teacher's forward give the same bits); a mixed run (GRPO's
  reward + the teacher's term) with the teacher and engine in worker processes and the async
  scheduler one step off-policy; a Ray actor teacher equals the in-process run bit for bit.
Marked `reference` (the model directories are made with transformers).
"""

import json

import numpy as np
import pytest
from hf_tiny import make_model_dir, make_tokenizer_dir

from minirl import cli
from minirl.measure.metrics_log import read_metrics
from minirl.run.tracking import tensorboard_tag

pytestmark = pytest.mark.reference

SMALL_RUN = [
    "rl.steps=2",
    "rl.prompts_per_step=4",
    "rl.group_size=2",
    "rl.checkpoint_every=2",
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
TEACHER_DIMS = {"hidden_size": 96, "num_hidden_layers": 3, "intermediate_size": 192}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    rows = [
        {
            "question": f"Tom has {i % 7 + 1} apples and buys 2 more. How many now?",
            "answer": f"#### {i % 7 + 3}",
        }
        for i in range(30)
    ]
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    student = make_model_dir(root / "student", arch="qwen2", seed=0)
    teacher = make_model_dir(root / "teacher", arch="qwen2", seed=1, dims=TEACHER_DIMS)
    assert (student / "tokenizer.json").read_bytes() == (teacher / "tokenizer.json").read_bytes()
    other = make_tokenizer_dir(root / "llama", style="llama")  # refused before any config is read
    return {"data": data, "student": student, "teacher": teacher, "other": other}


def _train(files, run_dir, teacher, *sets):
    argv = ["train", "--model", str(files["student"]), "--data", str(files["data"])]
    argv += ["--teacher", str(teacher), "--run-dir", str(run_dir), "--quiet"]
    for item in [*SMALL_RUN, *sets]:
        argv += ["--set", item]
    return cli.main(argv)


def test_minirl_train_teacher_distils_a_user_model(files, tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    run = tmp_path / "run"
    assert _train(files, run, files["teacher"], "log.tensorboard=true") == 0
    cfg = json.loads((run / "config.json").read_text())["config"]
    assert cfg["rl"]["loss"] == "distill" and cfg["rl"]["teacher"] == str(
        files["teacher"].resolve()
    )
    meta = json.loads((run / "meta.json").read_text())
    assert meta["inputs"]["teacher"]["path"] == str(files["teacher"].resolve())
    records = read_metrics(run)
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert np.isfinite(r["train/distill/reverse_kl"]) and r["train/distill/reverse_kl"] != 0.0
        assert r["train/distill/teacher_logp"] < 0 and r["time/teacher"] > 0
    acc = event_accumulator.EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    for key in ("train/distill/reverse_kl", "train/distill/teacher_logp"):
        points = {e.step: e.value for e in acc.Scalars(tensorboard_tag(key))}
        assert points == {r["step"]: np.float32(r[key]) for r in records}


def test_a_teacher_with_another_vocabulary_is_a_one_line_error(files, tmp_path, capsys):
    assert _train(files, tmp_path / "run", files["other"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "vocabulary differs from the student's" in err, err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_self_distillation_in_exact_mode_has_zero_reverse_kl(files, tmp_path):
    """The teacher is the student's own directory: at step 1 (on-policy, the weights the engine
    sampled with) the teacher's forward gives the engine's bits, so log mu - log pi_T is 0."""
    run = tmp_path / "run"
    assert _train(files, run, files["student"], "engine.exact=true", "rl.steps=1") == 0
    (record,) = read_metrics(run)
    assert record["train/distill/reverse_kl"] == 0.0 and record["lag/mean"] == 0.0
    assert record["train/loss"] == 0.0


@pytest.mark.slow
def test_mixed_reward_and_teacher_in_worker_processes_async_one_step_off(files, tmp_path):
    sets = ["rl.loss=grpo", "rl.distill_coef=0.5", "rl.distill_discount=0.9", "rl.workers=process"]
    sets += ["rl.scheduler=async", "rl.eta=1", "rl.max_lag=2", "rl.steps=3"]
    assert _train(files, tmp_path / "run", files["teacher"], *sets) == 0
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(np.isfinite(r["train/distill/reverse_kl"]) for r in records)
    assert max(r["lag/mean"] for r in records) <= 1.0  # within k = 2
