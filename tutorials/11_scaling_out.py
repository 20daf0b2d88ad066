# %% [markdown]
"""Lesson 11 — scaling out: the same engine and trainer on a device mesh, across processes.

    python tutorials/11_scaling_out.py            # full mode (a few minutes on 2 CPU cores)
    python tutorials/11_scaling_out.py --fast     # fast mode (CI)

Writes `scaling_out.png` and `results.json` into `--out` (default `runs/tutorials/11_scaling_out`).
Uses `scale/` (read `scale/README.md` next): `scale/mesh.py` (meshes, sharding rules, publish and
load), `scale/tensorstore_weights.py` (the weight store), `scale/verifier_service.py` and
`scale/remote_verifier.py` (the verifier as a service), `scale/launch.py` and
`scale/ray_run.py` (the layout on Ray).
Mirrors, in miniature: RLAX §3 and Fig. 1 (one controller; trainer, inference and verifier
services; a parameter server), §6.1 (test data uploaded once, referenced by hash: 500 GB ->
1.35 GB per epoch) and Fig. 3a (inference throughput against the number of inference devices;
this one does NOT reproduce on one 2-core machine, and the lesson measures how it does not).


THE IDEA
--------
Everything so far ran in one Python process on one device. A real run spreads the same work
over many accelerators and hosts. minirl's answer (and RLAX's) has three parts.

1. Sharding, not rewriting. minirl's engine and trainer are `jax.jit` functions over plain
   parameter dicts. Put the parameters on a MESH of devices with a `NamedSharding` per array, and
   XLA's sharding propagation (GSPMD) partitions every computation around them: the same
   functions, the same numbers up to the order of the sums. `scale/mesh.py` writes the placement
   once, by LOGICAL axis ("embed", "mlp", "kv_heads", ...), and a rule set maps logical axes to
   the mesh axes ("data", "fsdp", "tensor"):
     fsdp()             training: each weight split along the model width over "fsdp" (every
                        device holds 1/N of it; XLA gathers it where it is used), heads and
                        MLP columns over "tensor"
     tensor_parallel()  inference (Megatron): heads, KV-cache heads and MLP columns over
                        "tensor", so a decode step needs only two all-reduces per layer
   The trainer and the engine use different layouts. That is RLAX's "divergent parallelism",
   one more source of training–inference mismatch (lesson 08), measured below.
   On a laptop the devices are fake: `XLA_FLAGS=--xla_force_host_platform_device_count=4`
   (set before JAX starts) turns one CPU into 4 devices. They share the same cores, so they show
   the layouts and the numbers, not the speed.

2. Processes. A job larger than one host is one JAX program on several processes
   (`jax.distributed.initialize(coordinator, num_processes, process_id)`): every process runs
   the same code (SPMD) on its own devices, and the mesh spans all of them. Weights go from the
   trainer job to the engine job through a shared WEIGHT STORE on TensorStore (zarr arrays on a
   file system or a bucket): every trainer process writes only the shards it holds, a manifest
   written last commits the version (atomic: a reader never sees half a version), and every
   engine process reads only the slices its own devices need. The controller never holds the
   weights, only version references: RLAX's parameter server.

3. Services. Verification runs untrusted code, so it lives on its own hosts: a verifier pool
   behind HTTP (`scale/verifier_service.py`). Test data can be huge (RLAX: 500 GB per Codeforces
   epoch if sent with every request), so it is uploaded ONCE into a content-addressed repository
   and requests carry only sha256 references. The client (`RemoteVerifier`) retries with
   backoff, re-uploads what a restarted service lost, and never drops a rollout.

WHAT THE SCRIPT DOES
--------------------
1. 4 fake CPU devices in this process. Places a model on a training mesh (fsdp=2 x tensor=2) and
   an inference mesh (tensor=4), prints the layouts and the bytes each device holds.
2. Runs minirl's own Engine on the tensor-parallel mesh and its Trainer on the FSDP mesh, and
   compares them with the same work on one device: the same tokens, log-probs equal to ~1e-6,
   the same gradient norm and AdamW update (to ~1e-4 relative); and the mismatch between the
   tensor-parallel engine and the FSDP trainer ("divergent parallelism").
3. Two processes x 2 fake devices = one 4-device job through `jax.distributed` on 127.0.0.1
   (this script started twice, with --process-id 0 and 1). Together they run the same trainer
   step on the same batch, publish the new weights to a TensorStore store (each process writes
   its own shards) and load them back in the inference layout (each reads its own slices).
4. The verifier as a service: `python -m scale.verifier_service` in a subprocess, scored through
   `RemoteVerifier`; scores equal the local verifier's; bytes sent by reference vs by value over
   two epochs; the service killed in mid-request and restarted empty: no rollout lost.
5. (full mode) RLAX's layout on a local Ray cluster with `python -m scale.launch ray --weights`:
   a trainer job of two Ray actors joined by jax.distributed (FSDP over their 4 fake devices), an
   engine job (tensor=2), the verifier service over HTTP and the controller, two RL steps.
6. Engine decode throughput on 1, 2 and 4 fake devices (RLAX Fig. 3a's axis), and the figure.

Expected output (full mode, measured)
-------------------------------------
Measured on 2026-11-25 with `python tutorials/11_scaling_out.py --out OUT` on a virtual machine
with 2 cores (nproc = 2), this lesson alone (load average 0.6 at the start, 1.9 at the end), with
JAX's persistent compilation cache from earlier runs. It took 91 s of wall time and 107 s of CPU
time (this process and the children it waited for, user + sys; the Ray processes of step 5 are
not among them). The figure is figures/11_scaling_out.png. (The first measurement, 2026-11-23,
ran step 5 as four processes over the TCP transport Ray has since replaced, at load 13-14 and
without the cache: 384 s wall.)

What reproduces: the layouts change WHERE the work runs and not WHAT it computes. On the tiny model
(3.2M parameters) the tensor-parallel engine samples the same 1536 tokens as one device (log-probs
within 3.3e-6), the FSDP trainer's recompute is within 5.2e-6 and its gradient norm within 7e-8
(relative) of one device's, and each device holds about a quarter of the weights (3.2 MB of 12.7
MB). Divergent parallelism (tensor-parallel engine, FSDP trainer) adds no measurable mismatch here:
mean |Δ log p| 8.9e-7 against 8.8e-7 with one device on both sides. Two processes running one job
reproduce the one-process FSDP step bit for bit (recompute difference 0, the same gradient norm),
each writes half of the weights to the TensorStore store and reads back only its half in the
inference layout, equal to an in-process reshard. The verifier service scores exactly as the local
verifier; by reference, test data crosses the network once (247 KB in epoch 1, then 3.1 KB per
epoch, 78x less than by value: RLAX's 500 GB -> 1.35 GB in miniature); a service killed in mid-
request and restarted with an empty repository cost 3 retries and 1 re-upload, and no rollout.
On a local Ray cluster, a trainer job of two actors (one JAX job over their 4 fake devices), an
engine job and the verifier service ran two RL steps with the weights travelling by reference
(the same rewards as the one-process runs of this preset: 0.000 and 0.188).

What does not reproduce: throughput against devices (RLAX Fig. 3a: near-linear). Fake devices
share the same 2 cores, so a tensor-parallel mesh only adds communication: 4 devices were 5x
SLOWER than one (0.19x), 2 devices 0.91x (1.50x, 0.37x and 0.72x in three earlier runs on a
loaded machine: read it as noise). Also note the AdamW update: it agrees to 2e-4 in L2, but
single weights differ by up to 1.6e-4 (16% of the learning rate), because Adam's first step is
lr * g / (|g| + eps): for weights whose gradient is at rounding level, the update itself is
rounding noise, amplified.

    mode: full   cores: 2   load average: 0.6   jax 0.10.2

    Step 1. 4 devices: [CpuDevice(id=0), CpuDevice(id=1), CpuDevice(id=2), CpuDevice(id=3)]
      model: 3.16M parameters; training mesh {'data': 1, 'fsdp': 2, 'tensor': 2}, inference mesh {'data': 1, 'fsdp': 1, 'tensor': 4}
      parameter                          shape   fsdp()                tensor_parallel()
      embed                          (64, 256)   P(None, 'fsdp')       P(None, None)
      layers/0/attn/q_proj          (256, 256)   P('fsdp', 'tensor')   P(None, 'tensor')
      layers/0/attn/o_proj          (256, 256)   P('tensor', 'fsdp')   P('tensor', None)
      layers/0/mlp/down_proj        (768, 256)   P('tensor', 'fsdp')   P('tensor', None)
      layers/0/attn_norm/weight         (256,)   P(None,)              P(None,)
      bytes per device, one device          12657.7 KB
      bytes per device, fsdp=2 x tensor=2    3187.7 KB    3187.7 KB    3187.7 KB    3187.7 KB
      bytes per device, tensor=4             3220.5 KB    3220.5 KB    3220.5 KB    3220.5 KB

    Step 2. minirl's Engine on tensor=4 and Trainer on fsdp=2 x tensor=2, vs one device
      decode: 1536 tokens, same tokens sampled: True, max |Δ log μ| 3.3e-06
      train:  recompute max |Δ| 5.2e-06; grad norm 3.3816803 vs 3.3816800 (relative Δ 7.1e-08)
              the AdamW update (lr 1e-3): |Δ update| / |update| = 2.0e-04 (L2); largest |Δ| of one weight 1.6e-04
      training-inference mismatch, engine log μ vs trainer recompute:
        one device engine vs one device trainer  mean 8.8e-07  p95 2.1e-06  max 4.8e-06
        tensor=4 engine vs fsdp trainer          mean 8.9e-07  p95 2.1e-06  max 4.3e-06

    Step 3. two processes x 2 fake devices = one 4-device job (jax.distributed, 127.0.0.1)
      process 0 of 2: local devices ['cpu:0', 'cpu:1'], global 4; wrote 50% and read 50% of the weights' bytes; loaded == resharded: True
      process 1 of 2: local devices ['cpu:2048', 'cpu:2049'], global 4; wrote 50% and read 50% of the weights' bytes; loaded == resharded: True
      the same step as step 2's fsdp trainer in one process: grad norm 3.3816800 vs 3.3816800, recompute max |Δ| 0.0e+00
      the store: versions [1], manifests ['000000000001.json']; read_slices(1, embed[0:2]) -> shape (2, 256)

    Step 4. the verifier as a service (python -m scale.verifier_service, 127.0.0.1)
      16 rollouts, 4 problems, 240 KB of test data; remote scores == local scores: True
      bytes sent: by reference 247.4 KB (epoch 1, with the one-time upload), 3.1 KB (epoch 2); by value 243.9 KB per epoch, 78x more
      service SIGKILLed mid-request and restarted empty: all 4 rollouts scored as locally: True; retries 3, uploads 1, lost 0

    Step 5. the RLAX layout on a local Ray cluster: python -m scale.launch ray --weights ... (trainer job of 2 processes, engine job, verifier service)
      controller: step 1 version 1 reward 0.000 step_s 9.90
      controller: step 2 version 2 reward 0.188 step_s 0.34
      weights published by the trainer job, by reference: versions [2]; verifier requests 2, unscored 0 (21 s)

    Step 6. engine decode tokens/s on a tensor-parallel mesh of 1, 2 and 4 fake devices (64 requests x 64 tokens, best of 3)
      1 device(s):     9552 tokens/s   (1.00x one device; ideal 1x)
      2 device(s):     8683 tokens/s   (0.91x one device; ideal 2x)
      4 device(s):     1793 tokens/s   (0.19x one device; ideal 4x)

    The claims, checked
      sharded_decode_samples_the_same_tokens     True
      sharded_logprobs_within_1e-5               True
      fsdp_step_matches_one_device               True
      two_processes_match_one_process            True
      each_process_wrote_part_of_the_weights     True
      store_load_equals_reshard                  True
      remote_scores_equal_local                  True
      by_reference_sends_less_after_epoch_1      True
      service_restart_loses_no_rollout           True
      launcher_ran_two_steps                     True

    wrote OUT/scaling_out.png and OUT/results.json
    wall 91 s, CPU 107 s (this process and its children), load average 0.6 -> 1.9
"""

