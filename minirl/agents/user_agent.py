"""Your own agent, from a file: `minirl train --agent my_agent.py:solve` (task.agent).

    # my_agent.py
    async def solve(client, row):                 # client: openai.AsyncOpenAI, row: a dict
        r = await client.chat.completions.create(model="minirl", messages=[...], tools=[...])
        ...                                       # run tools, call again, as any agent does
        return 1.0                                # the reward (a number, a bool, a minirl Score),
                                                  # or the final answer (text) for the task's
                                                  # verifier, or None: the last answer's text

`client` is a real `openai.AsyncOpenAI` whose `base_url` names the episode
(http://127.0.0.1:PORT/episodes/<id>/v1), with no retries (a retried call would be a second
turn); `row` is the dataset row (or a built-in task's {"prompt": text, **meta}). Any HTTP client
pointed at that URL works as well.

`load_agent(spec)` checks at the start, as one line: the file exists and imports, it has the
name, the name is an async function (`async def`) taking (client, row). `AgentLoops` runs the
agents: a few threads, each an asyncio event loop with its own client (an httpx connection pool
belongs to one loop; each episode gets a copy of its loop's client with its own base_url, which
shares the pool). An agent that does not finish in time is cancelled; one that blocks its loop
(`time.sleep` inside `async def`) cannot be, and holds up the episodes that share its loop — they
run out of time with it — so a loop that no longer answers is replaced for later episodes.

The `openai` package comes with the `agent` extra (`pip install 'minirl[agent]'`); without it
`--agent` is a one-line error naming the extra.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import inspect
import threading
from collections.abc import Callable
from concurrent.futures import Future

from minirl.configlib import optional_import
from minirl.verifiers.reward_function import load_function

CLIENT_TIMEOUT_S = 3600.0  # one call may wait this long for the engine (the runner answers)


def load_agent(spec: str) -> Callable:
    """The agent function `spec` ("path/to/file.py:solve") names; ValueError, one line, saying
    what is wrong with it (MissingExtra if the `openai` package is not installed)."""
    optional_import("openai", "agent", "--agent (your agent's OpenAI client)")
    fn = load_function(spec, flag="--agent", what="async function")
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(
            f"--agent {spec!r}: {getattr(fn, '__name__', spec)} must be an async function "
            "(async def solve(client, row): ...)"
        )
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        raise ValueError(
            f"--agent {spec!r}: it must take two arguments (client, row); its signature is "
            f"{inspect.signature(fn)}"
        ) from None
    return fn


class _Loop:
    """One event-loop thread and its OpenAI client."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self.client = None  # made in the loop, at its first episode
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def alive(self, wait_s: float = 0.5) -> bool:
        """Does the loop still run callbacks (not blocked by an agent)?"""
        answered = threading.Event()
        self.loop.call_soon_threadsafe(answered.set)
        return answered.wait(wait_s)


class AgentLoops:
    """Where agents run: `count` event-loop threads (module docstring)."""

    def __init__(self, count: int = 4):
        self.count, self._loops, self._next = count, [], 0

    def start(self, agent: Callable, base_url: str, row: dict) -> tuple[int, Future]:
        """Run `agent(client, row)` on a loop: (loop index, concurrent future of its result)."""
        if not self._loops:
            self._loops = [_Loop(f"minirl-agents-{i}") for i in range(self.count)]
            atexit.register(self.close)  # clients closed in their loops, not by the GC at exit
        index = self._next % self.count
        self._next += 1
        loop = self._loops[index]
        return index, asyncio.run_coroutine_threadsafe(
            self._run(loop, agent, base_url, row), loop.loop
        )

    async def _run(self, loop: _Loop, agent: Callable, base_url: str, row: dict):
        if loop.client is None:
            openai = optional_import("openai", "agent", "--agent (your agent's OpenAI client)")
            loop.client = openai.AsyncOpenAI(
                base_url=base_url, api_key="minirl", max_retries=0, timeout=CLIENT_TIMEOUT_S
            )
        return await agent(loop.client.with_options(base_url=base_url), row)

    def stop(self, index: int, future: Future) -> None:
        """Cancel an agent; if its loop no longer answers (blocked), replace the loop."""
        if future.done():
            return
        future.cancel()
        if self._loops and not self._loops[index].alive():
            self._loops[index] = _Loop(f"minirl-agents-{index}")

    def close(self) -> None:
        """Close each loop's client (in its loop) and stop the loops; a blocked loop is left."""
        loops, self._loops = self._loops, []
        for loop in loops:
            if loop.client is not None and loop.alive():
                done = asyncio.run_coroutine_threadsafe(loop.client.close(), loop.loop)
                with contextlib.suppress(Exception):
                    done.result(timeout=5)
            loop.loop.call_soon_threadsafe(loop.loop.stop)
