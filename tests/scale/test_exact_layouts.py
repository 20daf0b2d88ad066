"""Exact mode whatever the layout (#45): a tensor-parallel engine and an FSDP trainer give the same
bits, on 4 fake CPU devices (subprocesses: the devices are configured before JAX starts).

  tests/scale/exact_layouts.py  engines and trainers on the layouts named: the engine's tokens
                                and behaviour log-probs (prefill, chunked decode, the paged cache,
                                multi-turn episodes continuing their cache) against the first
                                engine's, the trainer's recompute and training forward against
                                those log-probs, all with ==
  tests/scale/exact_run.py      an async RL run in RLAX's layout (scale/roles.py without Ray): a
                                TP engine loading each version from a TensorStore store, an FSDP
                                trainer publishing it; metrics.jsonl's mismatch/* must be 0

Default lane: the MoE model in bfloat16 with LoRA and experts over a mesh axis, engine tensor=4
vs trainer fsdp=2,tensor=2; the async run (fixture model, float32), engine tensor=4 vs trainer
fsdp=4. (tests/scale/test_diagnose.py adds the dense float32 decode on tensor=4 vs the recompute
on fsdp=2,tensor=2, and shows that fast mode differs there.) Slow lane: every layout pair of the
issue (one device, tensor=2, tensor=4 engines, and data=2,tensor=2 with the slots split over
"data"; one device, fsdp=2, fsdp=4, fsdp=2,tensor=2 trainers), dense and MoE, float32 and
bfloat16, LoRA, experts split or whole, shared prompts (a group's prompt run once per
micro-batch, derived on for a user's dense model); and the same run through Ray (`python -m
scale.launch ray --weights`, a two-process trainer job).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
TIMEOUT = 900  # seconds: cold compiles on a loaded 2-core machine


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return {**env, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}


def _layouts(tmp_path, *argv: str, env=None) -> dict:
    out = tmp_path / "layouts.json"
    done = subprocess.run(
        [sys.executable, str(HERE / "exact_layouts.py"), str(out), *argv],
        env=env or _env(),
        capture_output=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return json.loads(out.read_text())


def _check_bitwise(r: dict, engines: list[str], trainers: list[str]) -> None:
    assert r["tokens"] >= 100 and r["multi_turn"] >= 1, r  # enough tokens; turns that continue
    assert sorted(r["engines"]) == sorted(engines[1:]) and sorted(r["trainers"]) == sorted(trainers)
    for layout, e in r["engines"].items():  # against the first engine
        assert e["tokens_equal"] and e["equal"] and e["max"] == 0.0, (layout, e)
    for layout, t in r["trainers"].items():  # against the first engine's log-probs
        for side in ("recompute", "training_forward"):
            assert t[side]["equal"] and t[side]["max"] == 0.0, (layout, side, t)


def _flags(engines, trainers) -> list[str]:
    return [x for e in engines for x in ("--engine", e)] + [
        x for t in trainers for x in ("--trainer", t)
    ]


@pytest.mark.slow  # ~50 s cold; the default lane keeps the async TP-engine/FSDP-trainer run
def test_moe_bf16_lora_tp_engine_equals_fsdp_trainer_bitwise(tmp_path):
    engines, trainers = ["tensor=4"], ["fsdp=2,tensor=2"]
    r = _layouts(
        tmp_path,
        *("--model", "moe", "--dtype", "bfloat16", "--lora", "--experts"),
        *_flags(engines, trainers),
    )
    _check_bitwise(r, engines, trainers)


MATRIX = [  # (model, dtype, flags): every layout pair on each
    ("dense", "float32", []),
    ("dense", "bfloat16", ["--lora"]),
    ("dense", "bfloat16", ["--lora", "--share-prompts"]),  # derived on for a user's dense model
    ("moe", "float32", []),  # experts whole on every device, their F split by "tensor"
    ("moe", "float32", ["--experts", "--lora"]),
    ("moe", "bfloat16", ["--experts"]),
]


@pytest.mark.slow  # ~2-4 min each on a loaded 2-core machine: 3 engines, 4 trainers
@pytest.mark.parametrize(
    "model, dtype, flags", MATRIX, ids=["-".join([m, d, *f]) for m, d, f in MATRIX]
)
def test_every_layout_pair_is_bitwise(tmp_path, model, dtype, flags):
    engines = ["one", "tensor=2", "tensor=4", "data=2,tensor=2"]
    trainers = ["one", "fsdp=2", "fsdp=4", "fsdp=2,tensor=2"]
    r = _layouts(tmp_path, "--model", model, "--dtype", dtype, *flags, *_flags(engines, trainers))
    _check_bitwise(r, engines, trainers)
    assert (r["rows_sharing"] > 0) == ("--share-prompts" in flags), r  # 7 of 14 rows, measured


@pytest.mark.gpu
@pytest.mark.slow  # the GPU lane runs it (`pytest -m gpu`); on the CPU: one device each side
def test_layouts_on_the_accelerators_devices(tmp_path):
    """On the devices JAX finds (the exact dense product runs as the Pallas kernel on a GPU):
    tensor=n engines and fsdp=n trainers on n >= 2 GPUs, else the one-device engine against the
    one-device trainer; the MoE in bfloat16 (experts: the kernel's 3-D form), paged, multi-turn."""
    import jax

    n = jax.device_count()
    engines = ["one", *([f"tensor={n}"] if n > 1 else [])]
    trainers = ["one", *([f"fsdp={n}"] if n > 1 else [])]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = ("--model", "moe", "--dtype", "bfloat16", "--devices", "0")
    r = _layouts(tmp_path, *argv, *_flags(engines, trainers), env=env)
    _check_bitwise(r, engines, trainers)


# ---- an RL run: mismatch/* exactly 0 at every step -----------------------------------------

RUN_SETS = [
    "engine.exact=true",
    "rl.scheduler=async",
    "rl.steps=2",
    "rl.prompts_per_step=4",
    "rl.group_size=4",
    "engine.slots=16",
    "eval.prompts=1",
    "eval.samples=1",
]


def _check_zero_mismatch(run_dir: Path, steps: int) -> None:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    for r in records:
        # every token sampled by the version the trainer held (lag 0): mismatch/* is numerics only
        assert r["mismatch/tokens"] > 0 and r["lag/[0,1)/tokens"] == r["mismatch/tokens"], r
        mismatch = {k: v for k, v in r.items() if k.startswith("mismatch/")}
        assert set(mismatch) >= {"mismatch/max_abs_dlogp", "mismatch/kl_k3"}
        assert all(v == 0.0 for k, v in mismatch.items() if k != "mismatch/tokens"), mismatch
        # the training forward's own log-probs (first update) against the engine's, too
        assert r["train/dlogp_no_recompute/max_abs_dlogp"] == 0.0, r


def test_async_run_with_tp_engine_and_fsdp_trainer_logs_zero_mismatch(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, str(HERE / "exact_run.py"), str(run_dir)]
    cmd += ["--engine-mesh", "tensor=4", "--trainer-mesh", "fsdp=4"]
    cmd += [x for s in RUN_SETS for x in ("--set", s)]
    done = subprocess.run(cmd, env=_env(), capture_output=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    _check_zero_mismatch(run_dir, 2)


@pytest.mark.slow  # ~2 min: a local Ray cluster, a two-process trainer job, a TP engine job
def test_the_ray_weights_run_logs_zero_mismatch(tmp_path):
    pytest.importorskip("ray")
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "scale.launch", "ray", "--preset", "fixture"]
    cmd += [x for s in RUN_SETS for x in ("--set", s)]
    cmd += ["--trainer-hosts", "2", "--cpu-devices", "2", "--trainer-mesh", "fsdp=-1"]
    cmd += ["--engine-mesh", "tensor=2", "--weights", f"file://{tmp_path}/weights"]
    cmd += ["--run-dir", str(run_dir), "--quiet"]
    env = {**_env(), "MINIRL_TOKEN": "exact-test-secret"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=TIMEOUT)
    assert done.returncode == 0, (done.stdout + done.stderr).decode()[-3000:]
    _check_zero_mismatch(run_dir, 2)


# ---- layouts exact mode cannot keep its bits on: refused in one line --------------------------


def test_a_split_into_3_is_refused_before_anything_runs(tmp_path, capsys):
    from minirl.modeling.model_config import ModelConfig
    from scale import mesh as mesh_lib

    cfg = ModelConfig(dim=64, num_layers=1, num_heads=4, head_dim=16, mlp_dim=96)
    tp = mesh_lib.tensor_parallel()
    for tensor in (2, 4, 8):  # 2, 4, 8 ways: accepted (with 8, 96 / 8 = 12 MLP columns each)
        mesh_lib.check_exact(cfg, mesh_lib.MeshConfig(tensor=tensor), tensor, tp)
    with pytest.raises(
        ValueError, match=r"tensor=3: layers/0/mlp/down_proj \(96, 64\) is split 3 ways"
    ):
        mesh_lib.check_exact(cfg, mesh_lib.MeshConfig(tensor=-1), 3, tp)
    mesh_lib.check_exact(cfg, mesh_lib.MeshConfig(fsdp=3), 3, mesh_lib.fsdp())  # 64: not split

    pytest.importorskip("ray")
    from scale.launch import main

    with pytest.raises(SystemExit) as exit_:  # the launcher: before Ray or any job starts
        main(
            [
                "ray",
                "--preset",
                "fixture",
                "--set",
                "engine.exact=true",
                "--set",
                "model.mlp_dim=96",
            ]
            + ["--weights", f"file://{tmp_path}/w", "--run-dir", str(tmp_path / "run")]
            + ["--cpu-devices", "3", "--engine-mesh", "tensor=-1"]
        )
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("python -m scale.launch ray: error: exact mode on the tensor_parallel")
    assert "is split 3 ways" in err
