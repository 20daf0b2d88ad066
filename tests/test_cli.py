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
    ],
)
def test_bad_overrides_are_clear_errors(capsys, assignment, message):
    assert main(["config", "--set", assignment]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


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
