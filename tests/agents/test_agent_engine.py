"""Agent episodes through the real Engine, Trainer and Controller (minirl/agents/runner.py).

The agent is the real `openai` client making three chat calls per episode (a random model
answers; its turns end at any digit, as in tests/envs/test_multiturn.py, whose shapes these
are). What holds for episodes run by an agent, as for the environments':

  token in, token out: every answer in the batch is, byte for byte, the tokens the engine
    sampled for that call; the new messages are the template's rendering, mask 0; the
    log-probs the agent got over HTTP are the ones the trainer's batch carries
  exact mode: the trainer's recompute equals the engine's log-probs bitwise across calls
    (each call's prompt is the episode so far, re-run by a prefill)
  n > 1: the episode follows the choice the next call sends back
  interrupt("discard") restarts the agents, which replay the same tokens; "continue" keeps
    them and later tokens carry the new version
  through the Controller: trained on, and a snapshot-and-resume ends bitwise equal
"""

import dataclasses
import json

import jax
import numpy as np
import pytest
from flax import nnx
from turn_shapes import CFG, EXACT, TOK

from minirl.agents import AgentConfig, AgentRunner, load_agent
from minirl.envs import Turns
from minirl.inference.engine import Engine, Request
from minirl.losses import get_preset
from minirl.modeling.model import init_model
from minirl.training.batching import make_batch
from minirl.training.trainer import Trainer, TrainerConfig
from minirl.types import Prompt

TURNS = Turns(TOK)
AGENT = '''
import json
from pathlib import Path

async def solve(client, row):
    """Three calls; each answer is followed by a tool message about it; what the agent got
    over HTTP is written down for the test."""
    messages, got = [{"role": "user", "content": row["prompt"]}], []
    for k in range(3):
        r = await client.chat.completions.create(
            model="m", messages=messages, max_tokens=8, logprobs=True, n=row.get("n", 1)
        )
        pick = r.choices[-1]  # n > 1: continue with the last choice
        got.append([x.logprob for x in pick.logprobs.content])
        messages.append(pick.message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "content": f"t{k} {len(pick.message.content or '')}"})
    Path(row["out"], f"{row['uid']}.json").write_text(json.dumps(got))
    return 0.25 * len(messages[-2]["content"] or "") % 1.0
'''


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    path = tmp_path_factory.mktemp("agent") / "agent.py"
    path.write_text(AGENT)
    return load_agent(f"{path}:solve")


@pytest.fixture(scope="module")
def params():
    return jax.jit(lambda: nnx.to_pure_dict(nnx.split(init_model(CFG, seed=0))[1]))()


class Spy:
    """The engine, recording every rollout it returns (what was sampled, per call)."""

    def __init__(self, engine):
        self.engine, self.seen = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def step(self):
        out = self.engine.step()
        self.seen += out
        return out


def requests(out, n_prompts=4, samples=2, n=1):
    prompts = [
        Prompt(10 + i, "t", f"{100 + i}+{i}=", np.ones(1, np.int32), {"uid": 10 + i, "n": n})
        for i in range(n_prompts)
    ]
    prompts = [dataclasses.replace(p, meta={**p.meta, "out": str(out)}) for p in prompts]
    return [Request(p, s, 8) for p in prompts for s in range(samples)]


def runner(agent, params, config=EXACT):
    engine = Engine(CFG, config, seed=3)
    engine.load_weights(0, params)
    return AgentRunner(Spy(engine), agent, TURNS, None, AgentConfig(timeout=30.0))


