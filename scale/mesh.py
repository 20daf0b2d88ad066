"""Device meshes and sharding rules: the one place where minirl's arrays meet devices.

minirl's core never mentions a mesh. Its trainer and engine are `jax.jit` functions over pure
parameter dicts, so they run sharded as they are: place the parameters on a mesh with
`NamedSharding`s and XLA's sharding propagation (GSPMD) partitions every step around them — the
same functions, the same numbers up to reduction order. This file decides where arrays go:

    initialize(DistributedConfig(...))            # jax.distributed, before any JAX work
    mesh = make_mesh(MeshConfig(fsdp=-1))         # axes ("data", "fsdp", "tensor")
    params = place_params(params, mesh, fsdp())   # ZeRO-3 style: weights split over "fsdp"
    cfg, params, _ = load_checkpoint(DIR, mesh, fsdp())   # a HF directory, each process its blocks
    trainer = Trainer(model_cfg, params, ..., row_layout=MeshRows(mesh, fsdp()))
    slots = MeshSlots(infer_mesh, tensor_parallel(), ecfg.slots)  # scale/slots.py: on "data"
    engine = Engine(model_cfg, ecfg, slot_layout=slots)
    engine.load_weights(v, place_params(trainer.params(), infer_mesh, tensor_parallel()))

The trainer's `row_layout` is its one door to devices: `MeshRows` splits each micro-batch's
rows over the rules' "batch" mesh axes (("data", "fsdp") for `fsdp()`), so the step is data
parallel as well as FSDP; results come back to the host gathered from every process. The
engine's is `slot_layout`: `MeshSlots` (scale/slots.py) splits its slots — the KV cache's rows
and every per-slot array of a decode — over "data" (`tensor_parallel()`), so each data replica
decodes its share of them.

Partition specs are written once, as LOGICAL axes (what a dimension means: "embed", "mlp",
"kv_heads", "batch", ...) in `PARAM_AXES` / `ACTIVATION_AXES`, and a `ShardingRules` maps
logical axes to mesh axes. Three rule sets cover the usual layouts:

    no_sharding()       every array replicated: single-device code, the default
    fsdp()              training: weights split along their model-width dim over "fsdp", heads
                        and MLP columns over "tensor"; batch rows over ("data", "fsdp")
    tensor_parallel()   inference (Megatron-style): attention heads, KV-cache heads and MLP
                        columns over "tensor"; batch rows over "data"

A dimension that its mesh axes do not divide evenly stays replicated. (Head dims are stored
flattened, H*Dh, so a split may cut inside a head; GSPMD then adds the communication a reshape
needs — correct, just slower: choose "tensor" to divide the number of KV heads.)

Trainer and engine may use different meshes and rules (RLAX runs training with FSDP and
inference with tensor parallelism). `place_params` reshards between them inside one job;
across jobs the weights travel through the TensorStore weight store: `publish` writes each
process's FSDP shards, `load` reads only the slices of the engine's own layout. An engine keeps
the JAX arrays it is given (docs/engine.md, "Memory between calls"): a copy made for it alone
(a reshard) is best made in its compute dtype, the token embedding excepted (as roles.py does).

Different shardings reduce in different orders, so in fast mode trainer and engine log-probs
drift apart — RLAX's "divergent parallelism" source of training-inference mismatch;
`python -m scale.diagnose` adds it to minirl's mismatch table (scale/diagnose.py). Exact mode
keeps its bits on any layout that splits each weight 1, 2, 4 or 8 ways (its fixed tree is cut at
shard boundaries: minirl/modeling/exact.py); `check_exact` refuses any other before a job starts.

Mixture-of-experts weights ([E, D, F] per projection) follow the same tables (`EXPERT_AXES`);
`expert_parallel(rules)` adds expert parallelism, the experts' axis over one of the mesh axes.

Simplified on purpose: a prefill runs whole on every data replica of an engine (each keeps its
own slots' rows), and a paged cache's block pool, shared by all slots, stays whole on each; no
pipeline parallelism; no mesh axis of its own for experts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from minirl.store.trees import flatten_tree

AXES = ("data", "fsdp", "tensor")

# -------------------------------------------------------------------------------------------
# What every dimension means (logical axes). THE place to add a new parameter or activation.

PARAM_AXES: dict[str, tuple[str, ...]] = {  # by the leaf's name (last path component)
    "embed": ("vocab", "embed"),  # [V, D]
    "lm_head": ("embed", "vocab"),  # [D, V]
    "q_proj": ("embed", "q_heads"),  # [D, H*Dh]
    "k_proj": ("embed", "kv_heads"),  # [D, K*Dh]
    "v_proj": ("embed", "kv_heads"),  # [D, K*Dh]
    "o_proj": ("q_heads", "embed"),  # [H*Dh, D]
    "q_bias": ("q_heads",),  # [H*Dh]
    "k_bias": ("kv_heads",),  # [K*Dh]
    "v_bias": ("kv_heads",),
    "gate_proj": ("embed", "mlp"),  # [D, F]
    "up_proj": ("embed", "mlp"),  # [D, F]
    "down_proj": ("mlp", "embed"),  # [F, D]
    "weight": ("norm",),  # RMSNorm scales [D] or [Dh]: always replicated
}
# An MoE layer's batched experts (minirl/modeling/moe.py), by leaf name when 3-D.
EXPERT_AXES: dict[str, tuple[str, ...]] = {
    "gate_proj": ("experts", "embed", "mlp"),  # [E, D, F]
    "up_proj": ("experts", "embed", "mlp"),  # [E, D, F]
    "down_proj": ("experts", "mlp", "embed"),  # [E, F, D]
}

ACTIVATION_AXES: dict[str, tuple[str, ...]] = {
    "tokens": ("batch", "seq"),  # [B, T] tokens, targets, mask, log-probs, versions
    "rows": ("batch",),  # [B] rewards, group ids
    "hidden": ("batch", "seq", "act_embed"),  # [B, T, D]
    "logits": ("batch", "seq", "vocab"),  # [B, T, V]
    "kv_cache": ("batch", "cache", "kv_heads", "head_dim"),  # [B, S, K, Dh]
    "kv_pool": ("pages", "page", "kv_heads", "head_dim"),  # [N, Bs, K, Dh] a paged cache's blocks
}


@dataclasses.dataclass(frozen=True)
class ShardingRules:
    """Logical axis -> mesh axis (a name, a tuple of names, or None = replicated)."""

    name: str
    rules: tuple[tuple[str, str | tuple[str, ...] | None], ...] = ()

    def __post_init__(self):
        for logical, mesh_axes in self.rules:
            for a in (mesh_axes,) if isinstance(mesh_axes, str) else (mesh_axes or ()):
                if a not in AXES:
                    raise ValueError(f"rule {logical!r} -> {a!r}: mesh axes are {AXES}")

    def mesh_axes(self, logical: str) -> tuple[str, ...]:
        target = dict(self.rules).get(logical)
        return (target,) if isinstance(target, str) else tuple(target or ())

    def spec(
        self, logical_axes: tuple[str, ...], shape: tuple[int, ...], mesh: Mesh
    ) -> PartitionSpec:
        """The PartitionSpec of an array with these logical axes and shape on `mesh`. A dim the
        mesh axes do not divide stays replicated; a mesh axis is used at most once."""
        if len(logical_axes) != len(shape):
            raise ValueError(f"logical axes {logical_axes} do not match shape {shape}")
        used: set[str] = set()
        out = []
        for logical, size in zip(logical_axes, shape, strict=True):
            axes = tuple(
                a for a in self.mesh_axes(logical) if a not in used and mesh.shape.get(a, 1) > 1
            )
            ways = math.prod(mesh.shape[a] for a in axes)
            if not axes or size % ways:
                out.append(None)
                continue
            used.update(axes)
            out.append(axes[0] if len(axes) == 1 else axes)
        return PartitionSpec(*out)


def expert_parallel(base: ShardingRules, axis: str = "fsdp") -> ShardingRules:
    """`base` plus expert parallelism: the experts' leading axis split over mesh `axis`, so each
    device holds E / n whole experts (the axis is then used by no other dim of those weights;
    GSPMD moves the tokens' activations to the experts). The router and the shared expert
    follow `base`."""
    return ShardingRules(f"{base.name}+experts", (("experts", axis), *base.rules))


def no_sharding() -> ShardingRules:
    """Every array replicated: what single-device code does without saying so."""
    return ShardingRules("none")


def fsdp() -> ShardingRules:
    """Training layout: weights split along D over "fsdp" (gathered by XLA where used), heads
    and MLP columns over "tensor"; batch rows over data x fsdp."""
    return ShardingRules(
        "fsdp",
        (
            ("batch", ("data", "fsdp")),
            ("embed", "fsdp"),
            ("q_heads", "tensor"),
            ("kv_heads", "tensor"),
            ("mlp", "tensor"),
        ),
    )


def tensor_parallel() -> ShardingRules:
    """Inference layout (Megatron): heads, KV-cache heads and MLP columns over "tensor" (so a
    decode step needs one all-reduce after attention and one after the MLP); rows over "data".
    Add ("vocab", "tensor") for large vocabularies."""
    return ShardingRules(
        "tensor_parallel",
        (("batch", "data"), ("q_heads", "tensor"), ("kv_heads", "tensor"), ("mlp", "tensor")),
    )


# -------------------------------------------------------------------------------------------
# Processes and meshes


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """How this process joins a multi-process JAX job. One process: nothing to do.
    `num_processes=-1` lets JAX detect the cluster (TPU pods, SLURM, ...)."""

    coordinator_address: str | None = None  # "host:port" of process 0
    num_processes: int = 1
    process_id: int = 0
    local_device_ids: tuple[int, ...] | None = None  # GPUs this process drives
    initialization_timeout_s: int = 300

    def __post_init__(self):
        if self.num_processes == 0 or self.num_processes < -1:
            raise ValueError(f"num_processes must be >= 1 or -1 (auto), got {self.num_processes}")
        if self.num_processes > 1 and not self.coordinator_address:
            raise ValueError("several processes need coordinator_address='host:port' of process 0")
        if self.num_processes > 0 and not 0 <= self.process_id < self.num_processes:
            raise ValueError(f"process_id {self.process_id} not in [0, {self.num_processes})")


def initialize(cfg: DistributedConfig = DistributedConfig()) -> None:
    """Start JAX's distributed runtime (call before any other JAX work). A no-op for one
    process, so single-host code can call it unconditionally."""
    if cfg.num_processes == 1:
        return
    if cfg.num_processes == -1:
        jax.distributed.initialize()
        return
    jax.distributed.initialize(
        coordinator_address=cfg.coordinator_address,
        num_processes=cfg.num_processes,
        process_id=cfg.process_id,
        local_device_ids=list(cfg.local_device_ids) if cfg.local_device_ids else None,
        initialization_timeout=cfg.initialization_timeout_s,
    )


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the mesh axes; one may be -1 = "all remaining devices"."""

    data: int = 1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self):
        sizes = (self.data, self.fsdp, self.tensor)
        if any(s == 0 or s < -1 for s in sizes) or sizes.count(-1) > 1:
            raise ValueError(f"mesh axis sizes must be >= 1, at most one -1 (fill), got {sizes}")

    @classmethod
    def parse(cls, text: str) -> MeshConfig:
        """ "fsdp=2,tensor=2" -> MeshConfig(fsdp=2, tensor=2); "" -> one device per axis."""
        sizes = {}
        for item in filter(None, (t.strip() for t in text.split(","))):
            name, _, value = item.partition("=")
            if name not in AXES or name in sizes or not value.lstrip("-").isdigit():
                raise ValueError(f"mesh {text!r}: expected axis=size items, each of {AXES} once")
            sizes[name] = int(value)
        return cls(**sizes)

    def shape(self, num_devices: int) -> tuple[int, int, int]:
        sizes = [self.data, self.fsdp, self.tensor]
        known = math.prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if num_devices % known:
                raise ValueError(
                    f"{num_devices} devices cannot fill a mesh with fixed axes {sizes}"
                )
            sizes[sizes.index(-1)] = num_devices // known
        if math.prod(sizes) != num_devices:
            raise ValueError(
                f"mesh {dict(zip(AXES, sizes, strict=True))} needs "
                f"{math.prod(sizes)} devices, got {num_devices}"
            )
        return tuple(sizes)  # type: ignore[return-value]


