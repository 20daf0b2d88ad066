"""Plots of a run: read `run_dir/metrics.jsonl`, write PNGs to `run_dir/plots/` (`minirl plot`).

Each function draws only the keys the run actually logged, labels every line with its key, and
returns the path of the PNG it wrote. A missing or empty metrics file, or a run without the
keys a plot needs, gives a PNG that says so in words (and a warning) instead of an exception,
so `minirl plot` always leaves something to look at. Only a run directory that does not exist,
or one run given twice, is an error. Runs are labelled by directory name, or by path where two
names are one (runs/a/countdown, runs/b/countdown).

  dashboard.py  `plot_dashboard`    reward, pass@k, loss, ratio / correction, clipping, time split
                `plot_compare`      one metric of several runs against step or wall-clock time
                `time_shares`       each time part's share of the run's step time (overhead)
  mismatch.py   `plot_mismatch`     |Δ log p| with and without recomputation (RLAX Fig. 5), the
                                    engine-vs-recompute mismatch, one run or several
                `plot_zero_centred` A (c - 1) by advantage sign (VeXact Eq. 5, Fig. 5)
  lag.py        `plot_lag`          lag-bucket table + ratio tails by lag (PipelineRL Table 3)
                `lag_table`         the table's numbers
  common.py     finding keys and series, message PNGs, the panels' shared style

`plot_all(run_dir)` draws the four single-run plots. The metric names are listed in
docs/diagnostics.md.
"""

from __future__ import annotations

from pathlib import Path

from minirl.plots.common import series
from minirl.plots.dashboard import plot_compare, plot_dashboard, time_parts, time_shares
from minirl.plots.lag import lag_table, plot_lag
from minirl.plots.mismatch import plot_mismatch, plot_zero_centred

__all__ = [
    "lag_table",
    "plot_all",
    "plot_compare",
    "plot_dashboard",
    "plot_lag",
    "plot_mismatch",
    "plot_zero_centred",
    "series",
    "time_parts",
    "time_shares",
]


def plot_all(run_dir) -> list[Path]:
    """Dashboard, mismatch, lag and zero-centred plots of one run (what `minirl plot` draws)."""
    return [f(run_dir) for f in (plot_dashboard, plot_mismatch, plot_lag, plot_zero_centred)]
