"""The engine's slots over a mesh's "data" axis (scale.slots.MeshSlots, what the launcher's engine
role uses): on 4 fake CPU devices in a subprocess (tests/scale/engine_slots_run.py; the devices
are configured before JAX starts), and `check_slots`' one-line refusals in-process.

What must hold, against an engine on one device given the same requests (single-turn requests
reusing slots, two-turn episodes continuing their cache):
- the KV cache in flight is split by rows over "data": each device holds 4 of the 8 slots' rows
  (and, on data=2,tensor=2, 1 of the 2 KV heads); a paged cache's block pool stays whole on
  each data replica while its slots' lengths are split
- exact mode: tokens and behaviour log-probs bitwise equal on data=2 and data=2,tensor=2; fast
  mode: the same tokens, log-probs within 1e-5 (measured: equal on data=2, 1.9e-6 on
  data=2,tensor=2, whose tensor split adds its partial sums in its own order)
- each compiled function compiles as many times as on one device (the cache it returns has the
  layout it was given, so nothing compiles twice)
- the engine role refuses an "fsdp" axis in one line, and builds its engine with MeshSlots

~1 min cold on a loaded 2-core machine, ~10 s warm (exact mode, contiguous cache); fast mode
and the paged cache in the slow lane.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scale import mesh as mesh_lib
from scale import slots as slots_lib

HERE = Path(__file__).parent
TIMEOUT = 900  # seconds: cold compiles on a loaded 2-core machine


def _run(tmp_path, settings: list[str]) -> dict:
    out = tmp_path / "slots.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(HERE.parents[1]))
    cmd = [sys.executable, str(HERE / "engine_slots_run.py"), str(out)]
    cmd += [x for s in settings for x in ("--setting", s)]
    cmd += ["--layout", "data=2", "--layout", "data=2,tensor=2"]
    done = subprocess.run(cmd, env=env, capture_output=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return json.loads(out.read_text())


# The in-flight cache's keys by (cache, layout): spec, and the part of it one device holds.
# Contiguous [B, S, K, Dh]: 4 of the 8 slots' rows on each device (and 1 of the 2 KV heads on
# data=2,tensor=2). Paged [N, Bs, K, Dh]: the block pool all slots share, whole on each replica.
KEYS = {
    ("contiguous", "data=2"): {"spec": "P('data',)", "local": [4, 48, 2, 8]},
    ("contiguous", "data=2,tensor=2"): {
        "spec": "P('data', None, 'tensor')",
        "local": [4, 48, 1, 8],
    },
    ("paged", "data=2"): {"spec": "P()", "local": [25, 16, 2, 8]},
    ("paged", "data=2,tensor=2"): {"spec": "P(None, None, 'tensor')", "local": [25, 16, 1, 8]},
}


def _check(r: dict, setting: str) -> None:
    row, (mode, cache) = r["settings"][setting], setting.split()
    for layout in ("data=2", "data=2,tensor=2"):
        got = row[layout]
        assert got["tokens"] > 200 and got["tokens_equal"], (setting, layout, got)
        if mode == "exact":
            assert got["logprobs_equal"] and got["max_dlogp"] == 0.0, (setting, layout, got)
        else:
            assert got["max_dlogp"] < 1e-5, (setting, layout, got)
        assert got["cache"]["k"] == KEYS[cache, layout], (setting, layout, got["cache"])
        assert got["cache"]["lengths"] == {"spec": "P('data',)", "local": [4]}, got["cache"]
        assert got["compiled"] == row["one"]["compiled"], (setting, layout, row)


def test_slots_split_over_data_and_generate_what_one_device_does(tmp_path):
    r = _run(tmp_path, ["exact contiguous"])
    _check(r, "exact contiguous")
    assert r["fsdp_refused"].startswith("engine mesh fsdp=2: the engine splits its weights over")
    assert r["role"] == {"slots": "MeshSlots", "mesh": {"data": 2, "fsdp": 1, "tensor": 2}}


@pytest.mark.slow  # ~2 min cold: fast mode, and both modes with the paged cache
def test_fast_mode_and_a_paged_cache_split_their_slots_over_data(tmp_path):
    r = _run(tmp_path, ["fast contiguous", "exact paged", "fast paged"])
    for setting in ("fast contiguous", "exact paged", "fast paged"):
        _check(r, setting)


class FakeMesh:
    """Just the `.shape` check_slots reads."""

    def __init__(self, **shape):
        self.shape = {"data": 1, "fsdp": 1, "tensor": 1, **shape}


def test_an_axis_the_engine_would_not_use_or_slots_that_do_not_split_are_refused():
    tp = mesh_lib.tensor_parallel()
    for sizes in ({"tensor": 8}, {"data": 4}, {"data": 2, "tensor": 2}, {"data": -1}):
        slots_lib.check_slots({"fsdp": 1, **sizes}, tp, 8)  # accepted (-1: not known yet)
    with pytest.raises(ValueError, match=r"^engine mesh fsdp=2: the engine splits its weights "):
        slots_lib.check_slots({"data": 1, "fsdp": 2, "tensor": 2}, tp, 8)
    with pytest.raises(ValueError, match=r"engine mesh fsdp=-1: .*--engines N"):
        slots_lib.check_slots({"data": 1, "fsdp": -1, "tensor": 1}, tp, 8)
    with pytest.raises(ValueError, match=r"engine.slots=6 cannot be split over 4 data replicas"):
        slots_lib.MeshSlots(FakeMesh(data=4), tp, 6)
    experts = mesh_lib.expert_parallel(tp, "fsdp")  # an axis the rules use is fine
    slots_lib.check_slots({"data": 2, "fsdp": 2, "tensor": 1}, experts, 8)