@pytest.fixture(scope="module")
def episodes(agent, params, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    run = runner(agent, params)
    done = run.generate(requests(out, samples=1))
    run.close()
    return done, run.engine.seen, out


def segments(mask):
    edges = [0, *np.nonzero(np.diff(mask))[0] + 1, len(mask)]
    return [(a, b, bool(mask[a])) for a, b in zip(edges, edges[1:], strict=False)]


def test_each_answer_is_the_engines_tokens_byte_for_byte(episodes):
    done, seen, out = episodes
    by_episode = {}
    for r in seen:  # the calls' requests: meta names the episode and the call
        by_episode.setdefault(r.prompt.meta["episode"][0], []).append(r)
    for e in done:
        calls = by_episode[e.prompt.uid]
        answers = [(a, b) for a, b, policy in segments(e.mask) if policy]
        assert len(answers) == len(calls) == 3
        for (a, b), call in zip(
            answers, sorted(calls, key=lambda r: r.prompt.meta["turn"]), strict=True
        ):
            assert e.tokens[a:b].tobytes() == call.tokens.tobytes()
            assert e.logprobs[a:b].tobytes() == call.logprobs.tobytes()
            # the call's prompt was the episode so far: the same tokens, no re-tokenization
            so_far = np.concatenate([e.prompt.tokens, e.tokens[:a]])
            assert call.prompt.tokens.tobytes() == so_far.astype(np.int32).tobytes()
        for a, b, policy in segments(e.mask):
            if not policy:
                text = TOK.decode(e.tokens[a:b], skip_special=False)
                assert text.startswith("\n= t") and (e.versions[a:b] == -1).all()
        got = json.loads((out / f"{e.prompt.uid}.json").read_text())  # over HTTP
        assert np.concatenate(got).astype(np.float32).tobytes() == e.logprobs[e.mask > 0].tobytes()
        assert e.prompt.tokens.tolist() == TOK.encode(e.prompt.text).tolist()


def test_exact_logprobs_equal_the_trainers_across_calls(episodes, params):
    done, _, _ = episodes
    batch = make_batch(done, TOK.pad_id)
    trainer = Trainer(
        CFG, params, None, TrainerConfig(micro_batch_tokens=256), sampling=EXACT.sampling
    )
    got, m = trainer.recompute_logprobs(batch), batch.mask > 0
    observed = np.cumsum((batch.mask == 0) & (np.cumsum(m, axis=1) > 0), axis=1) > 0
    assert (m & observed).sum() > 10  # answers after a tool message
    assert got[m].view(np.uint32).tolist() == batch.behaviour_logprobs[m].view(np.uint32).tolist()


def test_the_episode_follows_the_choice_sent_back(agent, params, tmp_path):
    run = runner(agent, params)
    done = run.generate(requests(tmp_path, n_prompts=2, samples=1, n=2))
    run.close()
    for e in done:
        calls = sorted(
            (r for r in run.engine.seen if r.prompt.meta["episode"][0] == e.prompt.uid),
            key=lambda r: (r.prompt.meta["turn"], r.sample_index),
        )
        assert len(calls) == 6  # 3 calls x 2 choices
        answers = [e.tokens[a:b] for a, b, policy in segments(e.mask) if policy]
        for k, answer in enumerate(answers[:2]):  # calls 1 and 2: the last choice was sent back
            assert answer.tobytes() == calls[2 * k + 1].tokens.tobytes()
        assert answers[2].tobytes() == calls[4].tokens.tobytes()  # the end: choice 0


@pytest.mark.parametrize("policy", ["discard", "continue"])
def test_interrupt_mid_episode(agent, params, episodes, policy, tmp_path):
    """Same weights under a new version number, interrupted once the first answers are in:
    "discard" restarts the agents (the same keys: the same tokens), "continue" rebuilds the
    calls in flight. Either way the episodes equal the undisturbed ones, bit for bit."""
    run = runner(agent, params)
    run.submit(requests(tmp_path, samples=1))
    done = []
    while run.pending() and not any(x.episode.turns for x in run._live.values()):
        done += run.step()
    run.engine.load_weights(1, params)
    run.interrupt(policy)
    while run.pending():
        done += run.step()
    run.close()
    done.sort(key=lambda r: r.prompt.uid)
    for a, b in zip(episodes[0], done, strict=True):
        assert (
            a.tokens.tobytes() == b.tokens.tobytes()
            and a.logprobs.tobytes() == b.logprobs.tobytes()
        )
    late = np.concatenate([r.versions[r.mask > 0] for r in done])
    assert (late == 1).any()
    if policy == "discard":
        assert run.stats["restarted"] > 0 and (late == 1).all()  # one version per episode
    else:
        assert (late == 0).any()


def controller(agent, params, out):
    """The real Controller in lockstep with the AgentRunner as its engine (2 x 2 episodes a
    step, grpo), scored by what the agent returns."""
    from minirl.control.controller import Controller
    from minirl.control.workers import InProcessWorker
    from minirl.data.mixture import Mixture
    from minirl.envs import EpisodeScores
    from minirl.run.presets import make_config
    from minirl.store.weights import InMemoryWeightStore

    prompts = [r.prompt for r in requests(out, n_prompts=16, samples=1)]
    base = make_config("fixture")
    rl = dataclasses.replace(base.rl, prompts_per_step=2, group_size=2, steps=3)
    cfg = dataclasses.replace(base, model=CFG, engine=EXACT, rl=rl)
    trainer = Trainer(CFG, params, get_preset("grpo"), TrainerConfig(micro_batch_tokens=256))
    ctl = Controller(
        cfg,
        engine=InProcessWorker(runner(agent, params)),
        trainer=InProcessWorker(trainer),
        verifier=InProcessWorker(EpisodeScores()),
        store=InMemoryWeightStore(keep=4),
        mixture=Mixture({"t": prompts}, seed=0),
        tokenizer=TOK,
        max_new_tokens=8,
        log=lambda *_: None,
    )
    ctl.store.put(0, ctl.params())
    return ctl, trainer


def test_controller_trains_on_agent_episodes_and_resumes_bitwise(agent, params, tmp_path):
    """3 steps straight == 2 steps, snapshot, a fresh controller and runner restored from it,
    1 more step: the same weights, bit for bit (the agent replays the same calls)."""
    straight, _ = controller(agent, params, tmp_path)
    metrics = [straight.step() for _ in range(3)]
    assert all(np.isfinite(m["train/loss"]) for m in metrics)
    assert any((r.mask == 0).any() for g in straight.last_trained for r in g.rollouts)
    first, trainer = controller(agent, params, tmp_path)
    for _ in range(2):
        first.step()
    snap, state = first.snapshot(), trainer.state_dict()
    resumed, trainer = controller(agent, params, tmp_path)
    trainer.load_state_dict(state)
    resumed.restore(snap)
    version, weights = resumed.counters.version, resumed.params()
    resumed.store.put(version, weights)
    resumed.engine.call("load_weights", version, weights).result()
    resumed.counters.engine_version = version
    last = resumed.step()
    assert last["train/loss"] == metrics[2]["train/loss"]
    same = jax.tree.map(
        lambda a, b: np.asarray(a).tobytes() == np.asarray(b).tobytes(),
        straight.params(),
        resumed.params(),
    )
    assert all(jax.tree.leaves(same))
