"""The engine job's weight loading (scale/roles.py `EngineRole`): weights read from the TensorStore
store for the engine alone reach it in the dtypes it would cast them to itself, so it keeps one
copy (it keeps JAX arrays as given: docs/engine.md, "Memory between calls")."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from minirl.inference.engine import Engine, EngineConfig, Request
from minirl.modeling import lora
from minirl.modeling.model import ModelConfig, init_model
from minirl.types import Prompt
from scale import mesh as mesh_lib
from scale.roles import BASE_VERSION, EngineRole, StoredWeights
from scale.tensorstore_weights import TensorStoreWeightStore

CFG = ModelConfig(
    vocab_size=64, dim=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=64,
    max_seq_len=64, lora_rank=2, lora_targets=("q", "v"),
)  # fmt: skip
ENGINE = EngineConfig(slots=2, cache_len=32, prefill_buckets=(8,), decode_chunk=4, dtype="bfloat16")


def test_a_lora_engine_job_gets_its_base_in_bf16_and_its_adapters_unrounded(tmp_path):
    params = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.split(init_model(CFG, seed=3))[1]))
    rng = np.random.default_rng(0)  # adapters bf16 cannot hold: a rounding would show
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: (
            rng.standard_normal(x.shape).astype(np.float32) / 3
            if str(path[-1].key).endswith("_lora_b")
            else x
        ),
        params,
    )
    adapters, base = lora.partition(params, lora.is_adapter)
    store, base_store = (TensorStoreWeightStore(tmp_path / n) for n in ("weights", "base"))
    mesh_lib.publish(store, 1, adapters)
    mesh_lib.publish(base_store, BASE_VERSION, base)
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig())
    role = EngineRole(Engine(CFG, ENGINE), store, mesh, mesh_lib.tensor_parallel(), base_store)
    role.load_weights(1, StoredWeights(1))

    held_adapters, held_base = lora.partition(role.engine._given, lora.is_adapter)
    jax.tree.map(np.testing.assert_array_equal, held_adapters, adapters)  # float32, unrounded
    assert {x.dtype for x in jax.tree.leaves(held_adapters)} == {jnp.dtype(jnp.float32)}
    assert held_base["embed"].dtype == jnp.float32  # the embedding as given (docs/engine.md)
    rest = {k: v for k, v in held_base.items() if k != "embed"}
    assert {x.dtype for x in jax.tree.leaves(rest)} == {jnp.dtype(jnp.bfloat16)}

    local = Engine(CFG, ENGINE)  # the same weights handed over in this process, as numpy
    local.load_weights(1, params)
    req = [Request(Prompt(0, "t", "", np.arange(1, 6, dtype=np.int32)), 0, 8)]
    got, want = role.generate(req)[0], local.generate(req)[0]
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=1e-6)  # fast mode: to rounding
