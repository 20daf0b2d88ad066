"""Plots (minirl/plots/) from synthetic metrics.jsonl files: PNGs are written, missing keys and
empty files give a message PNG and a warning, and the lag table's numbers are the right ones."""

import math

import numpy as np
import pytest

from minirl.measure.diagnostics import (
    lag_buckets,
    mismatch_metrics,
    snis_baseline_proxy,
    zero_centred_contributions,
)
from minirl.measure.metrics_log import MetricsWriter, read_metrics
from minirl.plots import (
    lag_table,
    plot_all,
    plot_compare,
    plot_dashboard,
    plot_lag,
    plot_mismatch,
    plot_zero_centred,
    series,
    time_shares,
)

PNG = b"\x89PNG\r\n\x1a\n"
STEPS, B, T = 12, 8, 16


def _is_png(path) -> bool:
    return path.exists() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG


def _write_run(run_dir, seed: int, noise: float, steps: int = STEPS):
    """A run with every key family the controller logs, from the real diagnostics."""
    rng = np.random.default_rng(np.random.SeedSequence([seed]))
    with MetricsWriter(run_dir, clock=iter(range(0, 1000 * steps, 1000)).__next__) as w:
        for step in range(steps):
            behav = rng.normal(-1.0, 0.3, (B, T))
            prox = behav + rng.normal(0.0, noise, (B, T))
            mask = (rng.random((B, T)) < 0.8).astype(np.float32)
            lag = rng.integers(0, 60, (B, T))
            rewards = (rng.random(B) < 0.5).astype(np.float64)
            adv = rewards - 0.5
            log_ratio = prox - behav
            w.write(
                {
                    "reward": {"mean": rewards.mean(), "std": rewards.std()},
                    "eval": {"pass@1": 0.1 * step, "pass@4": 0.2 * step},
                    "train": {
                        "loss": 1.0 / (step + 1),
                        "clip_fraction": 0.01 * step,
                        "ratio_mean": 1.0,
                        "ratio_max": 1.5 + step,
                        "correction_p95": 1.1,
                        # RLAX Fig. 5 (minirl/training/trainer.py): first update vs prox and vs mu
                        "dlogp_recompute": {"mean_abs_dlogp": 1e-7 * (step + 1)},
                        "dlogp_no_recompute": {"mean_abs_dlogp": noise * (step + 1)},
                    },
                    "time": {"generate": 2.0, "verify": 0.5, "train": 1.0, "step": 4.0},
                    "memory": {"peak_rss_gb": 0.5 + 0.01 * step},
                    "mismatch": mismatch_metrics(behav, prox, mask),
                    "mismatch_plain": mismatch_metrics(behav, prox + noise, mask),
                    "lag": lag_buckets(log_ratio, lag, mask),
                    "snis": snis_baseline_proxy(rewards, log_ratio, mask, np.arange(B) // 4, lag),
                    "zero_centred": zero_centred_contributions(adv, np.exp(log_ratio), mask),
                },
                step=step,
            )
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return _write_run(root / "exact", 0, 1e-3), _write_run(root / "plain", 1, 3e-2)


@pytest.mark.parametrize("plot", [plot_dashboard, plot_mismatch, plot_lag, plot_zero_centred])
def test_each_plot_writes_a_png(runs, plot, recwarn):
    path = plot(runs[0])
    assert path.parent == runs[0] / "plots" and _is_png(path)
    assert not [w for w in recwarn if "matplotlib" not in str(w.filename)]  # no "missing" warning


def test_the_dashboard_has_a_panel_per_key_family(runs):
    from minirl.plots.dashboard import dashboard_panels

    panels = {
        title.split(" ")[0]: found for title, found, _ in dashboard_panels(read_metrics(runs[0]))
    }
    assert panels["reward"] == ["reward/mean"] and panels["loss"] == ["train/loss"]
    assert panels["peak"] == ["memory/peak_rss_gb"]  # the run's peak RSS (minirl/run/memory.py)


def test_plot_mismatch_and_compare_several_runs(runs, tmp_path):
    path = plot_mismatch(list(runs), labels=["exact", "plain"], out=tmp_path / "m.png")
    assert path == tmp_path / "m.png" and _is_png(path)
    for x in ("step", "time"):
        p = plot_compare(runs, x=x, y="reward/mean", labels=["a", "b"])
        assert p == runs[0].parent / f"compare_reward_mean_{x}.png" and _is_png(p)
    assert [p.name for p in plot_all(runs[1])] == [
        "dashboard.png",
        "mismatch.png",
        "lag.png",
        "zero_centred.png",
    ]


def test_plot_mismatch_finds_the_fig5_series_and_the_other_families(runs):
    from minirl.plots.mismatch import _families

    fig5, other = _families(list(runs), ["exact", "plain"])
    assert [(label, prefix) for label, _, prefix, _, _ in fig5] == [
        (run, f"train/dlogp_{kind}")
        for run in ("exact", "plain")
        for kind in ("no_recompute", "recompute")
    ]
    assert [label for label, _, _ in other] == [
        "exact",
        "exact mismatch_plain",
        "plain",
        "plain mismatch_plain",
    ]


def test_p95_over_steps_is_rlax_summary():
    from minirl.plots.common import p95_over_steps

    # numpy's linear interpolation over the finite values 1..5: rank 0.95 * 4 = 3.8 -> 4.8
    assert p95_over_steps(np.array([5.0, math.nan, 1.0, 3.0, 2.0, 4.0])) == pytest.approx(4.8)
    assert math.isnan(p95_over_steps(np.array([math.nan])))


def test_empty_and_keyless_runs_get_a_message_png(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("")
    for plot in (plot_dashboard, plot_mismatch, plot_lag, plot_zero_centred):
        with pytest.warns(UserWarning, match="no records|no '<prefix>"):
            assert _is_png(plot(empty))
    keyless = tmp_path / "keyless"
    with MetricsWriter(keyless) as w:
        w.write({"something": 1.0}, step=0)
    with pytest.warns(UserWarning, match="none of the dashboard keys"):
        assert _is_png(plot_dashboard(keyless))
    with pytest.warns(UserWarning, match="lag/<bucket>"):
        assert _is_png(plot_lag(keyless))
    with pytest.warns(UserWarning, match="zero_centred"):
        assert _is_png(plot_zero_centred(keyless))
    with pytest.warns(UserWarning, match="no run has values for 'reward/mean'"):
        assert _is_png(plot_compare([empty, keyless], x="time"))


def test_bad_arguments_are_clear_errors(runs, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        plot_dashboard(tmp_path / "missing")
    with pytest.raises(ValueError, match="'step' or 'time'"):
        plot_compare(runs, x="epoch")
    with pytest.raises(ValueError, match="labels"):
        plot_compare(runs, labels=["only one"])


def test_series_skips_absent_keys_and_reads_null_as_nan(tmp_path):
    with MetricsWriter(tmp_path, clock=iter([10.0, 12.0, 15.0]).__next__) as w:
        w.write({"a": 1.0}, step=5)
        w.write({"b": 2.0}, step=6)
        w.write({"a": math.nan}, step=7)
    from minirl.measure.metrics_log import read_metrics

    recs = read_metrics(tmp_path)
    xs, ys = series(recs, "a")
    assert list(xs) == [5, 7] and ys[0] == 1.0 and math.isnan(ys[1])
    xs, _ = series(recs, "a", x="time")
    assert list(xs) == [0.0, 5.0]  # seconds since the first record


def test_time_shares_hand_computed():
    """The dashboard's step-time shares: the run's sums, "other" derived when not logged."""
    logged = [
        {
            "time/generate": 2.0,
            "time/verify": 0.5,
            "time/train": 1.0,
            "time/other": 0.5,
            "time/step": 4.0,
        },
        {
            "time/generate": 4.0,
            "time/verify": 0.5,
            "time/train": 1.0,
            "time/other": 0.5,
            "time/step": 6.0,
        },
    ]
    shares = time_shares(logged)
    assert shares == pytest.approx({"generate": 0.6, "verify": 0.1, "train": 0.2, "other": 0.1})
    derived = [{k: v for k, v in r.items() if k != "time/other"} for r in logged]
    assert time_shares(derived) == pytest.approx(shares)
    assert time_shares([{"reward/mean": 1.0}]) == {}


def test_lag_table_hand_computed():
    records = [
        {
            "step": 0,
            "lag/[0,1)/tokens": 10,
            "lag/[0,1)/max_rho": 1.2,
            "lag/[0,1)/mean_rho": 1.0,
            "lag/[0,1)/kl_k3": 1e-4,
            "lag/[0,1)/p_rho_gt_2": 0.0,
            "lag/[8,20)/tokens": 1,
            "lag/[8,20)/max_rho": 3.0,
            "lag/[8,20)/mean_rho": 1.1,
            "lag/[8,20)/kl_k3": 5e-3,
            "lag/[8,20)/p_rho_gt_2": 1.0,
            "snis/[8,20)/groups": 1,
            "snis/[8,20)/rmse_gap": 0.3,
        },
        {
            "step": 1,
            "lag/[0,1)/tokens": 30,
            "lag/[0,1)/max_rho": 1.6,
            "lag/[0,1)/mean_rho": 0.9,
            "lag/[0,1)/kl_k3": 2e-4,
            "lag/[0,1)/p_rho_gt_2": 0.1,
            "snis/[0,1)/groups": 3,
            "snis/[0,1)/rmse_gap": 0.2,
        },
        {
            "step": 2,
            "lag/[0,1)/tokens": 10,
            "lag/[0,1)/max_rho": 1.4,
            "lag/[0,1)/mean_rho": 1.2,
            "lag/[0,1)/kl_k3": None,
            "lag/[0,1)/p_rho_gt_2": 0.0,
            "snis/[0,1)/groups": 1,
            "snis/[0,1)/rmse_gap": 0.4,
        },
    ]
    rows = lag_table(records)
    assert [r["bucket"] for r in rows] == ["[0,1)", "[8,20)"]  # sorted by lag
    r0 = rows[0]
    assert (r0["steps"], r0["tokens"]) == (3, 50)
    assert r0["median_max_rho"] == pytest.approx(1.4)
    # p95 of (1.2, 1.4, 1.6): rank 0.95 * 2 = 1.9 -> 1.4 + 0.9 * 0.2 = 1.58
    assert r0["p95_max_rho"] == pytest.approx(1.58) and r0["max_rho"] == 1.6
    assert r0["median_mean_rho"] == pytest.approx(1.0)
    # token-weighted P(rho > 2): (10 * 0 + 30 * 0.1 + 10 * 0) / 50 = 0.06
    assert r0["p_rho_gt_2"] == pytest.approx(0.06)
    assert math.isnan(r0["kl_k3"])  # one step logged null: not silently re-weighted
    # baseline RMSE pooled over groups: sqrt((3 * 0.2^2 + 1 * 0.4^2) / 4) = sqrt(0.07)
    assert r0["groups"] == 4 and r0["baseline_rmse"] == pytest.approx(math.sqrt(0.07))
    r1 = rows[1]
    assert (r1["steps"], r1["max_rho"], r1["kl_k3"], r1["baseline_rmse"]) == (1, 3.0, 5e-3, 0.3)


def test_format_table_aligns_formats_and_marks_missing_values():
    from minirl.measure.metrics_log import format_table

    rows = [{"name": "a", "x": 0.5, "n": 3}, {"name": "longer", "x": math.nan, "n": None}]
    columns = (("run", "name", "{}"), ("x", "x", "{:.2f}"), ("count", "n", "{:d}"))
    assert format_table(rows, columns).splitlines() == [
        "run        x  count",  # columns as wide as their widest cell, two spaces apart
        "-------------------",
        "a       0.50      3",  # text left-aligned, numbers right-aligned
        "longer     –      –",  # nan and None: a dash
    ]


def test_an_exact_run_with_every_ratio_one_and_every_tail_zero_plots(tmp_path):
    """Exact mode logs log-ratios of exactly 0: every ratio 1, every lag tail and KL 0. The log
    axes of those panels have nothing positive to show; each plot must still draw (it raised
    "Data cannot be log-scaled" at the end of an exact `minirl train`)."""
    zeros = np.zeros((B, T))
    mask = np.ones((B, T), np.float32)
    with MetricsWriter(tmp_path, clock=iter(range(0, 3000, 1000)).__next__) as w:
        for step in range(3):
            w.write(
                {
                    "reward": {"mean": 0.5},
                    "train": {"loss": 0.1, "ratio_mean": 1.0, "ratio_max": 1.0},
                    "mismatch": mismatch_metrics(zeros - 1.0, zeros - 1.0, mask),
                    "lag": lag_buckets(zeros, np.zeros((B, T), np.int64), mask),
                },
                step=step,
            )
    rows = lag_table(read_metrics(tmp_path))
    assert rows and all(r["p_rho_gt_2"] == 0.0 and r["kl_k3"] == 0.0 for r in rows)
    for path in plot_all(tmp_path):
        assert _is_png(path)


def test_runs_of_one_name_keep_a_curve_each(runs, tmp_path, monkeypatch):
    """`minirl plot a/countdown b/countdown` (runs/<task> is the default run directory): the
    curves were keyed by directory name, so the second hid the first (and two empty runs of one
    name raised max() of an empty sequence). Now the paths label them; one run twice is refused."""
    from matplotlib.figure import Figure

    a, b = _write_run(tmp_path / "a" / "run", 0, 1e-3), _write_run(tmp_path / "b" / "run", 1, 3e-2)
    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: drawn.append(fig))
    plot_compare([a, b], out=tmp_path / "c.png")
    assert [line.get_label() for line in drawn[0].axes[0].get_lines()] == [str(a), str(b)]
    (tmp_path / "x" / "empty").mkdir(parents=True)
    (tmp_path / "y" / "empty").mkdir(parents=True)
    with pytest.warns(UserWarning, match="no run has values"):
        plot_compare([tmp_path / "x" / "empty", tmp_path / "y" / "empty"])
    with pytest.raises(ValueError, match=f"{a} given twice"):
        plot_compare([a, a])
    with pytest.raises(ValueError, match="same given twice"):
        plot_mismatch([a, b], labels=["same", "same"])


def test_a_step_that_is_not_a_number_and_an_out_without_a_suffix(tmp_path):
    """A metrics line with "step": "x" (written by hand or by another program) stopped the
    dashboard with `could not convert string to float`, and with it `minirl train` after a
    finished run; such a record now sits at its index. `--out cmp` printed "cmp" while matplotlib
    wrote cmp.png."""
    run = _write_run(tmp_path / "run", 0, 1e-3, steps=3)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": "x", "time/step": 1.0}\n')
    assert _is_png(plot_dashboard(run))
    assert series(read_metrics(run), "time/step")[0].tolist() == [0.0, 1.0, 2.0, 3.0]
    out = plot_compare([run], out=tmp_path / "cmp")
    assert out == tmp_path / "cmp.png" and _is_png(out)
