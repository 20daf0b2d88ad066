"""An RL run in RLAX's layout on fake CPU devices, in one process, run in a subprocess by
tests/scale/test_exact_layouts.py (fake devices must be configured before JAX starts).

    python tests/scale/exact_run.py RUN_DIR [--engine-mesh tensor=4] \
        [--trainer-mesh fsdp=2,tensor=2] [--devices 4] [--set key=value ...]

The roles of `python -m scale.launch ray --weights` (scale/roles.py) without Ray: the trainer on
an FSDP mesh publishing each version to a TensorStore store (file://RUN_DIR/weights), the engine
on a tensor-parallel mesh reading it into its own layout, both over the same devices of this
process; the step loop is `drive`'s, i.e. minirl/run/loop.py's (here rl.scheduler=async: the
rollout thread drives the engine while the trainer trains). Each step's metrics go to
RUN_DIR/metrics.jsonl as in any run; the test reads them.
"""

from __future__ import annotations

import argparse
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("run_dir")
parser.add_argument("--engine-mesh", default="tensor=4")
parser.add_argument("--trainer-mesh", default="fsdp=2,tensor=2")
parser.add_argument("--devices", type=int, default=4)
parser.add_argument("--set", action="append", default=[])
mine = parser.parse_args()

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={mine.devices}"
)
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from minirl.control.workers import InProcessWorker  # noqa: E402
from minirl.run.config_args import train_config_and_dir  # noqa: E402
from minirl.run.runner import Run  # noqa: E402
from minirl.run.starting_point import make_verifier  # noqa: E402
from scale import ray_run  # noqa: E402
from scale.roles import drive, engine_role, trainer_role  # noqa: E402

p = argparse.ArgumentParser()
ray_run.add_arguments(p)  # the flags `python -m scale.launch ray` takes
args = p.parse_args(
    ["--preset", "fixture", "--run-dir", mine.run_dir, "--quiet"]
    + [x for item in mine.set for x in ("--set", item)]
    + ["--weights", f"file://{os.path.abspath(mine.run_dir)}/weights"]
)
cfg, run_dir = train_config_and_dir(args)
run = Run(cfg, run_dir, log=lambda *a: print(*a, flush=True), progress=False)
role_args = dict(vars(args), run_dir=str(run_dir))
trainer = InProcessWorker(trainer_role(argparse.Namespace(**role_args, mesh=mine.trainer_mesh)))
engine = InProcessWorker(
    engine_role(argparse.Namespace(**role_args, mesh=mine.engine_mesh)), threaded=True
)
drive(argparse.Namespace(**role_args), run, engine, trainer, InProcessWorker(make_verifier(cfg)))
