"""minirl/envs without a model: the append-only check, checkpoint chat templates, the calculator,
the tool task, safe_step, the Python tool against hostile code, and the multi-turn bookkeeping
of scheduler.Sequence and Rollout (issue #23).

The episodes through the engine and the trainer are tests/envs/test_multiturn.py.
"""

import numpy as np
import pytest

from minirl.envs import (
    Calculator,
    PythonTool,
    Step,
    ToolTaskEnv,
    Turns,
    appended,
    safe_step,
    stop_sequences,
)
from minirl.inference.engine import Request
from minirl.modeling.tokenizer import CharTokenizer
from minirl.tasks.countdown import Countdown
from minirl.types import Prompt

TOK = CharTokenizer()


def test_appended_by_hand():
    assert appended("ab", "abcd") == "cd"
    assert appended("", "x") == "x"
    with pytest.raises(ValueError, match=r"at character 2 \(in turn 1\)"):
        appended("abXd", "abYde", [(0, "the prompt"), (2, "turn 1")])
    with pytest.raises(ValueError, match="at character 3"):
        appended("abcd", "abc")


def test_checkpoint_template_observations(tmp_path):
    """Qwen-style ChatML from tests/hf_tiny.py: an EOS-ended turn, a stop-ended turn (the
    template's end-of-turn opens the observation), and a trimming Llama-style template."""
    from hf_tiny import make_tokenizer_dir

    from minirl.hf.hf_tokenizer import HFTokenizer

    tok = HFTokenizer.from_dir(make_tokenizer_dir(tmp_path / "qwen", "qwen"))
    turns = Turns(tok)
    text, tokens = turns.first("hi")
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert np.array_equal(tokens, tok.encode(text, bos=False))
    tool = {"role": "tool", "content": "42"}
    for ending, opens in [([tok.eos_id], "\n"), ([], "<|im_end|>\n")]:
        turn = np.concatenate([tok.encode("ok", bos=False), ending]).astype(np.int32)
        spelled, content = turns.turn(turn)
        messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": content}]
        added = turns.observation(text + spelled, [*messages, tool])
        assert added == opens + "<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
        im_start = tok._tok.token_to_id("<|im_start|>")
        assert im_start in turns.encode(added).tolist()  # turn markers are special tokens
    llama = HFTokenizer.from_dir(make_tokenizer_dir(tmp_path / "llama", "llama"))
    turns = Turns(llama)
    text, _ = turns.first("hi")
    spelled, content = turns.turn(np.append(llama.encode("ok ", bos=False), llama.eos_id))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": content}]
    with pytest.raises(ValueError, match="not append-only"):  # `| trim` drops the space
        turns.observation(text + spelled, [*messages, tool], [(len(text), "assistant turn 1")])


def test_calculator_by_hand():
    calc = Calculator()
    assert calc("3*(5+7)") == "36" and calc(" 7/2 ") == "7/2" and calc("2-5") == "-3"
    assert calc("1/0") == "error: division by zero"
    assert calc("__import__('os')").startswith("error: expected a number")
    assert calc("(" * 70 + "1" + ")" * 70) == "error: longer than 128 characters"
    assert calc("(" * 20 + "1" + ")" * 20) == "error: parentheses nested too deeply"


def test_tool_task_env_calls_tools_and_scores_the_answer():
    task = Countdown()
    prompt = task.prompt(0)  # "4 5 2 4 -> 34:", meta reference 4+(2+4)*5
    env = ToolTaskEnv(task, [Calculator()])
    assert env.reset(prompt) == prompt.text
    assert env.step("try <calc>4+(2+4)*5</calc>") == Step(
        "34", 0.0, False, {"reason": "called calc"}
    )
    assert env.step("<calc>1/0</calc>").observation == "error: division by zero"
    final = env.step(prompt.meta["reference"])
    assert final.done and final.reward == 1.0 and final.info["reason"] == "correct"
    assert env.step("4+5+2+4").reward == 0.0
    assert stop_sequences([Calculator()], TOK) == (tuple(TOK.encode("</calc>", bos=False)),)


def test_safe_step_turns_an_environment_error_into_a_zero_reward():
    class Broken:
        def step(self, text):
            raise KeyError("boom")

    step = safe_step(Broken(), "x")
    assert step.done and step.reward == 0.0 and "KeyError" in step.info["reason"]


