"""Multi-turn episodes (minirl/envs/) through the real Engine, Trainer and Controller (#23).

  the episode's tokens = each turn exactly as sampled + each observation as the template
    renders it, byte for byte; the batch the trainer sees holds exactly those tokens
  tool output is masked: the loss never sees it (changing its targets changes no bit of a step)
  exact mode: the trainer's recompute equals the engine's log-probs bitwise across turns (fast
    mode: within 1e-4); the KV cache continues across turns, also paged with preemption, and
    through interrupt("continue") / ("discard") mid-episode (restarts replay the same tokens)
  a template that is not append-only is a ValueError naming where it rewrote the episode;
    limits on turns and tokens; Engine.extend's checks
  through the Controller: trained on, and a snapshot-and-resume ends bitwise equal

The model is random, so its turns are made short by ending a turn at any digit (stop
sequences); the environment is scripted and answers every turn. Model-free parts of
minirl/envs (templates, tools, hostile code) are tests/envs/test_envs.py.
"""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx
from turn_shapes import CFG, EXACT, TOK

from minirl.envs import (
    Calculator,
    EpisodeConfig,
    EpisodeRunner,
    PythonTool,
    Step,
    ToolTaskEnv,
    Turns,
    stop_sequences,
)
from minirl.inference.engine import Engine, Request
from minirl.losses import get_preset
from minirl.modeling.model import init_model
from minirl.modeling.tokenizer import CharTokenizer
from minirl.tasks.countdown import Countdown
from minirl.training.batching import make_batch
from minirl.training.trainer import Trainer, TrainerConfig
from minirl.types import Prompt

PAGED = dataclasses.replace(EXACT, paged=True, block_size=16, num_blocks=10)  # preempts
TURNS = EpisodeConfig(max_turns=3)
PER_TURN = 12  # max_new_tokens of each turn


class Scripted:
    """Answers turn k with "t{k} {length of the turn's text}"; reward 0.1 x (length mod 5)."""

    made = 0

    def __init__(self):
        Scripted.made += 1
        self.seen: list[str] = []

    def reset(self, prompt):
        self.seen = []
        return prompt.text

    def step(self, text):
        self.seen.append(text)
        return Step(f"t{len(self.seen)} {len(text)}", 0.1 * (len(text) % 5), False)


def requests(n_prompts=4, samples=2):
    prompts = [
        Prompt(uid=10 + i, task="t", text=f"{100 + i}+{i}=", tokens=np.zeros(1, np.int32))
        for i in range(n_prompts)
    ]
    return [Request(p, s, PER_TURN) for p in prompts for s in range(samples)]


def runner(config, params, episode=TURNS, template=None, make_env=Scripted):
    engine = Engine(CFG, config, seed=3)
    engine.load_weights(0, params)
    return EpisodeRunner(engine, make_env, Turns(TOK, template), episode)


@pytest.fixture(scope="module")
def params():
    return jax.jit(lambda: nnx.to_pure_dict(nnx.split(init_model(CFG, seed=0))[1]))()


@pytest.fixture(scope="module")
def episodes(params):
    envs = []

    def make_env():
        envs.append(Scripted())
        return envs[-1]

    return runner(EXACT, params, make_env=make_env).generate(requests()), envs


@pytest.fixture(scope="module")
def batch(episodes):
    return make_batch(episodes[0], TOK.pad_id)


def segments(mask):
    """[(start, end, is_policy)] runs of equal mask values."""
    edges = [0, *np.nonzero(np.diff(mask))[0] + 1, len(mask)]
    return [(a, b, bool(mask[a])) for a, b in zip(edges, edges[1:], strict=False)]


# ---- the tokens ----------------------------------------------------------------------------


