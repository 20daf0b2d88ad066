"""The endpoint and the agent runner with the real `openai` client, model-free: the policy is a
ScriptedEngine that says the arithmetic task's demonstration (one `calc` call, then the answer),
so every number here is known in advance.

  64 concurrent episodes through the endpoint: each the prompt + the call + the tool's output
    (mask 0) + the answer, every one correct, two calls each
  hostile agents (raise, hang, block their event loop, answer nonsense, never call the model,
    call twice at once, rewrite the history) end their own episode with reward 0 and the reason;
    the others are untouched; a hang costs the agent's time limit, not forever
  OpenAI-style error bodies for bad requests (no episode, an unknown one, bad JSON, a body too
    large, an unknown route), /v1/models, completions with text and token ids, streaming
  --agent mistakes are one line at the start
"""

import json
import re
import socket
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from minirl import cli
from minirl.agents import AgentConfig, AgentRunner, load_agent
from minirl.agents.server import Endpoint
from minirl.envs import Turns, demonstration_turns
from minirl.envs.scripted import ScriptedEngine
from minirl.inference.scheduler import Request
from minirl.modeling.sampling import Sampling
from minirl.modeling.tokenizer import CharTokenizer
from minirl.tasks.arithmetic import Arithmetic, ArithmeticConfig

TOK = CharTokenizer()
TURNS = Turns(TOK)
TASK = Arithmetic(ArithmeticConfig(max_operands=3, max_digits=2))

AGENTS = """
import asyncio, json, time

CALC = {"type": "function", "function": {"name": "calc", "description": "Add integers.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}

def add(expression):
    return str(sum(int(x) for x in expression.split("+")))

async def calc(client, row):
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(3):
        r = await client.chat.completions.create(model="m", messages=messages, tools=[CALC])
        m = r.choices[0].message
        messages.append(m.model_dump(exclude_none=True))
        if not m.tool_calls:
            return m.content          # the final answer: the task's verifier scores it
        for c in m.tool_calls:
            value = add(json.loads(c.function.arguments)["expression"])
            messages.append({"role": "tool", "tool_call_id": c.id, "content": value})

async def solve(client, row):
    kind = row.get("kind", "calc")
    if kind == "calc":
        return await calc(client, row)
    if kind == "no_call":
        return 1.0
    if kind == "unencodable":  # the character tokenizer has no capital letters
        await client.completions.create(model="m", prompt="WHAT IS 1+2?")
    first = [{"role": "user", "content": row["prompt"]}]
    r = await client.chat.completions.create(model="m", messages=first, tools=[CALC])
    m = r.choices[0].message.model_dump(exclude_none=True)
    if kind == "raise":
        raise KeyError("no such tool")
    if kind == "hang":
        await asyncio.sleep(3600)
    if kind == "block":
        time.sleep(4)  # blocks its event loop: cannot be cancelled
    if kind == "garbage":
        return {"reward": 1}
    if kind == "nan":
        return float("nan")
    if kind == "rewrite":
        m["tool_calls"][0]["function"]["arguments"] = '{"expression": "1+1"}'
    more = [*first, m, {"role": "tool", "tool_call_id": "x", "content": "5"}]
    if kind == "twice":
        await asyncio.gather(*[client.chat.completions.create(model="m", messages=more, tools=[CALC]) for _ in range(2)])
    await client.chat.completions.create(model="m", messages=more, tools=[CALC])
    return 1.0

async def complete(client, row):
    r = await client.completions.create(model="m", prompt=row["prompt"], logprobs=1)
    text = r.choices[0].text
    assert r.choices[0].logprobs.tokens and len(r.choices[0].logprobs.token_logprobs) == r.usage.completion_tokens
    tool = "\\n= " + add(text[len("<calc>"):-len("</calc>")]) + "\\n"
    ids = await client.completions.create(model="m", prompt=row["prompt"] + text + tool)
    return ids.choices[0].text

async def stream(client, row):
    first = [{"role": "user", "content": row["prompt"]}]
    chunks = [c async for c in await client.chat.completions.create(model="m", messages=first, tools=[CALC], stream=True)]
    call = chunks[1].choices[0].delta.tool_calls[0]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assistant = {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]}
    value = add(json.loads(call.function.arguments)["expression"])
    more = [*first, assistant, {"role": "tool", "tool_call_id": call.id, "content": value}]
    final = await client.chat.completions.create(model="m", messages=more, tools=[CALC], stream=True)
    return "".join([c.choices[0].delta.content or "" async for c in final])

async def corrected(client, row):
    # each kind sends one call the runner must refuse, then the calc episode, unchanged
    import openai

    async def refused(**call):
        try:
            await client.chat.completions.create(model="m", tools=[CALC], **call)
        except openai.BadRequestError:
            return
        raise AssertionError(f"accepted: {call}")

    kind, first = row["kind"], [{"role": "user", "content": row["prompt"]}]
    if kind == "bad_schema":  # accepted: declares no tool, so the call stays text
        bad = {"type": "function", "function": {"name": "calc", "parameters": "x"}}
        r = await client.chat.completions.create(model="m", messages=first, tools=[bad])
        m = r.choices[0].message
        return float(not m.tool_calls and m.content.startswith("<calc>"))
    if kind == "too_long":  # over the engine's cache_len
        await refused(messages=[{"role": "user", "content": "1" * 200}])
    if kind == "stop":  # a stop string the tokenizer cannot encode
        await refused(messages=first, stop=["STOP"])
    if kind == "big_id":  # a token id past int32
        try:
            await client.completions.create(model="m", prompt=[1, 2**40])
            raise AssertionError("accepted")
        except openai.BadRequestError:
            pass
    r = await client.chat.completions.create(model="m", messages=first, tools=[CALC])
    m = r.choices[0].message.model_dump(exclude_none=True)
    c = m["tool_calls"][0]
    value = add(json.loads(c["function"]["arguments"])["expression"])
    tool = {"role": "tool", "tool_call_id": c["id"], "content": value}
    if kind == "deep_arguments":  # past the JSON parser's depth
        deep = {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": "[" * 5000}}]}
        await refused(messages=[*first, deep, tool])
    if kind == "unencodable_output":
        await refused(messages=[*first, m, {**tool, "content": "FIVE"}])
    r = await client.chat.completions.create(model="m", messages=[*first, m, tool], tools=[CALC])
    return r.choices[0].message.content

def not_async(client, row):
    pass

async def one_argument(client):
    pass
"""


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
    path = tmp_path_factory.mktemp("agents") / "agents.py"
    path.write_text(AGENTS)
    return path


