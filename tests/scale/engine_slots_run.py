"""The engine's slots over a mesh's "data" axis, run in a subprocess by
tests/scale/test_engine_slots.py (fake CPU devices must be configured before JAX starts).

    python tests/scale/engine_slots_run.py OUT.json [--devices 4] \
        [--setting "exact contiguous" --setting "fast paged" ...] [--layout data=2 ...]

One tiny model; for each setting named (exact or fast mode, contiguous or paged cache) an
engine on one device is the reference, and engines on the meshes named (weights by
`tensor_parallel()`, slots by `MeshSlots`) generate the same requests: 10 single-turn requests
over 8 slots (a slot is reused) and 2 two-turn episodes (the second turn continues the slot's
cache: `Engine.extend`). Recorded for each: the layout of the cache while work is in flight
(spec and the rows one device holds), whether tokens and behaviour log-probs equal the
reference's, and how many executables its calls compiled. Then the launcher's engine role on a
mesh with "fsdp" (refused) and on data=2,tensor=2 (its engine's cache split over "data").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--devices", type=int, default=4)
parser.add_argument("--setting", action="append", default=[], help='e.g. "exact paged"')
parser.add_argument("--layout", action="append", default=[], help="an engine mesh, e.g. data=2")
args = parser.parse_args()

flag = f" --xla_force_host_platform_device_count={args.devices}"
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + flag
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from minirl.inference.engine import Engine, EngineConfig, Request  # noqa: E402
from minirl.modeling.model import ModelConfig, init_model  # noqa: E402
from minirl.types import Prompt  # noqa: E402
from scale import mesh as mesh_lib  # noqa: E402
from scale import slots as slots_lib  # noqa: E402

CFG = ModelConfig(
    vocab_size=32, dim=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=64,
    max_seq_len=64,
)  # fmt: skip
ENGINE = EngineConfig(
    slots=8, cache_len=48, prefill_buckets=(8,), prefill_rows=4, decode_chunk=8, top_k=20
)
PARAMS = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.split(init_model(CFG, seed=0))[1]))


def prompt(uid: int) -> Prompt:
    return Prompt(uid, "t", "", np.array([1, 3 + uid % 7, 5, 7 + uid % 5], np.int32))


def engine_on(layout: str, config: EngineConfig) -> Engine:
    if layout == "one":
        engine = Engine(CFG, config, seed=3)
        engine.load_weights(0, PARAMS)
        return engine
    mesh_cfg = mesh_lib.MeshConfig.parse(layout)
    devices = jax.devices()[: mesh_cfg.data * mesh_cfg.fsdp * mesh_cfg.tensor]
    mesh, rules = mesh_lib.make_mesh(mesh_cfg, devices), mesh_lib.tensor_parallel()
    slots = slots_lib.MeshSlots(mesh, rules, config.slots)
    engine = Engine(CFG, config, seed=3, slot_layout=slots)
    engine.load_weights(0, mesh_lib.place_params(PARAMS, mesh, rules))
    return engine


def cache_layout(engine: Engine) -> dict:
    """The in-flight cache's keys (or block pool) and per-slot lengths: spec, one device's part."""

    def seen(x) -> dict:
        spec = getattr(x.sharding, "spec", None)  # None: on one device, no mesh
        return {"spec": str(spec), "local": x.addressable_shards[0].data.shape}

    return {"k": seen(engine._cache.k[0]), "lengths": seen(engine._cache.lengths)}


def run(layout: str, config: EngineConfig) -> dict:
    """Rollouts (tokens, log-probs) of single-turn requests and two-turn episodes, the cache's
    layout after the first step, and the executables this engine's calls compiled."""
    engine = engine_on(layout, config)
    before = engine.compile_counts()
    engine.submit([Request(prompt(10 + i), s, 20) for i in range(5) for s in range(2)])
    finished = engine.step()
    layout_seen = cache_layout(engine)
    while engine.pending():
        finished += engine.step()
    episodes = [Request(prompt(30 + i), 0, 6, multi_turn=True) for i in range(2)]
    first = engine.generate(episodes)
    for r in first:
        engine.extend(r.prompt.uid, 0, [2, 4, 6], 6)  # an observation, then the next turn
    second = []
    while len(second) < len(first):
        second += engine.step()
    for r in second:
        engine.release(r.prompt.uid, 0)
    rollouts = sorted(finished, key=lambda r: (r.prompt.uid, r.sample_index))
    rollouts += sorted(second, key=lambda r: r.prompt.uid)
    after = engine.compile_counts()
    return {
        "rollouts": rollouts,
        "cache": layout_seen,
        "compiled": {k: after[k] - before[k] for k in after},
    }


def compare(reference: list, got: list) -> dict:
    """Tokens equal, log-probs equal (bit for bit) and their largest difference (over the rollouts
    whose tokens are equal), tokens compared."""
    pairs = list(zip(reference, got, strict=True))
    same = [(a, b) for a, b in pairs if np.array_equal(a.tokens, b.tokens)]
    return {
        "tokens_equal": len(same) == len(pairs),
        "logprobs_equal": all(np.array_equal(a.logprobs, b.logprobs) for a, b in pairs),
        "max_dlogp": float(
            max((np.abs(a.logprobs - b.logprobs).max() for a, b in same), default=0)
        ),
        "tokens": int(sum(len(a.tokens) for a in reference)),
    }


out: dict = {"settings": {}}
for setting in args.setting:
    mode, cache = setting.split()
    config = dataclasses.replace(ENGINE, exact=mode == "exact", paged=cache == "paged")
    reference = run("one", config)
    row = {"one": {"compiled": reference["compiled"]}}
    for layout in args.layout:
        got = run(layout, config)
        row[layout] = {
            **compare(reference["rollouts"], got["rollouts"]),
            "cache": got["cache"],
            "compiled": got["compiled"],
        }
    out["settings"][setting] = row

# The launcher's engine role (scale/roles.py) builds its engine the same way.
from scale import ray_run  # noqa: E402
from scale.roles import engine_role  # noqa: E402

flags = argparse.ArgumentParser()
ray_run.add_arguments(flags)
role_args = flags.parse_args(["--preset", "fixture", "--weights", "memory://engine-slots"])
try:
    engine_role(argparse.Namespace(**vars(role_args), mesh="fsdp=2,tensor=2"))
    out["fsdp_refused"] = None
except ValueError as e:
    out["fsdp_refused"] = str(e)
role = engine_role(argparse.Namespace(**vars(role_args), mesh="data=2,tensor=2"))
slots = role.engine._slot_layout
mesh = getattr(slots, "mesh", None)
out["role"] = {"slots": type(slots).__name__, "mesh": None if mesh is None else dict(mesh.shape)}

with open(args.out, "w") as f:
    json.dump(out, f, indent=1)
print(json.dumps(out))
