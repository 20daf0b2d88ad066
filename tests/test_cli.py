"""The command line: --help explains, bad keys and values are one-line errors, config lists knobs."""

import pytest

from minirl.tools.cli import main


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
    ],
)
def test_bad_overrides_are_clear_errors(capsys, assignment, message):
    assert main(["config", "--set", assignment]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_tools_parse_as_words_or_literals_and_need_a_built_in_task(tmp_path, capsys):
    """task.tools=calc,py and task.tools='("calc",)' both parse; a dataset file is refused."""
    from minirl.run_presets import make_config

    assert make_config("fixture", ["task.tools=calc,py"]).task.tools == ("calc", "py")
    assert make_config("fixture", ['task.tools=("calc",)']).task.tools == ("calc",)
    assert make_config("fixture", ['task.tools=["py"]']).task.tools == ("py",)
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n')
    args = ["--preset", "fixture", "--data", str(data), "--set", "task.tools=calc"]
    assert main(["train", "--run-dir", str(tmp_path / "run"), *args]) == 2
    err = capsys.readouterr().err
    assert "task.tools works with the built-in tasks only" in err and "Traceback" not in err


def test_behaviour_cap_reaches_decoupled_ppo_in_any_order():
    """rl.behaviour_cap sets decoupled PPO's bound on c (AReaL's 5 by default, 0 = the paper's
    uncapped Eq. 5), whichever of the two settings comes first on the command line."""
    from minirl.run_presets import make_config

    def cap(*sets):
        (part,) = make_config("fixture", list(sets)).rl.objective().importance
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


def test_debug_shows_the_traceback_of_a_user_error(tmp_path, capsys):
    missing = str(tmp_path / "nothing")
    assert main(["eval", missing]) == 2
    assert "config.json does not exist" in capsys.readouterr().err
    from minirl.configlib import ConfigError

    with pytest.raises(ConfigError, match="does not exist"):
        main(["eval", missing, "--debug"])  # anywhere on the line
    with pytest.raises(ConfigError, match="does not exist"):
        main(["--debug", "eval", missing])