def run(agents, name, kinds, config=AgentConfig(timeout=5.0), close=True):
    prompts = [TASK.prompt(i) for i in range(len(kinds))]
    prompts = [
        p.__class__(p.uid, p.task, p.text, p.tokens, {**p.meta, "kind": k})
        for p, k in zip(prompts, kinds, strict=True)
    ]
    script = {p.uid: demonstration_turns(TASK, p, TURNS) for p in prompts}
    runner = AgentRunner(
        ScriptedEngine(script, TOK.eos_ids, 128),
        load_agent(f"{agents}:{name}"),
        TURNS,
        TASK,
        config,
    )
    t0 = time.perf_counter()
    episodes = runner.generate([Request(p, 0, 32) for p in prompts])
    seconds = time.perf_counter() - t0
    if close:
        runner.close()
    return episodes, runner, seconds


def expected(prompt) -> tuple[list[int], list[float]]:
    """The tokens (and mask) of the scripted episode: call, calculator output, answer."""
    call, answer = demonstration_turns(TASK, prompt, TURNS)
    value = str(sum(prompt.meta["operands"]))
    output = TOK.encode(f"\n= {value}\n", bos=False)
    tokens = [*call.tolist(), *output.tolist(), *answer.tolist()]
    return tokens, [1.0] * len(call) + [0.0] * len(output) + [1.0] * len(answer)


def test_64_concurrent_episodes_through_the_endpoint(agents):
    episodes, runner, _ = run(agents, "solve", ["calc"] * 64)
    assert runner.stats == {"calls": 128, "refused": 0, "timed_out": 0, "restarted": 0}
    for e in episodes:
        tokens, mask = expected(e.prompt)
        assert e.tokens.tolist() == tokens and e.mask.tolist() == mask
        assert e.prompt.tokens.tolist() == TOK.encode(e.prompt.text).tolist()  # the agent's
        assert e.score.reward == 1.0 and e.score.reason == "correct"
        assert (e.versions[e.mask == 0] == -1).all() and (e.versions[e.mask == 1] == 0).all()


