"""Multi-turn episodes with tools (docs/multiturn.md): environments, tools, and the episode runner.

base.py         Environment (reset / step -> Step), Tool, safe_step (errors never crash a run)
turns.py        the conversation as text and tokens: rendered once per turn, append-only
episodes.py     EpisodeRunner: episodes through the real Engine, one KV cache per episode,
                returned as Rollouts with a loss mask over the policy's tokens
tool_calls.py   the model's own tool calls: Qwen's <tool_call>, Llama 3.1's JSON, minirl's tags
tool_task.py    a built-in task with tools: `<name>argument</name>` calls, the task's verifier
scripted.py     a scripted policy: an engine that says given turns (warm starts, tests)
user_env.py     your own environment from a file (--env file.py:Class): loaded, checked, run
calculator.py   the `calc` tool (exact arithmetic, never eval)
python_tool.py  the `py` tool (the code verifier's sandbox)
"""

from minirl.envs.base import Environment, Step, Tool, safe_step
from minirl.envs.calculator import Calculator
from minirl.envs.episodes import EpisodeConfig, EpisodeRunner, EpisodeScores
from minirl.envs.python_tool import PythonTool
from minirl.envs.tool_calls import Turn
from minirl.envs.tool_task import (
    ToolTaskEnv,
    demonstration_episode,
    demonstration_turns,
    stop_sequences,
)
from minirl.envs.turns import TOY_TEMPLATE, Turns, appended

__all__ = [
    "TOY_TEMPLATE",
    "Calculator",
    "Environment",
    "EpisodeConfig",
    "EpisodeRunner",
    "EpisodeScores",
    "PythonTool",
    "Step",
    "Tool",
    "ToolTaskEnv",
    "Turn",
    "Turns",
    "appended",
    "demonstration_episode",
    "demonstration_turns",
    "safe_step",
    "stop_sequences",
]
