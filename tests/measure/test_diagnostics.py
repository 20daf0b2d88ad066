"""Diagnostics (minirl/measure/diagnostics.py) on hand-computed inputs; the arithmetic is in comments."""

import json
import math

import numpy as np
import pytest

from minirl.measure.diagnostics import (
    LAG_EDGES,
    batch_diagnostics,
    bucket_labels,
    group_baselines,
    lag_buckets,
    mismatch_metrics,
    snis_baseline_proxy,
    zero_centred_contributions,
)
from minirl.measure.metrics_log import MetricsWriter, flatten_metrics, read_metrics, replayed
from minirl.types import Batch

INF, NAN = math.inf, math.nan
LN2, LN4 = math.log(2.0), math.log(4.0)


def _finite_everywhere(d):
    for k, v in flatten_metrics(d).items():
        assert math.isfinite(v), k


# ----------------------------------------------------------------------------- mismatch


def test_mismatch_hand_computed():
    behav = np.array([[-1.0, -2.0, -INF], [-0.5, NAN, -3.0]])
    prox = np.array([[-1.1, -1.5, -INF], [-0.5, -1.0, -2.0]])
    mask = np.array([[1, 1, 0], [1, 0, 1]], np.float32)
    m = mismatch_metrics(behav, prox, mask)
    # Delta = prox - behav on counted tokens: -0.1, 0.5, 0.0, 1.0
    assert m["tokens"] == 4 and m["nonfinite_tokens"] == 0
    assert m["mean_abs_dlogp"] == pytest.approx((0.1 + 0.5 + 0.0 + 1.0) / 4)  # 0.4
    # |Delta| sorted 0, 0.1, 0.5, 1.0; p95 at rank 0.95 * 3 = 2.85: 0.5 + 0.85 * 0.5 = 0.925
    assert m["p95_abs_dlogp"] == pytest.approx(0.925)
    assert m["max_abs_dlogp"] == pytest.approx(1.0)
    assert m["mean_dlogp"] == pytest.approx(1.4 / 4)  # (-0.1 + 0.5 + 0 + 1) / 4 = 0.35
    # k1 = mean(-Delta) = -0.35; k2 = mean(Delta^2 / 2) = (0.01 + 0.25 + 0 + 1) / 8 = 0.1575
    assert m["kl_k1"] == pytest.approx(-0.35)
    assert m["kl_k2"] == pytest.approx(0.1575)
    # k3 = mean(e^D - 1 - D): 0.0048374180 + 0.1487212707 + 0 + 0.7182818285 = 0.8718405172
    assert m["kl_k3"] == pytest.approx(0.8718405172 / 4)


def test_mismatch_counts_nonfinite_counted_tokens_and_empty_mask_is_zero():
    behav = np.array([[-1.0, -INF, -2.0]])
    prox = np.array([[-1.5, -1.0, NAN]])
    m = mismatch_metrics(behav, prox, np.ones((1, 3)))
    # only token 0 is finite on both sides: Delta = -0.5
    assert (m["tokens"], m["nonfinite_tokens"]) == (1, 2)
    assert m["max_abs_dlogp"] == pytest.approx(0.5)
    assert m["kl_k1"] == pytest.approx(0.5)
    empty = mismatch_metrics(behav, prox, np.zeros((1, 3)))
    _finite_everywhere(empty)
    assert empty["tokens"] == 0 and empty["mean_abs_dlogp"] == 0 and empty["kl_k3"] == 0


def test_mismatch_clamps_before_exp():
    # Delta = 1000 would overflow exp; clamped to 20: k3 = e^20 - 1 - 20
    m = mismatch_metrics(np.array([[-1000.0]]), np.array([[0.0]]), np.ones((1, 1)))
    assert m["kl_k3"] == pytest.approx(math.exp(20) - 21)
    assert m["max_abs_dlogp"] == 1000.0  # |Delta| itself is not clamped
    _finite_everywhere(m)


def test_kl_estimators_estimate_kl_mu_to_pi():
    """Sampling from mu, mean k1 and k3 converge to KL(mu || pi), not KL(pi || mu)."""
    mu = np.array([0.9, 0.09, 0.01])
    pi = np.array([0.3, 0.3, 0.4])
    kl_mu_pi = float(
        np.sum(mu * np.log(mu / pi))
    )  # 0.9 ln 3 + 0.09 ln 0.3 + 0.01 ln 0.025 = 0.8435
    kl_pi_mu = float(
        np.sum(pi * np.log(pi / mu))
    )  # 0.3 ln(1/3) + 0.3 ln(10/3) + 0.4 ln 40 = 1.5072
    x = np.random.default_rng(np.random.SeedSequence(0)).choice(3, size=(200, 1000), p=mu)
    m = mismatch_metrics(np.log(mu)[x], np.log(pi)[x], np.ones(x.shape))
    assert kl_pi_mu - kl_mu_pi > 0.6
    assert m["kl_k1"] == pytest.approx(kl_mu_pi, abs=0.02)
    assert m["kl_k3"] == pytest.approx(kl_mu_pi, abs=0.02)


