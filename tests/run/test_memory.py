"""memory/peak_rss_gb (minirl/run/memory.py): the peak of this process's own memory, not of the
process that started it."""

import subprocess
import sys

import numpy as np

from minirl.run.memory import peak_rss_gb


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
