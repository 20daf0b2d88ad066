# %% [markdown]
r"""Lesson 16 — bring your own agent: an agent written with the openai SDK, trained with GRPO.

    python tutorials/16_bring_your_own_agent.py            # full mode (see the measured output)
    python tutorials/16_bring_your_own_agent.py --fast     # fast mode (a few minutes; what CI runs)

Writes `agent_rl.png`, `calc_agent.py` (the agent) and `results.json` into `--out` (default
`runs/tutorials/16_bring_your_own_agent`). Uses `minirl/agents/` (read docs/multiturn.md, "Your
own agent", next). Mirrors issue #47; the three-seed measurement is `experiments/agent.py`.


THE IDEA
--------
Nearly every agent today is written against an OpenAI client: it sends the conversation, gets
an answer with tool calls, runs its tools, sends the conversation again. To train such an agent
with RL you should not have to rewrite it. So during rollouts minirl serves an OpenAI-compatible
endpoint in front of its rollout engine, and runs your agent — an async function of
`(client, row)` — unchanged against it:

  the episode is in the URL  each episode's client has base_url
                             http://127.0.0.1:PORT/episodes/<id>/v1, so the server knows which
                             episode a call continues (the engine never sees HTTP)
  token in, token out        a call must send the conversation back unchanged and add to it;
                             the answers it holds are matched against the tokens already sampled
                             and kept as they are; only the new messages are rendered (by the
                             chat template) and encoded. A rewritten history is refused with a
                             400, never silently re-tokenized (lesson 14's rule)
  one rollout per episode    when the agent returns, the episode is one Rollout: the prompt, every
                             answer (mask 1, the engine's log-probs and versions), every tool
                             result (mask 0). Its reward is what the agent returns, or the task's
                             verifier on the final answer
  a barrier per engine step  the runner waits for every agent's next call before the engine's next
                             step, so which calls are batched together never depends on how fast
                             an agent answered: runs replay bitwise, resume after kill -9 bitwise

The model's tool calls are read in its own format (Qwen's <tool_call>, Llama 3.1's JSON); this
lesson's character-level model uses minirl's `<calc>12+3</calc>` form of the same calls.

WHAT THE SCRIPT DOES
--------------------
1. Writes the agent: a `calc` tool declared as an OpenAI function schema, run by the agent
   itself; the model's final answer is returned for the task's verifier.
2. Warm start: a scripted policy says the task's demonstration (one calc call with the whole
   sum, then `#### sum`) to the agent through the endpoint; supervised steps on the episodes the
   agent laid out. Prints one such episode, token run by token run, with its mask.
3. Episodes of the warm-started model through the endpoint, in exact mode, checked token by
   token: every answer in the batch is the tokens the engine sampled for that call, byte for
   byte; every call's prompt is the episode's tokens so far; the trainer's recomputed log-probs
   equal the engine's, bitwise, after the tool results too.
4. An agent that edits an earlier answer before its next call: the call is refused (HTTP 400)
   with the place it differs.
5. `minirl train --preset arithmetic --agent calc_agent.py:solve` (the command's own path,
   minirl/run/runner.py `Run`): held-out pass@1 before and after GRPO, and the figure.

Expected output (full mode, measured)
-------------------------------------
Measured on 2026-11-28 with `python tutorials/16_bring_your_own_agent.py --out /tmp/l16/out`
(empty warm-start cache), library at commit e18407d, on a virtual machine with 2 cores
(nproc = 2), nothing else running (load average 1-2, this lesson's own). It took 347 s of wall
time and 531 s of CPU time (user + sys; the lesson's own count, 527 s, leaves out the start-up).
The figure is figures/16_bring_your_own_agent.png.

    Step 1. the agent: /tmp/l16/out/calc_agent.py (the openai SDK, a calc tool it runs itself)

    Step 2. warm start: 60 supervised steps on episodes the agent laid out
      prompt '8+1=' (the agent's first message, rendered)
        policy  (mask 1)   16 tokens  '<calc>8+1</calc>'
        tool    (mask 0)    5 tokens  '\n= 9\n'
        policy  (mask 1)    7 tokens  '#### 9<eos>'
      warm start: {'cached': False, 'steps': 60, 'seconds': 81.1, 'final_loss': 0.0386}

    Step 3. episodes through the endpoint, checked token by token (exact mode)
      prompt '1+8+5=' -> reward 1.0 (correct)
        policy  (mask 1)   18 tokens  '<calc>1+8+5</calc>'
        tool    (mask 0)    6 tokens  '\n= 14\n'
        policy  (mask 1)    8 tokens  '#### 14<eos>'
      64 answers: each the engine's sampled tokens, byte for byte: True
      each call's prompt is the episode's tokens so far (no re-tokenization): True
      837 answer tokens (246 after a tool result): the trainer's recompute equals the engine's log-probs bitwise: True

    Step 4. an agent that edits its first answer before the next call
      reward 0.0: agent raised BadRequestError: Error code: 400 - messages[1] is not an answer
      minirl gave (('', (('calc', '{"expression": "1+8+5"}'),)) became (' (edited)', ...

    Step 5. minirl train --preset arithmetic --agent calc_agent.py:solve (40 GRPO steps)
      held-out before RL: pass@1 0.639  turns 2.00
      held-out after RL: pass@1 0.803  turns 2.00
      held-out pass@1 up after RL: True

The training reward over the 40 steps (64 episodes each) went from 0.61 / 0.55 / 0.55 at the
start to 0.91 / 0.89 at the end (results.json, `rl.train_rewards`); held-out pass@4 0.859 ->
0.922. One seed here; `experiments/agent.py` runs three (docs/multiturn.md, "Your own agent").
"""

