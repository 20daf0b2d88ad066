"""The command line: --help explains, bad keys and values are one-line errors, config lists knobs."""

import pytest

from minirl.cli import main


def test_config_lists_every_knob_with_its_meaning(capsys):
    assert main(["config", "--preset", "fixture", "--set", "rl.steps=7"]) == 0
    out = capsys.readouterr().out
    assert "rl.steps" in out and " 7 " in out
    assert "k: accept a rollout" in out  # the help text comes from the config's field comment
    assert "engine.temperature" in out and "model.dim" in out


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("rl.stepz=3", "unknown key 'rl.stepz'"),
        ("rl.steps=many", "rl.steps: expected int"),
        ("rl.scheduler=fast", "rl.scheduler must be one of"),
        ("trainer.exact=true", "unknown key 'trainer.exact'"),  # how tokens are scored: engine.*
        ("rl", "must look like key=value"),
        ("rl.loss=grpoo", "unknown loss preset 'grpoo'"),
        ("rl.behaviour_cap=0.5", "rl.behaviour_cap must be 0 (uncapped) or >= 1"),
        ("rl.behaviour_cap=3", "rl.behaviour_cap=3.0 does nothing with rl.loss=grpo"),
        ("rl.kl_coef=-1", "rl.kl_coef=-1.0: KL coefficient must be >= 0"),
        ("task.tools=calc,shell", "task.tools: each of ('calc', 'py') at most once"),
        ("task.tools=calc,calc", "task.tools: each of ('calc', 'py') at most once"),
        ("task.max_turns=3", "task.max_turns does nothing without task.tools"),
        ("task.max_turns=0", "task.max_turns must be >= 1"),
        ("data.chat_template_kwargs={'messages': []}", "data.chat_template_kwargs: names"),
        ("data.chat_template_kwargs={1: 2}", "data.chat_template_kwargs: names (strings)"),
        ("data.chat_template_kwargs=[1]", "data.chat_template_kwargs: expected dict"),
    ],
)
def test_bad_overrides_are_clear_errors(capsys, assignment, message):
    assert main(["config", "--set", assignment]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_tools_parse_as_words_or_literals_and_need_a_built_in_task(tmp_path, capsys):
    """task.tools=calc,py, (calc, py) and '("calc",)' all parse; a dataset file is refused."""
    from minirl.run.presets import make_config

    assert make_config("fixture", ["task.tools=calc,py"]).task.tools == ("calc", "py")
    assert make_config("fixture", ['task.tools=("calc",)']).task.tools == ("calc",)
    assert make_config("fixture", ['task.tools=["py"]']).task.tools == ("py",)
    assert make_config("fixture", ["task.tools=(calc, py)"]).task.tools == ("calc", "py")
    assert make_config("fixture", ["task.tools=[calc]"]).task.tools == ("calc",)
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n')
    args = ["--preset", "fixture", "--data", str(data), "--set", "task.tools=calc"]
    assert main(["train", "--run-dir", str(tmp_path / "run"), *args]) == 2
    err = capsys.readouterr().err
    assert "task.tools works with the built-in tasks only" in err and "Traceback" not in err


def test_behaviour_cap_reaches_decoupled_ppo_in_any_order():
    """rl.behaviour_cap sets decoupled PPO's bound on c (AReaL's 5 by default, 0 = the paper's
    uncapped Eq. 5), whichever of the two settings comes first on the command line."""
    from minirl.losses import make_objective
    from minirl.run.presets import make_config

    def cap(*sets):
        rl = make_config("fixture", list(sets)).rl
        (part,) = make_objective(rl.loss, rl.behaviour_cap).importance
        return part.cap

    assert cap("rl.loss=decoupled_ppo") == 5.0
    assert cap("rl.behaviour_cap=3", "rl.loss=decoupled_ppo") == 3.0
    assert cap("rl.loss=decoupled_ppo_mis", "rl.behaviour_cap=2") == 2.0
    assert cap("rl.loss=decoupled_ppo", "rl.behaviour_cap=0") is None
    assert cap("rl.loss=naive_ppo") is None  # AReaL's naive baseline has no bound


def test_unknown_preset_and_help(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--preset", "nope"])
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--help"])
    assert exit_info.value.code == 0
    assert "--staleness" in capsys.readouterr().out


def test_resume_of_a_missing_run_is_a_clear_error(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path / "nothing")]) == 2
    assert "not a minirl run directory" in capsys.readouterr().err