def make_mesh(cfg: MeshConfig, devices: Any = None) -> Mesh:
    """A ("data", "fsdp", "tensor") mesh over `devices` (default: every device of the job, in
    an order jax.make_mesh picks for the hardware's topology)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = cfg.shape(len(devices))
    # Auto axes: XLA propagates shardings through minirl's unannotated code (with Explicit
    # axes, jax's default in make_mesh, every reshape of a sharded dim would need annotating).
    auto = (jax.sharding.AxisType.Auto,) * len(AXES)
    return jax.make_mesh(shape, AXES, devices=devices, axis_types=auto)


# -------------------------------------------------------------------------------------------
# Parameter placement and row layouts


def param_axes(path: str, ndim: int) -> tuple[str, ...]:
    """Logical axes of the parameter at `path` ("layers/0/attn/q_proj"); unknown parameters
    (and shapes that do not match the table) are replicated."""
    name = path.rsplit("/", 1)[-1]
    axes = EXPERT_AXES.get(name) if ndim == 3 else PARAM_AXES.get(name)
    return axes if axes is not None and len(axes) == ndim else ("replicated",) * ndim


def param_sharding(
    path: str, shape: tuple[int, ...], mesh: Mesh, rules: ShardingRules
) -> NamedSharding:
    return NamedSharding(mesh, rules.spec(param_axes(path, len(shape)), tuple(shape), mesh))


def param_shardings(params: Any, mesh: Mesh, rules: ShardingRules) -> dict[str, NamedSharding]:
    """{leaf path: NamedSharding} for every array leaf of `params`."""
    return {
        path: param_sharding(path, np.shape(x), mesh, rules)
        for path, x in flatten_tree(params).items()
        if hasattr(x, "shape")
    }


def activation_sharding(
    kind: str, shape: tuple[int, ...], mesh: Mesh, rules: ShardingRules
) -> NamedSharding:
    if kind not in ACTIVATION_AXES:
        raise KeyError(f"unknown activation kind {kind!r}; known: {sorted(ACTIVATION_AXES)}")
    return NamedSharding(mesh, rules.spec(ACTIVATION_AXES[kind], tuple(shape), mesh))


def place(x: Any, sharding: NamedSharding) -> jax.Array:
    """Put one array on `sharding`. Host arrays (the same value on every process) are sliced
    per device; device arrays are resharded (within one process or across the whole job)."""
    if isinstance(x, jax.Array):
        if x.is_fully_addressable and jax.process_count() == 1:
            return jax.device_put(x, sharding)
        return jax.jit(lambda a: a, out_shardings=sharding)(x)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def place_params(params: Any, mesh: Mesh, rules: ShardingRules) -> Any:
    """`params` (a pure dict, host or device arrays) laid out on `mesh` by `rules`."""
    paths = list(flatten_tree(params))
    leaves, treedef = jax.tree_util.tree_flatten(params)
    placed = [
        place(x, param_sharding(p, np.shape(x), mesh, rules)) if hasattr(x, "shape") else x
        for p, x in zip(paths, leaves, strict=True)
    ]
    return jax.tree_util.tree_unflatten(treedef, placed)


def load_checkpoint(path: Any, mesh: Mesh, rules: ShardingRules, dtype: Any = None):
    """A Hugging Face checkpoint directory read straight into `rules`' layout on `mesh` ->
    (ModelConfig, params, bytes this process read). Every process reads only the blocks its own
    devices hold, each distinct block once (safetensors slices of the memory-mapped files,
    minirl/hf/model_files.py's `TensorSource.read`), so no host reads the whole model unless its devices
    hold all of it; the values equal `load_hf`'s."""
    from minirl.hf.model_files import build_params, open_checkpoint

    cfg, sources = open_checkpoint(path, dtype)
    dtype, bytes_read = np.dtype(cfg.storage_dtype), 0

    def sharded(where, source) -> jax.Array:
        blocks: dict[str, np.ndarray] = {}  # devices holding the same block share one read

        def block(index) -> np.ndarray:  # called once per device of this process
            nonlocal bytes_read
            if str(index) not in blocks:
                blocks[str(index)] = source.read(index).astype(dtype)
                bytes_read += blocks[str(index)].nbytes
            return blocks[str(index)]

        sharding = param_sharding("/".join(map(str, where)), source.shape, mesh, rules)
        return jax.make_array_from_callback(source.shape, sharding, block)

    params = build_params(cfg, sources, sharded)
    return cfg, params, bytes_read


def batch_sharding(shape: tuple[int, ...], mesh: Mesh, rules: ShardingRules) -> NamedSharding:
    """Rows (axis 0, logical "batch") split by `rules`; a second axis is "seq"; any further
    axes replicated. [B] and [B, T] arrays get the "rows" and "tokens" activation layouts."""
    logical = ("batch", "seq", *("replicated",) * (len(shape) - 2))[: len(shape)]
    return NamedSharding(mesh, rules.spec(logical, tuple(shape), mesh))


def place_batch(arrays: Mapping[str, np.ndarray], mesh: Mesh, rules: ShardingRules) -> dict:
    """Batch arrays ([B, T] and [B]) split by rows, for callers that feed jitted functions."""
    return {name: place(x, batch_sharding(np.shape(x), mesh, rules)) for name, x in arrays.items()}


def to_host(x: Any) -> np.ndarray:
    """A device array as a numpy copy, the whole array on every process (a collective when the
    array spans processes: every process of the job must call it)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.array(x, copy=True)


class MeshRows:
    """A `minirl.training.trainer.Trainer` row layout (minirl/training/row_layout.py): each micro-batch's rows
    split over `rules`' batch axes on `mesh` (with `fsdp()`: data x fsdp, so the trainer is data
    parallel); results come back as whole numpy arrays on every process.

        trainer = Trainer(cfg, place_params(p, mesh, fsdp()), obj, tcfg,
                          row_layout=MeshRows(mesh, fsdp()))

    A row count the batch axes do not divide stays replicated (micro-batches have power-of-two
    row counts, so with power-of-two meshes only micro-batches smaller than the axes are)."""

    def __init__(self, mesh: Mesh, rules: ShardingRules):
        self.mesh, self.rules = mesh, rules

    def rows(self, x: np.ndarray) -> jax.Array:
        return place(x, batch_sharding(np.shape(x), self.mesh, self.rules))

    def host(self, tree: Any) -> Any:
        return jax.tree.map(to_host, tree)


def check_exact(model_cfg: Any, mesh_cfg: MeshConfig, devices: int, rules: ShardingRules) -> None:
    """ValueError (one line) if exact mode cannot keep its bits with `model_cfg`'s weights laid
    out by `rules` on a `mesh_cfg` mesh of `devices` devices (minirl.modeling.exact's
    `check_layout`: every weight split 1, 2, 4 or 8 ways). Nothing is placed: what a launcher
    checks before it starts any job."""
    from minirl.modeling.exact import check_layout
    from minirl.modeling.model import param_shapes

    sizes = dict(zip(AXES, mesh_cfg.shape(devices), strict=True))
    planned = {}
    for path, leaf in flatten_tree(param_shapes(model_cfg)).items():
        spec = rules.spec(param_axes(path, len(leaf.shape)), tuple(leaf.shape), _Sizes(sizes))
        axes = [(e,) if isinstance(e, str) else e or () for e in spec]  # mesh axes per dim
        ways = [math.prod(sizes[a] for a in dim) for dim in axes]
        shard = tuple(-(-d // n) for d, n in zip(leaf.shape, ways, strict=True))
        planned[path] = _Planned(leaf.shape, shard)
    axes = ",".join(f"{a}={n}" for a, n in sizes.items() if n > 1)
    check_layout(planned, f"exact mode on the {rules.name} mesh {axes}")


@dataclasses.dataclass(frozen=True)
class _Sizes:
    """A mesh's axis sizes: all that `ShardingRules.spec` reads of a mesh."""

    shape: dict


