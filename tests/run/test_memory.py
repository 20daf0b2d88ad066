"""memory/peak_rss_gb (minirl/run/memory.py): the peak of this process's own memory, not of the
process that started it; and the memory a run may use, a container's limit included."""

import os
import subprocess
import sys

import numpy as np

from minirl.run.memory import machine_memory_bytes, peak_rss_gb


def test_a_child_process_does_not_inherit_its_parents_peak():
    """On Linux getrusage's ru_maxrss carries the parent's peak across fork and exec: a small
    run started from a big driver reported the driver's size. Here the parent touches 1 GB and
    then starts a child that holds a few tens of MB."""
    held = np.ones(125_000_000)  # 1 GB, every page touched
    assert peak_rss_gb() >= 1.0  # the parent's own peak counts it
    code = "from minirl.run.memory import peak_rss_gb; print(peak_rss_gb())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    child = float(out.stdout)
    del held
    assert 0.005 < child < 0.5, child


def test_a_containers_memory_limit_is_the_memory_a_run_may_use(tmp_path):
    """A step's batch is checked against this (run/loop.py check_batch): in a container of 2 GB
    on a machine of more, 2 GB; no limit set ("max", cgroup v2; a huge number, v1) or no cgroup
    file: the machine's physical memory."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit, unset, v1 = tmp_path / "limit", tmp_path / "unset", tmp_path / "v1"
    limit.write_text("2000000000\n")
    unset.write_text("max\n")
    v1.write_text("9223372036854771712\n")
    assert machine_memory_bytes([str(limit)]) == min(2_000_000_000, physical)
    assert machine_memory_bytes([str(unset), str(limit)]) == min(2_000_000_000, physical)
    assert machine_memory_bytes([str(v1)]) == physical
    assert machine_memory_bytes([str(tmp_path / "none")]) == physical