# %%
from __future__ import annotations

import os
import sys

# Fake devices must be configured before JAX starts: 4 here, 2 in each of the two processes of
# step 3 (this same script, started with --process-id).
DEVICES = 2 if "--process-id" in sys.argv else 4
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = (
    f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={DEVICES}".strip()
)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

# subprocess.Popen forks and at once execs a new program; JAX's warning about forking a
# multithreaded process concerns fork WITHOUT exec, so it does not apply to this lesson.
warnings.filterwarnings("ignore", message="os.fork\\(\\) was called")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from minirl.inference.engine import Engine, EngineConfig  # noqa: E402
from minirl.inference.scheduler import Request  # noqa: E402
from minirl.losses import get_preset  # noqa: E402
from minirl.measure.diagnostics import mismatch_metrics  # noqa: E402
from minirl.modeling.model import ModelConfig, init_model  # noqa: E402
from minirl.store.trees import flatten_tree  # noqa: E402
from minirl.training.batching import make_batch  # noqa: E402
from minirl.training.trainer import Trainer, TrainerConfig  # noqa: E402
from minirl.types import Batch, Prompt, Rollout, Score  # noqa: E402
from scale import mesh as mesh_lib  # noqa: E402
from scale.launch import wait_for_output  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# %% [markdown]
# The settings. Full mode: the "tiny" model (3.2M parameters, the built-in tasks' default);
# fast mode: a 2-layer toy. The four fake devices are the same in both.