class _Planned:
    """A weight's shape and the shard shape a layout would give it: all check_layout reads of
    an array and of its sharding."""

    def __init__(self, shape, shard):
        self.shape, self.sharding, self._shard = shape, self, shard

    def shard_shape(self, shape) -> tuple:
        return self._shard


def describe(params: Any) -> dict[str, str]:
    """{leaf path: "P('fsdp', None)"} — for logs and tests."""
    return {
        p: str(x.sharding.spec) if isinstance(x.sharding, NamedSharding) else str(x.sharding)
        for p, x in flatten_tree(params).items()
        if isinstance(x, jax.Array)
    }


# -------------------------------------------------------------------------------------------
# Weights between jobs: publish from the trainer's layout, load in the engine's layout


def barrier(name: str) -> None:
    """Wait until every process of the job reaches `name` (no-op for one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def publish(store: Any, version: int, params: Any) -> None:
    """Every process of the trainer job calls this (SPMD): process 0 begins the version, all
    write the shards they hold, process 0 commits once all are written. `store` is a
    scale.tensorstore_weights.TensorStoreWeightStore on storage every process can reach."""
    primary = jax.process_index() == 0
    if primary:
        store.begin(version)
    barrier(f"minirl-publish-begin-{version}")
    store.write(version, params, primary=primary)
    barrier(f"minirl-publish-written-{version}")
    if primary:
        store.commit(version, params)
    barrier(f"minirl-publish-committed-{version}")


def load(store: Any, version: int | None, mesh: Mesh, rules: ShardingRules) -> tuple[int, Any]:
    """(version, params) read from `store` straight into the layout `rules` give on `mesh`:
    each process reads only the slices its devices hold."""
    return store.get_sharded(version, lambda path, shape: param_sharding(path, shape, mesh, rules))