def test_hostile_agents_end_their_own_episode_only(agents):
    kinds = ["calc", "raise", "hang", "garbage", "nan", "no_call", "rewrite", "twice"]
    kinds += ["unencodable", "calc"]
    episodes, runner, seconds = run(agents, "solve", kinds, AgentConfig(timeout=1.0, loops=2))
    got = dict(zip(kinds, episodes, strict=True))
    assert episodes[0].score.reward == episodes[-1].score.reward == 1.0
    reasons = {
        "raise": "agent raised KeyError: 'no such tool'",
        "hang": "agent timed out (its own time took over task.timeout=1.0s)",
        "garbage": "agent returned a dict: not a reward, text or None",
        "nan": "agent returned nan",
        "no_call": "no answer from the model (it returned 1.0)",  # the policy wrote nothing
        "rewrite": "agent raised BadRequestError",
        "twice": "agent raised ConflictError",
        "unencodable": "not in the tokenizer's alphabet",
    }
    for kind, why in reasons.items():
        assert got[kind].score.reward == 0.0 and why in got[kind].score.reason, (
            kind,
            got[kind].score,
        )
    assert "does not continue episode" in got["rewrite"].score.reason
    assert "messages[1] is not an answer minirl gave" in got["rewrite"].score.reason
    assert "one call at a time" in got["twice"].score.reason
    assert len(got["no_call"].tokens) == len(got["unencodable"].tokens) == 0
    for kind in ("raise", "hang", "rewrite", "twice"):  # the first answer stays: what was sampled
        call = demonstration_turns(TASK, got[kind].prompt, TURNS)[0]
        assert got[kind].tokens.tolist() == call.tolist() and got[kind].mask.all()
    assert runner.stats["timed_out"] == 1 and runner.stats["refused"] == 2
    assert seconds < 20  # the hang cost its 1 s, not an hour


def test_a_refused_call_changes_nothing_and_never_stops_the_run(agents):
    """Calls the runner's thread cannot lay out (a prompt over the cache, a stop string or tool
    output the tokenizer cannot encode, a token id past int32, tool-call arguments nested past
    the JSON parser's depth) are 400s that leave the episode as it was: the corrected call goes
    on, and the episode is the one an agent that never erred lays out. A tool schema of the
    wrong shape declares no tool: the answer is text."""
    kinds = ["too_long", "stop", "big_id", "deep_arguments", "unencodable_output", "bad_schema"]
    episodes, runner, _ = run(agents, "corrected", kinds)
    for kind, e in zip(kinds, episodes, strict=True):
        assert e.score.reward == 1.0, (kind, e.score)
        if kind != "bad_schema":
            tokens, mask = expected(e.prompt)
            assert e.tokens.tolist() == tokens and e.mask.tolist() == mask, kind
    assert runner.stats["refused"] == 5 and runner.stats["calls"] == 11


def test_an_agent_that_blocks_its_loop_is_cut_off_and_its_loop_replaced(agents):
    episodes, runner, seconds = run(
        agents, "solve", ["block", "calc", "calc"], AgentConfig(timeout=1.0, loops=2)
    )
    assert "agent timed out" in episodes[0].score.reason
    assert episodes[1].score.reward == 1.0  # another loop
    assert episodes[2].score.reward == 0.0  # shared the blocked loop: ran out of time with it
    again, _, _ = run(agents, "solve", ["calc"] * 4, AgentConfig(timeout=5.0, loops=2))
    assert [e.score.reward for e in again] == [1.0] * 4


def test_completions_and_streams(agents):
    for name in ("complete", "stream"):
        episodes, _, _ = run(agents, name, ["calc"] * 3)
        for e in episodes:
            assert e.score.reward == 1.0, (name, e.score)
            tokens, mask = expected(e.prompt)
            assert e.tokens.tolist() == tokens and e.mask.tolist() == mask


