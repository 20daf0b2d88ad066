"""scale/mesh.py: sharding rules by hand on one device, then minirl's own Engine and Trainer run
sharded on a fake 4-device CPU mesh (one subprocess) and on 2 processes x 2 devices through
jax.distributed on 127.0.0.1 (two subprocesses); tests/scale/sharded_run.py does the work.

Tolerances (float32, tiny model, learning rate 1e-3): sharded == unsharded up to reduction
order — sampled tokens identical; |log-prob difference| <= 1e-5 in decode and in the trainer's
recompute; loss and grad-norm within rtol 1e-5; parameters after one AdamW step within 1e-5
(1% of the step size). The sharded trainer is FSDP AND data parallel: every micro-batch array
it hands to jit is split by rows over "fsdp" (each device holds half the rows), and so are the
log-probs that come back. Weights loaded from the TensorStore store into the engine's layout are
bitwise equal to an in-process reshard.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from scale import mesh as mesh_lib

SCRIPT = Path(__file__).with_name("sharded_run.py")
TIMEOUT = 600  # seconds: cold compiles on a loaded 2-core machine


# ---- rules, by hand (single device) ----------------------------------------------------------


class FakeMesh:
    """Just the `.shape` a ShardingRules.spec reads."""

    def __init__(self, **shape):
        self.shape = {"data": 1, "fsdp": 1, "tensor": 1, **shape}


def test_fsdp_rules_split_model_width_and_heads():
    mesh, rules = FakeMesh(fsdp=2, tensor=2), mesh_lib.fsdp()
    spec = lambda path, shape: rules.spec(mesh_lib.param_axes(path, len(shape)), shape, mesh)
    assert spec("layers/0/attn/q_proj", (32, 32)) == P("fsdp", "tensor")  # [D, H*Dh]
    assert spec("layers/0/attn/o_proj", (32, 32)) == P("tensor", "fsdp")  # [H*Dh, D]
    assert spec("layers/3/mlp/down_proj", (64, 32)) == P("tensor", "fsdp")  # [F, D]
    assert spec("embed", (32, 32)) == P(None, "fsdp")  # [V, D]
    assert spec("layers/0/attn_norm/weight", (32,)) == P(None)  # norms: replicated
    assert spec("layers/0/attn/k_proj", (32, 5)) == P("fsdp", None)  # 5 % 2: not split...
    assert spec("layers/0/attn/k_proj", (31, 6)) == P(None, "tensor")  # ...nor 31
    assert spec("something/new", (8, 8)) == P(None, None)  # unknown: replicated


def test_tensor_parallel_rules_and_activations():
    mesh, rules = FakeMesh(data=2, tensor=4), mesh_lib.tensor_parallel()
    assert rules.spec(mesh_lib.param_axes("layers/1/mlp/gate_proj", 2), (32, 64), mesh) == P(
        None, "tensor"
    )
    assert rules.spec(mesh_lib.param_axes("embed", 2), (32, 32), mesh) == P(None, None)
    kv = rules.spec(mesh_lib.ACTIVATION_AXES["kv_cache"], (8, 40, 4, 16), mesh)
    assert kv == P("data", None, "tensor", None)  # [B, S, K, Dh]
    assert mesh_lib.fsdp().spec(
        mesh_lib.ACTIVATION_AXES["tokens"], (8, 16), FakeMesh(data=2, fsdp=2)
    ) == P(("data", "fsdp"), None)


def test_no_sharding_replicates_everything():
    mesh = FakeMesh(data=2, fsdp=2, tensor=2)
    for name, axes in mesh_lib.PARAM_AXES.items():
        assert mesh_lib.no_sharding().spec(axes, (8,) * len(axes), mesh) == P(
            *[None] * len(axes)
        ), name


def test_a_mesh_axis_is_used_once_per_array():
    rules = mesh_lib.ShardingRules("greedy", (("vocab", "tensor"), ("embed", "tensor")))
    assert rules.spec(("vocab", "embed"), (8, 8), FakeMesh(tensor=2)) == P("tensor", None)


def test_mesh_config_fills_and_checks_device_counts():
    assert mesh_lib.MeshConfig(fsdp=-1).shape(8) == (1, 8, 1)
    assert mesh_lib.MeshConfig(data=2, tensor=-1).shape(8) == (2, 1, 4)
    with pytest.raises(ValueError, match="needs 4 devices, got 8"):
        mesh_lib.MeshConfig(data=2, tensor=2).shape(8)
    with pytest.raises(ValueError, match="at most one -1"):
        mesh_lib.MeshConfig(data=-1, fsdp=-1)
    with pytest.raises(ValueError, match="cannot fill"):
        mesh_lib.MeshConfig(tensor=3, fsdp=-1).shape(8)


def test_distributed_config_is_validated_and_one_process_is_a_no_op():
    mesh_lib.initialize(
        mesh_lib.DistributedConfig()
    )  # nothing happens: jax is still single-process here
    assert jax.process_count() == 1
    with pytest.raises(ValueError, match="coordinator_address"):
        mesh_lib.DistributedConfig(num_processes=2)
    with pytest.raises(ValueError, match="process_id"):
        mesh_lib.DistributedConfig("127.0.0.1:1234", num_processes=2, process_id=2)
    with pytest.raises(ValueError, match="mesh axes"):
        mesh_lib.ShardingRules("bad", (("embed", "model"),))


def test_place_params_on_a_one_device_mesh_keeps_every_value():
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(), devices=jax.devices()[:1])
    params = {
        "embed": np.arange(12, dtype=np.float32).reshape(3, 4),
        "step": 3,
        "layers": [{"attn": {"q_proj": np.ones((4, 4), np.float32)}}],
    }
    placed = mesh_lib.place_params(params, mesh, mesh_lib.fsdp())
    assert placed["step"] == 3 and isinstance(placed["embed"], jax.Array)
    np.testing.assert_array_equal(np.asarray(placed["embed"]), params["embed"])
    assert mesh_lib.describe(placed)["layers/0/attn/q_proj"] == str(
        P(None, None)
    )  # 1-way: replicated


# ---- sharded runs in subprocesses ---------------------------------------------------------------


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return {**env, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(SCRIPT.parents[2])}


def _read(out: Path, process: int) -> dict:
    return json.loads(Path(f"{out}.{process}").read_text())


def _check_equal_to_unsharded(r: dict) -> None:
    d, t = r["decode"], r["train"]
    assert d["tokens_equal"] and d["tokens"] == 192
    assert d["max_abs_dlogp"] <= 1e-5
    assert t["prox_max_abs_diff"] <= 1e-5
    np.testing.assert_allclose(t["loss"][1], t["loss"][0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(t["grad_norm"][1], t["grad_norm"][0], rtol=1e-5)
    assert t["update_max_abs"] > 5e-4  # the step really moved the weights (lr 1e-3)...
    assert t["param_max_abs_diff"] <= 1e-5  # ...and both layouts moved them alike
    for name, m in r["mismatch"].items():  # measured, finite, small
        assert m["tokens"] == 192 and m["nonfinite_tokens"] == 0, name
        assert 0 <= m["mean_abs_dlogp"] <= m["max_abs_dlogp"] <= 1e-5, name


def _check_rows_split(layouts: dict) -> None:
    """The micro-batch arrays entered the jitted functions split by rows over "fsdp" (2 ways),
    and the per-row log-probs came back split the same way."""
    rows, host = layouts["rows"], layouts["host"]
    assert set(rows) == {"1d", "2d"} and set(host) == {"2d"}, layouts
    for ndim, (spec, shape, shard) in {**rows, "out": host["2d"]}.items():
        assert spec in ("P('fsdp',)", "P('fsdp', None)"), (ndim, spec)  # rows over fsdp only
        assert shape[0] >= 2 and shard == [shape[0] // 2, *shape[1:]], (ndim, shape, shard)


def _check_checkpoint_read(c: dict, param_bytes: int) -> None:
    """A Hugging Face checkpoint read into the FSDP layout: the same values, and exactly the
    distinct blocks this process's devices hold were read, each once."""
    assert c["equal"] and c["embed_spec"] == "P(None, 'fsdp')"
    assert c["bytes_read"] == c["bytes_held"] <= param_bytes


