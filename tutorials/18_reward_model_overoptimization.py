# %% [markdown]
"""Lesson 18 — learning from a reward model, and over-optimising it.

    python tutorials/18_reward_model_overoptimization.py         # full mode (10 CPU-minutes)
    python tutorials/18_reward_model_overoptimization.py --fast  # fast mode (seconds; a tiny model)

Writes `overoptimization.png` and `results.json` into `--out` (default
`runs/tutorials/18_reward_model_overoptimization`), with what the run is made of: `data/` (the
prompts, a JSONL file), `gold.py` (the gold reward, a program) and `reward_model/` (the proxy, a
Hugging Face `Qwen2ForSequenceClassification` directory). Uses `--verifier rm:DIR`
(minirl/hf/reward_model.py, docs/verifiers.md) through `minirl train`'s own loop. Mirrors, in
miniature: Gao, Schulman & Hilton 2022, "Scaling Laws for Reward Model Overoptimization" (the RL
curves of their Fig. 1: the gold reward against the square root of the KL from the initial
policy, for RL against a learned proxy).


THE IDEA
--------
When no program can check an answer (is this summary good? is this reply helpful?), RLHF
learns one: a REWARD MODEL trained on comparisons ("A is better than B") and then used as the
reward of RL. But the reward model is only a PROXY for what the comparisons meant (the GOLD
reward): it was fitted on samples of the base policy, and RL moves the policy away from those
samples, to where the proxy was never checked. Goodhart's law: "when a measure becomes a
target, it ceases to be a good measure." Gao et al. measured it with a synthetic set-up: a large
"gold" reward model plays the human, labels the comparisons a smaller proxy is trained on, and
scores the policy that RL trains against the proxy. As RL goes on, the proxy score keeps rising,
while the gold score first rises and then FALLS. Plotted against d = sqrt(KL(pi || pi_init)),
how far the policy has moved (in nats), the gold score of RL follows

    R_gold(d) - R_gold(0) = d (alpha - beta log d)        (their functional form for RL)

a hump: up while the proxy's signal is mostly true, down once the policy finds where the proxy
is wrong.

Here the gold reward is a program, so nothing about it is learned or uncertain: countdown's own
verifier (minirl/tasks/countdown.py) with the preset's partial credit, 1 for an expression that
reaches the target using each given number once, 0.1 for a well-formed expression of the given
numbers that misses it, 0 for anything else. It is written as a reward function of a dataset row,
`gold.py:score` (`--verifier gold.py:score`), over a JSONL file of countdown prompts.

The proxy is a reward model made the way RLHF makes one, at 0.75M parameters:
  data    the base policy's samples of 1,024 training prompts, 8 each, every pair of samples of
          one prompt whose gold scores differ is a comparison ("the higher gold score wins");
          the last 10% of the prompts are held out
  model   a copy of the base policy (a Qwen2-shaped decoder: q/k/v biases, tied embeddings) with
          its language-model head replaced by a score head, a [hidden, 1] linear; the score of a
          conversation is the head on the final hidden state at its last token, transformers'
          sequence-classification rule
  loss    Bradley-Terry: -log sigmoid(r(prompt, winner) - r(prompt, loser)), 300 AdamW steps of
          64 pairs
  saved   as a Hugging Face Qwen2ForSequenceClassification directory (config.json with
          num_labels 1, model.safetensors with `score.weight`, the tokenizer), and loaded back
          by `RewardModel`, the class `--verifier rm:DIR` builds

Then GRPO (`minirl train`'s loop: Run.build_loop, one step at a time) with `data.verifier=rm:DIR`:
the reward of every completion is the proxy's score. No KL penalty (`rl.kl_coef=0`), so nothing
holds the policy near the base but the learning rate; the x axis measures how far it went. Every
few steps the script samples the SAME held-out prompts with the same keys and scores those
samples three ways: the proxy's score, the gold score, and log pi(y) - log pi_base(y) (summed
over the completion's tokens, averaged over the samples: an unbiased estimate of the KL from
the base, in nats per completion). Three seeds of RL against the proxy; one run of RL against
the gold itself, as a control: what the same RL does when its reward cannot be gamed.

WHAT THE SCRIPT DOES
--------------------
1. Writes the data (countdown prompts as chat rows, each with one random well-formed expression
   as its demonstration) and gold.py; warm-starts the base policy on the demonstrations (100
   supervised steps: a base that writes well-formed expressions about 2/3 of the time).
2. Samples the base on 1,024 training prompts, scores the samples with the gold, and builds the
   comparisons.
3. Trains the reward model (Bradley-Terry), prints its held-out accuracy by kind of pair, saves
   it as a Hugging Face directory and checks that `RewardModel(DIR)` scores as the trained
   model does.
4. RL against the proxy (3 seeds) and against the gold (1 seed), 60 steps each, measured every 5
   steps; fits Gao et al.'s form to each proxy run's gold curve.
5. Prints the curves, the claims, and plots gold and proxy against sqrt(KL).

Expected output (full mode, measured)
-------------------------------------
Measured on 2026-11-29 with `python tutorials/18_reward_model_overoptimization.py --out
/tmp/l18full/out3` (nothing cached: the warm start ran), library at commit 86771e5 plus this
lesson, on a virtual machine with 2 cores (nproc = 2, AMD EPYC) shared with other jobs (load
average 1.3 at the start, 4.3 at the end). It took 443 s of wall time and 620 s of CPU time (user 481 s + sys
141 s; peak memory 0.9 GB): 140 s for the reward model's 300 steps, about 108 s for each of the
four RL runs with their 13 measurements. An earlier run (at load 3: 638 s of wall time, 616 s of
CPU time) gave the same numbers to the last digit: lockstep runs are deterministic on one
machine. The figure is figures/18_reward_model_overoptimization.png.

What the numbers say. The result of Gao et al. reproduces in miniature, in every seed. The
reward model is a fair proxy on the base's own samples: 0.794 of held-out comparisons ordered
as the gold orders them (0.920 for a right answer against one that scores 0, 0.721 for a right
answer against a well-formed wrong one: it learned the format well and the arithmetic in part).
RL against it raises its score all the way, 0.27 -> 1.20-1.30 over 60 steps. The gold score
rises with it at first, 0.223 -> 0.304-0.334, a peak at steps 20-35 and sqrt(KL) 0.94-1.14,
then falls to 0.165-0.208 at sqrt(KL) 1.83-2.03: below the base the run started from. RL
against the gold itself, from the same base with the same settings, rises to 0.374 and is still
rising at step 60. What the policy found: expressions the proxy scores highly that use the
wrong numbers (one the prompt did not give, or one twice). Such samples go from 0.338 of the
held-out samples to 0.537-0.600 (the gold-trained run: 0.148). The base answered "7 4 1 -> 4:"
with "7-1+4" and "7 6 8 -> 21:" with "6+8-7"; at the end seed 0 writes "7+1+9" and "6+8+9"
(all pluses, and a 9). On the policy's own samples the proxy's accuracy falls from 0.785 at the
base (about its held-out accuracy, 0.794) to 0.42-0.49, worse than a coin: the policy now
writes what the proxy was never trained to judge. Per step, early on the proxy is as
good a teacher as the gold (gold score 0.297 / 0.255 / 0.276 at step 10 against the proxy, 0.275
against the gold), but it keeps pushing after its true signal is used up, and the policy moves
twice as far (sqrt(KL) 1.83-2.03 at step 60, against 1.01).

What does not match: Gao et al.'s RL form d (alpha - beta log d) fits the gold curves only
roughly (rms error 0.023-0.028 on gains of 0.08-0.11): it puts the peak at sqrt(KL) 0.64-0.73,
before the measured maxima (0.94-1.14), because its fall is slow and the measured one is steep
past sqrt(KL) 1.4. Their curves come from reward models of 3M to 3B parameters and a 1.2B
policy; here there is one reward model, so the scaling laws of the title (how the peak moves
with the reward model's size and data) are not measured, nor the effect of a KL penalty (they
found it acts like early stopping).

    mode: full

    Step 1. [   16s wall,    26s cpu] 4096 training rows in /tmp/l18full/out3/data, the gold reward RewardFunction('/tmp/l18full/out3/gold.py:score'); the base policy: 0.75M parameters, 100 warm-start steps on the rows' demonstrations

    Step 2. [   30s wall,    47s cpu] 8192 samples of the base on 1024 training prompts, gold score mean 0.250 (samples by gold score: {'0': 2592, '0.1': 3951, '1': 1649}); 16277 comparisons, 1571 of them held out

    Step 3. [  107s wall,   187s cpu] the reward model: 300 Bradley-Terry steps, loss 0.690 -> 0.382
        pairwise accuracy (pairs)   all   1 > 0.1    1 > 0  0.1 > 0
        train     ( 14706)    0.820     0.712    0.912    0.858
        held_out  (  1571)    0.794     0.721    0.920    0.792
        saved as Qwen2ForSequenceClassification in /tmp/l18full/out3/reward_model; RewardModel(DIR) scores 64 samples as the trained model does: max |difference| 0.0e+00

    Step 4. [  107s wall,   187s cpu] GRPO with data.verifier=rm:/tmp/l18full/out3/reward_model (RewardModel('/tmp/l18full/out3/reward_model')), 60 steps, measured every 5 on 128 held-out prompts x 4 samples
        run             step   sqrt(KL)   proxy    gold   right  well-formed  proxy acc
        proxy seed 0       0      0.000   0.267   0.223   0.176        0.645      0.785
        proxy seed 0       5      0.404   0.446   0.248   0.201        0.666      0.791
        proxy seed 0      10      0.674   0.570   0.297   0.252        0.699      0.797
        proxy seed 0      15      0.788   0.546   0.297   0.254        0.682      0.815
        proxy seed 0      20      0.817   0.628   0.312   0.266        0.725      0.750
        proxy seed 0      25      0.915   0.738   0.323   0.275        0.748      0.745
        proxy seed 0      30      1.054   0.705   0.332   0.287        0.734      0.769
        proxy seed 0      35      1.136   0.816   0.334   0.291        0.717      0.700
        proxy seed 0      40      1.297   0.905   0.322   0.283        0.670      0.611
        proxy seed 0      45      1.410   0.904   0.288   0.254        0.598      0.598
        proxy seed 0      50      1.491   0.978   0.288   0.256        0.578      0.589
        proxy seed 0      55      1.765   1.138   0.234   0.207        0.475      0.523
        proxy seed 0      60      1.834   1.203   0.208   0.182        0.445      0.485
        proxy seed 1       0      0.000   0.267   0.223   0.176        0.645      0.785
        proxy seed 1       5      0.448   0.492   0.242   0.195        0.662      0.724
        proxy seed 1      10      0.631   0.563   0.255   0.209        0.666      0.744
        proxy seed 1      15      0.742   0.590   0.278   0.232        0.689      0.741
        proxy seed 1      20      0.886   0.694   0.306   0.262        0.705      0.735
        proxy seed 1      25      0.974   0.705   0.313   0.270        0.703      0.714
        proxy seed 1      30      1.096   0.831   0.315   0.271        0.703      0.668
        proxy seed 1      35      1.259   0.862   0.287   0.248        0.641      0.681
        proxy seed 1      40      1.417   0.935   0.289   0.254        0.605      0.597
        proxy seed 1      45      1.477   0.943   0.282   0.248        0.586      0.584
        proxy seed 1      50      1.663   1.083   0.227   0.197        0.492      0.515
        proxy seed 1      55      1.791   1.159   0.216   0.188        0.469      0.475
        proxy seed 1      60      2.027   1.297   0.165   0.141        0.385      0.422
        proxy seed 2       0      0.000   0.267   0.223   0.176        0.645      0.785
        proxy seed 2       5      0.414   0.385   0.236   0.189        0.658      0.738
        proxy seed 2      10      0.634   0.510   0.276   0.230        0.686      0.725
        proxy seed 2      15      0.907   0.602   0.287   0.244        0.670      0.763
        proxy seed 2      20      0.939   0.646   0.304   0.260        0.697      0.743
        proxy seed 2      25      1.089   0.677   0.290   0.246        0.684      0.714
        proxy seed 2      30      1.239   0.749   0.278   0.238        0.639      0.654
        proxy seed 2      35      1.328   0.798   0.278   0.238        0.639      0.632
        proxy seed 2      40      1.289   0.799   0.303   0.262        0.678      0.663
        proxy seed 2      45      1.504   0.929   0.265   0.229        0.590      0.613
        proxy seed 2      50      1.695   1.060   0.222   0.191        0.496      0.551
        proxy seed 2      55      1.928   1.145   0.179   0.156        0.385      0.583
        proxy seed 2      60      1.910   1.205   0.188   0.164        0.400      0.502
        gold seed 0        0      0.000   0.267   0.223   0.176        0.645      0.785
        gold seed 0        5      0.306   0.341   0.251   0.205        0.664      0.742
        gold seed 0       10      0.477   0.440   0.275   0.229        0.691      0.740
        gold seed 0       15      0.565   0.480   0.277   0.230        0.695      0.782
        gold seed 0       20      0.544   0.484   0.292   0.244        0.727      0.747
        gold seed 0       25      0.733   0.631   0.321   0.271        0.764      0.790
        gold seed 0       30      0.711   0.609   0.324   0.273        0.781      0.804
        gold seed 0       35      0.714   0.686   0.316   0.264        0.785      0.819
        gold seed 0       40      0.780   0.703   0.328   0.277        0.787      0.752
        gold seed 0       45      0.882   0.712   0.339   0.287        0.803      0.800
        gold seed 0       50      0.921   0.787   0.354   0.301        0.834      0.769
        gold seed 0       55      0.962   0.751   0.351   0.297        0.836      0.783
        gold seed 0       60      1.015   0.748   0.374   0.322        0.840      0.756

    Step 5. [  442s wall,   619s cpu] the gold score: base -> peak (step, sqrt(KL)) -> last step
        proxy seed 0   gold 0.223 -> 0.334 (35, 1.14) -> 0.208 at sqrt(KL) 1.83;  proxy 0.27 -> 1.20
                       fit of d(alpha - beta log d): alpha 0.086, beta 0.124, its peak at sqrt(KL) 0.73, rms error 0.026
        proxy seed 1   gold 0.223 -> 0.315 (30, 1.10) -> 0.165 at sqrt(KL) 2.03;  proxy 0.27 -> 1.30
                       fit of d(alpha - beta log d): alpha 0.065, beta 0.110, its peak at sqrt(KL) 0.67, rms error 0.028
        proxy seed 2   gold 0.223 -> 0.304 (20, 0.94) -> 0.188 at sqrt(KL) 1.91;  proxy 0.27 -> 1.20
                       fit of d(alpha - beta log d): alpha 0.063, beta 0.113, its peak at sqrt(KL) 0.64, rms error 0.023
        gold seed 0    gold 0.223 -> 0.374 (60, 1.01) -> 0.374 at sqrt(KL) 1.01;  proxy 0.27 -> 0.75
                       fit of d(alpha - beta log d): alpha 0.144, beta -0.043, its peak at sqrt(KL) nan, rms error 0.006

        the gold's verdicts on the held-out samples:  right  wrong value  wrong numbers  malformed
        proxy seed 0   step   0                   0.176        0.469          0.338      0.018
        proxy seed 0   step  60                   0.182        0.264          0.537      0.018
        proxy seed 1   step  60                   0.141        0.244          0.600      0.016
        proxy seed 2   step  60                   0.164        0.236          0.588      0.012
        gold seed 0    step  60                   0.322        0.518          0.148      0.012
        samples of the last step (proxy seed 0): ['7+1+9', '6+8+9', '8+6+5', '7+2+1']

      claims:
        the reward model loads through RewardModel and scores as trained     True
        the KL from the base is 0 before RL                                  True
        every curve is finite                                                True
        the reward model beats chance on held-out comparisons                True
        the proxy score rises in every seed                                  True
        against the proxy the gold score rises, then falls, in every seed    True
        RL against the gold itself ends above every run against the proxy    True

    [  443s wall,   620s cpu] wrote /tmp/l18full/out3/overoptimization.png and /tmp/l18full/out3/results.json
wrote /tmp/l18full/out2/overoptimization.png and /tmp/l18full/out2/results.json
"""