# %%
FAST_MODEL = ModelConfig(
    vocab_size=32,
    dim=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    max_seq_len=64,
)
FULL = dict(
    model=ModelConfig.preset("tiny", max_seq_len=128),
    prompts=8,
    samples=4,
    new=48,
    launcher=True,
    throughput_tokens=64,
)
FAST = dict(model=FAST_MODEL, prompts=4, samples=2, new=16, launcher=False, throughput_tokens=16)
TRAINER = TrainerConfig(learning_rate=1e-3, micro_batch_tokens=4096, bucket_minimum=32)
TOKEN = "tutorial-11-secret"  # the shared secret of the services (>= 8 characters)
ADD = "a, b = map(int, input().split())\nprint(a + b)"
SLOW = "import time\ntime.sleep(1.5)\n" + ADD
WRONG = "a, b = map(int, input().split())\nprint(a - b)"
# CPU seconds per test (wall: twice that + 0.5 s): far above what these programs need even on a
# loaded machine, so the local and the remote verdicts never depend on how busy it is
TIME_LIMIT_S = 10.0


# %%
def engine_config(s: dict) -> EngineConfig:
    return EngineConfig(
        slots=8, cache_len=s["new"] + 16, prefill_buckets=(16,), prefill_rows=8, decode_chunk=8
    )


# %%
SEED = 3  # keys the engine's sampling draws


# %%
def host_params(cfg: ModelConfig) -> dict:
    """The model's initial weights as host numpy: the same on every process."""
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.split(init_model(cfg, seed=0))[1]))


# %%
def requests(s: dict, vocab: int) -> list[Request]:
    prompts = [
        Prompt(10 + i, "toy", "", np.array([1, 3 + i, 5, 7 + i], np.int32) % vocab)
        for i in range(s["prompts"])
    ]
    return [Request(p, k, s["new"]) for p in prompts for k in range(s["samples"])]


# %%
def generate(cfg, s, params):
    engine = Engine(cfg, engine_config(s), seed=SEED)
    engine.load_weights(0, params)
    rollouts = engine.generate(requests(s, cfg.vocab_size))
    for r in rollouts:  # a reward with variance inside each group, so GRPO has a gradient
        r.score = Score(1.0 if r.sample_index == 0 else 0.0)
    return rollouts


