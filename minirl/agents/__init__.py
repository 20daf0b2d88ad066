"""Your own agent (docs/multiturn.md): an OpenAI-compatible endpoint over the rollout engine.

runner.py      AgentRunner: agent episodes through the engine (the engine's interface, a barrier
               per step), scored by the agent's return value or the task's verifier
episode.py     AgentEpisode: one conversation as tokens; each call matched against the tokens
               already sampled (a rewritten history is refused, never re-tokenized)
server.py      Endpoint: /episodes/<id>/v1/chat/completions, /completions, /v1/models on
               localhost (the standard library's ThreadingHTTPServer)
protocol.py    the OpenAI wire format: checked requests, responses, error bodies, streams
user_agent.py  your agent from a file (--agent file.py:solve): loaded, checked, run on event loops

The endpoint is a plug-in above the engine (docs/design.md, "Layers"): the engine learns no HTTP;
it sees token ids in and token ids out, as from any other caller.
"""

from minirl.agents.runner import AgentConfig, AgentRunner
from minirl.agents.server import Endpoint
from minirl.agents.user_agent import load_agent

__all__ = ["AgentConfig", "AgentRunner", "Endpoint", "load_agent"]