# %%
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

# %%
# What every run of the lesson shares: a dataset file of countdown prompts, a Qwen2-shaped
# policy (q/k/v biases) and an engine sized for 14-token prompts and 18-token completions.
COMMON = [
    "task.name=file",
    "data.max_new_tokens=18",  # countdown's budget for 3 one-digit numbers, EOS included
    "model.qkv_bias=true",  # Qwen2's shape: the reward model is a Qwen2ForSequenceClassification
    "engine.slots=64",
    "engine.cache_len=64",
    "engine.prefill_buckets=[32]",
    "rl.time_budget=0",
    "rl.kl_coef=0",  # no KL penalty: how far the policy moves is the x axis
]
TINY_MODEL = [  # fast mode: the fixture preset's model sizes (compiles in seconds)
    "model.dim=64",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.head_dim=32",
    "model.mlp_dim=128",
]
FULL = dict(
    rows=4096,  # training rows (prompts with a demonstration)
    test_rows=256,
    policy=["sft.steps=100", "trainer.learning_rate=5e-5"],
    evaluation=["eval.prompts=128", "eval.samples=4"],
    rm_prompts=1024,
    rm_samples=8,
    rm_steps=300,
    rm_batch=64,
    rm_learning_rate=3e-4,
    steps=60,
    eval_every=5,
    seeds=(0, 1, 2),
)
FAST = dict(
    rows=256,
    test_rows=16,
    policy=["sft.steps=60", "trainer.learning_rate=5e-5", "rl.prompts_per_step=4"] + TINY_MODEL,
    evaluation=["eval.prompts=8", "eval.samples=2"],
    rm_prompts=64,
    rm_samples=4,
    rm_steps=4,
    rm_batch=16,
    rm_learning_rate=3e-4,
    steps=2,
    eval_every=2,
    seeds=(0,),
)
HELD_OUT_RM = 0.1  # share of the reward model's prompts whose comparisons it never trains on
PAIR_KINDS = ("1 > 0.1", "1 > 0", "0.1 > 0")  # gold of the winner > gold of the loser
VERDICTS = ("right", "wrong value", "wrong numbers", "malformed")  # the gold's, in four kinds