# %%
def max_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


# %%
def update_difference(before, after_ref, after_sharded) -> dict[str, float]:
    """How far apart two optimizer updates of the same weights are. Adam's first step is about
    lr * g / (|g| + eps) per weight, so a weight whose gradient is at rounding level (~1e-9) gets
    an update that depends on the rounding: the largest single difference can be a sizeable
    fraction of lr while the update as a whole agrees to ~1e-4 (relative L2)."""
    diff2 = norm2 = 0.0
    largest = 0.0
    ref, sharded = flatten_tree(after_ref), flatten_tree(after_sharded)
    for path, x0 in flatten_tree(before).items():
        u_ref = np.asarray(ref[path], np.float64) - np.asarray(x0, np.float64)
        u_sh = np.asarray(sharded[path], np.float64) - np.asarray(x0, np.float64)
        diff2 += float(np.sum((u_sh - u_ref) ** 2))
        norm2 += float(np.sum(u_ref**2))
        largest = max(largest, float(np.max(np.abs(u_sh - u_ref))))
    return {"relative_l2": (diff2 / max(norm2, 1e-30)) ** 0.5, "max_abs": largest}


# %%
def bytes_per_device(params) -> dict[str, int]:
    """Parameter bytes each device holds under the arrays' shardings."""
    held: dict[str, int] = {}
    for x in flatten_tree(params).values():
        for shard in x.addressable_shards:
            held[str(shard.device)] = held.get(str(shard.device), 0) + shard.data.nbytes
    return held


# %%
def train_step(cfg, params, batch: Batch) -> dict:
    """One recompute + GRPO step of minirl's Trainer on whatever layout `params` has."""
    trainer = Trainer(cfg, params, get_preset("grpo"), TRAINER)
    prox = trainer.recompute_logprobs(batch)
    metrics = trainer.train_step(batch, prox)
    return {"prox": np.asarray(prox), "metrics": metrics, "params": trainer.params()}


# %% [markdown]
# Steps 1-2: one process, four fake devices


# %%
def step_meshes(s: dict) -> tuple[dict, Batch, dict]:
    cfg = s["model"]
    params = host_params(cfg)
    train_mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(fsdp=2, tensor=2))
    infer_mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(tensor=4))
    fsdp_params = mesh_lib.place_params(params, train_mesh, mesh_lib.fsdp())
    tp_params = mesh_lib.place_params(params, infer_mesh, mesh_lib.tensor_parallel())
    print(f"\nStep 1. {jax.device_count()} devices: {jax.devices()}")
    print(
        f"  model: {cfg.num_params() / 1e6:.2f}M parameters; training mesh "
        f"{dict(train_mesh.shape)}, inference mesh {dict(infer_mesh.shape)}"
    )
    fsdp_spec, tp_spec = mesh_lib.describe(fsdp_params), mesh_lib.describe(tp_params)
    print(f"  {'parameter':28s}{'shape':>12s}   {'fsdp()':22s}{'tensor_parallel()':22s}")
    for path in (
        "embed",
        "layers/0/attn/q_proj",
        "layers/0/attn/o_proj",
        "layers/0/mlp/down_proj",
        "layers/0/attn_norm/weight",
    ):
        shape = str(tuple(np.shape(flatten_tree(params)[path])))
        print(f"  {path:28s}{shape:>12s}   {fsdp_spec[path]:22s}{tp_spec[path]:22s}")
    total = sum(x.nbytes for x in flatten_tree(params).values())
    layouts = {
        "one device": {"cpu:0": total},
        "fsdp=2 x tensor=2": bytes_per_device(fsdp_params),
        "tensor=4": bytes_per_device(tp_params),
    }
    for name, held in layouts.items():
        print(
            f"  bytes per device, {name:18s} "
            + "  ".join(f"{v / 1e3:8.1f} KB" for v in held.values())
        )

    # Step 2: the same engine and trainer, sharded and not.
    print("\nStep 2. minirl's Engine on tensor=4 and Trainer on fsdp=2 x tensor=2, vs one device")
    one = generate(cfg, s, params)
    tp = generate(cfg, s, tp_params)
    batch_one = make_batch(one, pad_id=0, bucket_minimum=32)
    batch_tp = make_batch(tp, pad_id=0, bucket_minimum=32)
    ref = train_step(cfg, params, batch_tp)
    sharded = train_step(cfg, fsdp_params, batch_tp)
    update = update_difference(params, ref["params"], sharded["params"])
    result = {
        "devices": jax.device_count(),
        "layouts_bytes_per_device": layouts,
        "specs": {"fsdp": fsdp_spec, "tensor_parallel": tp_spec},
        "tokens_equal": all(
            np.array_equal(a.tokens, b.tokens) for a, b in zip(one, tp, strict=True)
        ),
        "tokens": sum(len(r.tokens) for r in one),
        "decode_max_abs_dlogp": max(
            max_diff(a.logprobs, b.logprobs) for a, b in zip(one, tp, strict=True)
        ),
        "recompute_max_abs_diff": max_diff(ref["prox"], sharded["prox"]),
        "loss": [ref["metrics"]["loss"], sharded["metrics"]["loss"]],
        "grad_norm": [ref["metrics"]["grad_norm"], sharded["metrics"]["grad_norm"]],
        "update_difference": update,
        "mismatch": {
            "one device engine vs one device trainer": mismatch_metrics(
                batch_one.behaviour_logprobs,
                train_step(cfg, params, batch_one)["prox"],
                batch_one.mask,
            ),
            "tensor=4 engine vs fsdp trainer": mismatch_metrics(
                batch_tp.behaviour_logprobs, sharded["prox"], batch_tp.mask
            ),
        },
    }
    print(
        f"  decode: {result['tokens']} tokens, same tokens sampled: {result['tokens_equal']}, "
        f"max |Δ log μ| {result['decode_max_abs_dlogp']:.1e}"
    )
    g = result["grad_norm"]
    print(
        f"  train:  recompute max |Δ| {result['recompute_max_abs_diff']:.1e}; grad norm "
        f"{g[0]:.7f} vs {g[1]:.7f} (relative Δ {abs(g[0] - g[1]) / g[0]:.1e})"
    )
    print(
        f"          the AdamW update (lr 1e-3): |Δ update| / |update| = {update['relative_l2']:.1e} "
        f"(L2); largest |Δ| of one weight {update['max_abs']:.1e}"
    )
    print("  training-inference mismatch, engine log μ vs trainer recompute:")
    for name, m in result["mismatch"].items():
        print(
            f"    {name:40s} mean {m['mean_abs_dlogp']:.1e}  p95 {m['p95_abs_dlogp']:.1e}  "
            f"max {m['max_abs_dlogp']:.1e}"
        )
    return result, batch_tp, sharded


