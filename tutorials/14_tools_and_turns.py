# %% [markdown]
r"""Lesson 14 — tools and turns: multi-turn episodes, token in and token out.

    python tutorials/14_tools_and_turns.py            # full mode (~12 CPU minutes on 2 cores)
    python tutorials/14_tools_and_turns.py --fast     # fast mode (about a minute; what CI runs)

Writes `tool_vs_no_tool.png` and `results.json` into `--out` (default
`runs/tutorials/14_tools_and_turns`). Uses `minirl/envs/` (read `docs/multiturn.md` next).
Mirrors, in miniature: issue #23, and the agent-RL bugs it rules out (TRL #5224, verl #3960,
verl #6501); the three-seed measurement is `experiments/tools.py`.


THE IDEA
--------
An agent answers in turns: it writes, calls a tool, reads the output, writes again. To train it
with RL the trainer must see EXACTLY the tokens the policy produced, and only those may carry a
gradient. Three rules make that true by construction:

  token in, token out   a turn's tokens are kept as sampled, never decoded and encoded again
                        (a tokenizer spells one string many ways; a re-encoded turn is not the
                        turn the policy produced). Only the tool's output is encoded.
  append-only           the observation's turn markers come from the chat template, rendered
                        once per turn; the new rendering must START WITH the text the episode's
                        tokens already spell, or minirl raises (a template that rewrites past
                        turns would silently change the training data).
  a loss mask           observation tokens get mask 0: the model reads them, the loss never
                        sees them.

The engine keeps one KV cache per episode: after a turn the slot is HELD, and the observation is
appended at the slot's offset (a prefill of a few tokens, never a re-run of the history). In
exact mode the trainer's recomputed log-probs equal the engine's bit for bit, across turns.

Then the point of tools: on scratchpad addition written most-significant-digit first (hard for
a small model alone: the first digit of the sum depends on every carry), a model that may call
`<calc>12+345+6</calc>` only has to copy. Same model, warm-start budget and RL budget: with the
calculator, held-out pass@1 is far higher. Most of the gap comes from the warm start (copying is
easy to learn, left-to-right addition is not); 30 GRPO steps move neither arm much.

WHAT THE SCRIPT DOES
--------------------
1. Warm-starts the calculator arm on demonstrations laid out as episodes (call, masked output,
   answer), then runs held-out episodes through Engine + EpisodeRunner and prints one, token
   run by token run, with its mask and the engine's counters (extensions, no re-prefills).
2. Exact mode: the same episodes from an exact engine; the trainer's recompute equals the
   engine's log-probs at every assistant token, bitwise, including turns after an observation.
3. A template that rewrites earlier turns (as templates that drop past reasoning do): the
   ValueError, which names the character and the turn.
4. RL without and with the calculator (one seed; GRPO through the Controller), pass@1 before
   and after, and the figure.

Expected output (full mode, measured)
-------------------------------------
Measured on 2026-11-25 with `python tutorials/14_tools_and_turns.py` on a shared virtual machine
with 2 cores (nproc = 2), beside another job of the same size (load average 5-6). It took 23.5
min of wall time and 12.2 min of CPU time (user + sys). The figure is
`tutorials/figures/14_tools_and_turns.png`. `experiments/tools.py` runs step 4 for seeds 0, 1
and 2 with its own warm-start prompts and evaluation (docs/multiturn.md): held-out pass@1 after RL
calc 0.930 / 0.922 / 0.949 against no tool 0.012 / 0.000 / 0.016.

    Step 1. episodes through the engine (calculator arm, after its warm start)
      prompt '5+756+77=' -> reward 1.0 (correct)
        policy  (mask 1)   21 tokens  '<calc>5+756+77</calc>'
        tool    (mask 0)    7 tokens  '\n= 838\n'
        policy  (mask 1)    9 tokens  '#### 838<eos>'
      engine: 64 observations appended to held caches, 0 re-prefills; pass@1 0.891

    Step 2. exact mode: the trainer's recompute equals the engine's log-probs
      504 assistant tokens (148 after an observation), 116 observation tokens masked: bitwise equal True

    Step 3. a template that rewrites earlier turns is refused
      turn 1: the observation appends '\n= 3\n'
      turn 2: ValueError: the chat template is not append-only: its new rendering differs from the episode's tokens at character 4 (in turn 1): '1+2=<calc>1+2</calc>\n= 3' beca...

    Step 4. RL without and with the calculator (30 GRPO steps each)
      no tool  held-out pass@1 before RL 0.012  after RL 0.012
      calc     held-out pass@1 before RL 0.887  after RL 0.891
      RL with the calculator beats RL without it: True

    wrote runs/tutorials/14_tools_and_turns/tool_vs_no_tool.png and runs/tutorials/14_tools_and_turns/results.json

Reading it. The episode is the rule in action: the call and the answer are the policy's tokens,
the calculator's `\n= 838\n` is read but masked, and each observation was appended to a held
KV cache (64 extensions, no re-prefill). Exact mode holds across turns, including the 148 tokens
sampled after an observation. The rewriting template is refused at the turn where it rewrites
turn 1. And the calculator wins by a mile, but honestly: the gap is there before RL (0.887 vs
0.012 after the same 200 supervised steps: copying a sum is easy to learn, adding left to right
is not), and 30 GRPO steps move neither arm by more than noise. RL here keeps what the warm start
gave; a task where RL has to discover when to call the tool is the next step.
"""