GOLD_PY = '''"""The gold reward: countdown's own verifier, as a reward function of a dataset row
(`--verifier gold.py:score`): 1 for the target reached with each given number once, 0.1 for a
well-formed expression of the given numbers that misses it, else 0."""

from types import SimpleNamespace

from minirl.tasks.countdown import CountdownVerifier

VERIFIER = CountdownVerifier(format_reward=0.1)


def score(completion, row):
    problem = {"numbers": row["numbers"], "target": row["target"], "use_all": True}
    rollout = SimpleNamespace(text=completion, prompt=SimpleNamespace(meta=problem))
    return VERIFIER.score_one(rollout)
'''


# %% [markdown]
# Step 1: the data, the gold reward and the base policy


# %%
def write_if_changed(path: Path, text: str) -> None:
    """Write `text` unless the file already holds it (the warm start's cache key includes the
    data file's modification time: an unchanged file keeps the cached base)."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


# %%
def write_data(out: Path, mode: dict) -> tuple[Path, Path]:
    """train.jsonl and test.jsonl of countdown problems (the preset's: 3 numbers, + and -): a
    row is the prompt as a user message, one random well-formed expression over its numbers as
    the assistant's demonstration (for the warm start; it ignores the target), and the numbers
    and target the gold reads."""
    from minirl.run.presets import make_config
    from minirl.tasks import get_task

    task = get_task("countdown", **make_config("countdown").task.args)
    (out / "data").mkdir(parents=True, exist_ok=True)
    paths = []
    for split, n in (("train", mode["rows"]), ("test", mode["test_rows"])):
        lines = []
        for i in range(n):
            p = task.prompt(i, split)
            messages = [
                {"role": "user", "content": p.text},
                {"role": "assistant", "content": task.demonstration(p)},
            ]
            row = {"messages": messages, "numbers": p.meta["numbers"], "target": p.meta["target"]}
            lines.append(json.dumps(row) + "\n")
        paths.append(out / "data" / f"{split}.jsonl")
        write_if_changed(paths[-1], "".join(lines))
    write_if_changed(out / "gold.py", GOLD_PY)
    return paths[0], paths[1]


# %%
def configs(mode: dict, out: Path, seed: int = 0) -> tuple:
    """(the gold run's config, the proxy run's): the same run, scored by gold.py:score or by
    the reward model in out/reward_model (`--verifier rm:DIR`)."""
    from minirl.run.presets import make_config

    data = [
        f"data.train={out / 'data' / 'train.jsonl'}",
        f"data.eval={out / 'data' / 'test.jsonl'}",
        f"rl.seed={seed}",
    ]
    sets = COMMON + data + mode["policy"] + mode["evaluation"]
    gold = make_config("countdown", sets + [f"data.verifier={out / 'gold.py'}:score"])
    proxy = make_config("countdown", sets + [f"data.verifier=rm:{out / 'reward_model'}"])
    return gold, proxy


# %% [markdown]
# Step 2: the comparisons, from the base policy's samples


# %%
def sample(engine, run, prompts: list, samples: int) -> list:
    """`samples` completions of each prompt (decoded), in prompt order."""
    from minirl.control.evaluation import decode_rollouts
    from minirl.inference.scheduler import Request

    requests = [Request(p, k, run.task.max_new_tokens) for p in prompts for k in range(samples)]
    order = {p.uid: i for i, p in enumerate(prompts)}
    rollouts = engine.generate(requests)  # in the order they finished
    rollouts.sort(key=lambda r: (order[r.prompt.uid], r.sample_index))
    decode_rollouts(rollouts, run.tokenizer)
    return rollouts


# %%
def with_prompts(rollouts: list, prompts: dict) -> list:
    """The rollouts with each prompt replaced by `prompts[uid]`: the same row as the other run
    reads it (the gold run's prompts carry the row's numbers, the proxy run's its messages)."""
    return [dataclasses.replace(r, prompt=prompts[r.prompt.uid]) for r in rollouts]


# %%
def comparisons(gold: np.ndarray, samples: int) -> np.ndarray:
    """[N, 2] (winner, loser) index pairs: every two samples of one prompt whose gold scores
    differ, the higher one first (`gold` [P * samples], prompt-major)."""
    pairs = []
    for p in range(len(gold) // samples):
        rows = range(p * samples, (p + 1) * samples)
        pairs += [(a, b) for a in rows for b in rows if gold[a] > gold[b]]
    return np.asarray(pairs, np.int64).reshape(-1, 2)


# %% [markdown]
# Step 3: the reward model, trained, saved as Qwen2ForSequenceClassification and loaded back


# %%
def save_reward_model(body: dict, head, model_cfg, tokenizer, path: Path) -> None:
    """A Hugging Face sequence classifier: the decoder as `save_hf` writes a causal LM (a tied
    model has no lm_head), config.json retitled Qwen2ForSequenceClassification with one label,
    and the score head [1, hidden] added to model.safetensors."""
    from safetensors.numpy import load_file, save_file

    from minirl.hf.model_files import TokenIds, save_hf

    ids = TokenIds(bos=tokenizer.bos_id, eos=tuple(tokenizer.eos_ids), pad=tokenizer.pad_id)
    save_hf(body, model_cfg, path, token_ids=ids)
    tokenizer.save(path)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"], config["architectures"]
    config.update(
        architectures=["Qwen2ForSequenceClassification"],
        num_labels=1,
        id2label={"0": "LABEL_0"},
        label2id={"LABEL_0": 0},
    )
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = load_file(str(path / "model.safetensors"))
    tensors["score.weight"] = np.ascontiguousarray(np.asarray(head, np.float32).T)  # [1, D]
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


# %%
def padded(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(token rows right-padded with 0 [N, L], each row's last index [N]); L a multiple of 8.
    Padding is never read: the decoder is causal and the score is read at the last token."""
    length = -(-max(len(r) for r in rows) // 8) * 8
    tokens = np.zeros((len(rows), length), np.int32)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
    return tokens, np.asarray([len(r) - 1 for r in rows], np.int32)


# %%
def train_reward_model(scores, params, tokens, last, pairs, held_out, mode: dict, seed: int = 0):
    """Bradley-Terry on the comparisons not in `held_out`: `mode["rm_steps"]` AdamW steps of
    `rm_batch` random pairs, loss -log sigmoid(r_winner - r_loser). `scores(body, head, tokens,
    last)` [R] is RewardModel's own forward (minirl.hf.reward_model.scores_function)."""

    def loss(p, winners, losers):  # each (tokens [N, L], last [N]) of one side of N pairs
        margin = scores(p["body"], p["head"], *winners) - scores(p["body"], p["head"], *losers)
        return -jnp.mean(jax.nn.log_sigmoid(margin))  # margin [N]

    schedule = optax.cosine_decay_schedule(mode["rm_learning_rate"], mode["rm_steps"])
    opt = optax.adamw(schedule, weight_decay=0.0)
    state = opt.init(params)

    @jax.jit
    def step(p, state, winners, losers):
        value, grads = jax.value_and_grad(loss)(p, winners, losers)
        updates, state = opt.update(grads, state, p)
        return optax.apply_updates(p, updates), state, value

    train = pairs[~held_out]
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(mode["rm_steps"]):
        win, lose = train[rng.integers(0, len(train), mode["rm_batch"])].T  # [rm_batch] each
        params, state, value = step(
            params, state, (tokens[win], last[win]), (tokens[lose], last[lose])
        )
        losses.append(float(value))
    return params, losses


# %%
def score_rows(scores, params, tokens, last, rows: int = 512) -> np.ndarray:
    """The reward model's scores [N] of token rows [N, L], `rows` rows a call (all 8,192 in one
    call would hold gigabytes of activations)."""
    parts = [
        scores(params["body"], params["head"], tokens[i : i + rows], last[i : i + rows])
        for i in range(0, len(tokens), rows)
    ]
    return np.concatenate([np.asarray(part) for part in parts])


# %%
def pair_accuracy(reward: np.ndarray, gold: np.ndarray, pairs: np.ndarray) -> dict:
    """How often the reward orders a comparison as the gold does, overall and by kind of pair
    ("1 > 0.1": a right answer against a well-formed wrong one, ...)."""
    right = reward[pairs[:, 0]] > reward[pairs[:, 1]]
    out = {"all": float(right.mean()) if len(pairs) else float("nan"), "pairs": len(pairs)}
    kinds = {(gold[a], gold[b]) for a, b in pairs}
    for hi, lo in sorted(kinds, reverse=True):
        of_kind = (gold[pairs[:, 0]] == hi) & (gold[pairs[:, 1]] == lo)
        out[f"{hi:g} > {lo:g}"] = float(right[of_kind].mean())
    return out


# %% [markdown]
# Step 4: RL against the proxy (and against the gold), measured on held-out samples


# %%
def verdict_shares(reasons: list[str]) -> dict:
    """The gold's verdicts in four kinds, as shares of the samples: right, a wrong value,
    the wrong numbers (one not given, one used twice, one left out) and not an expression."""

    def kind(reason: str) -> str:
        if reason == "correct":
            return "right"
        if reason.startswith("wrong value"):
            return "wrong value"
        if reason.startswith(("uses", "does not use")):
            return "wrong numbers"
        return "malformed"

    kinds = [kind(r) for r in reasons]
    return {k: kinds.count(k) / len(kinds) for k in VERDICTS}


# %%
class Meter:
    """Held-out samples of a policy, scored three ways: the proxy's score, the gold score, and
    log pi - log pi_base summed over each completion (the KL from the base, in nats). The same
    prompts and sampling keys every time (one engine, counter-based keys): paired."""

    def __init__(self, gold_run, proxy_run, base):
        from minirl.control.evaluation import heldout_prompts
        from minirl.training.trainer import Trainer

        cfg = proxy_run.cfg
        self.gold_run, self.proxy_run, self.samples = gold_run, proxy_run, cfg.eval.samples
        self.prompts = heldout_prompts(proxy_run.task, cfg.eval.prompts)
        self.gold_prompts = {p.uid: p for p in heldout_prompts(gold_run.task, cfg.eval.prompts)}
        self.engine = proxy_run.engine(0, base)
        self.base = Trainer(cfg.model, base, None, cfg.trainer_config())  # log pi_base

    def __call__(self, version: int, params) -> dict:
        from minirl.training.batching import make_batch
        from minirl.types import Score

        self.engine.load_weights(version, params)
        rollouts = sample(self.engine, self.proxy_run, self.prompts, self.samples)
        proxy = np.array([s.reward for s in self.proxy_run.verifier.score(rollouts)])
        verdicts = self.gold_run.verifier.score(with_prompts(rollouts, self.gold_prompts))
        gold = np.array([s.reward for s in verdicts])
        for r in rollouts:
            r.score = Score(0.0)  # make_batch packs scored rollouts; the reward is not read
        batch = make_batch(rollouts, self.proxy_run.tokenizer.pad_id, 8)
        base_logp = self.base.recompute_logprobs(batch)  # [B, T]
        # log mu (the engine's, at temperature 1) is log pi: behaviour_logprobs [B, T]
        kl = float(np.sum((batch.behaviour_logprobs - base_logp) * batch.mask) / batch.num_rows)
        return {
            "step": version,
            "kl": kl,
            "sqrt_kl": float(np.sqrt(max(kl, 0.0))),
            "proxy": float(proxy.mean()),
            "gold": float(gold.mean()),
            "correct": float((gold >= 1.0).mean()),
            "well_formed": float((gold > 0.0).mean()),
            "proxy_accuracy": pair_accuracy(proxy, gold, comparisons(gold, self.samples))["all"],
            "verdicts": verdict_shares([s.reason for s in verdicts]),
            "examples": [r.text for r in rollouts[: 4 * self.samples : self.samples]],
        }


# %%
def rl_curve(run, base, meter: Meter, steps: int, eval_every: int) -> dict:
    """`minirl train`'s loop on `run` (its verifier is the reward), one step at a time from
    `base`, measured at step 0 and every `eval_every` steps."""
    from minirl.run.loop import run_steps

    controller = run.build_loop(base, run.engine(0, base), log=lambda *a: None)
    controller.store.put(0, controller.params())
    train_reward = []
    points = [meter(0, base)]
    while controller.counters.steps < steps:
        run_steps(controller, controller.counters.steps + 1, lambda m: train_reward.append(m))
        step = controller.counters.steps
        if step % eval_every == 0 or step == steps:
            points.append(meter(step, controller.params(host=False)))
    return {"points": points, "train_reward": [m["reward/mean"] for m in train_reward]}


# %%
def fit_gao(points: list[dict]) -> dict:
    """Least squares of Gao et al.'s RL form, gold(d) - gold(0) = d (alpha - beta log d) with
    d = sqrt(KL), over the measured points past the base; its peak is at d* = exp(alpha/beta -
    1) when beta > 0."""
    d = np.array([p["sqrt_kl"] for p in points[1:]])
    gain = np.array([p["gold"] - points[0]["gold"] for p in points[1:]])
    keep = d > 1e-6
    if keep.sum() < 2:
        return dict.fromkeys(("alpha", "beta", "peak_sqrt_kl", "rms"), float("nan"))
    design = np.stack([d[keep], -d[keep] * np.log(d[keep])], axis=1)  # [n, 2]
    (alpha, beta), *_ = np.linalg.lstsq(design, gain[keep], rcond=None)
    peak = float(np.exp(alpha / beta - 1)) if beta > 0 else float("nan")
    rms = float(np.sqrt(np.mean((design @ np.array([alpha, beta]) - gain[keep]) ** 2)))
    return {"alpha": float(alpha), "beta": float(beta), "peak_sqrt_kl": peak, "rms": rms}


# %% [markdown]
# Step 5: what the curves say, and the figure


# %%
def summarise(curve: dict) -> dict:
    """The gold score at the base, at its peak and at the last step; the proxy's first and last
    score; the fit of Gao et al.'s form; the last step's first samples."""
    pts = curve["points"]
    peak = max(pts, key=lambda q: q["gold"])
    return {
        "base_gold": pts[0]["gold"],
        "peak_gold": peak["gold"],
        "peak_step": peak["step"],
        "peak_sqrt_kl": peak["sqrt_kl"],
        "final_gold": pts[-1]["gold"],
        "final_sqrt_kl": pts[-1]["sqrt_kl"],
        "proxy": [pts[0]["proxy"], pts[-1]["proxy"]],
        "fit": curve["fit"],
        "examples": pts[-1]["examples"],
    }


# %%
def plot(curves: dict, rm_params: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
    gold_ax, steps_ax, why_ax = axes
    proxy_ax = gold_ax.twinx()

    def line(ax, x, pts, key, color, label, style="-o"):
        ax.plot(x, [p[key] for p in pts], style, ms=3, color=color, alpha=0.8, label=label)

    for name, curve in curves.items():
        pts = curve["points"]
        x, steps = [p["sqrt_kl"] for p in pts], [p["step"] for p in pts]
        if not name.startswith("proxy"):  # the control: RL against the gold itself
            line(gold_ax, x, pts, "gold", "k", "gold score, RL against the gold itself")
            line(steps_ax, steps, pts, "gold", "k", "RL against the gold itself")
            continue
        first = name == "proxy seed 0"  # one legend entry per kind of line
        label = lambda text, first=first: text if first else None  # noqa: E731
        line(gold_ax, x, pts, "gold", "C3", label("gold score (countdown's verifier)"))
        line(proxy_ax, x, pts, "proxy", "C0", label("proxy score (the reward model)"), "--s")
        fit = curve["fit"]
        if np.isfinite(fit["alpha"]):
            d = np.linspace(1e-3, max(x), 100)
            fitted = pts[0]["gold"] + d * (fit["alpha"] - fit["beta"] * np.log(d))
            gold_ax.plot(d, fitted, ":", color="C3", lw=1, label=label("d(alpha - beta log d)"))
        line(steps_ax, steps, pts, "gold", "C3", label("RL against the proxy"))
        line(why_ax, x, pts, "well_formed", "C2", label("well-formed, the given numbers"))
        line(why_ax, x, pts, "correct", "C3", label("right answers (gold 1)"))
        text = "proxy orders the policy's samples as the gold does"
        line(why_ax, x, pts, "proxy_accuracy", "C0", label(text))
    gold_ax.set_xlabel("sqrt(KL(pi || pi_base)), KL in nats per completion")
    gold_ax.set_ylabel("gold score (mean, held-out samples)", color="C3")
    proxy_ax.set_ylabel("proxy score (mean, same samples)", color="C0")
    handles = gold_ax.get_legend_handles_labels()
    more = proxy_ax.get_legend_handles_labels()
    gold_ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize=7, loc="upper left")
    gold_ax.set_title("RL against a learned reward model", fontsize=9)
    steps_ax.set_xlabel("RL step")
    steps_ax.set_ylabel("gold score (mean, held-out samples)")
    steps_ax.set_title("gold score against RL steps", fontsize=9)
    steps_ax.legend(fontsize=7)
    why_ax.set_xlabel("sqrt(KL(pi || pi_base))")
    why_ax.set_ylabel("share of held-out samples / of pairs")
    why_ax.set_ylim(0, 1)
    why_ax.set_title("what the policy found", fontsize=9)
    why_ax.legend(fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    seeds = sum(name.startswith("proxy") for name in curves)
    fig.suptitle(
        f"Reward model over-optimisation on countdown: GRPO against a {rm_params / 1e6:.2f}M-parameter proxy "
        f"({seeds} seed{'s' * (seeds > 1)}), scored by the gold",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# %%
def main() -> None:
    p = argparse.ArgumentParser(description="Lesson 18: reward model over-optimisation")
    p.add_argument("--fast", action="store_true", help="a tiny model, 2 RL steps (CI)")
    p.add_argument(
        "--out", type=Path, default=Path("runs/tutorials/18_reward_model_overoptimization")
    )
    args = p.parse_args()
    mode, out = (FAST if args.fast else FULL), args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    c0, w0 = time.process_time(), time.perf_counter()
    stamp = lambda: f"[{time.perf_counter() - w0:5.0f}s wall, {time.process_time() - c0:5.0f}s cpu]"  # noqa: E731
    print(f"mode: {'fast' if args.fast else 'full'}")

    from minirl.hf.reward_model import RewardModel, scores_function
    from minirl.run.runner import Run
    from minirl.run.warmstart import warm_start

    # Step 1: data, gold, base.
    write_data(out, mode)
    gold_cfg, proxy_cfg = configs(mode, out)
    gold_run = Run(gold_cfg, "unused", progress=False)
    base, _ = warm_start(gold_cfg, gold_run.tokenizer, gold_run.task, False, lambda *a: None)
    tokenizer, model_cfg = gold_run.tokenizer, gold_cfg.model
    print(
        f"\nStep 1. {stamp()} {mode['rows']} training rows in {out / 'data'}, the gold "
        f"reward {gold_run.verifier!r}; the base policy: {model_cfg.num_params() / 1e6:.2f}M "
        f"parameters, {gold_cfg.sft.steps} warm-start steps on the rows' demonstrations"
    )

    # Step 2: the base's samples, scored by the gold, and the comparisons.
    rm_dir = out / "reward_model"
    body = jax.tree.map(jnp.asarray, base)  # the reward model starts as the base policy ...
    head = jnp.zeros((model_cfg.dim, 1), jnp.float32)  # ... with a score head, scoring 0
    save_reward_model(body, head, model_cfg, tokenizer, rm_dir)  # so the proxy run can be built
    proxy_run = Run(proxy_cfg, "unused", progress=False)
    engine = gold_run.engine(0, base)
    n = mode["rm_prompts"]
    prompts = [gold_run.task.prompt(i, "train") for i in range(n)]
    rollouts = sample(engine, gold_run, prompts, mode["rm_samples"])
    gold = np.array([s.reward for s in gold_run.verifier.score(rollouts)])
    pairs = comparisons(gold, mode["rm_samples"])
    held_out = pairs[:, 0] // mode["rm_samples"] >= int(n * (1 - HELD_OUT_RM))  # by prompt
    if held_out.all():
        raise SystemExit("no comparison to train on: every sample of a prompt scored the same")
    kinds = {f"{v:g}": int((gold == v).sum()) for v in np.unique(gold)}
    print(
        f"\nStep 2. {stamp()} {len(rollouts)} samples of the base on {n} training prompts, gold "
        f"score mean {gold.mean():.3f} (samples by gold score: {kinds}); {len(pairs)} "
        f"comparisons, {int(held_out.sum())} of them held out"
    )

    # Step 3: the reward model.
    rm_prompts = {p.uid: p for p in (proxy_run.task.prompt(i, "train") for i in range(n))}
    rm_rows = [proxy_run.verifier.layout(r)[0] for r in with_prompts(rollouts, rm_prompts)]
    tokens, last = padded(rm_rows)  # [N, L], [N]: what RewardModel reads for each sample
    scores = scores_function(model_cfg)
    params, losses = train_reward_model(
        scores, {"body": body, "head": head}, tokens, last, pairs, held_out, mode
    )
    save_reward_model(params["body"], params["head"], model_cfg, tokenizer, rm_dir)
    trained = score_rows(scores, params, tokens, last)  # [N]
    accuracy = {
        "train": pair_accuracy(trained, gold, pairs[~held_out]),
        "held_out": pair_accuracy(trained, gold, pairs[held_out]),
    }
    loaded = RewardModel(rm_dir, dtype=model_cfg.dtype)  # what --verifier rm:DIR builds
    check = with_prompts(rollouts[: 8 * mode["rm_samples"]], rm_prompts)
    from_dir = np.array([s.reward for s in loaded.score(check)])
    export_error = float(np.max(np.abs(from_dir - trained[: len(check)])))
    print(
        f"\nStep 3. {stamp()} the reward model: {mode['rm_steps']} Bradley-Terry steps, loss "
        f"{np.mean(losses[:10]):.3f} -> {np.mean(losses[-10:]):.3f}"
    )
    print("    pairwise accuracy (pairs)   all   " + "  ".join(f"{k:>7s}" for k in PAIR_KINDS))
    for split, acc in accuracy.items():
        by_kind = "  ".join(f"{acc.get(k, float('nan')):7.3f}" for k in PAIR_KINDS)
        print(f"    {split:9s} ({acc['pairs']:6d})    {acc['all']:.3f}   {by_kind}")
    print(
        f"    saved as {json.loads((rm_dir / 'config.json').read_text())['architectures'][0]} "
        f"in {rm_dir}; RewardModel(DIR) scores {len(check)} samples as the trained model does: "
        f"max |difference| {export_error:.1e}"
    )

    # Step 4: RL against the proxy, for each seed, and against the gold.
    proxy_run = Run(proxy_cfg, "unused", progress=False)  # a fresh one: reads the trained RM
    meter = Meter(gold_run, proxy_run, base)
    print(
        f"\nStep 4. {stamp()} GRPO with data.verifier=rm:{rm_dir} ({proxy_run.verifier!r}), "
        f"{mode['steps']} steps, measured every {mode['eval_every']} on "
        f"{len(meter.prompts)} held-out prompts x {meter.samples} samples"
    )
    print("    run             step   sqrt(KL)   proxy    gold   right  well-formed  proxy acc")
    arms = {f"proxy seed {seed}": configs(mode, out, seed)[1] for seed in mode["seeds"]}
    arms["gold seed 0"] = configs(mode, out, 0)[0]  # the control: the gold is the reward
    curves = {}
    for name, cfg in arms.items():
        run = Run(cfg, "unused", progress=False)
        curves[name] = rl_curve(run, base, meter, mode["steps"], mode["eval_every"])
        curves[name]["fit"] = fit_gao(curves[name]["points"])
        for pt in curves[name]["points"]:
            print(
                f"    {name:14s} {pt['step']:5d}   {pt['sqrt_kl']:8.3f}  {pt['proxy']:6.3f}  "
                f"{pt['gold']:6.3f}  {pt['correct']:6.3f}  {pt['well_formed']:11.3f}  "
                f"{pt['proxy_accuracy']:9.3f}",
                flush=True,
            )

    # Step 5: what the curves say.
    summary = {name: summarise(curve) for name, curve in curves.items()}
    print(f"\nStep 5. {stamp()} the gold score: base -> peak (step, sqrt(KL)) -> last step")
    for name, s in summary.items():
        f = s["fit"]
        print(
            f"    {name:14s} gold {s['base_gold']:.3f} -> {s['peak_gold']:.3f} ({s['peak_step']}, "
            f"{s['peak_sqrt_kl']:.2f}) -> {s['final_gold']:.3f} at sqrt(KL) "
            f"{s['final_sqrt_kl']:.2f};  proxy {s['proxy'][0]:.2f} -> {s['proxy'][1]:.2f}\n"
            f"    {'':14s} fit of d(alpha - beta log d): alpha {f['alpha']:.3f}, beta "
            f"{f['beta']:.3f}, its peak at sqrt(KL) {f['peak_sqrt_kl']:.2f}, rms error "
            f"{f['rms']:.3f}"
        )
    print("\n    the gold's verdicts on the held-out samples:  " + "  ".join(VERDICTS))
    for name, curve in curves.items():
        shown = curve["points"][:: len(curve["points"]) - 1]  # the first and the last
        for pt in shown if name == "proxy seed 0" else shown[1:]:
            shares = "  ".join(f"{pt['verdicts'][k]:{len(k)}.3f}" for k in VERDICTS)
            print(f"    {name:14s} step {pt['step']:3d}                   {shares}")
    print(f"    samples of the last step (proxy seed 0): {summary['proxy seed 0']['examples']}")
    proxies = [s for name, s in summary.items() if name.startswith("proxy")]
    claims = {
        "the reward model loads through RewardModel and scores as trained": export_error < 1e-4,
        "the KL from the base is 0 before RL": all(
            abs(c["points"][0]["kl"]) < 1e-3 for c in curves.values()
        ),
        "every curve is finite": all(
            np.isfinite([pt[k] for pt in c["points"] for k in ("kl", "proxy", "gold")]).all()
            for c in curves.values()
        ),
    }
    if not args.fast:
        claims["the reward model beats chance on held-out comparisons"] = (
            accuracy["held_out"]["all"] > 0.6
        )
        claims["the proxy score rises in every seed"] = all(
            s["proxy"][1] > s["proxy"][0] for s in proxies
        )
        claims["against the proxy the gold score rises, then falls, in every seed"] = all(
            s["peak_gold"] > s["base_gold"] + 0.03 and s["final_gold"] < s["peak_gold"] - 0.03
            for s in proxies
        )
        claims["RL against the gold itself ends above every run against the proxy"] = summary[
            "gold seed 0"
        ]["final_gold"] > max(s["final_gold"] for s in proxies)
    print("\n  claims:")
    for name, ok in claims.items():
        print(f"    {name:68s} {ok}")
    results = {
        "mode": "fast" if args.fast else "full",
        "reward_model": {
            "dir": str(rm_dir),
            "samples": len(rollouts),
            "gold_counts": kinds,
            "comparisons": len(pairs),
            "loss": [float(np.mean(losses[:10])), float(np.mean(losses[-10:]))],
            "accuracy": accuracy,
            "export_max_abs_error": export_error,
        },
        "curves": curves,
        "summary": summary,
        "claims": claims,
        "steps": mode["steps"],
        "seconds": time.perf_counter() - w0,
        "cpu_seconds": time.process_time() - c0,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1, default=float))
    plot(curves, model_cfg.num_params(), out / "overoptimization.png")
    print(f"\n{stamp()} wrote {out / 'overoptimization.png'} and {out / 'results.json'}")
    if not all(claims.values()):
        raise SystemExit(f"a claim of the lesson failed: {claims}")


# %%
if __name__ == "__main__":
    main()
