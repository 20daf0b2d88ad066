"""A tool-using agent written with the `openai` SDK, as for any OpenAI-compatible server: it
declares a `calc` tool, runs the calls the model makes itself, and returns the model's final
answer for the task's verifier. Trained by `minirl train --agent experiments/calc_agent.py:solve`
(experiments/agent.py); the end-to-end tests of `minirl train --agent` run this same file
(tests/agents/test_agent_runs.py, tests/run/test_preemption.py, tests/scale/test_ray_workers.py).
Lesson 16 writes its own copy (the same tool and `solve`, beside an `edits` variant the lesson
needs), so that the lesson shows the agent it trains."""

import json

CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Add integers, e.g. 12+345+6.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


def add(expression: str) -> str:
    try:
        return str(sum(int(x) for x in expression.split("+")))
    except ValueError:
        return "error: integers and + only"


async def solve(client, row):
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(3):
        r = await client.chat.completions.create(model="minirl", messages=messages, tools=[CALC])
        m = r.choices[0].message
        messages.append(m.model_dump(exclude_none=True))
        if not m.tool_calls:
            return m.content  # the final answer: the task's verifier scores it
        for c in m.tool_calls:
            value = add(json.loads(c.function.arguments).get("expression", ""))
            messages.append({"role": "tool", "tool_call_id": c.id, "content": value})
    return None  # out of calls: the last answer is scored