# %%
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from minirl.control.controller import Controller
from minirl.control.workers import InProcessWorker
from minirl.data.mixture import Mixture
from minirl.envs import (
    Calculator,
    EpisodeConfig,
    EpisodeRunner,
    EpisodeScores,
    ToolTaskEnv,
    Turns,
    demonstration_episode,
    stop_sequences,
)
from minirl.inference.engine import Engine, EngineConfig, Request
from minirl.losses import get_preset
from minirl.modeling.tokenizer import CharTokenizer
from minirl.run.presets import make_config
from minirl.run.starting_point import initial_params
from minirl.store.weights import InMemoryWeightStore
from minirl.tasks.arithmetic import Arithmetic, ArithmeticConfig
from minirl.training.batching import make_batch
from minirl.training.trainer import Trainer

TOK = CharTokenizer()
TURNS = Turns(TOK)
PER_TURN = 64  # max_new_tokens of one turn
TASK = Arithmetic(ArithmeticConfig(max_operands=4, reverse_digits=False))


# %%
def setup(tools):
    """The run config (the arithmetic preset's model and trainer) and its engine config."""
    cfg = make_config("arithmetic")
    engine = EngineConfig(
        slots=32,
        cache_len=160,
        prefill_buckets=(32, 64),
        prefill_rows=8,
        eos_ids=TOK.eos_ids,
        stop_sequences=stop_sequences(tools, TOK),
    )
    return dataclasses.replace(cfg, engine=engine)