# %% [markdown]
# Step 3: two processes, one job


# %%
def save_batch(batch: Batch, path: Path) -> None:
    fields = dataclasses.asdict(batch)
    np.savez(path, **{name: a for name, a in fields.items() if a is not None})  # routes: MoE only


# %%
def load_batch(path: Path) -> Batch:
    with np.load(path) as data:
        return Batch(**{f.name: data[f.name] for f in dataclasses.fields(Batch) if f.name in data})


# %%
def spmd_process(args) -> None:
    """One of the two processes of step 3 (this script with --process-id 0 or 1)."""
    mesh_lib.initialize(mesh_lib.DistributedConfig(args.coordinator, 2, args.process_id))
    from scale.tensorstore_weights import TensorStoreWeightStore

    s = FAST if args.fast else FULL
    cfg, work = s["model"], Path(args.work)
    train_mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(fsdp=2, tensor=2))  # spans both processes
    infer_mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(tensor=4))
    params = mesh_lib.place_params(host_params(cfg), train_mesh, mesh_lib.fsdp())
    step = train_step(cfg, params, load_batch(work / "batch.npz"))
    store = TensorStoreWeightStore(str(work / "weights"), keep=2)
    mesh_lib.publish(store, 1, step["params"])  # every process writes the shards it holds
    version, loaded = mesh_lib.load(
        store, 1, infer_mesh, mesh_lib.tensor_parallel()
    )  # its own slices only
    resharded = mesh_lib.place_params(step["params"], infer_mesh, mesh_lib.tensor_parallel())
    same = all(
        np.array_equal(np.asarray(a.data), np.asarray(b.data))
        for path, x in flatten_tree(loaded).items()
        for a, b in zip(
            x.addressable_shards, flatten_tree(resharded)[path].addressable_shards, strict=True
        )
    )
    out = {
        "process": jax.process_index(),
        "processes": jax.process_count(),
        "local_devices": [str(d) for d in jax.local_devices()],
        "global_devices": jax.device_count(),
        "loss": step["metrics"]["loss"],
        "grad_norm": step["metrics"]["grad_norm"],
        "prox": np.asarray(step["prox"]).tolist(),
        "loaded_equals_resharded": same,
        "bytes_written": store.stats["bytes_written"],
        "bytes_read": store.stats["bytes_read"],
        "versions": store.versions(),
    }
    mesh_lib.barrier("tutorial-11-done")
    (work / f"process{jax.process_index()}.json").write_text(json.dumps(out))