def test_samples_ranks_past_lines_it_cannot_read_and_n_counts_from_one(tmp_path, capsys):
    """samples.jsonl lines edited by hand or written by another program: a reward that is not a
    number raised TypeError in --worst / --best (a traceback), --best put the samples without a
    reward first, a "step" of true passed for step 1; -n 0 printed nothing and -n -1 all but one
    sample, both with exit status 0."""
    lines = [
        '{"step": 1, "uid": "a", "reward": 1.0}',
        '{"step": 1, "uid": "b", "reward": "high"}',
        '{"step": 1, "uid": "c", "reward": [1]}',
        '{"step": 1, "uid": "d", "reward": 0.0}',
        '{"step": true, "uid": "e", "reward": 0.5}',
    ]
    (tmp_path / "samples.jsonl").write_text("\n".join(lines) + "\n")
    for order, first in (("--worst", "prompt d "), ("--best", "prompt a ")):
        assert main(["samples", str(tmp_path), order, "-n", "1"]) == 0
        out = capsys.readouterr().out
        assert first in out and out.count("── step") == 1
    assert main(["samples", str(tmp_path), "--step", "1"]) == 0
    assert "prompt e " not in capsys.readouterr().out
    for n in ("0", "-1", "x"):
        with pytest.raises(SystemExit):
            main(["samples", str(tmp_path), "-n", n])
        assert "expected a whole number >= 1" in capsys.readouterr().err
    a_file = tmp_path / "samples.jsonl"  # a file given for the run directory is named as such
    assert main(["samples", str(a_file)]) == 2
    assert f"{a_file} is not a run directory" in capsys.readouterr().err
    assert main(["plot", str(a_file)]) == 2
    assert "is a file, not a run directory" in capsys.readouterr().err


def test_debug_shows_the_traceback_of_a_user_error(tmp_path, capsys):
    missing = str(tmp_path / "nothing")
    assert main(["eval", missing]) == 2
    assert "config.json does not exist" in capsys.readouterr().err
    from minirl.configlib import ConfigError

    with pytest.raises(ConfigError, match="does not exist"):
        main(["eval", missing, "--debug"])  # anywhere on the line
    with pytest.raises(ConfigError, match="does not exist"):
        main(["--debug", "eval", missing])


def test_every_knob_has_a_meaning_even_where_the_formatter_wrapped_its_line(capsys):
    """`minirl config` prints a non-empty meaning for every key: a field whose line ruff wrapped
    (`eta: int = (\\n    0  # ...\\n)`) keeps its comment inside the statement."""
    from minirl.config import RunConfig
    from minirl.configlib import describe

    rows = describe(RunConfig)
    assert [key for key, _, meaning in rows if not meaning.strip()] == []
    meanings = {key: meaning for key, _, meaning in rows}
    assert meanings["rl.eta"].startswith("AReaL: generation may run at most eta batches ahead")
    assert meanings["task.tools"].startswith("multi-turn episodes with these tools")
    assert main(["config"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(rows)
    assert all(len(line.split(maxsplit=2)) == 3 for line in out)  # key, value, meaning


def test_help_lists_each_command_once_and_no_internal_names(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    examples = [line.strip() for line in out.splitlines() if line.strip().startswith("minirl ")]
    assert len(examples) == len(set(examples))  # no row twice
    commands = {"train", "sft", "eval", "export", "plot", "samples", "plan", "diagnose", "config"}
    assert {line.split()[1] for line in examples} == commands
    assert "USER_ERRORS" not in out
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: the device's) (default: None)" not in out and "(default: None)" not in out
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "math (" in out and "math_verify (" in out  # --verifier names its choices


def test_a_model_directory_is_not_taken_for_a_damaged_run(tmp_path, capsys):
    """`minirl export MODEL_DIR` (or eval, or --resume) says MODEL_DIR is not a run directory,
    not that its config.json "was changed by hand or damaged"."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 64}))
    for argv in (
        ["export", str(tmp_path), "--out", str(tmp_path / "out")],
        ["eval", str(tmp_path)],
        ["train", "--resume", str(tmp_path)],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert (
            f"{tmp_path} is not a minirl run directory (its config.json is a Hugging Face " in err
        )
        assert "changed by hand" not in err and len(err.splitlines()) == 1
    (tmp_path / "config.json").write_text(json.dumps({"config": {}}))  # minirl's, damaged
    assert main(["eval", str(tmp_path)]) == 2
    assert "changed by hand or damaged" in capsys.readouterr().err


def test_the_readme_set_up_commands_do_not_share_an_environment():
    """Issue #34: both README commands made `.venv` in the same folder, so the second silently
    reused the first's packages."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("##", 1)[0]
    made = re.findall(r"python3 -m venv (\S+) && \. (\S+)/bin/activate", setup)
    assert len(made) == 2 and all(venv == activated for venv, activated in made)
    assert len({venv for venv, _ in made}) == 2


def test_the_readme_test_command_is_what_ci_runs():
    """.ci/run installs the same extras and runs the same pytest command as the README's second
    set-up command, so CI proves what a reader runs."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    setup = (root / "README.md").read_text().split("## Set up", 1)[1].split("##", 1)[0]
    ci = (root / ".ci" / "run").read_text()
    readme_extras = re.findall(r'pip install -e "\.\[([^\]]+)\]"', setup)
    ci_extras = re.findall(r'pip install -q -e "\.\[([^\]]+)\]"', ci)
    assert readme_extras and readme_extras == ci_extras
    readme_pytest = re.findall(r"python -m pytest [^\n`]*", setup)
    assert readme_pytest and readme_pytest[0].strip() in ci