# %%
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from minirl.inference.scheduler import Request
from minirl.modeling.tokenizer import CharTokenizer
from minirl.run.presets import make_config
from minirl.run.runner import Run
from minirl.run.starting_point import make_engine, make_task
from minirl.run.warmstart import ScriptedDemonstrations, warm_start
from minirl.training.batching import make_batch
from minirl.training.trainer import Trainer

TOK = CharTokenizer()
AGENT = '''"""A tool-using agent written with the openai SDK (lesson 16)."""
import json

CALC = {"type": "function", "function": {"name": "calc", "description": "Add integers, e.g. 12+345+6.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}


def add(expression):
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
            return m.content                      # the final answer: the verifier scores it
        for c in m.tool_calls:
            value = add(json.loads(c.function.arguments).get("expression", ""))
            messages.append({"role": "tool", "tool_call_id": c.id, "content": value})


async def edits(client, row):
    """Like solve, but changes its first answer before the next call."""
    messages = [{"role": "user", "content": row["prompt"]}]
    r = await client.chat.completions.create(model="minirl", messages=messages, tools=[CALC])
    m = r.choices[0].message.model_dump(exclude_none=True)
    m["content"] = (m.get("content") or "") + " (edited)"
    messages += [m, {"role": "tool", "tool_call_id": "call_0", "content": "7"}]
    await client.chat.completions.create(model="minirl", messages=messages, tools=[CALC])
'''


# %%
def config(args, agent: Path, name: str = "solve"):
    """The run: the arithmetic preset with your agent, a short warm start, GRPO."""
    sets = [
        f"task.agent={agent}:{name}",
        'task.args={"max_digits": 1, "max_operands": 4, "reverse_digits": false}',
        "task.max_turns=3",
        f"sft.steps={args.sft_steps}",
        f"rl.steps={args.rl_steps}",
        f"rl.prompts_per_step={args.prompts}",
        f"rl.group_size={args.group}",
        f"rl.checkpoint_every={args.rl_steps}",
        f"eval.prompts={args.eval_prompts}",
        f"eval.samples={args.eval_samples}",
        "trainer.learning_rate=3e-4",
    ]
    return make_config("arithmetic", sets)