def test_episode_is_sampled_turns_plus_rendered_observations(episodes):
    rollouts, envs = episodes
    three = 0
    for r, env in zip(rollouts, envs, strict=True):
        assert np.array_equal(r.prompt.tokens, TOK.encode(r.prompt.text, bos=True))
        parts = segments(r.mask)
        turns = [r.tokens[a:b] for a, b, policy in parts if policy]
        observations = [r.tokens[a:b] for a, b, policy in parts if not policy]
        assert [p for _, _, p in parts] == [True, False] * len(observations) + [True]
        assert env.seen == [TOK.decode(t) for t in turns]  # the env read the sampled tokens
        for k, obs in enumerate(observations, 1):  # TOY_TEMPLATE, by hand
            text = f"\n= t{k} {len(env.seen[k - 1])}\n"
            assert np.array_equal(obs, TOK.encode(text, bos=False))
        off = r.mask == 0
        assert np.all(r.logprobs[off] == 0) and np.all(r.versions[off] == -1)
        assert np.all(r.versions[~off] == 0) and r.oldest_version == 0
        assert len(turns) <= TURNS.max_turns
        if len(turns) == 3:
            three += 1
            cut = r.finish_reason == "length"
            assert r.score.reason == ("turn 3 cut at max_new_tokens" if cut else "turn limit (3)")
        assert r.score.reward == pytest.approx(sum(0.1 * (len(t) % 5) for t in env.seen))
    assert three >= 3, "too few episodes reached 3 turns to test anything"


def test_batch_holds_the_engine_tokens_byte_for_byte(episodes, batch):
    rollouts = sorted(episodes[0], key=lambda r: (r.prompt.uid, r.sample_index))
    assert sum((r.mask == 0).any() for r in rollouts) >= 4  # most are multi-turn
    for i, r in enumerate(rollouts):
        seq = np.concatenate([r.prompt.tokens, r.tokens])
        n, p = len(seq) - 1, len(r.prompt.tokens)
        assert batch.tokens[i, :n].tobytes() == seq[:-1].tobytes()
        assert batch.targets[i, :n].tobytes() == seq[1:].tobytes()
        assert np.array_equal(batch.mask[i, p - 1 : n], r.mask)  # observations: mask 0
        assert batch.mask[i].sum() == r.mask.sum()
        assert np.array_equal(batch.behaviour_logprobs[i, p - 1 : n], r.logprobs)


@pytest.mark.gpu
def test_exact_logprobs_equal_the_trainers_across_turns(params, episodes, batch):
    cfg = TrainerConfig(micro_batch_tokens=256)
    trainer = Trainer(CFG, params, None, cfg, sampling=EXACT.sampling)
    got = trainer.recompute_logprobs(batch)
    m = batch.mask > 0
    after_an_observation = (np.cumsum(observation_targets(episodes[0], batch), axis=1) > 0) & m
    assert after_an_observation.sum() > 10  # turns 2 and 3 are really compared
    np.testing.assert_array_equal(
        got[m].view(np.uint32), batch.behaviour_logprobs[m].view(np.uint32)
    )


@pytest.mark.slow  # ~20 s cold: a paged engine pressed into preemption
def test_paged_cache_with_preemption_replays_the_same_episodes(params, episodes):
    run = runner(PAGED, params)
    again = run.generate(requests())
    assert run.engine.stats["preempted"] > 0 and run.engine.stats["extended"] > 0
    for a, b in zip(episodes[0], again, strict=True):
        assert (
            a.tokens.tobytes() == b.tokens.tobytes()
            and a.logprobs.tobytes() == b.logprobs.tobytes()
        )


@pytest.mark.parametrize("policy", ["continue", "discard"])
def test_interrupt_mid_episode(params, episodes, policy):
    """Same weights under a new version number: "continue" keeps every token and rebuilds the
    cache (observations included); "discard" restarts episodes and their environments, which
    replay the same tokens (counter-based keys). Either way the episodes equal the run without
    an interruption, bit for bit."""
    run = runner(EXACT, params)
    run.submit(requests())
    done = []
    while run.pending() and not any((ep.mask == 0).any() for ep in run._episodes.values()):
        done += run.step()
    made = Scripted.made
    run.engine.load_weights(1, params)
    assert run.interrupt(policy) > 0
    while run.pending():
        done += run.step()
    done.sort(key=lambda r: (r.prompt.uid, r.sample_index))
    for a, b in zip(episodes[0], done, strict=True):
        assert (
            a.tokens.tobytes() == b.tokens.tobytes()
            and a.logprobs.tobytes() == b.logprobs.tobytes()
        )
    late = np.concatenate([r.versions[r.mask > 0] for r in done])
    assert (late == 1).any()
    if policy == "continue":
        assert run.engine.stats["rebuilt"] > 0 and (late == 0).any()
    else:
        assert Scripted.made > made  # restarted episodes got fresh environments


