"""One sharded run, executed in a subprocess by tests/scale/test_mesh.py (fake CPU devices must
be configured before JAX starts, so the pytest process itself stays single-device).

    python tests/scale/sharded_run.py OUT.json STORE_DIR [--devices 4]
    python tests/scale/sharded_run.py OUT.json STORE_DIR --devices 2 \
        --coordinator 127.0.0.1:PORT --num-processes 2 --process-id I

On 4 devices (one process, or two processes x two devices), with minirl's own Engine/Trainer:
  1. decode: the engine with its params on a tensor-parallel mesh (tensor=4)
  2. train:  the trainer with its params on an FSDP mesh (fsdp=2 x tensor=2) and its batch
             rows split over data x fsdp (MeshRows): one recompute and one GRPO step on the
             TP engine's rollouts; the layouts of the arrays that entered and left the jitted
             functions are recorded
  3. weights: the new FSDP weights published to a TensorStore store by every process (each
             writes its shards), loaded into the TP layout (each reads only its slices),
             compared with an in-process reshard; and the starting weights saved as a Hugging
             Face checkpoint, read into the FSDP layout by `load_checkpoint` (each process
             reads only the blocks its devices hold); and the trainer's state saved with Orbax
             (each process its shards) and restored into a fresh trainer, compared shard by shard
  4. references (process 0): the same decode and step unsharded; the mismatch between engine
             log-probs and trainer recompute with the SAME layout (both unsharded) and with
             DIVERGENT layouts (TP engine, FSDP trainer). MINIRL_TEST_EXACT=1 runs both in
             exact mode.
Every process writes its numbers to OUT.json (process id appended) for the test to check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("store")
parser.add_argument("--devices", type=int, default=4)
parser.add_argument("--coordinator", default=None)
parser.add_argument("--num-processes", type=int, default=1)
parser.add_argument("--process-id", type=int, default=0)
args = parser.parse_args()

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"
)
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from scale import mesh as mesh_lib  # noqa: E402

mesh_lib.initialize(
    mesh_lib.DistributedConfig(args.coordinator, args.num_processes, args.process_id)
)

from minirl.hf.model_files import save_hf  # noqa: E402
from minirl.inference.engine import Engine, EngineConfig, Request  # noqa: E402
from minirl.losses import get_preset  # noqa: E402
from minirl.measure.diagnostics import mismatch_metrics  # noqa: E402
from minirl.modeling.model import ModelConfig, init_model  # noqa: E402
from minirl.store.trees import flatten_tree  # noqa: E402
from minirl.training.batching import make_batch  # noqa: E402
from minirl.training.trainer import Trainer, TrainerConfig  # noqa: E402
from minirl.types import Prompt, Score  # noqa: E402
from scale.tensorstore_weights import TensorStoreWeightStore  # noqa: E402

t_start = time.perf_counter()
CFG = ModelConfig(
    vocab_size=32,
    dim=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    max_seq_len=64,
)
EXACT = os.environ.get("MINIRL_TEST_EXACT", "0") == "1"
ENGINE = EngineConfig(
    slots=8, cache_len=40, prefill_buckets=(8,), prefill_rows=8, decode_chunk=8, exact=EXACT
)
SCORING = ENGINE.sampling.scoring  # the trainer scores as the engine samples
TRAINER = TrainerConfig(learning_rate=1e-3, micro_batch_tokens=1024, bucket_minimum=32)
times = {}


def lap(name: str) -> None:
    times[name] = round(time.perf_counter() - t_start - sum(times.values()), 2)


params = nnx.to_pure_dict(nnx.split(init_model(CFG, seed=0))[1])  # host numpy, same everywhere
params = jax.tree.map(np.asarray, params)
assert jax.device_count() == 4, jax.devices()
train_mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(fsdp=2, tensor=2))
infer_mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(tensor=4))
out: dict = {"process": jax.process_index(), "processes": jax.process_count()}


def max_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def local(x) -> np.ndarray:
    """A replicated (or single-device) array as host numpy, on any process."""
    return np.asarray(x.addressable_data(0) if isinstance(x, jax.Array) else x)


# Sharded work first (every process takes part), the unsharded references last and on process 0
# only (they run on one local device; other processes wait at the final barrier).

# 1. decode on the tensor-parallel mesh --------------------------------------------------------
requests = [
    Request(Prompt(10 + i, "t", "", np.array([1, 3 + i, 5, 7 + i], np.int32)), k, 24)
    for i in range(4)
    for k in range(2)
]


def generate(p):
    engine = Engine(CFG, ENGINE, seed=3)
    engine.load_weights(0, p)
    return engine.generate(requests), engine


def scored(rollouts):
    for r in rollouts:
        r.score = Score(1.0 if r.sample_index == 0 else 0.0)  # groups with reward variance
    return make_batch(rollouts, pad_id=0, bucket_minimum=32)


lap("setup")
tp_params = mesh_lib.place_params(params, infer_mesh, mesh_lib.tensor_parallel())
sharded, tp_engine = generate(tp_params)
batch_tp = scored(sharded)
lap("decode sharded")

# 2. recompute + one GRPO step on the FSDP mesh ------------------------------------------------


class Recorded(mesh_lib.MeshRows):
    """MeshRows that notes the layout of every array it places or brings back."""

    seen: dict = {"rows": {}, "host": {}}

    def _note(self, kind, x):
        if isinstance(x, jax.Array):
            shard = x.addressable_shards[0].data.shape
            self.seen[kind][f"{x.ndim}d"] = (str(x.sharding.spec), list(x.shape), list(shard))

    def rows(self, x):
        placed = super().rows(x)
        self._note("rows", placed)
        return placed

    def host(self, tree):
        if isinstance(tree, list):  # the per-micro-batch log-probs, not the params
            for x in tree:
                self._note("host", x)
        return super().host(tree)


row_layout = Recorded(train_mesh, mesh_lib.fsdp())
fsdp = Trainer(
    CFG,
    mesh_lib.place_params(params, train_mesh, mesh_lib.fsdp()),
    get_preset("grpo"),
    TRAINER,
    row_layout=row_layout,
    sampling=SCORING,
)
prox_fsdp = fsdp.recompute_logprobs(batch_tp)
m_fsdp = fsdp.train_step(batch_tp, prox_fsdp)
new_fsdp = fsdp.params()
lap("train sharded")

# 3. weights: every process publishes its FSDP shards, loads its TP slices ----------------------
store = TensorStoreWeightStore(args.store, keep=2)
mesh_lib.publish(store, 1, new_fsdp)
version, loaded = mesh_lib.load(store, 1, infer_mesh, mesh_lib.tensor_parallel())
resharded = mesh_lib.place_params(new_fsdp, infer_mesh, mesh_lib.tensor_parallel())
same = True
for path, x in flatten_tree(loaded).items():
    y = flatten_tree(resharded)[path]
    assert x.sharding == y.sharding, (path, x.sharding, y.sharding)
    for a, b in zip(x.addressable_shards, y.addressable_shards, strict=True):
        same &= bool(np.array_equal(np.asarray(a.data), np.asarray(b.data)))
out["weights"] = {
    "version": version,
    "loaded_equals_resharded": same,
    "bytes_written": store.stats["bytes_written"],
    "bytes_read": store.stats["bytes_read"],
    "param_bytes": int(sum(x.nbytes for x in flatten_tree(params).values())),
    "versions": store.versions(),
}
# 3b. a Hugging Face checkpoint straight into the FSDP layout: each process reads its blocks
hf_dir = args.store.rstrip("/") + "_hf"
if jax.process_index() == 0:
    save_hf(params, CFG, hf_dir)
mesh_lib.barrier("minirl-test-hf-saved")
hf_cfg, from_hf, hf_read = mesh_lib.load_checkpoint(hf_dir, train_mesh, mesh_lib.fsdp())
placed = mesh_lib.place_params(params, train_mesh, mesh_lib.fsdp())
held, hf_same = {}, hf_cfg == CFG  # distinct blocks held by this process's devices
for path, x in flatten_tree(from_hf).items():
    assert x.sharding == flatten_tree(placed)[path].sharding, path
    for shard in x.addressable_shards:
        held[path, str(shard.index)] = shard.data.nbytes
        hf_same &= bool(
            np.array_equal(np.asarray(shard.data), flatten_tree(params)[path][shard.index])
        )
out["checkpoint"] = {
    "equal": hf_same,
    "bytes_read": hf_read,
    "bytes_held": sum(held.values()),
    "embed_spec": mesh_lib.describe(from_hf)["embed"],
}
# 3c. the trainer's state as an Orbax checkpoint (each process writes and reads its shards),
# restored into a fresh trainer on the same mesh: every shard equal, bit for bit
from scale.orbax_checkpoints import TrainerCheckpoints  # noqa: E402

orbax = TrainerCheckpoints(args.store.rstrip("/") + "_orbax")
orbax.save(1, fsdp)
orbax.save(2, fsdp)  # a step a resume drops: every process must delete it, even one that
if jax.process_index() == 1:  # lists the steps after another process has removed the directory
    time.sleep(2)
orbax.discard_after(1)
fresh = Trainer(
    CFG,
    mesh_lib.place_params(params, train_mesh, mesh_lib.fsdp()),
    get_preset("grpo"),
    TRAINER,
    row_layout=mesh_lib.MeshRows(train_mesh, mesh_lib.fsdp()),
    sampling=SCORING,
)
orbax.restore(1, fresh)
want, got = fsdp.state_dict(host=False), fresh.state_dict(host=False)
orbax_same, orbax_shards = (want["step"], want["skipped_nonfinite"]) == (got["step"], 0), 0
for a, b in zip(
    jax.tree.leaves((want["params"], want["opt_state"])),
    jax.tree.leaves((got["params"], got["opt_state"])),
    strict=True,
):
    orbax_same &= a.sharding.is_equivalent_to(b.sharding, a.ndim)
    for x, y in zip(a.addressable_shards, b.addressable_shards, strict=True):
        orbax_same &= bool(np.array_equal(np.asarray(x.data), np.asarray(y.data)))
        orbax_shards += 1
orbax.close()
out["orbax"] = {
    "equal": orbax_same,
    "shards_compared": orbax_shards,
    "steps": orbax.steps(),
    "step": got["step"],
}
out["batch_layouts"] = row_layout.seen
out["specs"] = {
    "engine q_proj": mesh_lib.describe(tp_engine._given)["layers/0/attn/q_proj"],
    "trainer embed": mesh_lib.describe(new_fsdp)["embed"],
    "trainer q_proj": mesh_lib.describe(new_fsdp)["layers/0/attn/q_proj"],
}
lap("weights")

# 4. the unsharded references (process 0) ------------------------------------------------------
if jax.process_index() == 0:
    plain, _ = generate(params)
    batch = scored(plain)
    lap("decode unsharded")
    ref = Trainer(CFG, params, get_preset("grpo"), TRAINER, sampling=SCORING)
    prox_ref = ref.recompute_logprobs(batch_tp)
    m_ref = ref.train_step(batch_tp, prox_ref)
    new_ref = flatten_tree(ref.params())
    lap("train unsharded")
    param_diff = 0.0
    for path, x in flatten_tree(new_fsdp).items():
        want = np.asarray(new_ref[path])
        for shard in x.addressable_shards:  # what this process holds
            param_diff = max(param_diff, max_diff(shard.data, want[shard.index]))
    pairs = list(zip(plain, sharded, strict=True))
    out["decode"] = {
        "tokens_equal": all(np.array_equal(a.tokens, b.tokens) for a, b in pairs),
        "tokens": sum(len(r.tokens) for r in plain),
        "max_abs_dlogp": max(max_diff(a.logprobs, b.logprobs) for a, b in pairs),
        "bitwise": all(np.array_equal(a.logprobs, b.logprobs) for a, b in pairs),
    }
    out["train"] = {
        "prox_max_abs_diff": max_diff(prox_ref, prox_fsdp),
        "loss": [m_ref["loss"], m_fsdp["loss"]],
        "grad_norm": [m_ref["grad_norm"], m_fsdp["grad_norm"]],
        "param_max_abs_diff": param_diff,
        "update_max_abs": max(max_diff(new_ref[k], v) for k, v in flatten_tree(params).items()),
    }
    # engine log-probs vs trainer recompute: both unsharded ("same layout"), TP engine vs FSDP
    # trainer ("divergent"); and what the layout alone changes on each side
    out["mismatch"] = {
        "same_layout": mismatch_metrics(batch.behaviour_logprobs, prox_ref, batch.mask),
        "divergent": mismatch_metrics(batch_tp.behaviour_logprobs, prox_fsdp, batch_tp.mask),
        "trainer_layout_only": mismatch_metrics(prox_ref, prox_fsdp, batch_tp.mask),
        "engine_layout_only": mismatch_metrics(
            batch.behaviour_logprobs, batch_tp.behaviour_logprobs, batch.mask
        ),
    }
mesh_lib.barrier("minirl-test-done")
out["seconds"] = times
with open(f"{args.out}.{jax.process_index()}", "w") as f:
    json.dump(out, f, indent=1, default=float)
print(json.dumps(times))
