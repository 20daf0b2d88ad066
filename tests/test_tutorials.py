"""Every tutorial's fast mode runs, exits 0, prints its results and writes what it promises.

Each lesson is run as a user would run it, `python tutorials/NN_name.py --fast --out DIR`, in a
subprocess (fresh JAX, its own argument parsing, its own `if __name__ == "__main__"`). The checks
are on what the lesson claims: the figure is a real PNG, `results.json` holds the numbers, and the
printed text contains the lines the lesson's docstring tells the reader to look for. Each lesson
also checks its own claims and exits non-zero when one fails (e.g. exact mode not bitwise), so a
regression in the library shows up here as a failing lesson.

Each lesson is also a notebook (tutorials/build_notebooks.py; tests/test_notebooks.py keeps
them in step): the slow lane runs the notebooks of lessons 01-05 in a Jupyter kernel (nbclient),
in fast mode, with the same checks as the scripts.

The static tests check the rules of tutorials/README.md: every lesson has a `--fast` flag and
quotes its measured full-mode output together with the command and the machine, and the table
of contents lists every lesson.

Cost: the fast modes together take a few minutes (most about 10-30 s alone; 11 and 14 start
several processes or train several arms and take minutes on a shared machine), so only the
cheapest (FAST_IN_DEFAULT_LANE) run in the default lane; the rest are `slow`, and the default
lane imports every lesson instead. They share the JAX persistent compilation cache with the
rest of the suite (tests/conftest.py).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "tutorials"
LESSONS = sorted(p.name for p in TUTORIALS.glob("[0-9][0-9]_*.py"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TIMEOUT_S = 900  # generous: the machine may be shared; a fast mode takes ~10-30 s alone
# The fast modes run in the default lane only for these cheap lessons (a few CPU seconds each);
# the others are in the slow lane (`pytest -m slow`, which CI runs as well), and every lesson
# is imported in the default lane (test_every_lesson_imports).
FAST_IN_DEFAULT_LANE = ("03_verifiers.py",)
# Each lesson is also a notebook (tutorials/build_notebooks.py); the slow lane runs these
# notebooks in a Jupyter kernel, in fast mode (issue #49).
NOTEBOOKS_RUN = LESSONS[:5]

# What each lesson promises in fast mode: files it writes, lines it prints, facts in results.json.
EXPECTED = {
    "01_model_and_kv_cache.py": dict(
        files=["kv_cache_mismatch.png"],
        prints=[
            "full forward (trainer) vs prefill + decode",
            "exact / default =",
            "exact mode: decode and full forward are bitwise equal",
        ],
        check=lambda r: (
            r["comparison"]["float32/exact"]["bitwise_equal"]
            and r["comparison"]["bfloat16/exact"]["bitwise_equal"]
            and 0 <= r["comparison"]["float32/default"]["max_abs_dlogit"] < 1e-4
            and r["timing"]["full_forward"]["exact_over_default"] > 0
        ),
    ),
    "02_rollout_engine.py": dict(
        files=["static_vs_continuous.png"],
        prints=["continuous / static", "behaviour log-probs", "sampled alone == inside the batch"],
        check=lambda r: (
            r["throughput_ratio"] > 0
            and r["decode_calls"]["static"] > r["decode_calls"]["continuous"]
            and r["logprobs_match_trainer"]
            and r["logprob_checks"]["alone_equals_in_batch"]
            and len(r["versions_of_rollout_0"]) == 2
        ),
    ),
    "03_verifiers.py": dict(
        files=["verdicts.png"],
        prints=[
            "accepted (3/3 tests)",
            "wrong answer on test 1",
            "time limit on test 1",
            "no sandbox process left",
        ],
        check=lambda r: (
            all(r["host_checks"].values())
            and r["code"]["correct"]["reward"] == 1.0
            and all(h["reward"] == 0.0 for h in r["hostile"].values())
            and [m["reward"] for m in r["math"]][:3] == [1.0, 1.0, 1.0]
        ),
    ),
    "04_loss_as_parts.py": dict(
        files=["clip_mask_vs_regulariser.png"],
        prints=["== get_preset('cispo'): True", "grpo_A_pos_masked_beyond_1.2     True"],
        check=lambda r: (
            all(r["claims"].values())
            and r["final_ratio_of_rewarded_token"]["GRPO"]
            < 1.5
            < r["final_ratio_of_rewarded_token"]["CISPO"]
        ),
    ),
    "05_first_rl_run.py": dict(
        files=["pass_at_k.png", "run/summary.json", "run/metrics.jsonl"],
        prints=[
            "held-out before RL",
            "held-out after RL",
            "every batch sampled by the weights it trained (lag 1): True",
        ],
        check=lambda r: (
            r["on_policy"]
            and r["unclipped"]
            and all(
                0.0 <= r[w][k] <= 1.0
                for w in ("before", "after")
                for k in ("pass@1", f"pass@{r['samples']}")
            )
        ),
    ),
    "06_staleness_knobs.py": dict(
        files=[
            "reward_vs_step_and_time.png",
            "runs/j1_k1/metrics.jsonl",
            "runs/j4_k8/metrics.jsonl",
        ],
        prints=["every batch within its bound k: True", "step time relative to (1, 1)"],
        check=lambda r: (
            r["bound_holds"]
            and sorted(r["settings"]) == ["j1_k1", "j1_k2", "j4_k4", "j4_k8"]
            and r["settings"]["j1_k1"]["mean_lag"] == 1.0  # synchronous: always fresh data
            and r["settings"]["j1_k2"]["worst_step_lag"] <= 2.0
            and all(s["step_seconds"] > 0 for s in r["settings"].values())
        ),
    ),
    "07_async_decoupled_ppo.py": dict(
        files=["naive_vs_decoupled.png", "runs/naive_ppo_eta4_seed0/metrics.jsonl"],
        prints=["staleness = eta on every step after the first eta: True", "AReaL Table 2"],
        check=lambda r: (
            r["lag_equals_eta"]
            and r["naive_clips_more_when_stale"]
            and r["inside_the_step"]["eta0"]["dropped"] == 0.0  # fresh data: c = 1, none dropped
            and r["inside_the_step"]["eta4"]["ess_uncapped"] < 1.0  # stale data: unequal weights
            and set(r["shape_of_table_2"])
            == {
                "naive_degrades_with_eta",
                "decoupled_near_the_oracle",
                "decoupled_beats_naive_when_stale",
            }
        ),
    ),
    "08_training_inference_mismatch.py": dict(
        files=["mismatch.png", "exact/metrics.jsonl", "tis_mis/metrics.jsonl"],
        prints=["Step 1. minirl diagnose", "exact rows 0: True", "collapse under mismatch?"],
        check=lambda r: (
            all(r["claims"].values())
            and all(x == 0.0 for x in r["runs"]["exact"]["dlogp_max_per_step"])
            and r["runs"]["mismatch"]["dlogp_mean"] > 1e-4
            and r["runs"]["tis_mis"]["rejected_sequences"] > 0
            and all(s["max"] == 0.0 for s in r["sources"] if s["expect_zero"])
        ),
    ),
    "09_lag_diagnostics.py": dict(
        files=["lag.png", "lag_per_step.png", "run/metrics.jsonl"],
        prints=["the mean stays at 1 while the max and the KL grow", "the lag-bucket table"],
        check=lambda r: (
            len(r["table"]) >= 3
            and all(abs(row["median_mean_rho"] - 1) < 0.02 for row in r["table"])
            and r["table"][-1]["median_max_rho"] > r["table"][0]["median_max_rho"]
            and all(v for k, v in r["claims"].items() if k != "baseline_rmse_flat_as_in_the_paper")
            and r["regimes"]["claims"]["kl_flat_at_the_smallest_rate"]  # lr 1e-7: the paper's KL
            and set(r["regimes"]["tables"]) == {"0.0003", "1e-07"}
        ),
    ),
    "10_preemption.py": dict(
        files=["preemption.png", "reference/metrics.jsonl", "killed/metrics.jsonl"],
        prints=[
            "the resumed run is bitwise equal to the uninterrupted one",
            "fails its sha256 check",
            "refused: a resumed run must be the run that was started",
        ],
        check=lambda r: (
            r["bitwise_equal"]
            and any(p["killed"] for p in r["processes"])
            and r["comparison"]["params"] == r["comparison"]["opt_state"] == "bitwise equal"
            and r["damaged_checkpoint"]["restored_step"] < r["damaged_checkpoint"]["damaged_step"]
            and r["changed_config_refused"]["returncode"] != 0
        ),
    ),
    "11_scaling_out.py": dict(
        files=["scaling_out.png"],
        prints=[
            "two processes x 2 fake devices",
            "remote scores == local scores: True",
            "lost 0",
            "bitwise equal: True",
        ],
        check=lambda r: (
            all(r["claims"].values())
            and [p["processes"] for p in r["two_processes"]["processes"]] == [2, 2]
            and r["meshes"]["devices"] == 4
            and r["exact"]["mismatch"]["max_abs_dlogp"] == 0.0
        ),
    ),
    "12_your_own_model.py": dict(
        files=[
            "pass_at_k.png",
            "run/summary.json",
            "exported/model.safetensors",
            "exported/tokenizer.json",
            "exported/generation_config.json",
            "base/config.json",
        ],
        prints=[
            "the base model directory",
            "as the chat template lays it out",
            "<|im_start|>user",
            "held-out after RL",
            "transformers loads it",
        ],
        check=lambda r: (
            r["steps"] == 3
            and len(r["eos_ids"]) == 2
            and all(0.0 <= r[w]["pass@1"] <= 1.0 for w in ("before", "after"))
            and (not r["transformers"]["checked"] or r["transformers"]["equal_to_1e-4"])
        ),
    ),
    "13_a_pod_on_a_laptop.py": dict(
        files=["engine_devices_sweep.png"],
        prints=[
            "-bound:",
            "1 slot(s): 5 s",
            "2 slot(s): 3 s",
            "async / sync throughput",
            "k = 2j / k = j step time",
            "steps/hour, engine busy",
        ],
        check=lambda r: (
            r["schedule"] == {"1": 5.0, "2": 3.0}
            and r["areal"]["speedup"] > 0
            and r["rlax"]["8"]["seconds_per_step"] < r["rlax"]["4"]["seconds_per_step"]
            and len(r["plan"]) >= 2
        ),
    ),
    "14_tools_and_turns.py": dict(
        files=["tool_vs_no_tool.png"],
        prints=[
            "observations appended to held caches, 0 re-prefills",
            "bitwise equal True",
            "ValueError: the chat template is not append-only",
            "RL with the calculator beats RL without it",
        ],
        check=lambda r: (
            r["exact"]["bitwise_equal"]
            and r["exact"]["after_observation"] > 0
            and r["template"]["refused_at_turn"] == 2
            and r["episode"]["extended"] > 0
            and r["episode"]["rebuilt"] == 0
            and all(
                0.0 <= arm[w] <= 1.0
                for arm in r["rl"]["arms"].values()
                for w in ("before", "after")
            )
        ),
    ),
    "15_mixture_of_experts.py": dict(
        files=["moe.png", "free_seed0/metrics.jsonl", "replay_seed0/metrics.jsonl"],
        prints=[
            "Step 1. the anatomy of one batch",
            "trainer routing = replay",
            "replay_runs_the_engine_experts_everywhere    True",
            "collapse under routing mismatch?",
        ],
        check=lambda r: (
            all(r["claims"].values())
            and r["anatomy"]["replay_runs_engine_experts"] == 1.0
            and r["anatomy"]["free_runs_engine_experts"] < 1.0  # bf16 flipped some routes
            and r["anatomy"]["dlogp"]["replay_flipped"] < r["anatomy"]["dlogp"]["free_flipped"]
            and r["runs"]["exact"]["disagreement_max"] == 0.0
            and r["exact_bitwise"]  # exact mode: |dlogp| = 0 at every step
            and sorted(r["runs"]) == ["exact", "free", "replay"]
            and all(len(a["heldout_pass@1"]) == 1 for a in r["runs"].values())
        ),
    ),
    "16_bring_your_own_agent.py": dict(
        files=["agent_rl.png", "calc_agent.py", "run/metrics.jsonl"],
        prints=[
            "Step 2. warm start",
            "each the engine's sampled tokens, byte for byte: True",
            "(no re-tokenization): True",
            "recompute equals the engine's log-probs bitwise: True",
            "is not an answer minirl gave",
            "held-out pass@1 up after RL",
        ],
        check=lambda r: (
            r["checks"]["answers_byte_equal"]
            and r["checks"]["prompts_are_the_episode"]
            and r["checks"]["exact_bitwise"]
            and r["checks"]["answers_checked"] > 0
            and r["rewrite"]["refused"]
            and all(0.0 <= r["rl"][w]["pass@1"] <= 1.0 for w in ("before", "after"))
        ),
    ),
    "17_on_policy_distillation.py": dict(
        files=["distillation.png", "teacher/config.json", "teacher/tokenizer.json"],
        prints=[
            "Step 1.",
            "the teacher, exported to",
            "distillation's reverse KL to the teacher",
            "the teacher is better than the student base             True",
        ],
        check=lambda r: (
            all(r["claims"].values())
            and sorted(r["per_seed"]) == ["0", "1", "2"]
            and all(
                sorted(arms) == ["distill", "grpo", "sft"]
                and all(len(a["curve"]) == 2 for a in arms.values())
                for arms in r["per_seed"].values()
            )
            and all(len(k) == r["steps"] for k in r["summary"]["reverse_kl"])
        ),
    ),
    "18_reward_model_overoptimization.py": dict(
        files=[
            "overoptimization.png",
            "gold.py",
            "data/train.jsonl",
            "reward_model/config.json",
            "reward_model/model.safetensors",
            "reward_model/tokenizer.json",
        ],
        prints=[
            "Bradley-Terry steps",
            "saved as Qwen2ForSequenceClassification",
            "GRPO with data.verifier=rm:",
            "RewardModel(",
            "the reward model loads through RewardModel and scores as trained     True",
        ],
        check=lambda r: (
            all(r["claims"].values())
            and r["reward_model"]["export_max_abs_error"] < 1e-4
            and r["reward_model"]["comparisons"] > 0
            and sorted(r["curves"]) == ["gold seed 0", "proxy seed 0"]
            and all(
                [p["step"] for p in c["points"]] == [0, r["steps"]] for c in r["curves"].values()
            )
            and all(abs(c["points"][0]["kl"]) < 1e-3 for c in r["curves"].values())
        ),
    ),
}


def test_every_lesson_has_an_expectation():
    assert LESSONS, f"no lessons found in {TUTORIALS}"
    assert sorted(EXPECTED) == LESSONS


@pytest.mark.parametrize(
    "lesson",
    [
        pytest.param(lesson, marks=() if lesson in FAST_IN_DEFAULT_LANE else pytest.mark.slow)
        for lesson in LESSONS
    ],
)
def test_fast_mode_runs_and_delivers(lesson, tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("MINIRL_CACHE", str(tmp_path / "cache"))  # warm starts: never the user's cache
    proc = subprocess.run(
        [sys.executable, str(TUTORIALS / lesson), "--fast", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        cwd=tmp_path,
    )
    tail = f"\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"{lesson} --fast exited with {proc.returncode}{tail}"
    assert_delivers(lesson, proc.stdout, out, tail)


def assert_delivers(lesson: str, stdout: str, out: Path, tail: str) -> None:
    """What the lesson promises in fast mode: its lines printed, its files and its numbers."""
    expected = EXPECTED[lesson]
    for line in expected["prints"]:
        assert line in stdout, f"{lesson} did not print {line!r}{tail}"
    for name in expected["files"] + ["results.json"]:
        assert (out / name).is_file(), f"{lesson} did not write {name}{tail}"
    for name in expected["files"]:
        if name.endswith(".png"):
            data = (out / name).read_bytes()
            assert data.startswith(PNG_MAGIC) and len(data) > 10_000, f"{name} is not a real figure"
    results = json.loads((out / "results.json").read_text())
    assert results["mode"] == "fast"
    assert expected["check"](results), f"{lesson}: results.json does not show the claim: {results}"


@pytest.mark.slow
@pytest.mark.parametrize("lesson", NOTEBOOKS_RUN)
def test_notebook_runs_in_fast_mode_and_delivers(lesson, tmp_path, monkeypatch):
    """The lesson's notebook, run top to bottom by a Jupyter kernel (nbclient) in tutorials/, as
    a reader runs it, with one edit a reader would make: `--out` added to its options. It must
    print and write what the script does."""
    import nbformat
    from nbclient import NotebookClient

    out = tmp_path / "out"
    nb = nbformat.read(TUTORIALS / lesson.replace(".py", ".ipynb"), as_version=4)
    setup = nb.cells[1]
    assert 'ARGS = ["--fast"]' in setup.source, "the set-up cell names the lesson's options"
    setup.source = setup.source.replace('ARGS = ["--fast"]', f'ARGS = ["--fast", "--out", "{out}"]')
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    monkeypatch.setenv("PYTHONPATH", path)  # the kernel inherits this process's environment
    monkeypatch.setenv("MINIRL_CACHE", os.environ.get("MINIRL_CACHE", str(tmp_path / "cache")))
    client = NotebookClient(
        nb, timeout=TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": TUTORIALS}}
    )
    client.execute()
    stdout = "".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "stream" and o.name == "stdout"
    )
    assert f"{lesson}: JAX will run on 'cpu'" in stdout  # the set-up cell ran; no accelerator here
    assert_delivers(lesson, stdout, out, f"\n--- notebook output ---\n{stdout[-4000:]}")


def test_every_lesson_imports():
    """The default lane's smoke test of every lesson (their fast modes are in the slow lane,
    except FAST_IN_DEFAULT_LANE): each lesson module loads in one fresh interpreter, so every
    name it takes from minirl, scale and experiments still exists."""
    code = (
        "import importlib.util, sys\n"
        "for path in sys.argv[1:]:\n"
        "    spec = importlib.util.spec_from_file_location('lesson', path)\n"
        "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "print('imported', len(sys.argv) - 1)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    paths = [str(TUTORIALS / lesson) for lesson in LESSONS]
    proc = subprocess.run(
        [sys.executable, "-c", code, *paths], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip() == f"imported {len(LESSONS)}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_text_follows_the_rules(lesson):
    """A docstring that IS the lesson: the idea, how to run it, and the measured full-mode output
    with the command and the machine that produced it."""
    text = (TUTORIALS / lesson).read_text()
    doc = text.split('"""')[1]
    assert doc.startswith(f"Lesson {lesson[:2]} — "), "the docstring opens with 'Lesson NN — title'"
    for section in ("THE IDEA", "WHAT THE SCRIPT DOES", "Expected output (full mode, measured)"):
        assert section in doc, f"{lesson}: the docstring has no {section!r} section"
    measured = doc.split("Expected output (full mode, measured)")[1]
    assert f"python tutorials/{lesson}" in measured, "the measured output names its command"
    assert re.search(r"nproc\s*=?\s*\d", measured), "the measured output names the machine (nproc)"
    assert re.search(r"20\d\d-\d\d-\d\d", measured), "the measured output is dated"
    assert "--fast" in text and 'add_argument("--fast"' in text


def test_readme_lists_every_lesson():
    readme = (TUTORIALS / "README.md").read_text()
    for lesson in LESSONS:
        assert f"({lesson})" in readme, f"tutorials/README.md does not link {lesson}"