# %%
def warm_start(cfg, tools, steps: int, batch: int, seed: int = 0):
    """Supervised steps on the arm's demonstrations (the loss sees only mask-1 tokens)."""
    trainer_cfg = dataclasses.replace(
        cfg.trainer,
        learning_rate=cfg.sft.learning_rate,
        schedule="cosine",
        warmup_steps=min(20, steps // 10),
        total_steps=steps,
    )
    trainer = Trainer(cfg.model, initial_params(cfg, seed=seed), None, trainer_cfg)
    for step in range(steps):
        prompts = [TASK.prompt(i, "train") for i in range(step * batch, (step + 1) * batch)]
        demos = [demonstration_episode(TASK, p, TURNS, tools) for p in prompts]
        trainer.sft_step(make_batch(demos, TOK.pad_id))
    return trainer.params(host=True)


# %%
def runner(engine_cfg, model_cfg, tools, params, version=0) -> EpisodeRunner:
    """A fresh engine with `params`, driven episode by episode (at most 3 turns each)."""
    engine = Engine(model_cfg, engine_cfg, seed=0)
    engine.load_weights(version, params)
    make_env = lambda: ToolTaskEnv(TASK, tools)  # noqa: E731
    return EpisodeRunner(engine, make_env, TURNS, EpisodeConfig(max_turns=3))


# %%
def heldout(n: int, samples: int) -> list[Request]:
    """`samples` episodes of each of the first n test prompts (the same ones every time)."""
    return [Request(TASK.prompt(i, "test"), g, PER_TURN) for i in range(n) for g in range(samples)]


# %%
def pass1(episodes) -> float:
    return float(np.mean([r.score.reward for r in episodes]))


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
def step1_episodes(cfg, params, args) -> dict:
    print("\nStep 1. episodes through the engine (calculator arm, after its warm start)")
    tools = [Calculator()]
    run = runner(cfg.engine, cfg.model, tools, params)
    episodes = run.generate(heldout(args.eval_prompts, 1))
    first = next((r for r in episodes if (r.mask == 0).any()), episodes[0])
    print(f"  prompt {first.prompt.text!r} -> reward {first.score.reward} ({first.score.reason})")
    runs = show(first)
    stats = run.engine.stats
    print(
        f"  engine: {stats['extended']} observations appended to held caches, "
        f"{stats['rebuilt']} re-prefills; pass@1 {pass1(episodes):.3f}"
    )
    return {"runs": runs, "extended": stats["extended"], "rebuilt": stats["rebuilt"]}


# %%
def step2_exact(cfg, params, args) -> dict:
    print("\nStep 2. exact mode: the trainer's recompute equals the engine's log-probs")
    exact = dataclasses.replace(cfg.engine, exact=True)
    episodes = runner(exact, cfg.model, [Calculator()], params).generate(
        heldout(args.exact_prompts, 1)
    )
    batch = make_batch(episodes, TOK.pad_id)
    trainer = Trainer(cfg.model, params, None, cfg.trainer, sampling=exact.sampling)
    got, m = trainer.recompute_logprobs(batch), batch.mask > 0
    observed = (batch.mask == 0) & (np.cumsum(m, axis=1) > 0) & (batch.targets != TOK.pad_id)
    after = m & (np.cumsum(observed, axis=1) > 0)  # assistant tokens after an observation
    equal = bool(
        np.array_equal(got[m].view(np.uint32), batch.behaviour_logprobs[m].view(np.uint32))
    )
    print(
        f"  {int(m.sum())} assistant tokens ({int(after.sum())} after an observation), "
        f"{int(observed.sum())} observation tokens masked: bitwise equal {equal}"
    )
    return {"bitwise_equal": equal, "tokens": int(m.sum()), "after_observation": int(after.sum())}


# %%
REWRITING = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}{{ '\\n= ' + m.content + '\\n' }}"
    "{%- elif m.role == 'assistant' and loop.index0 < messages|length - 2 -%}..."
    "{%- else -%}{{ m.content }}{%- endif -%}"
    "{%- endfor -%}"
)


# %%
def step3_template() -> dict:
    print("\nStep 3. a template that rewrites earlier turns is refused")
    turns = Turns(TOK, REWRITING)
    text, _ = turns.first("1+2=")
    parts = [(0, "the prompt"), (len(text), "turn 1")]
    messages = [{"role": "user", "content": "1+2="}]
    for k, (turn, out) in enumerate([("<calc>1+2</calc>", "3"), ("<calc>3*1</calc>", "3")], 1):
        messages += [{"role": "assistant", "content": turn}, {"role": "tool", "content": out}]
        try:
            added = turns.observation(text + turn, messages, parts)
        except ValueError as e:
            print(f"  turn {k}: ValueError: {str(e)[:150]}...")
            return {"refused_at_turn": k, "message": str(e)}
        parts.append((len(text) + len(turn), f"observation {k}"))
        text += turn + added
        parts.append((len(text), f"turn {k + 1}"))
        print(f"  turn {k}: the observation appends {added!r}")
    return {"refused_at_turn": None}