# %%
def show(episode) -> list[dict]:
    """An episode as runs of equal mask: what the policy wrote, what the tool answered."""
    edges = [0, *np.nonzero(np.diff(episode.mask))[0] + 1, len(episode.mask)]
    runs = []
    for a, b in zip(edges, edges[1:], strict=False):
        who = "policy  (mask 1)" if episode.mask[a] else "tool    (mask 0)"
        text = TOK.decode(episode.tokens[a:b], skip_special=False)
        runs.append({"who": who, "tokens": int(b - a), "text": text})
        print(f"    {who}  {b - a:3d} tokens  {text!r}")
    return runs


# %%
def step2_warm_start(cfg, task) -> tuple[dict, dict]:
    print(f"\nStep 2. warm start: {cfg.sft.steps} supervised steps on episodes the agent laid out")
    demo = ScriptedDemonstrations(cfg, TOK, task)
    (first,) = demo(0, 1, cfg.sft.seed)
    demo.close()
    print(f"  prompt {first.prompt.text!r} (the agent's first message, rendered)")
    runs = show(first)
    params, report = warm_start(cfg, TOK, task, progress=False, log=lambda *a: None)
    print(f"  warm start: {report}")
    return params, {"demonstration": runs, "report": report}


# %%
class Spy:
    """The engine, recording every rollout it returns: what was sampled for each call."""

    def __init__(self, engine):
        self.engine, self.seen = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def step(self):
        out = self.engine.step()
        self.seen += out
        return out


# %%
def answers_are_the_engines(episodes, seen) -> tuple[bool, bool, int]:
    """(every answer is the tokens sampled for its call; every call's prompt is the episode so
    far; answers checked)."""
    calls = {}
    for r in seen:
        calls.setdefault(r.prompt.meta["episode"][0], []).append(r)
    same = prompts = True
    checked = 0
    for e in episodes:
        mine = sorted(calls[e.prompt.uid], key=lambda r: r.prompt.meta["turn"])
        edges = [0, *np.nonzero(np.diff(e.mask))[0] + 1, len(e.mask)]
        answers = [(a, b) for a, b in zip(edges, edges[1:], strict=False) if e.mask[a]]
        for (a, b), call in zip(answers, mine, strict=False):
            same &= e.tokens[a:b].tobytes() == call.tokens.tobytes()
            so_far = np.concatenate([e.prompt.tokens, e.tokens[:a]]).astype(np.int32)
            prompts &= call.prompt.tokens.tobytes() == so_far.tobytes()
            checked += 1
        same &= len(answers) == len(mine)
    return bool(same), bool(prompts), checked


# %%
def step3_token_checks(cfg, task, params, args) -> dict:
    print("\nStep 3. episodes through the endpoint, checked token by token (exact mode)")
    exact = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, exact=True))
    runner = make_engine(exact, TOK, task)
    runner.engine = Spy(runner.engine)
    runner.load_weights(0, params)
    prompts = [task.prompt(i, "test") for i in range(args.check_prompts)]
    episodes = runner.generate([Request(p, 0, task.max_new_tokens) for p in prompts])
    runner.close()
    first = next((e for e in episodes if (e.mask == 0).any()), episodes[0])
    print(f"  prompt {first.prompt.text!r} -> reward {first.score.reward} ({first.score.reason})")
    runs = show(first)
    same, prompts_ok, checked = answers_are_the_engines(episodes, runner.engine.seen)
    batch = make_batch(episodes, TOK.pad_id)
    trainer = Trainer(cfg.model, params, None, cfg.trainer, sampling=exact.engine.sampling)
    got, m = trainer.recompute_logprobs(batch), batch.mask > 0
    after = m & (np.cumsum((batch.mask == 0) & (np.cumsum(m, axis=1) > 0), axis=1) > 0)
    bitwise = bool(
        np.array_equal(got[m].view(np.uint32), batch.behaviour_logprobs[m].view(np.uint32))
    )
    print(f"  {checked} answers: each the engine's sampled tokens, byte for byte: {same}")
    print(f"  each call's prompt is the episode's tokens so far (no re-tokenization): {prompts_ok}")
    print(
        f"  {int(m.sum())} answer tokens ({int(after.sum())} after a tool result): the trainer's "
        f"recompute equals the engine's log-probs bitwise: {bitwise}"
    )
    return {
        "episode": runs,
        "answers_byte_equal": same,
        "prompts_are_the_episode": prompts_ok,
        "answers_checked": checked,
        "exact_bitwise": bitwise,
        "after_tool": int(after.sum()),
    }