@pytest.mark.slow  # a fast engine and recompute of their own (~13 s cold); exact (above) is bitwise
def test_fast_mode_logprobs_close_to_the_trainers_across_turns(params):
    fast = dataclasses.replace(EXACT, exact=False)
    batch = make_batch(runner(fast, params).generate(requests()), TOK.pad_id)
    cfg = TrainerConfig(micro_batch_tokens=256)
    got = Trainer(CFG, params, None, cfg, sampling=fast.sampling).recompute_logprobs(batch)
    m = batch.mask > 0
    np.testing.assert_allclose(got[m], batch.behaviour_logprobs[m], rtol=0, atol=1e-4)


def test_engine_extend_checks_its_input(params):
    engine = Engine(CFG, EXACT, seed=3)
    engine.load_weights(0, params)
    prompt = Prompt(uid=1, task="t", text="", tokens=TOK.encode("12+3="))
    engine.submit([Request(prompt, 0, 4, multi_turn=True)])
    while engine.num_active == 0 or not engine._sched.idle:
        engine.step()
    (turn,) = [engine._sched.slots[b] for b in engine._sched.active()]
    assert turn.held and engine.step() == []  # held: nothing decodes
    with pytest.raises(KeyError, match="no sequence in flight"):
        engine.extend(2, 0, [5], 4)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.extend(1, 0, [CFG.vocab_size], 4)
    with pytest.raises(ValueError, match="would not fit cache_len 128"):
        engine.extend(1, 0, [5] * 100, 40)
    engine.extend(1, 0, [5, 6], 4)
    with pytest.raises(ValueError, match="no finished turn to extend"):
        engine.extend(1, 0, [5], 4)
    engine.release(1, 0)
    assert engine.num_active == 0 and engine._sched.idle


def test_limits_end_episodes(params):
    run = runner(EXACT, params, EpisodeConfig(max_turns=3, max_tokens=36))
    out = run.generate(requests())
    reasons = {r.score.reason for r in out}
    assert "episode token limit (36)" in reasons
    assert all(len(r.prompt.tokens) + len(r.tokens) <= 36 for r in out)
    cut = [r for r in out if r.finish_reason == "length"]
    assert cut and all(r.score.reason.endswith("cut at max_new_tokens") for r in cut)


def test_another_eos_id_ends_the_episode(params):
    """The tokenizer's second EOS ids (here: every letter) are not what the template writes at
    a turn's end: a turn ending on one ends the episode instead of failing the check."""
    tok = CharTokenizer()
    letters = tuple(int(i) for i in tok.encode("abcdefghijklmnopqrstuvwxyz", bos=False))
    tok.eos_ids = (tok.eos_id, *letters)
    engine = Engine(CFG, dataclasses.replace(EXACT, eos_ids=tok.eos_ids), seed=3)
    engine.load_weights(0, params)
    out = EpisodeRunner(engine, Scripted, Turns(tok), TURNS).generate(requests())
    ended = [r for r in out if "ended the conversation" in r.score.reason]
    assert ended and all(r.tokens[-1] in letters and r.mask[-1] == 1 for r in ended)


# ---- the trainer -----------------------------------------------------------------------------


def observation_targets(rollouts, batch):
    """[B, T] True where a target is an observation token (from the rollouts, not the batch)."""
    out = np.zeros(batch.mask.shape, bool)
    rows = sorted(rollouts, key=lambda r: (r.prompt.uid, r.sample_index))
    for i, r in enumerate(rows):
        out[i, len(r.prompt.tokens) - 1 + np.nonzero(r.mask == 0)[0]] = True
    return out


@pytest.mark.parametrize(
    "preset",
    [
        "grpo",
        pytest.param("gspo", marks=pytest.mark.slow),
        pytest.param("decoupled_ppo", marks=pytest.mark.slow),
    ],
)
def test_tool_output_never_reaches_the_loss(params, episodes, batch, preset):
    """A train step on an episode batch, then the same step with every observation target
    replaced: the updated parameters are bitwise the same. The mask is the loss's input for
    every preset; GRPO in the default lane, the sequence-level and decoupled ones (a compile
    each) in the slow lane. The trainer runs in fast mode (its step compiles in half the time
    of exact mode's): the same program on the same inputs but the masked targets is bitwise
    deterministic either way."""
    cfg = TrainerConfig(micro_batch_tokens=256, learning_rate=1e-2)
    sampling = EXACT.sampling._replace(exact=False)
    first = Trainer(CFG, params, get_preset(preset), cfg, sampling=sampling)
    metrics = first.train_step(batch)
    assert np.isfinite(metrics["loss"]) and first.last_step_ok
    observed = observation_targets(episodes[0], batch)
    assert observed.sum() > 20
    poked = dataclasses.replace(batch, targets=np.where(observed, 5, batch.targets))
    second = Trainer(CFG, params, get_preset(preset), cfg, sampling=sampling)
    second.train_step(poked)
    same = jax.tree.map(
        lambda a, b: np.asarray(a).tobytes() == np.asarray(b).tobytes(),
        first.params(),
        second.params(),
    )
    assert all(jax.tree.leaves(same))
    moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), first.params(), params)
    assert any(jax.tree.leaves(moved))  # the step did train