def _http(url, body=None, raw=None):
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_bad_requests_get_openai_error_bodies(agents):
    """Checked in the handler threads, before the runner sees them: an episode that is open
    (its agent waits on its first call; the runner is not stepped) and one that is over."""
    (ended,), runner, _ = run(agents, "solve", ["calc"], close=False)
    prompt = TASK.prompt(5)
    runner.submit(
        [Request(prompt.__class__(prompt.uid, "t", "1+2=", prompt.tokens, {"kind": "hang"}), 0, 8)]
    )
    base = runner._endpoint.url("x").split("/episodes/")[0]
    url, over = (
        runner._endpoint.url(f"{prompt.uid:x}-0-0"),
        runner._endpoint.url(f"{TASK.prompt(0).uid:x}-0-0"),
    )
    chat = {"model": "m", "messages": [{"role": "user", "content": "1+2="}]}
    cases = [
        (f"{base}/v1/chat/completions", chat, None, 404, "no episode in the URL"),
        (f"{over}/chat/completions", chat, None, 404, "is over"),
        (f"{base}/episodes/nope/v1/completions", {"prompt": "x"}, None, 404, "is over"),
        (f"{url}/chat/completions", None, b"{not json", 400, "not JSON"),
        (f"{url}/chat/completions", {"messages": "x"}, None, 400, "'messages' must be"),
        (
            f"{url}/chat/completions",
            {**chat, "temperature": 0.2},
            None,
            400,
            "engine.temperature=1.0",
        ),
        (f"{url}/embeddings", {"input": "x"}, None, 404, "no route"),
        (f"{url}/chat/completions", None, b" " * ((8 << 20) + 1), 413, "over"),
    ]
    for where, body, raw, status, words in cases:
        got, answer = _http(where, body, raw)
        assert got == status and words in answer["error"]["message"], (where, answer)
        assert set(answer["error"]) == {"message", "type", "param", "code"}
    model = {"id": "minirl", "object": "model", "created": 0, "owned_by": "minirl"}
    assert (
        _http(f"{url}/models")
        == _http(f"{base}/v1/models")
        == (200, {"object": "list", "data": [model]})
    )
    runner.close()  # the agent's waiting call is answered (503) and the agent cancelled
    assert runner.pending() == 0 and ended.score.reward == 1.0


def _raw(port: int, request: bytes) -> bytes:
    """What the endpoint answers to `request`, sent as is, until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_a_body_the_endpoint_cannot_read_is_answered_and_never_holds_a_thread():
    """No usable length (negative, not a number, chunked), JSON nested past the parser's depth,
    a body that stops arriving: an OpenAI-style error body, then the connection closes (before,
    the first and last held their handler thread until the client left, and the others were a
    500 or a misread). A silent connection is closed after the endpoint's idle time."""
    answer = lambda r: r.future.set_result((200, {}, False))  # noqa: E731
    endpoint = Endpoint(answer, lambda episode: True, Sampling(), idle_s=1.0).start()
    post = b"POST /episodes/a-0-0/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    deep = b"[" * 100_000
    cases = [
        (b"Content-Length: -1\r\n\r\n{}", 411, "the Content-Length '-1' is not read"),
        (b"Content-Length: ten\r\n\r\n{}", 411, "the Content-Length 'ten' is not read"),
        (b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 411, "a chunked body"),
        (b"Content-Length: %d\r\n\r\n" % len(deep) + deep, 400, "not JSON: maximum recursion"),
        (b"Content-Length: 100\r\n\r\n{", 408, "the body did not arrive within 1.0 s"),
    ]
    for request, status, words in cases:
        head, _, body = _raw(endpoint.port, post + request).partition(b"\r\n\r\n")
        assert head.split()[1] == str(status).encode(), head
        assert words in json.loads(body)["error"]["message"], body
    assert _raw(endpoint.port, b"") == b""  # closed after idle_s
    endpoint.close()


def test_agent_mistakes_are_one_line_at_the_start(agents, tmp_path, capsys):
    for name, words in [
        ("not_async", "must be an async function"),
        ("one_argument", "must take two arguments (client, row)"),
        ("missing", "has no async function 'missing'"),
    ]:
        with pytest.raises(ValueError, match=re.escape(words)):
            load_agent(f"{agents}:{name}")
    argv = ["train", "--preset", "fixture", "--run-dir", str(tmp_path / "run")]
    assert cli.main([*argv, "--agent", f"{agents}:not_async"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("minirl train: error: --agent ") and len(err.splitlines()) == 1
    assert cli.main([*argv, "--agent", f"{agents}:solve", "--env", f"{agents}:solve"]) == 2
    assert "an episode has one kind" in capsys.readouterr().err
    assert cli.main([*argv, "--set", "task.timeout=3"]) == 2
    assert "task.timeout does nothing without task.env or task.agent" in capsys.readouterr().err
    assert np.all(True)
