"""`python -m scale.diagnose`: minirl's mismatch table plus RLAX's "divergent parallelism".

    python -m scale.diagnose --cpu-devices 4 --fast                    # fake CPU devices, CI size
    python -m scale.diagnose --cpu-devices 4 --sources recompute,exact,sharding
    python -m scale.diagnose --train-mesh fsdp=8 --engine-mesh tensor=8   # real devices

Takes every flag of `minirl diagnose` (minirl/diagnose/) and registers one more source,
"sharding", before running it. minirl never imports scale/: this module puts the source into
minirl's registry (`minirl.diagnose.register_source`), and `sharding_rows` can be registered
the same way by any other program.

The "sharding" rows score the table's rollouts with the trainer's recompute on an FSDP mesh
(weights split by `scale.mesh.fsdp()`, batch rows split over data x fsdp by `MeshRows`) and
with the engine's decode on a tensor-parallel mesh (`tensor_parallel()`: weights over "tensor",
each call's engine.slots rows over "data" by `MeshSlots`, no "fsdp"), the meshes RLAX uses, and
compare them with each other and with the same computations on one device:

  recompute on the train mesh vs one device     the trainer's layout alone
  decode on the engine mesh vs one device       the engine's layout alone
  divergent: engine-mesh decode vs train-mesh   both at once: what a sharded run's mismatch/*
             recompute                          holds beside the decode-vs-forward gap
  exact: the same, in exact mode                0: exact mode's fixed tree is cut at shard
                                                boundaries, each device adds its own subtree
                                                and no collective picks an order
                                                (minirl/modeling/exact.py)
`--fast` keeps the two "divergent" rows. A layout exact mode cannot make invariant (a weight
split 3 ways, say) is refused with a one-line error.

Fake CPU devices must be configured before JAX starts, hence --cpu-devices (the other rows run
on the first device, as they would without a mesh).
"""

from __future__ import annotations

import argparse
import functools
import sys


def sharding_rows(ctx, train_mesh: str = "fsdp=2,tensor=2", engine_mesh: str = "tensor=-1"):
    """The "sharding" rows of a `minirl.diagnose.Context` (see the module docstring). Mesh
    arguments are `MeshConfig.parse` strings over all devices of the job."""
    import jax

    from minirl.diagnose import Decode, Recompute
    from scale import mesh as mesh_lib
    from scale import slots as slots_lib

    if jax.device_count() < 2:
        raise ValueError(
            f"the sharding source needs >= 2 devices, JAX has {jax.device_count()}: "
            "python -m scale.diagnose --cpu-devices 4 fakes them on a CPU"
        )
    tmesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.parse(train_mesh))
    emesh = mesh_lib.make_mesh(mesh_lib.MeshConfig.parse(engine_mesh))
    t_name = "FSDP " + ",".join(f"{a}={n}" for a, n in tmesh.shape.items() if n > 1)
    e_name = "TP " + ",".join(f"{a}={n}" for a, n in emesh.shape.items() if n > 1)
    slots = slots_lib.MeshSlots(emesh, mesh_lib.tensor_parallel(), ctx.cfg.engine.slots)
    t_params = mesh_lib.place_params(ctx.params, tmesh, mesh_lib.fsdp())
    e_params = mesh_lib.place_params(ctx.params, emesh, mesh_lib.tensor_parallel())
    rows = mesh_lib.MeshRows(tmesh, mesh_lib.fsdp())
    d = ctx.base_dtype

    @functools.cache
    def recompute(exact: bool):  # [B, T] on the train mesh
        return ctx.compute(Recompute(d, exact), params=t_params, row_layout=rows)

    @functools.cache
    def decode(exact: bool):  # [B, T] on the engine mesh
        return ctx.compute(Decode(d, exact), params=e_params, row_layout=slots)

    out = []
    if not ctx.fast:  # each layout alone
        alone = (
            (f"recompute on {t_name}", recompute, Recompute(d)),
            (f"decode on {e_name}", decode, Decode(d)),
        )
        for name, sharded, one_device in alone:
            a, b = sharded(False), ctx.logprobs(one_device)
            out.append(ctx.compare_arrays("sharding", f"{name} vs one device", a, b))
    for exact, name in ((False, "divergent"), (True, "exact")):
        compares = f"{name}: decode on {e_name} vs recompute on {t_name}"
        row = ctx.compare_arrays("sharding", compares, decode(exact), recompute(exact), exact)
        out.append(row)
    return out


def register(train_mesh: str = "fsdp=2,tensor=2", engine_mesh: str = "tensor=-1") -> None:
    """Add "sharding" to minirl's mismatch table, with these meshes."""
    from minirl.diagnose import register_source

    fn = functools.partial(sharding_rows, train_mesh=train_mesh, engine_mesh=engine_mesh)
    register_source("sharding", fn)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--cpu-devices", type=int, default=0)
    if (n := early.parse_known_args(argv)[0].cpu_devices) > 0:
        from scale import use_cpu_devices

        use_cpu_devices(n)  # before anything imports JAX's backend

    from minirl.diagnose import add_diagnose_arguments, cmd_diagnose
    from minirl.diagnose.command import DESCRIPTION

    register()  # so that --help lists "sharding" among the sources
    p = argparse.ArgumentParser(
        prog="python -m scale.diagnose",
        description=DESCRIPTION + ' With the "sharding" source of scale/ (device meshes).',
    )
    add_diagnose_arguments(p)
    p.add_argument("--cpu-devices", type=int, default=0, help="fake N CPU devices (set first)")
    p.add_argument(
        "--train-mesh",
        default="fsdp=2,tensor=2",
        help="the trainer's mesh (-1: the devices left): fsdp=N splits the weights along the "
        "model width and the batch rows, tensor=N attention heads and MLP columns, data=N the "
        "batch rows only",
    )
    p.add_argument(
        "--engine-mesh",
        default="tensor=-1",
        help="the engine's mesh (-1: the devices left): tensor=N splits the weights, data=N the "
        "decode's rows (engine.slots a multiple of N); no fsdp",
    )
    args = p.parse_args(argv)
    register(args.train_mesh, args.engine_mesh)
    from minirl.configlib import ConfigError

    try:
        return cmd_diagnose(args)
    except (ConfigError, ValueError) as e:
        print(f"python -m scale.diagnose: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