# %%
def step4_rewritten(cfg, task, params, agent: Path) -> dict:
    print("\nStep 4. an agent that edits its first answer before the next call")
    cfg = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, agent=f"{agent}:edits"))
    runner = make_engine(cfg, TOK, task)
    runner.load_weights(0, params)
    (episode,) = runner.generate([Request(task.prompt(0, "test"), 0, task.max_new_tokens)])
    runner.close()
    reason = episode.score.reason
    print(f"  reward {episode.score.reward}: {reason[:190]}...")
    return {"refused": "is not an answer minirl gave" in reason, "reason": reason}


# %%
def step5_rl(cfg, out: Path, args) -> dict:
    print(
        f"\nStep 5. minirl train --preset arithmetic --agent calc_agent.py:solve ({cfg.rl.steps} GRPO steps)"
    )
    summary = Run(cfg, out / "run", log=lambda *a: None, progress=not args.fast).train(resume=False)
    metrics = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    before, after = summary["before"], summary["after"]
    for when, r in (("before", before), ("after", after)):
        print(f"  held-out {when} RL: pass@1 {r['pass@1']:.3f}  turns {r['turns']:.2f}")
    print(f"  held-out pass@1 up after RL: {after['pass@1'] > before['pass@1']}")
    rewards = [m["reward/mean"] for m in metrics]
    return {"before": before, "after": after, "train_rewards": rewards}


# %%
def plot(rl: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    values = [rl["before"]["pass@1"], rl["after"]["pass@1"]]
    a.bar(["before RL", "after RL"], values, color=["0.6", "tab:blue"])
    a.set_ylim(0, 1)
    a.set_ylabel("held-out pass@1")
    a.set_title("your agent, trained with GRPO")
    b.plot(np.arange(1, len(rl["train_rewards"]) + 1), rl["train_rewards"], marker=".")
    b.set_xlabel("GRPO step")
    b.set_ylabel("mean episode reward")
    b.set_title("training reward")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# %%
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="tiny budgets (CI)")
    parser.add_argument("--out", default="runs/tutorials/16_bring_your_own_agent")
    args = parser.parse_args()
    full = dict(sft_steps=60, rl_steps=40, prompts=16, group=8, eval_prompts=128, eval_samples=4)
    full |= dict(check_prompts=32)
    fast = dict(full, sft_steps=6, rl_steps=2, prompts=4, group=4, eval_prompts=8, eval_samples=2)
    fast |= dict(check_prompts=8)
    vars(args).update(fast if args.fast else full)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    agent = out / "calc_agent.py"
    agent.write_text(AGENT)
    print(f"Step 1. the agent: {agent} (the openai SDK, a calc tool it runs itself)")
    cfg = config(args, agent)
    task = make_task(cfg, TOK)
    params, warm = step2_warm_start(cfg, task)
    results = {
        "mode": "fast" if args.fast else "full",
        "warm_start": warm,
        "checks": step3_token_checks(cfg, task, params, args),
        "rewrite": step4_rewritten(cfg, task, params, agent),
        "rl": step5_rl(cfg, out, args),
    }
    plot(results["rl"], out / "agent_rl.png")
    results["seconds"] = {"wall": time.perf_counter() - t0, "cpu": time.process_time() - cpu0}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out / 'agent_rl.png'} and {out / 'results.json'}")
    c = results["checks"]
    claims = [c["answers_byte_equal"], c["prompts_are_the_episode"], c["exact_bitwise"]]
    if not all(claims + [results["rewrite"]["refused"]]):
        raise SystemExit(f"a claim of this lesson failed: {claims}, {results['rewrite']}")


# %%
if __name__ == "__main__":
    main()