# %%
def rl_arm(tools, args, params=None) -> dict:
    """Warm start (unless `params` is one), pass@1, GRPO steps through the Controller, pass@1."""
    cfg = setup(tools)
    rl = dataclasses.replace(cfg.rl, prompts_per_step=args.prompts, group_size=args.group)
    cfg = dataclasses.replace(cfg, rl=rl)
    if params is None:
        params = warm_start(cfg, tools, args.sft_steps, args.sft_batch)
    before = pass1(
        runner(cfg.engine, cfg.model, tools, params).generate(
            heldout(args.eval_prompts, args.samples)
        )
    )
    trainer = Trainer(
        cfg.model, params, get_preset("grpo"), cfg.trainer, sampling=cfg.engine.sampling
    )
    ctl = Controller(
        cfg,
        engine=InProcessWorker(runner(cfg.engine, cfg.model, tools, params)),
        trainer=InProcessWorker(trainer),
        verifier=InProcessWorker(EpisodeScores()),
        store=InMemoryWeightStore(keep=4),
        mixture=Mixture({TASK.name: TASK}, seed=0),
        tokenizer=TOK,
        max_new_tokens=PER_TURN,
        log=lambda *_: None,
    )
    ctl.store.put(0, ctl.params())
    rewards = [ctl.step()["reward/mean"] for _ in range(args.rl_steps)]
    final = ctl.params()
    after = pass1(
        runner(cfg.engine, cfg.model, tools, final).generate(
            heldout(args.eval_prompts, args.samples)
        )
    )
    return {"before": before, "after": after, "train_rewards": rewards}


# %%
def step4_rl(params_calc, args) -> dict:
    print(f"\nStep 4. RL without and with the calculator ({args.rl_steps} GRPO steps each)")
    arms = {"no tool": rl_arm([], args), "calc": rl_arm([Calculator()], args, params_calc)}
    for name, r in arms.items():
        print(f"  {name:8s} held-out pass@1 before RL {r['before']:.3f}  after RL {r['after']:.3f}")
    holds = arms["calc"]["after"] > arms["no tool"]["after"]
    print(f"  RL with the calculator beats RL without it: {holds}")
    return {"arms": arms, "calc_beats_no_tool": holds}


# %%
def plot(arms: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    x = np.arange(len(arms))
    for i, (when, shade) in enumerate([("before", 0.45), ("after", 0.9)]):
        values = [arms[name][when] for name in arms]
        ax.bar(x + (i - 0.5) * 0.38, values, 0.38, alpha=shade, label=f"{when} RL")
    ax.set_xticks(x, list(arms))
    ax.set_ylabel("held-out pass@1")
    ax.set_ylim(0, 1)
    ax.set_title("scratchpad addition, answers left to right")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# %%
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="tiny budgets (CI)")
    parser.add_argument("--out", default="runs/tutorials/14_tools_and_turns")
    args = parser.parse_args()
    full = dict(sft_steps=200, sft_batch=64, rl_steps=30, prompts=8, group=8)
    full |= dict(eval_prompts=64, samples=4, exact_prompts=16)
    fast = dict(full, sft_steps=10, rl_steps=2, prompts=4, group=4, eval_prompts=8, samples=1)
    fast |= dict(exact_prompts=8)
    vars(args).update(fast if args.fast else full)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    cfg = setup([Calculator()])
    params = warm_start(cfg, [Calculator()], args.sft_steps, args.sft_batch)
    results = {
        "mode": "fast" if args.fast else "full",
        "episode": step1_episodes(cfg, params, args),
        "exact": step2_exact(cfg, params, args),
        "template": step3_template(),
        "rl": step4_rl(params, args),
    }
    plot({k: v for k, v in results["rl"]["arms"].items()}, out / "tool_vs_no_tool.png")
    results["seconds"] = {"wall": time.perf_counter() - t0, "cpu": time.process_time() - cpu0}
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nwrote {out / 'tool_vs_no_tool.png'} and {out / 'results.json'}")
    checks = [results["exact"]["bitwise_equal"], results["template"]["refused_at_turn"] == 2]
    if not all(checks):
        raise SystemExit(f"a claim of this lesson failed: {checks}")


# %%
if __name__ == "__main__":
    main()