def test_greedy_flip_fraction_from_logits():
    behav = np.array([[[0.0, 1.0, -INF], [2.0, 0.0, 0.0], [NAN, NAN, NAN]]])  # [1, 3, 3]
    prox = np.array([[[0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [NAN, NAN, NAN]]])
    mask = np.array([[1, 1, 0]])
    m = mismatch_metrics(
        np.zeros((1, 3)), np.zeros((1, 3)), mask, behav_logits=behav, prox_logits=prox
    )
    # argmax 1 vs 1 (same), 0 vs 2 (flip); the nan row is masked out
    assert m["greedy_tokens"] == 2 and m["greedy_flip_fraction"] == 0.5
    with pytest.raises(ValueError, match="both"):
        mismatch_metrics(np.zeros((1, 3)), np.zeros((1, 3)), mask, behav_logits=behav)
    with pytest.raises(ValueError, match="same"):
        mismatch_metrics(np.zeros((1, 3)), np.zeros((1, 4)), mask)


# ----------------------------------------------------------------------------- zero-centred


def test_zero_centred_hand_computed():
    adv = np.array([1.0, -2.0, 0.0])  # [B]
    c = np.array([[1.5, 0.8], [1.2, INF], [3.0, 3.0]])
    mask = np.array([[1, 1], [1, 0], [1, 1]])
    z = zero_centred_contributions(adv, c, mask, return_arrays=True)
    # A > 0: row 0: 1 * 0.5 = 0.5, 1 * (-0.2) = -0.2 -> sum 0.3, mean 0.15
    assert z["pos_tokens"] == 2
    assert z["pos_sum"] == pytest.approx(0.3) and z["pos_mean"] == pytest.approx(0.15)
    # quantiles of (-0.2, 0.5): p05 = -0.2 + 0.05 * 0.7 = -0.165, p50 = 0.15, p95 = 0.465
    assert z["pos_p05"] == pytest.approx(-0.165)
    assert z["pos_p50"] == pytest.approx(0.15)
    assert z["pos_p95"] == pytest.approx(0.465)
    # A < 0: row 1 token 0: -2 * 0.2 = -0.4 (token 1 is masked, its inf never leaks)
    assert z["neg_tokens"] == 1 and z["neg_sum"] == pytest.approx(-0.4)
    # A = 0 (row 2) counts in neither; net = 0.3 - 0.4
    assert z["sum"] == pytest.approx(-0.1)
    np.testing.assert_allclose(np.sort(z["pos_values"]), [-0.2, 0.5])
    # [B, T] advantages give the same as [B]
    same = zero_centred_contributions(np.repeat(adv[:, None], 2, axis=1), c, mask)
    assert same["neg_sum"] == z["neg_sum"] and same["pos_sum"] == z["pos_sum"]
    assert "pos_values" not in same


def test_zero_centred_is_zero_without_mismatch_and_on_empty_mask():
    adv = np.array([1.0, -1.0])
    z = zero_centred_contributions(adv, np.ones((2, 4)), np.ones((2, 4)))
    assert z["pos_sum"] == 0 and z["neg_sum"] == 0 and z["pos_tokens"] == 4
    empty = zero_centred_contributions(adv, np.full((2, 4), NAN), np.zeros((2, 4)))
    _finite_everywhere(empty)
    assert empty["pos_tokens"] == 0 and empty["neg_mean"] == 0


# ----------------------------------------------------------------------------- lag buckets


def test_bucket_labels():
    assert bucket_labels() == [
        "[0,1)",
        "[1,3)",
        "[3,8)",
        "[8,20)",
        "[20,50)",
        "[50,200)",
        "[200,inf)",
    ]
    assert bucket_labels((0, 0.5, INF)) == ["[0,0.5)", "[0.5,inf)"]


def test_lag_bucket_boundaries_lower_inclusive_upper_exclusive():
    lags = np.array([[0, 1, 2, 3, 7, 8, 19, 20, 49, 50, 199, 200, 10**6]])
    out = lag_buckets(np.zeros(lags.shape), lags, np.ones(lags.shape))
    counts = {k: v["tokens"] for k, v in out.items()}
    assert counts == {
        "[0,1)": 1,  # 0
        "[1,3)": 2,  # 1, 2
        "[3,8)": 2,  # 3, 7
        "[8,20)": 2,  # 8, 19
        "[20,50)": 2,  # 20, 49
        "[50,200)": 2,  # 50, 199
        "[200,inf)": 2,  # 200, 10^6
    }
    # one token at each exact edge, on its own
    for lag, label in ((1, "[1,3)"), (3, "[3,8)"), (8, "[8,20)"), (200, "[200,inf)")):
        assert list(lag_buckets(np.zeros((1, 1)), np.array([[lag]]), np.ones((1, 1)))) == [label]


def test_lag_bucket_statistics_hand_computed():
    log_ratio = np.array([[0.0, LN4, -LN2, 30.0, -INF, NAN]])
    lag = np.array([[1, 2, 2, 60, 60, 0]])
    mask = np.array([[1, 1, 1, 1, 0, 1]])  # -inf is masked; the counted nan is left out
    out = lag_buckets(log_ratio, lag, mask)
    assert set(out) == {"[1,3)", "[50,200)"}  # lag 0 only had the nan token
    b = out["[1,3)"]
    # rho = 1, 4, 0.5
    assert b["tokens"] == 3
    assert b["mean_rho"] == pytest.approx(5.5 / 3)
    assert b["max_rho"] == pytest.approx(4.0)
    assert b["mean_rho2"] == pytest.approx((1 + 16 + 0.25) / 3)  # 5.75
    assert b["mean_log_ratio"] == pytest.approx((0 + LN4 - LN2) / 3)  # ln 2 / 3
    assert b["mean_abs_log_ratio"] == pytest.approx((LN4 + LN2) / 3)  # ln 2
    # k3 = rho - log rho - 1: 0, 3 - ln 4, ln 2 - 0.5  -> (2.5 - ln 2) / 3
    assert b["kl_k3"] == pytest.approx((2.5 - LN2) / 3)
    assert b["kl_k1"] == pytest.approx(-LN2 / 3)
    assert (b["p_rho_gt_2"], b["p_rho_gt_5"], b["p_rho_gt_10"]) == pytest.approx((1 / 3, 0, 0))
    # log-ratio 30 is clamped to 20 before exp
    far = out["[50,200)"]
    assert far["max_rho"] == pytest.approx(math.exp(20.0))
    assert far["mean_log_ratio"] == 20.0 and far["p_rho_gt_10"] == 1.0
    _finite_everywhere(out)


def test_lag_buckets_bad_input():
    ones = np.ones((1, 2))
    # a negative lag at a MASKED position is padding, not an error
    assert (
        lag_buckets(np.zeros((1, 2)), np.array([[0, -1]]), np.array([[1, 0]]))["[0,1)"]["tokens"]
        == 1
    )
    with pytest.raises(ValueError, match=">= 0"):
        lag_buckets(np.zeros((1, 2)), np.array([[0, -1]]), ones)
    with pytest.raises(ValueError, match="from 0 to inf"):
        lag_buckets(np.zeros((1, 2)), np.zeros((1, 2), int), ones, edges=(0, 5, 10))
    with pytest.raises(ValueError, match="same"):
        lag_buckets(np.zeros((1, 2)), np.zeros((1, 3), int), ones)
    assert lag_buckets(np.zeros((1, 2)), np.zeros((1, 2), int), np.zeros((1, 2))) == {}


# ----------------------------------------------------------------------------- SNIS proxy


def _snis_example():
    # group 7: rows 0, 1; group 3: rows 2, 3, 4 (ids need not be sorted)
    rewards = np.array([1.0, 0.0, 1.0, 1.0, 0.0])
    log_ratio = np.array([[0.2, 0.4], [-0.1, -INF], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    mask = np.array([[1, 1], [1, 0], [1, 1], [1, 1], [1, 1]])
    group_ids = np.array([7, 7, 3, 3, 3])
    lag = np.array([[2, 2], [4, 99], [0, 0], [0, 0], [0, 0]])  # 99 is masked
    return rewards, log_ratio, mask, group_ids, lag


def test_group_baselines_eq7_eq8_hand_computed():
    rewards, log_ratio, mask, group_ids, lag = _snis_example()
    g = group_baselines(rewards, log_ratio, mask, group_ids, lag)
    assert list(g["group_ids"]) == [3, 7]
    # group 3: all log-ratios 0 -> b_SNIS = b_plain = 2/3
    assert g["b_plain"][0] == pytest.approx(2 / 3) and g["b_snis"][0] == pytest.approx(2 / 3)
    # group 7, Eq. 8: log rho_bar = mean over counted tokens: row 0 (0.2 + 0.4) / 2 = 0.3, row 1 -0.1
    # b_SNIS = e^0.3 * 1 / (e^0.3 + e^-0.1) = sigmoid(0.4) = 0.598687660; b_plain = 0.5
    assert g["b_plain"][1] == pytest.approx(0.5)
    assert g["b_snis"][1] == pytest.approx(0.598687660)
    assert g["gap"][1] == pytest.approx(0.098687660)
    # mean lag over the group's counted tokens: (2 + 2 + 4) / 3
    np.testing.assert_allclose(g["mean_lag"], [0.0, 8 / 3])
    np.testing.assert_allclose(g["size"], [3, 2])
    # the full sequence weight: log w = 0.6, -0.1 -> sigmoid(0.7) = 0.668187772
    s = group_baselines(rewards, log_ratio, mask, group_ids, weight="sequence")
    assert s["b_snis"][1] == pytest.approx(0.668187772)
    assert "mean_lag" not in s
    # per-row lag [B]: mean over the group's rows (3 + 5) / 2 = 4
    per_row = group_baselines(rewards, log_ratio, mask, group_ids, np.array([3, 5, 1, 1, 1]))
    np.testing.assert_allclose(per_row["mean_lag"], [1.0, 4.0])


def test_snis_proxy_by_group_lag_bucket():
    out = snis_baseline_proxy(*_snis_example())
    assert set(out) == {"[0,1)", "[1,3)", "all"}  # mean lags 0 and 8/3
    assert out["[0,1)"] == {"groups": 1.0, "mean_gap": 0.0, "rmse_gap": 0.0, "max_gap": 0.0}
    assert out["[1,3)"]["mean_gap"] == pytest.approx(0.098687660)
    assert out["[1,3)"]["rmse_gap"] == pytest.approx(0.098687660)
    # all: gaps (0, 0.098687660): mean 0.049343830, rmse 0.098687660 / sqrt(2) = 0.069782...
    assert out["all"]["groups"] == 2
    assert out["all"]["mean_gap"] == pytest.approx(0.049343830)
    assert out["all"]["rmse_gap"] == pytest.approx(0.098687660 / math.sqrt(2))
    assert out["all"]["max_gap"] == pytest.approx(0.098687660)


def test_snis_is_stable_for_huge_ratios_and_empty_input():
    rewards = np.array([1.0, 0.0, NAN])  # a nan reward is left out
    log_ratio = np.full((3, 50), 1e4)  # clamped to 20 per token; sum 1000 -> softmax, no overflow
    log_ratio[1] = -1e4
    g = group_baselines(rewards, log_ratio, np.ones((3, 50)), np.zeros(3, int), weight="sequence")
    assert g["size"][0] == 2 and g["b_snis"][0] == pytest.approx(1.0)
    empty = snis_baseline_proxy(
        np.zeros(0), np.zeros((0, 4)), np.zeros((0, 4)), np.zeros(0, int), np.zeros((0, 4), int)
    )
    assert empty == {"all": {"groups": 0.0, "mean_gap": 0.0, "rmse_gap": 0.0, "max_gap": 0.0}}
    with pytest.raises(ValueError, match="geometric"):
        group_baselines(rewards, log_ratio, np.ones((3, 50)), np.zeros(3, int), weight="arith")


# ----------------------------------------------------------------------------- batch


def test_batch_diagnostics_matches_the_parts():
    rewards, log_ratio, mask, group_ids, _ = _snis_example()
    behav = np.array([[-1.0, -1.0], [-1.0, -INF], [-1.0, -1.0], [-2.0, -1.0], [-1.0, -1.0]])
    prox = np.where(mask > 0, behav + log_ratio, -INF)  # the trainer's view of the same tokens
    versions = np.array([[8, 8], [6, 0], [10, 10], [10, 10], [10, 10]])  # current version 10
    batch = Batch(
        tokens=np.zeros((5, 2), np.int32),
        targets=np.zeros((5, 2), np.int32),
        mask=mask.astype(np.float32),
        behaviour_logprobs=behav.astype(np.float32),
        versions=versions.astype(np.int32),
        rewards=rewards.astype(np.float32),
        group_ids=group_ids.astype(np.int32),
        prompt_uids=np.arange(5),
    )
    adv = np.array([1.0, -1.0, 0.5, 0.5, -1.0])
    d = batch_diagnostics(batch, prox, current_version=10, advantages=adv)
    assert set(d) == {"mismatch", "lag", "snis", "zero_centred"}
    assert d["mismatch"]["tokens"] == 9 and d["mismatch"]["max_abs_dlogp"] == pytest.approx(0.4)
    # lags: 2, 2, 4 (row 0, 1) and 0 elsewhere; the masked token (version 0 -> lag 10) is ignored
    assert {k: v["tokens"] for k, v in d["lag"].items()} == {"[0,1)": 6, "[1,3)": 2, "[3,8)": 1}
    assert d["snis"]["[1,3)"]["mean_gap"] == pytest.approx(0.098687660, rel=1e-6)
    # zero-centred: row 0 (A=1): (e^0.2 - 1) + (e^0.4 - 1); row 1 (A=-1): -(e^-0.1 - 1)
    assert d["zero_centred"]["pos_sum"] == pytest.approx(
        math.exp(0.2) + math.exp(0.4) - 2, rel=1e-6
    )
    assert d["zero_centred"]["neg_sum"] == pytest.approx(1 - math.exp(-0.1), rel=1e-6)
    flat = flatten_metrics(d)
    assert flat["lag/[1,3)/tokens"] == 2.0 and "snis/all/rmse_gap" in flat
    _finite_everywhere(d)


# ----------------------------------------------------------------------------- metrics.jsonl


def test_flatten_metrics():
    nested = {
        "reward": {"mean": np.float32(0.5), "count": 3},
        "lag": {"[1,3)": {"mean_rho": np.array(1.25)}},
        "ok": True,
        "nan": NAN,
        "note": "skipped",
        "values": np.arange(3),  # not a scalar: left out
        "one": np.array([2.0]),
        7: 1,
    }
    flat = flatten_metrics(nested)
    assert set(flat) == {
        "reward/mean",
        "reward/count",
        "lag/[1,3)/mean_rho",
        "ok",
        "nan",
        "one",
        "7",
    }
    assert flat["reward/mean"] == 0.5 and flat["lag/[1,3)/mean_rho"] == 1.25 and flat["ok"] == 1.0
    assert math.isnan(flat["nan"]) and flat["one"] == 2.0
    assert all(type(v) is float for v in flat.values())


def test_replayed_drops_the_readings_of_the_machine_and_keeps_the_run():
    record = {
        "step": 3,
        "wall_time": 1.7e9,
        "time/step": 2.5,
        "time/train": 1.0,
        "engine/decode_tokens_per_s": 900.0,
        "engine/busy_seconds": 4.0,
        "memory/peak_rss_gb": 0.8,
        "reward/mean": 0.25,
        "loss/ratio_max": 1.0,
        "lag/[1,3)/mean_rho": None,
    }
    assert replayed(record) == {
        "step": 3,
        "reward/mean": 0.25,
        "loss/ratio_max": 1.0,
        "lag/[1,3)/mean_rho": None,
    }


def test_metrics_writer_round_trip_with_nan_and_torn_last_line(tmp_path):
    run = tmp_path / "run"
    with MetricsWriter(run, clock=lambda: 100.0) as w:
        w.write({"reward": {"mean": 0.25}, "mismatch": {"kl_k3": NAN}}, step=0)
        rec = w.write({"reward": {"mean": np.float64(0.5)}, "x": INF}, step=1)
    assert rec == {"step": 1, "wall_time": 100.0, "reward/mean": 0.5, "x": None}
    path = run / "metrics.jsonl"
    assert all(json.loads(line) for line in path.read_text().splitlines())  # strict JSON: no NaN
    with open(path, "a") as f:
        f.write('{"step": 2, "reward/me')  # a crash mid-write
    recs = read_metrics(run)
    assert [r["step"] for r in recs] == [0, 1]
    assert recs[0] == {"step": 0, "wall_time": 100.0, "reward/mean": 0.25, "mismatch/kl_k3": None}
    # resuming: the torn fragment is sealed on its own line; it is skipped with a warning
    with MetricsWriter(run, clock=lambda: 200.0) as w:
        w.write({"reward": {"mean": 0.75}}, step=2)
    with pytest.warns(UserWarning, match="not a JSON object"):
        recs = read_metrics(run)
    assert [(r["step"], r["reward/mean"]) for r in recs] == [(0, 0.25), (1, 0.5), (2, 0.75)]
    assert read_metrics(tmp_path / "nowhere") == []


def test_metrics_writer_warns_instead_of_crashing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    w = MetricsWriter(blocker, clock=lambda: 0.0)  # nothing happens in the constructor
    with pytest.warns(UserWarning, match="could not write"):
        w.write({"a": 1.0}, step=0)
    w.close()


def test_default_edges_are_the_papers():
    assert LAG_EDGES == (0, 1, 3, 8, 20, 50, 200, INF)