def _check_orbax(o: dict) -> None:
    """The trainer's Orbax checkpoint, restored into a fresh trainer: every shard of params and
    optimizer state equal bit for bit, the counters back."""
    assert o["equal"] and o["shards_compared"] > 0 and o["steps"] == [1] and o["step"] == 1


def _report(r: dict, label: str) -> None:
    lines = [f"\n{label}: " + ", ".join(f"{k} {v:.1f}s" for k, v in r["seconds"].items())]
    if "train" in r:
        t = r["train"]
        lines.append(
            f"  sharded vs unsharded step: recompute {t['prox_max_abs_diff']:.1e}, loss "
            f"{abs(t['loss'][1] - t['loss'][0]):.1e}, params {t['param_max_abs_diff']:.1e} "
            f"(update {t['update_max_abs']:.1e})"
        )
    for name, m in r.get("mismatch", {}).items():
        lines.append(
            f"  mismatch {name:20s} mean|dlogp| {m['mean_abs_dlogp']:.2e}  "
            f"p95 {m['p95_abs_dlogp']:.2e}  max {m['max_abs_dlogp']:.2e}  k3 {m['kl_k3']:.1e}"
        )
    print("\n".join(lines))


@pytest.mark.slow  # ~30 s cold; the default lane keeps tests/scale/test_exact_layouts.py's TP/FSDP run
def test_sharded_engine_and_trainer_on_four_fake_devices(tmp_path):
    out = tmp_path / "out.json"
    subprocess.run(
        [sys.executable, str(SCRIPT), str(out), str(tmp_path / "store"), "--devices", "4"],
        env=_env(),
        check=True,
        timeout=TIMEOUT,
        capture_output=True,
    )
    r = _read(out, 0)
    _report(r, "1 process x 4 devices")
    assert r["processes"] == 1
    _check_equal_to_unsharded(r)
    assert r["specs"] == {
        "engine q_proj": "P(None, 'tensor')",
        "trainer embed": "P(None, 'fsdp')",
        "trainer q_proj": "P('fsdp', 'tensor')",
    }
    _check_rows_split(r["batch_layouts"])
    w = r["weights"]
    assert w["loaded_equals_resharded"] and w["versions"] == [1]
    assert w["bytes_written"] == w["param_bytes"] == w["bytes_read"]  # one process: all of it
    _check_checkpoint_read(r["checkpoint"], w["param_bytes"])
    _check_orbax(r["orbax"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # ~25 s of CPU (no persistent compile cache across processes); 2 min when busy
def test_two_processes_with_two_devices_each(tmp_path):
    out, port = tmp_path / "out.json", _free_port()
    cmd = lambda i: [
        sys.executable,
        str(SCRIPT),
        str(out),
        str(tmp_path / "store"),
        "--devices",
        "2",
        "--coordinator",
        f"127.0.0.1:{port}",
        "--num-processes",
        "2",
        "--process-id",
        str(i),
    ]
    procs = [
        subprocess.Popen(cmd(i), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for i in range(2)
    ]
    try:
        logs = [p.communicate(timeout=TIMEOUT)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    r0, r1 = _read(out, 0), _read(out, 1)
    _report(r0, "2 processes x 2 devices")
    assert r0["processes"] == r1["processes"] == 2 and (r0["process"], r1["process"]) == (0, 1)
    _check_equal_to_unsharded(r0)
    _check_rows_split(r0["batch_layouts"])
    for w in (r0["weights"], r1["weights"]):
        assert w["loaded_equals_resharded"] and w["versions"] == [1]
        assert w["bytes_read"] < w["param_bytes"]  # each process read only its own slices
    for r in (r0, r1):  # and of the Hugging Face checkpoint, less than the whole model
        _check_checkpoint_read(r["checkpoint"], r0["weights"]["param_bytes"])
        _check_orbax(r["orbax"])  # each process restored its own shards of the Orbax checkpoint
        assert r["checkpoint"]["bytes_read"] < r0["weights"]["param_bytes"]
    # every FSDP shard was written by exactly one process
    assert (
        r0["weights"]["bytes_written"] + r1["weights"]["bytes_written"]
        == r0["weights"]["param_bytes"]
    )


def test_expert_parallel_rules_split_the_experts_axis():
    mesh, rules = FakeMesh(fsdp=4, tensor=2), mesh_lib.expert_parallel(mesh_lib.fsdp())
    spec = lambda path, shape: rules.spec(mesh_lib.param_axes(path, len(shape)), shape, mesh)
    # [E, D, F]: experts over fsdp (so D is not), F over tensor; [E, F, D] likewise.
    assert spec("layers/0/mlp/gate_proj", (8, 64, 32)) == P("fsdp", None, "tensor")
    assert spec("layers/0/mlp/down_proj", (8, 32, 64)) == P("fsdp", "tensor", None)
    assert spec("layers/0/mlp/gate_proj", (64, 32)) == P("fsdp", "tensor")  # a dense MLP: as fsdp
    assert spec("layers/0/mlp/router", (64, 8)) == P(None, None)  # small: replicated
    # Without the rule, experts stay whole on every device and their inner dims split as dense.
    plain = mesh_lib.fsdp().spec(mesh_lib.param_axes("x/up_proj", 3), (8, 64, 32), mesh)
    assert plain == P(None, "fsdp", "tensor")
    tp = mesh_lib.expert_parallel(mesh_lib.tensor_parallel(), axis="tensor")
    assert tp.spec(mesh_lib.param_axes("x/up_proj", 3), (8, 64, 32), mesh) == P(
        "tensor", None, None
    )


@pytest.mark.slow  # ~14 s: a fresh process, its own compiles
def test_the_tiny_moe_with_expert_parallelism_on_four_fake_devices(tmp_path):
    """Forward, Hugging Face checkpoint, TensorStore weights and Orbax: all carry the MoE in
    its expert-parallel layout (tests/scale/moe_run.py)."""
    out = tmp_path / "out.json"
    script = SCRIPT.with_name("moe_run.py")
    subprocess.run(
        [sys.executable, str(script), str(out), str(tmp_path)],
        env=_env(),
        check=True,
        timeout=TIMEOUT,
        capture_output=True,
    )
    r = json.loads(out.read_text())
    assert r["specs"]["layers/0/mlp/gate_proj"] == "P('fsdp', None, None)"
    assert r["specs"]["layers/0/mlp/down_proj"] == "P('fsdp', None, None)"
    assert r["expert_shard"] == [2, 64, 64]  # 8 experts over 4 devices
    assert r["logits_max_diff"] <= 1e-5
    assert r["checkpoint_equal"] and r["store_equal"] and r["orbax_equal"]