def test_python_tool_runs_code_and_contains_hostile_code(tmp_path, request):
    from minirl.verifiers import isolation_mode

    py = PythonTool()
    request.addfinalizer(py.close)
    assert py("print(6 * 7)") == "42"
    assert py("1/0") == "error: runtime error: ZeroDivisionError: division by zero"
    assert py("while True:\n    pass") == "error: time limit"
    assert py("x = []\nwhile True:\n    x.append(bytearray(50 * 2**20))") == "error: memory limit"
    assert py("import sys\nwhile True:\n    sys.stdout.write('x' * 10000)") == "error: output limit"
    outside = tmp_path / "escaped"
    wrote = py(f"open({str(outside)!r}, 'w').write('x')\nprint('wrote')")
    if isolation_mode() != "none":  # the host file system is read-only or hidden in the jail
        assert not outside.exists() and wrote != "wrote"
    env = ToolTaskEnv(Countdown(), [py])
    env.reset(Countdown().prompt(0))
    assert env.step("<py>import os\nos.kill(os.getppid(), 9)</py>").done is False  # we live on


def test_oldest_version_and_stop_sequences_see_only_the_policys_tokens():
    from minirl.inference.scheduler import Sequence, finish_reason
    from minirl.types import Rollout

    none = np.zeros(0, np.float32)
    r = Rollout(None, 0, np.arange(4), none, np.array([3, -1, -1, 5]), "eos", mask=None)
    assert r.oldest_version == -1
    r.mask = np.array([1, 0, 0, 1], np.float32)
    assert r.oldest_version == 3
    seq = Sequence(Request(Prompt(0, "t", "", np.ones(2, np.int32)), 0, 8, multi_turn=True), 0)
    seq.append(7, -1.0, 0)
    seq.held = True
    seq.observe(np.array([7], np.int32), 8)
    seq.observation_cached()  # tokens [7 | 7]: "7 7" spans the observation
    seq.append(9, -1.0, 0)
    assert finish_reason(seq, (), [(7, 9)]) is None  # the turn is only [9]
    seq.append(7, -1.0, 0)
    seq.append(9, -1.0, 0)
    assert finish_reason(seq, (), [(7, 9)]) == "stop"
    assert seq.mask == [1.0, 0.0, 1.0, 1.0, 1.0] and seq.versions == [0, -1, 0, 0, 0]


@pytest.mark.parametrize("reverse", [False, True])
def test_demonstration_episode_is_laid_out_as_an_episode_the_environment_scores_1(reverse):
    """demonstration_episode (the warm start of task.tools runs): the calculator demonstration
    is [call, observation (mask 0), answer + EOS] exactly as EpisodeRunner lays an episode out,
    and replaying its turns through the environment earns reward 1; without the tool it is the
    task's own scratchpad as one turn, which the verifier accepts."""
    from minirl.envs import demonstration_episode
    from minirl.tasks.arithmetic import Arithmetic, ArithmeticConfig

    tok = CharTokenizer()
    task = Arithmetic(ArithmeticConfig(max_operands=4, reverse_digits=reverse))
    prompt = task.prompt(3, "train")
    value = str(sum(prompt.meta["operands"]))
    answer = value[::-1] if reverse else value
    for tools in ([], [Calculator()]):
        demo = demonstration_episode(task, prompt, Turns(tok), tools)
        assert demo.prompt.tokens.tolist() == tok.encode(prompt.text).tolist()
        env = ToolTaskEnv(task, tools)
        env.reset(prompt)
        if not tools:
            assert demo.mask.all() and env.step(tok.decode(demo.tokens)).reward == 1.0
            continue
        turn1, turn2 = f"<calc>{prompt.text.rstrip('=')}</calc>", f"#### {answer}"
        want = [
            *tok.encode(turn1, bos=False).tolist(),
            *tok.encode(f"\n= {value}\n", bos=False).tolist(),
            *tok.encode(turn2, bos=False, eos=True).tolist(),
        ]
        assert demo.tokens.tolist() == want
        observation = [0.0] * (len(value) + 4)
        assert demo.mask.tolist() == [1.0] * len(turn1) + observation + [1.0] * (len(turn2) + 1)
        assert env.step(turn1).observation == value and env.step(turn2).reward == 1.0