# ---- the template ----------------------------------------------------------------------------

# Shows earlier assistant turns as "..." (as templates that drop past reasoning do).
REWRITING = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}{{ '\\n= ' + m.content + '\\n' }}"
    "{%- elif m.role == 'assistant' and loop.index0 < messages|length - 2 -%}..."
    "{%- else -%}{{ m.content }}{%- endif -%}"
    "{%- endfor -%}"
)


def test_a_template_that_is_not_append_only_is_detected(params):
    run = runner(EXACT, params, template=REWRITING)
    with pytest.raises(ValueError, match=r"not append-only.*\(in assistant turn 1\)"):
        run.generate(requests())


# ---- environments and tools --------------------------------------------------------------------


def test_tool_episodes_run_through_the_engine(params, request):
    """Countdown with both tools, end to end on the random model: scored episodes, and calls
    the model happens to write are answered (a digit-free stop: the closing tags)."""
    tools = [Calculator(), PythonTool()]
    request.addfinalizer(tools[1].close)
    config = dataclasses.replace(EXACT, stop_sequences=stop_sequences(tools, TOK))
    task = Countdown()
    run = runner(config, params, make_env=lambda: ToolTaskEnv(task, tools))
    reqs = [Request(task.prompt(i), 0, PER_TURN) for i in range(4)]
    out = run.generate(reqs)
    assert [r.prompt.uid for r in out] == [q.prompt.uid for q in reqs]
    assert all(r.score is not None and r.score.reward in (0.0, 1.0) for r in out)


# ---- through the controller: train, snapshot, resume ---------------------------------------------


def controller(params):
    """The real Controller in lockstep, the EpisodeRunner as its engine, EpisodeScores as its
    verifier: 2 prompts x 2 samples per step, grpo."""
    from minirl.control.controller import Controller
    from minirl.control.workers import InProcessWorker
    from minirl.data.mixture import Mixture
    from minirl.envs import EpisodeScores
    from minirl.run.presets import make_config
    from minirl.store.weights import InMemoryWeightStore
    from minirl.tasks import get_task

    base = make_config("fixture")
    rl = dataclasses.replace(base.rl, prompts_per_step=2, group_size=2, steps=3)
    cfg = dataclasses.replace(base, model=CFG, engine=EXACT, rl=rl)
    episodes = runner(EXACT, params)
    trainer = Trainer(CFG, params, get_preset("grpo"), TrainerConfig(micro_batch_tokens=256))
    ctl = Controller(
        cfg,
        engine=InProcessWorker(episodes),
        trainer=InProcessWorker(trainer),
        verifier=InProcessWorker(EpisodeScores()),
        store=InMemoryWeightStore(keep=4),
        mixture=Mixture({"fixture": get_task("fixture")}, seed=0),
        tokenizer=TOK,
        max_new_tokens=PER_TURN,
        log=lambda *_: None,
    )
    ctl.store.put(0, ctl.params())
    return ctl, trainer


def test_controller_trains_on_episodes_and_resumes_bitwise(params):
    """3 steps straight == 2 steps, snapshot (controller + trainer state), a fresh controller,
    engine and runner restored from it, 1 more step: the same weights, bit for bit."""
    straight, _ = controller(params)
    metrics = [straight.step() for _ in range(3)]
    assert all(np.isfinite(m["train/loss"]) for m in metrics)
    trained = [r for g in straight.last_trained for r in g.rollouts]
    assert any((r.mask == 0).any() for r in trained)  # multi-turn episodes were trained on
    first, trainer = controller(params)
    for _ in range(2):
        first.step()
    snap, state = first.snapshot(), trainer.state_dict()
    resumed, trainer = controller(params)
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
