"""The tiny MoE on 4 fake CPU devices with expert parallelism, run in a subprocess by
tests/scale/test_mesh.py (fake devices must be configured before JAX starts).

    python tests/scale/moe_run.py OUT.json WORK_DIR

With `expert_parallel(fsdp())` on an fsdp=4 mesh (each device holds 2 of the 8 experts):
  1. the forward's logits against the unsharded forward
  2. a Hugging Face checkpoint read straight into that layout (`load_checkpoint`: each device's
     experts only), against the parameters
  3. the weights published to a TensorStore store and loaded back into the layout
  4. a Trainer holding them saved with Orbax and restored into a fresh one (started at zeros)
Writes its numbers to OUT.json.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
)
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from minirl.hf.model_files import save_hf  # noqa: E402
from minirl.losses import get_preset  # noqa: E402
from minirl.modeling.model import ModelConfig, abstract_model, init_model  # noqa: E402
from minirl.store.trees import flatten_tree  # noqa: E402
from minirl.training.trainer import Trainer, TrainerConfig  # noqa: E402
from scale import mesh as mesh_lib  # noqa: E402
from scale.orbax_checkpoints import TrainerCheckpoints  # noqa: E402
from scale.tensorstore_weights import TensorStoreWeightStore  # noqa: E402

out_file, work = sys.argv[1], sys.argv[2]
CFG = ModelConfig.preset("tiny-moe", max_seq_len=64)
params = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.split(init_model(CFG, seed=0))[1]))
mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(fsdp=4))
rules = mesh_lib.expert_parallel(mesh_lib.fsdp())
placed = mesh_lib.place_params(params, mesh, rules)
graphdef = abstract_model(CFG)[0]
forward = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))
tokens = np.random.default_rng(0).integers(0, 64, (4, 12)).astype(np.int32)
flat, flat_placed = flatten_tree(params), flatten_tree(placed)


def equal_shards(tree) -> bool:
    """Every leaf of `tree` has the EP layout and its shards equal the parameters' blocks."""
    same = True
    for path, x in flatten_tree(tree).items():
        same &= x.sharding.is_equivalent_to(flat_placed[path].sharding, x.ndim)
        for shard in x.addressable_shards:
            same &= bool(np.array_equal(np.asarray(shard.data), flat[path][shard.index]))
    return same


gate = flat_placed["layers/0/mlp/gate_proj"]
out = {
    "specs": {k: str(v) for k, v in mesh_lib.describe(placed).items() if "layers/0/mlp" in k},
    "expert_shard": list(gate.addressable_shards[0].data.shape),
    "logits_max_diff": float(np.abs(forward(placed, tokens) - forward(params, tokens)).max()),
}
save_hf(params, CFG, work + "/hf")
hf_cfg, from_hf, _ = mesh_lib.load_checkpoint(work + "/hf", mesh, rules)
out["checkpoint_equal"] = hf_cfg == CFG and equal_shards(from_hf)
store = TensorStoreWeightStore(work + "/store", keep=2)
mesh_lib.publish(store, 1, placed)
out["store_equal"] = equal_shards(mesh_lib.load(store, 1, mesh, rules)[1])
trainer_args = (get_preset("grpo"), TrainerConfig(micro_batch_tokens=256))
rows = mesh_lib.MeshRows(mesh, rules)
trainer = Trainer(CFG, placed, *trainer_args, row_layout=rows)
orbax = TrainerCheckpoints(work + "/orbax")
orbax.save(1, trainer)
zeros = mesh_lib.place_params(jax.tree.map(np.zeros_like, params), mesh, rules)
fresh = Trainer(CFG, zeros, *trainer_args, row_layout=rows)  # restored over zeros
orbax.restore(1, fresh)
out["orbax_equal"] = equal_shards(fresh.state_dict(host=False)["params"])
orbax.close()
with open(out_file, "w") as f:
    json.dump(out, f)