# %%
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# %%
def child_env(devices_flag: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["JAX_PLATFORMS"] = "cpu"
    return env


# %%
def step_two_processes(s: dict, fast: bool, batch: Batch, single: dict, work: Path) -> dict:
    print(
        "\nStep 3. two processes x 2 fake devices = one 4-device job (jax.distributed, 127.0.0.1)"
    )
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    save_batch(batch, work / "batch.npz")
    coordinator = f"127.0.0.1:{free_port()}"
    cmd = [sys.executable, __file__, "--work", str(work), "--coordinator", coordinator]
    cmd += ["--fast"] if fast else []
    procs = [
        subprocess.Popen(
            [*cmd, "--process-id", str(i)],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    for p, log in zip(procs, logs, strict=True):
        if p.returncode != 0:
            raise SystemExit(f"a process of the 2-process job failed:\n{log[-3000:]}")
    outs = [json.loads((work / f"process{i}.json").read_text()) for i in range(2)]
    param_bytes = sum(x.nbytes for x in flatten_tree(host_params(s["model"])).values())
    for o in outs:
        print(
            f"  process {o['process']} of {o['processes']}: local devices {o['local_devices']}, "
            f"global {o['global_devices']}; wrote {o['bytes_written'] / param_bytes:.0%} and "
            f"read {o['bytes_read'] / param_bytes:.0%} of the weights' bytes; loaded == "
            f"resharded: {o['loaded_equals_resharded']}"
        )
    result = {
        "processes": outs,
        "param_bytes": param_bytes,
        "loss_vs_one_process": [outs[0]["loss"], single["metrics"]["loss"]],
        "grad_norm_vs_one_process": [outs[0]["grad_norm"], single["metrics"]["grad_norm"]],
        "recompute_max_abs_diff_vs_one_process": max_diff(outs[0]["prox"], single["prox"]),
    }
    g = result["grad_norm_vs_one_process"]
    print(
        f"  the same step as step 2's fsdp trainer in one process: grad norm {g[0]:.7f} vs "
        f"{g[1]:.7f}, recompute max |Δ| "
        f"{result['recompute_max_abs_diff_vs_one_process']:.1e}"
    )
    from scale.tensorstore_weights import TensorStoreWeightStore

    store = TensorStoreWeightStore(str(work / "weights"))
    manifests = sorted(p.name for p in (work / "weights" / "manifests").iterdir())
    _, part = store.read_slices(1, {"embed": np.s_[0:2]})  # two rows, without the rest
    print(
        f"  the store: versions {store.versions()}, manifests {manifests}; "
        f"read_slices(1, embed[0:2]) -> shape {part['embed'].shape}"
    )
    result["store_versions"] = store.versions()
    return result


# %% [markdown]
# Step 4: the verifier as a service


# %%
class Service:
    """`python -m scale.verifier_service` in its own process group, on 127.0.0.1."""

    def __init__(self, repository: Path, port: int = 0):
        env = {**child_env(), "MINIRL_VERIFIER_TOKEN": TOKEN}
        cmd = [
            sys.executable,
            "-m",
            "scale.verifier_service",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--repository",
            str(repository),
            "--verifier",
            "code",
            "--workers",
            "1",
            "--item-timeout",
            "120",
        ]
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.url, _ = wait_for_output(self.proc, r"on (http://127\.0\.0\.1:\d+)", 600)
        self.port = int(self.url.rsplit(":", 1)[1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the service and its pool workers
        self.proc.wait(30)
        self.proc.stdout.close()


# %%
def code_rollouts(repo, problems: int, per_problem: int, pad: int) -> list[Rollout]:
    """Rollouts of an "add two numbers" task; each problem's tests carry `pad` bytes of input
    the programs ignore (stand-in for big test data)."""
    from minirl.verifiers import put_tests

    rollouts = []
    for p in range(problems):
        tests = put_tests(repo, [(f"{i} {p}\n" + "x" * pad + "\n", f"{i + p}\n") for i in range(2)])
        for k in range(per_problem):
            text = (ADD, WRONG)[k % 2]
            prompt = Prompt(
                uid=100 + p,
                task="code",
                text="",
                tokens=np.zeros(1, np.int32),
                meta={"tests": tests, "time_limit_s": TIME_LIMIT_S},
            )
            zeros = np.zeros(1, np.int32)
            rollouts.append(
                Rollout(prompt, k, zeros, np.zeros(1, np.float32), zeros, "eos", text=text)
            )
    return rollouts


# %%
def step_verifier_service(s: dict, work: Path) -> dict:
    from minirl.verifiers import CodeVerifier, TestRepository
    from scale.remote_verifier import ClientConfig, RemoteVerifier

    print("\nStep 4. the verifier as a service (python -m scale.verifier_service, 127.0.0.1)")
    shutil.rmtree(work, ignore_errors=True)
    local = TestRepository(work / "local")  # the client's copy of the test data
    rollouts = code_rollouts(local, problems=4, per_problem=4, pad=30_000)
    expected = CodeVerifier(local).score(rollouts)
    service = Service(work / "remote1")
    out: dict = {}
    try:
        sent = {}
        for by_value in (False, True):
            client = RemoteVerifier(
                service.url,
                TOKEN,
                repository=local,
                config=ClientConfig(by_value=by_value, max_items=4),
            )
            epochs = []
            for _ in range(2):
                before = client.stats["bytes_sent"]
                scores = client.score(rollouts)
                assert scores == expected, "remote scores differ from local scores"
                epochs.append(client.stats["bytes_sent"] - before)
            sent["by value" if by_value else "by reference"] = epochs
        test_bytes = sum(len(local.get(r.prompt.meta["tests"])) for r in rollouts[::4])
        out["bytes_sent_per_epoch"] = sent
        out["test_data_bytes"] = test_bytes
        out["remote_equals_local"] = True
        ref, val = sent["by reference"], sent["by value"]
        print(
            f"  {len(rollouts)} rollouts, 4 problems, {test_bytes / 1e3:.0f} KB of test data; "
            f"remote scores == local scores: True"
        )
        print(
            f"  bytes sent: by reference {ref[0] / 1e3:.1f} KB (epoch 1, with the one-time "
            f"upload), {ref[1] / 1e3:.1f} KB (epoch 2); by value {val[1] / 1e3:.1f} KB per epoch, "
            f"{val[1] / ref[1]:.0f}x more"
        )

        # Kill the service in the middle of a request; restart it on the same port, EMPTY.
        slow = [*rollouts[:2], dataclasses.replace(rollouts[2], text=SLOW), rollouts[3]]
        want = CodeVerifier(local).score(slow)
        # retries for up to ~10 minutes: a restart on a loaded machine is slow, never a loss
        config = ClientConfig(backoff_s=0.2, backoff_max_s=2.0, max_attempts=300, max_items=2)
        client = RemoteVerifier(service.url, TOKEN, repository=local, config=config)
        got: list = []
        worker = threading.Thread(target=lambda: got.extend(client.score(slow)))
        worker.start()
        # most often the slow program of the second request runs when the service dies; on a
        # busy machine the request may not have left yet: then it meets the dead port instead
        time.sleep(1.0)
        port = service.port
        service.kill()
        time.sleep(0.5)
        service = Service(work / "remote2", port=port)
        worker.join()  # the client gives up only after its ~10 minutes of retries
        out["restart"] = {
            "all_scored_as_locally": got == want,
            "retries": client.stats["retries"],
            "uploads": client.stats["uploads"],
            "unscored": client.stats["unscored"],
        }
        print(
            f"  service SIGKILLed mid-request and restarted empty: all {len(slow)} rollouts "
            f"scored as locally: {got == want}; retries {client.stats['retries']}, "
            f"uploads {client.stats['uploads']}, lost {client.stats['unscored']}"
        )
    finally:
        service.kill()
    return out


# %% [markdown]
# Step 5: the RLAX layout on Ray (python -m scale.launch ray --weights ...)


# %%
def step_launcher(work: Path) -> dict:
    print(
        "\nStep 5. the RLAX layout on a local Ray cluster: python -m scale.launch ray --weights ... "
        "(trainer job of 2 processes, engine job, verifier service)"
    )
    shutil.rmtree(work, ignore_errors=True)
    env = {**child_env(), "MINIRL_TOKEN": TOKEN}
    env.pop("RAY_ADDRESS", None)
    sets = [
        "--preset",
        "fixture",
        "--set",
        "rl.prompts_per_step=4",
        "--set",
        "rl.group_size=4",
        "--set",
        "engine.slots=16",
        "--set",
        "rl.steps=2",
    ]
    launch = [sys.executable, "-m", "scale.launch"]
    t0 = time.perf_counter()
    service = subprocess.Popen(
        [
            *launch,
            "verifier",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--workers",
            "1",
            "--verifier",
            "task:fixture",
            "--repository",
            str(work / "vdata"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        url = wait_for_output(service, r"on (http://127\.0\.0\.1:\d+)", 600)[0]
        run = subprocess.run(
            [
                *launch,
                "ray",
                *sets,
                "--weights",
                f"file://{work}/weights",
                "--trainer-hosts",
                "2",
                "--cpu-devices",
                "2",
                "--engine-mesh",
                "tensor=2",
                "--verifier-url",
                url,
                "--run-dir",
                str(work / "run"),
                "--quiet",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if run.returncode != 0:
            raise SystemExit(f"the run failed:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
        for line in run.stdout.splitlines():
            if line.startswith("step "):
                print("  controller: " + line)
        summary = json.loads((work / "run" / "summary.json").read_text())
        print(
            f"  weights published by the trainer job, by reference: versions {summary['weights']}; "
            f"verifier requests {summary['verifier']['requests']}, unscored "
            f"{summary['verifier']['unscored']} ({time.perf_counter() - t0:.0f} s)"
        )
        return summary
    finally:
        if service.poll() is None:
            os.killpg(service.pid, signal.SIGKILL)
        service.wait(30)
        service.stdout.close()


# %% [markdown]
# Step 6: throughput against the number of (fake) inference devices


# %%
def step_throughput(s: dict) -> dict:
    cfg = s["model"]
    params = host_params(cfg)
    s2 = {**s, "prompts": 8, "samples": 8, "new": s["throughput_tokens"]}
    print(
        "\nStep 6. engine decode tokens/s on a tensor-parallel mesh of 1, 2 and 4 fake devices "
        f"({s2['prompts'] * s2['samples']} requests x {s2['new']} tokens, best of 3)"
    )
    out = {}
    for n in (1, 2, 4):
        mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(tensor=n), devices=jax.devices()[:n])
        placed = mesh_lib.place_params(params, mesh, mesh_lib.tensor_parallel())
        engine = Engine(cfg, dataclasses.replace(engine_config(s2), slots=64), seed=SEED)
        engine.load_weights(0, placed)
        engine.generate(requests(s2, cfg.vocab_size))  # compile
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            tokens = sum(len(r.tokens) for r in engine.generate(requests(s2, cfg.vocab_size)))
            best = min(best, time.perf_counter() - t)
        out[n] = tokens / best
    for n, tps in out.items():
        print(
            f"  {n} device(s): {tps:8.0f} tokens/s   ({tps / out[1]:.2f}x one device; ideal {n}x)"
        )
    return out


# %%
def rel(pair) -> float:
    """Relative difference of two numbers that should agree."""
    return abs(pair[0] - pair[1]) / max(abs(pair[0]), 1e-12)


# %%
def plot(results: dict, path: Path) -> None:
    fig = Figure(figsize=(14, 4.3), layout="constrained")
    a, b, c = fig.subplots(1, 3)
    layouts = results["meshes"]["layouts_bytes_per_device"]
    for i, held in enumerate(layouts.values()):
        values = np.array(list(held.values())) / 1e3
        width = 0.8 / 4  # at most four devices per layout
        a.bar(i + (np.arange(len(values)) - (len(values) - 1) / 2) * width, values, width * 0.9)
    a.set_xticks(range(len(layouts)), list(layouts), fontsize=8)
    a.set_ylabel("parameter KB held per device")
    a.set_title("sharding splits the weights (one bar per device)", fontsize=10)
    sent = results["verifier"]["bytes_sent_per_epoch"]
    x = np.arange(2)
    for k, (name, epochs) in enumerate(sent.items()):
        b.bar(x + (k - 0.5) * 0.35, np.array(epochs) / 1e3, 0.35, label=name)
    b.set_xticks(x, ["epoch 1", "epoch 2"])
    b.set_ylabel("KB sent to the verifier service")
    b.set_title("test data by sha256 reference: sent once (RLAX §6.1)", fontsize=10)
    b.legend(fontsize=8)
    tps = {int(k): v for k, v in results["throughput"].items()}
    n = np.array(sorted(tps))
    c.plot(n, [tps[k] / tps[1] for k in n], "o-", label="measured (fake devices, 2 shared cores)")
    c.plot(n, n, "--", color="gray", label="ideal linear scaling (RLAX Fig. 3a: near-linear)")
    c.set_xticks(n)
    c.set_xlabel("inference devices (tensor=N)")
    c.set_ylabel("decode tokens/s relative to 1 device")
    c.set_title("throughput vs devices: does not scale on one CPU", fontsize=10)
    c.legend(fontsize=8)
    fig.suptitle("Scaling out in miniature: meshes, a weight store, a verifier service")
    fig.savefig(path, dpi=110)


# %%
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="a toy model, no launcher (CI)")
    parser.add_argument("--out", default="runs/tutorials/11_scaling_out")
    parser.add_argument("--process-id", type=int, help=argparse.SUPPRESS)  # step 3's processes
    parser.add_argument("--coordinator", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.process_id is not None:
        spmd_process(args)
        return
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    s = FAST if args.fast else FULL
    t0, load0 = time.perf_counter(), os.getloadavg()
    print(
        f"mode: {'fast' if args.fast else 'full'}   cores: {os.cpu_count()}   "
        f"load average: {load0[0]:.1f}   jax {jax.__version__}"
    )

    meshes, batch, sharded = step_meshes(s)
    processes = step_two_processes(s, args.fast, batch, sharded, out / "two_processes")
    verifier = step_verifier_service(s, out / "verifier")
    launcher = step_launcher(out / "launcher") if s["launcher"] else None
    throughput = step_throughput(s)

    claims = {
        "sharded_decode_samples_the_same_tokens": meshes["tokens_equal"],
        "sharded_logprobs_within_1e-5": meshes["decode_max_abs_dlogp"] < 1e-5
        and meshes["recompute_max_abs_diff"] < 1e-5,
        "fsdp_step_matches_one_device": rel(meshes["grad_norm"]) < 1e-5
        and meshes["update_difference"]["relative_l2"] < 1e-3,
        "two_processes_match_one_process": processes["recompute_max_abs_diff_vs_one_process"] < 1e-5
        and rel(processes["grad_norm_vs_one_process"]) < 1e-5,
        "each_process_wrote_part_of_the_weights": all(
            0 < p["bytes_written"] < processes["param_bytes"] for p in processes["processes"]
        ),
        "store_load_equals_reshard": all(
            p["loaded_equals_resharded"] for p in processes["processes"]
        ),
        "remote_scores_equal_local": verifier["remote_equals_local"],
        "by_reference_sends_less_after_epoch_1": verifier["bytes_sent_per_epoch"]["by reference"][1]
        < verifier["bytes_sent_per_epoch"]["by value"][1] / 5,
        "service_restart_loses_no_rollout": verifier["restart"]["all_scored_as_locally"]
        and verifier["restart"]["unscored"] == 0,
        "launcher_ran_two_steps": launcher is None or launcher["steps"] == 2,
    }
    print("\nThe claims, checked")
    for name, ok in claims.items():
        print(f"  {name:42s} {ok}")
    results = {
        "mode": "fast" if args.fast else "full",
        "model_params": s["model"].num_params(),
        "meshes": meshes,
        "two_processes": processes,
        "verifier": verifier,
        "launcher": launcher,
        "throughput": throughput,
        "claims": claims,
    }
    plot(results, out / "scaling_out.png")
    self_usage = resource.getrusage(resource.RUSAGE_SELF)
    child_usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    results.update(
        wall_s=time.perf_counter() - t0,
        cpu_s=sum(u.ru_utime + u.ru_stime for u in (self_usage, child_usage)),
        load_average=[load0, os.getloadavg()],
    )
    (out / "results.json").write_text(json.dumps(results, indent=1, default=float))
    print(f"\nwrote {out / 'scaling_out.png'} and {out / 'results.json'}")
    print(
        f"wall {results['wall_s']:.0f} s, CPU {results['cpu_s']:.0f} s (this process and its "
        f"children), load average {load0[0]:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    if not all(claims.values()):
        raise SystemExit(f"a claim of the lesson failed: {claims}")


# %%
if __name__ == "__main__":
    main()
