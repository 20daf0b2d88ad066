"""Exact mode across device layouts, run in a subprocess by tests/scale/test_exact_layouts.py (fake
CPU devices must be configured before JAX starts).

    python tests/scale/exact_layouts.py OUT.json --model dense --dtype float32 \
        --engine one --engine tensor=4 --trainer one --trainer fsdp=2,tensor=2 [--lora]
        [--experts] [--share-prompts] [--devices 4]

One model (the "tiny" preset cut to 2 layers, or "tiny-moe"), exact mode, computing in `--dtype`,
and each layout named ("one": one device; else a mesh over the first devices, "tensor=2" on 2):
  1. engines: each generates the same single-turn rollouts and multi-turn episodes (a scripted
     environment; each turn after the first continues the slot's KV cache), its weights placed
     by `tensor_parallel()` (experts over "tensor" with --experts), its slots split over "data"
     (`MeshSlots`, as the launcher's engine role does) and its cache paged on a mesh,
     contiguous on one device. The first engine is the reference: every other one's
     tokens and behaviour log-probs are compared with its
  2. trainers: each (weights by `fsdp()`, experts over "fsdp" with --experts; rows split by
     `MeshRows`) computes the recompute and the training forward (under the gradient, with
     remat) of the reference's batch, compared with the reference's behaviour log-probs
     (--share-prompts: each group's prompt run once per micro-batch, `trainer.share_prompts`)
Every comparison is recorded as (equal bit for bit, max |difference|); OUT.json holds them.
--lora adds rank-4 adapters (attention only on the MoE) with random B, so they change the output.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--model", choices=("dense", "moe"), default="dense")
parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
parser.add_argument("--engine", action="append", default=[], help="an engine layout (repeatable)")
parser.add_argument("--trainer", action="append", default=[], help="a trainer layout (repeatable)")
parser.add_argument("--lora", action="store_true")
parser.add_argument("--experts", action="store_true", help="experts over a mesh axis")
parser.add_argument("--share-prompts", action="store_true", help="trainer.share_prompts (dense)")
parser.add_argument("--devices", type=int, default=4, help="fake CPU devices; 0: JAX's own")
args = parser.parse_args()

if args.devices:  # fake CPU devices; 0: the devices JAX finds (the GPU lane)
    flag = f" --xla_force_host_platform_device_count={args.devices}"
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + flag
    os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from minirl.envs import EpisodeConfig, EpisodeRunner, Step, Turns  # noqa: E402
from minirl.inference.engine import Engine, EngineConfig, Request  # noqa: E402
from minirl.modeling import lora  # noqa: E402
from minirl.modeling.model import ModelConfig, init_model  # noqa: E402
from minirl.modeling.tokenizer import CharTokenizer  # noqa: E402
from minirl.training import microbatch as mbt  # noqa: E402
from minirl.training.batching import make_batch  # noqa: E402
from minirl.training.trainer import Trainer, TrainerConfig  # noqa: E402
from minirl.types import Prompt, Score  # noqa: E402
from scale import mesh as mesh_lib  # noqa: E402
from scale import slots as slots_lib  # noqa: E402

TOK = CharTokenizer()
shape = {"dense": dict(num_layers=2), "moe": {}}[args.model]
CFG = ModelConfig.preset(
    "tiny" if args.model == "dense" else "tiny-moe", vocab_size=72, max_seq_len=128, **shape
)
CFG = dataclasses.replace(CFG, dtype=args.dtype)  # compute dtype; the trainer keeps fp32 weights
if args.lora:
    targets = ("q", "v", "o") if CFG.num_experts else ("q", "v", "o", "down")
    CFG = dataclasses.replace(CFG, lora_rank=4, lora_targets=targets)
DIGITS = tuple((int(TOK.encode(c, bos=False)[0]),) for c in "0123456789")
ENGINE = EngineConfig(
    slots=4,
    cache_len=64,
    prefill_buckets=(16,),
    prefill_rows=2,
    decode_chunk=4,
    top_k=20,
    stop_sequences=DIGITS,  # a digit ends a turn: short turns from a random model
    eos_ids=TOK.eos_ids,
    exact=True,
)
PAGED = dataclasses.replace(ENGINE, paged=True, block_size=16)
TRAINER = TrainerConfig(micro_batch_tokens=256, bucket_minimum=32, share_prompts=args.share_prompts)


class Scripted:
    """Answers turn k with "t{k}"; reward 0.5."""

    def reset(self, prompt):
        self.turns = 0
        return prompt.text

    def step(self, text):
        self.turns += 1
        return Step(f"t{self.turns}", 0.5, False)


def make_params() -> dict:
    params = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.split(init_model(CFG, seed=0))[1]))
    if not CFG.lora_rank:
        return params
    rng = np.random.default_rng(1)
    adapters, base = lora.partition(params, lora.is_adapter)
    moved = {  # B = 0 at init: give the adapters something to add
        p: (rng.standard_normal(x.shape) * 0.05).astype(x.dtype) if "_lora_b" in p else x
        for p, x in zip(*_paths_and_leaves(adapters), strict=True)
    }
    return lora.join(_rebuild(adapters, moved), base)


def _paths_and_leaves(tree):
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [jax.tree_util.keystr(p) for p, _ in leaves], [x for _, x in leaves]


def _rebuild(tree, by_path: dict):
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return jax.tree_util.tree_unflatten(
        treedef, [by_path[jax.tree_util.keystr(p)] for p, _ in flat]
    )


def prompts(n: int, first_uid: int) -> list[Prompt]:
    return [
        Prompt(first_uid + i, "t", f"{12 + 7 * i}+{i}=", TOK.encode(f"{12 + 7 * i}+{i}="))
        for i in range(n)
    ]


def generate(params, config: EngineConfig, slots=None) -> list:
    """Single-turn rollouts (4 prompts x 2, 12 tokens) and episodes of up to 3 turns (3 prompts
    x 2; a digit ends a turn) on engines with these weights, config and slot layout (the same
    compiled functions: stop sequences are the host's business)."""
    single_turn = dataclasses.replace(config, stop_sequences=())
    engine = Engine(CFG, single_turn, seed=3, slot_layout=slots)
    engine.load_weights(0, params)
    single = engine.generate([Request(p, s, 12) for p in prompts(4, 10) for s in range(2)])
    for r in single:
        r.score = Score(float(r.sample_index))
    engine = Engine(CFG, config, seed=3, slot_layout=slots)
    engine.load_weights(0, params)
    runner = EpisodeRunner(engine, Scripted, Turns(TOK), EpisodeConfig(max_turns=3))
    multi = runner.generate([Request(p, s, 8) for p in prompts(3, 20) for s in range(2)])
    return single + multi


def compare(a, b, where=None) -> dict:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if where is not None:
        a, b = a[where], b[where]
    return {"equal": bool(np.array_equal(a, b)), "max": float(np.abs(a - b).max(initial=0.0))}


def placed(params, text: str, rules):
    """(params on layout `text`, its MeshRows or None): "one" is one device."""
    if text == "one":
        return params, None
    config = mesh_lib.MeshConfig.parse(text)
    size = config.data * config.fsdp * config.tensor  # the mesh's first devices: "tensor=2" is 2
    mesh = mesh_lib.make_mesh(config, jax.devices()[:size])
    return mesh_lib.place_params(params, mesh, rules), mesh_lib.MeshRows(mesh, rules)


def engines(params) -> tuple[list, dict]:
    """(the first engine's rollouts, {layout: comparison with them} for the others)."""
    rules = mesh_lib.tensor_parallel()
    if args.experts:
        rules = mesh_lib.expert_parallel(rules, "tensor")
    runs = {}
    for t in args.engine:
        p, rows = placed(params, t, rules)
        slots = None if rows is None else slots_lib.MeshSlots(rows.mesh, rules, ENGINE.slots)
        runs[t] = generate(p, ENGINE if t == "one" else PAGED, slots)
    reference, *_ = runs.values()
    out = {}
    for text, got in list(runs.items())[1:]:
        pairs = list(zip(reference, got, strict=True))
        out[text] = {
            "tokens_equal": all(np.array_equal(a.tokens, b.tokens) for a, b in pairs),
            **compare(
                np.concatenate([a.logprobs for a, _ in pairs]),
                np.concatenate([b.logprobs for _, b in pairs]),
            ),
        }
    return reference, out


def rows_sharing(batch) -> int:
    """Rows whose prompt another row of their micro-batch runs, as --share-prompts plans them."""
    if not TRAINER.share_prompts:
        return 0
    budget, bucket = TRAINER.micro_batch_tokens, TRAINER.bucket_minimum
    plan = mbt.share_prompts(batch.tokens, batch.mask, budget, bucket)
    return sum(len(mb.rows) - len(set(mb.prompts[0].tolist())) for mb in plan)


def trainers(params, batch) -> dict:
    rules = mesh_lib.expert_parallel(mesh_lib.fsdp()) if args.experts else mesh_lib.fsdp()
    out, real = {}, batch.mask > 0
    for text in args.trainer:
        p, rows = placed(params, text, rules)
        trainer = Trainer(CFG, p, None, TRAINER, row_layout=rows, sampling=ENGINE.sampling.scoring)
        want = batch.behaviour_logprobs
        out[text] = {
            "recompute": compare(trainer.recompute_logprobs(batch), want, real),
            "training_forward": compare(trainer.training_forward_logprobs(batch), want, real),
        }
    return out


params = make_params()
reference, engine_rows = engines(params)
batch = make_batch(reference, TOK.pad_id, bucket_minimum=32)
result = {
    "devices": jax.device_count(),
    "tokens": int((batch.mask > 0).sum()),
    "multi_turn": sum(bool((r.mask == 0).any()) for r in reference if r.mask is not None),
    "rows_sharing": rows_sharing(batch),
    "engines": engine_rows,
    "trainers": trainers(params, batch),
}
with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
print(json.dumps(result))
