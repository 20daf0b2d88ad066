"""The simulator (issue #17): hand-computed costs and schedules, the real controller's decisions
on virtual time, the event-driven async scheduler against the threaded one, determinism."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from minirl.config import RLConfig
from minirl.control.async_loop import RolloutThread
from minirl.data.mixture import Mixture
from minirl.hf.hf_config import config_to_hf
from minirl.inference.engine_config import EngineConfig
from minirl.inference.scheduler import Request
from minirl.measure.metrics_log import read_metrics
from minirl.modeling.model import ModelConfig
from minirl.run.presets import make_config
from minirl.run.run_dir import record_config
from minirl.run.runner import Run
from minirl.run.starting_point import train_prompts
from minirl.sim.calibrate import fit_run
from minirl.sim.costs import DEVICES, SHAPES, Costs, Device
from minirl.sim.parts import SimEngine, VirtualClock
from minirl.sim.run import AsyncSim, Setup, build, simulate
from minirl.sim.workload import Lengths, SimPrompts, SimVerifier
from minirl.store.checkpoints import CheckpointManager
from minirl.training.batching import bucket_length
from minirl.types import Prompt, Rollout

# A model small enough to count by hand: 7 matrices of 2x2 per layer, one layer, a 2x4 head.
TOY = ModelConfig(
    vocab_size=4, dim=2, num_layers=1, num_heads=1, num_kv_heads=1, head_dim=2, mlp_dim=2
)


def per_call(seconds: float) -> Costs:
    """Every engine call costs `seconds`, whatever its size (the roofline terms vanish)."""
    fast = Device("fast", 1e30, 1e30, 1e30, 1e30, decode_eff=1.0, call_s=seconds)
    return Costs(TOY, fast)


def test_decode_roofline_by_hand():
    # One decode step, 1 row at context 3, bf16: bytes = 2 x (36 params + 1 x 2 embedding row)
    # + KV 4 positions x 1 layer x 2 x 1 head x 2 dims x 2 bytes = 76 + 32 = 108;
    # FLOPs = 2 x 36 + 4 x 1 x 1 x 2 x 1 x 3 = 96.
    dev = Device(
        "d",
        peak_flops=96 * 4,
        hbm_bytes_per_s=108,
        hbm_bytes=1e9,
        link_bytes_per_s=36,
        decode_eff=1.0,
    )
    costs = Costs(TOY, dev)
    assert costs.decode_chunk(rows=1, context=3, steps=2) == pytest.approx(2.0)  # memory-bound
    assert Costs(TOY, dev, engine_devices=2).decode_chunk(1, 3, 2) == pytest.approx(1.0)
    assert costs.reload() == pytest.approx(2.0)  # 72 bytes of weights over 36 B/s
    # train: 8 x 36 x 10 tokens FLOPs / (384 FLOP/s x MFU 0.4)
    assert costs.train_step(10) == pytest.approx(8 * 36 * 10 / (384 * 0.4))


def two_requests(slots: int, lengths=(5, 9)):
    clock = VirtualClock()
    table = {(uid, 0): n for uid, n in enumerate(lengths)}
    engine = SimEngine(
        EngineConfig(
            slots=slots, cache_len=64, prefill_buckets=(8,), prefill_rows=2, decode_chunk=4
        ),
        per_call(1.0),
        Lengths("fixed", (1,), table=table),
        clock,
    )
    prompts = [Prompt(uid, "t", "", np.ones(3, np.int32)) for uid in range(len(lengths))]
    return engine, clock, [Request(p, 0, 16) for p in prompts]


def test_two_request_schedule_by_hand():
    # Two slots: one prefill call (both prompts, 1 s) samples each first token; request 0 needs
    # 4 more tokens = 1 chunk, request 1 needs 8 = 2 chunks: done at 1 + 2 = 3 s.
    engine, clock, requests = two_requests(slots=2)
    out = engine.generate(requests)
    assert clock() == pytest.approx(3.0)
    assert [len(r.tokens) for r in out] == [5, 9]
    assert [r.finish_reason for r in out] == ["eos", "eos"]
    stats = engine.work_stats()
    assert (stats["prefill_calls"], stats["decode_calls"], stats["slot_steps"]) == (1, 2, 16)
    # One slot: prefill 0 (1 s) + 1 chunk, then prefill 1 (1 s) + 2 chunks = 5 s.
    engine, clock, requests = two_requests(slots=1)
    engine.generate(requests)
    assert clock() == pytest.approx(5.0)
    # A length capped by max_new_tokens ends for "length", not EOS.
    engine, clock, requests = two_requests(slots=2, lengths=(5, 40))
    assert [r.finish_reason for r in engine.generate(requests)] == ["eos", "length"]


def test_interrupt_discard_regenerates_and_continue_rebuilds():
    engine, clock, requests = two_requests(slots=2)
    replica = engine.replicas[0]
    replica.submit(requests)
    replica.step(until=0.0)  # prefill + one chunk: request 0 is done, request 1 at 5 tokens
    assert replica.interrupt("continue") == 1
    finished, seconds = replica.step()
    assert seconds == pytest.approx(2.0) and replica.stats["rebuilt"] == 1  # re-prefill + chunk
    assert len(finished[0].tokens) == 9
    engine, clock, requests = two_requests(slots=2)
    replica = engine.replicas[0]
    replica.submit(requests)
    replica.step(until=0.0)
    replica.interrupt("discard")
    assert replica.stats["discarded"] == 1 and len(replica.sched.queue) == 1


def small_setup(**rl) -> Setup:
    base = dict(prompts_per_step=4, group_size=2, steps=10)
    return Setup(
        costs=Costs(SHAPES["qwen2.5-0.5b"], DEVICES["v5e"]),
        rl=RLConfig(**{**base, **rl}),
        engine=EngineConfig(slots=4, cache_len=512, prefill_buckets=(64,), decode_chunk=8),
        lengths=Lengths.parse("lognormal:4,1", seed=3),
        max_new_tokens=256,
        verify_per_rollout_s=0.01,
        verify_sigma=0.5,
    )


@pytest.mark.parametrize("every", [1, 2])
def test_a_lockstep_reload_finds_the_versions_before_released(every):
    """The engine may cast its own copy of a version (bf16 on a CPU): the real controller lets
    the store drop the versions before first, so their weights are gone before the engine
    loads, not held beside its copy; with j = 2 the store keeps the engine's version and what
    came after it until the next reload."""
    ctl, engine = build(small_setup(reload_every=every), VirtualClock())
    seen, load = [], engine.load_weights
    engine.load_weights = lambda v, p=None: (seen.append((v, ctl.store.versions())), load(v, p))
    for _ in range(4):
        ctl.step()
    assert seen == [(v, [v]) for v in range(every, 5, every)]


@pytest.fixture(scope="module")
def real_lockstep(tmp_path_factory):
    """A real fixture run whose settings make every knob decide something: j = 2 (the engine
    lags), k = 2 (groups go stale), eta = 2 (generation runs ahead)."""
    cfg = make_config("fixture")
    rl = dataclasses.replace(cfg.rl, steps=6, checkpoint_every=6, reload_every=2, max_lag=2, eta=2)
    cfg = dataclasses.replace(cfg, rl=rl)
    run_dir = tmp_path_factory.mktemp("real")
    run = Run(cfg, run_dir, log=lambda *a: None, progress=False)
    run.train()
    return cfg, run, run_dir


def test_simulated_lockstep_makes_the_real_controllers_decisions(real_lockstep):
    cfg, run, run_dir = real_lockstep
    mixture = Mixture({run.task.name: train_prompts(run.task)}, seed=cfg.rl.seed)
    setup = dataclasses.replace(
        small_setup(),
        rl=cfg.rl,
        engine=cfg.engine,
        max_new_tokens=run.task.max_new_tokens,
        lengths=Lengths.parse("lognormal:1,1"),
    )
    trace = simulate(setup, cfg.rl.steps, mixture=mixture)
    real = read_metrics(run_dir)
    decisions = ["version", "engine_version", "groups_produced", "groups_trained", "groups_stale"]
    for sim_step, real_step in zip(trace["steps"], real, strict=True):
        for name in decisions:
            assert sim_step[f"count/{name}"] == real_step[f"count/{name}"], name
        assert sim_step["lag/mean"] == real_step["lag/mean"]
    assert real[-1]["count/groups_stale"] > 0  # the bound k really discarded something
    snap = CheckpointManager(run_dir).restore().controller_state["controller"]
    sim_uids = [u for s in trace["steps"] for u in s["trained_uids"]]
    assert sim_uids == [int(u) for u in snap["trained_uids"]]


def run_threaded(setup: Setup, steps: int) -> list[list[int]]:
    """The async scheduler's own threads (minirl/control/async_loop.py) on the simulated parts."""
    ctl, engine = build(setup, VirtualClock())
    thread = RolloutThread(ctl, engine)
    thread.start()
    try:
        out = []
        for _ in range(steps):
            ctl.step_async(thread)
            out.append([(g.rollouts[0].prompt.uid, g.produced) for g in ctl.last_trained])
        return out
    finally:
        thread.stop()
        thread.join(timeout=10)


@pytest.mark.parametrize("policy", ["discard", "continue"])
def test_event_driven_async_decides_as_the_threaded_scheduler(policy):
    setup = small_setup(scheduler="async", eta=0, max_lag=1, reload_policy=policy)
    threaded = run_threaded(setup, 6)
    trace = simulate(setup, 6)
    sim = [s["trained_uids"] for s in trace["steps"]]
    assert sim == [[uid for uid, _ in step] for step in threaded]
    assert trace["steps"][-1]["count/groups_produced"] == 6 * 4


def test_async_bounds_hold_and_lag_distribution_is_reported():
    setup = small_setup(scheduler="async", eta=3, max_lag=3, reload_policy="continue")
    trace = simulate(setup, 12)
    assert max(s["lag/mean"] for s in trace["steps"]) <= 2  # lag counts from 0: k - 1
    hist = trace["lag_histogram"]
    assert len(hist) <= 3 and sum(hist) > 0 and hist[1] + hist[2] > 0
    sync = simulate(small_setup(), 12)
    assert trace["seconds_per_step"] < sync["seconds_per_step"]  # run-ahead overlaps the parts


def test_doubling_engine_replicas_nearly_halves_generation_time():
    base = small_setup(prompts_per_step=64, group_size=4)
    times = []
    for replicas in (1, 2):
        trace = simulate(dataclasses.replace(base, replicas=replicas, verify_per_rollout_s=0), 3)
        gen = [s["time/step"] - s["time/train"] for s in trace["steps"]]
        times.append(sum(gen))
    assert 0.45 < times[1] / times[0] < 0.6


def test_same_seed_same_trace_other_seed_another():
    setup = small_setup(scheduler="async", eta=2, max_lag=3)
    a, b = simulate(setup, 8), simulate(setup, 8)
    assert a == b
    other = dataclasses.replace(setup, lengths=Lengths.parse("lognormal:4,1", seed=4))
    assert simulate(other, 8)["seconds"] != a["seconds"]


def test_length_specs_and_their_errors(tmp_path):
    assert Lengths.parse("fixed:7")(0, 0, cap=5) == 5
    spec = Lengths.parse("lognormal:3,0")
    assert spec(1, 2, cap=100) == int(np.ceil(np.exp(3)))
    assert Lengths.parse("lognormal:1e9,1")(0, 0, cap=64) == 64  # no overflow: capped
    (tmp_path / "samples.jsonl").write_text('{"length": 4}\nnot json\n{"length": 6}\n{}\n')
    run = Lengths.parse(str(tmp_path))
    assert {run(u, 0, cap=99) for u in range(50)} == {4, 6}
    for bad in ("lognormal:1", "lognormal:1,-1", "fixed:0", "gamma:1", str(tmp_path / "nope")):
        with pytest.raises(ValueError, match="expected lognormal"):
            Lengths.parse(bad)


def test_prompts_resume_where_they_stopped():
    prompts = SimPrompts(prompt_len=5)
    prompts.next_prompts(3)
    again = SimPrompts(prompt_len=5)
    again.load_state(prompts.state())
    assert [p.uid for p in again.next_prompts(2)] == [3, 4]


def test_plan_prints_a_sweep_and_refuses_bad_input(capsys, tmp_path):
    from minirl.cli import main

    args = [
        "plan",
        "--model",
        "qwen2.5-0.5b",
        "--device",
        "h100",
        "--max-new-tokens",
        "512",
        "--prompts",
        "8",
        "--group-size",
        "2",
        "--slots",
        "8",
        "--steps",
        "2",
    ]
    plot = tmp_path / "sweep.png"
    assert main(args + ["--sweep", "engine-devices=1,2", "--plot", str(plot), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.split("\nwrote")[0])
    assert [r["engine_devices"] for r in rows] == [1, 2] and [r["replicas"] for r in rows] == [1, 2]
    assert rows[1]["seconds_per_step"] < rows[0]["seconds_per_step"]
    assert plot.read_bytes()[:4] == b"\x89PNG"
    model_dir = tmp_path / "model"  # a checkpoint directory: its config.json gives the shapes
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(config_to_hf(SHAPES["qwen2.5-0.5b"])))
    assert main([*args, "--model", str(model_dir), "--json"]) == 0
    from_dir = json.loads(capsys.readouterr().out)
    assert main([*args, "--json"]) == 0
    assert from_dir == json.loads(capsys.readouterr().out)
    for bad, says in [
        (["--staleness", "1,x"], "expected J,K,ETA"),
        (["--model", "nope"], "not a known shape"),
        (["--sweep", "colour=1"], "expected KNOB=V1,V2"),
        (["--lengths", "gamma:2"], "expected lognormal"),
        (["--mfu", "2"], "--mfu must be in (0, 1], got 2.0"),
        (["--steps", "1"], "--steps must be >= 2, got 1"),
        (["--lengths", "lognormal:nan,1"], "expected lognormal"),
        (["--verify-s", "-1"], "--verify-s must be >= 0, got -1.0"),
        (["--prompts", "0"], "--prompts must be >= 1, got 0"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
        (["--engine-devices", "0"], "--engine-devices must be >= 1, got 0"),
        (["--engine-devices", "3", "--replica-devices", "2"], "not a multiple of"),
        # every number is checked once, in the user's words (issue #34): a value that starts
        # with "-" is a value, not argparse's "expected one argument"; nan is not a number
        (["--staleness", "-1,0,0"], "--staleness -1,0,0: reload_every must be >= 1, got -1"),
        (["--replica-devices", "-1"], "--replica-devices must be >= 0, got -1"),
        (["--verify-s", "nan"], "--verify-s must be a finite number >= 0, got nan"),
        (["--decode-eff", "0"], "--decode-eff must be in (0, 1], got 0.0"),
        (["--sweep", "eta=1,-2"], "--sweep eta=1,-2: eta must be >= 0, got -2"),
        (["--calibrate", str(tmp_path)], "not a minirl run directory"),
        (["--plot", str(plot)], "--plot draws a sweep"),
        (["--model", str(tmp_path)], "not a known shape"),
    ]:
        assert main(args + bad) == 2
        assert says in capsys.readouterr().err


def test_colocated_training_shares_the_cores_with_the_engine():
    """Processor sharing: a step's work goes at 1 / slowdown while the engine is busy and at
    full speed once it idles; an end planned before a change is void."""
    sim = AsyncSim(dataclasses.replace(small_setup(scheduler="async"), colocated_slowdown=2.0))
    sim.training = {
        "groups": [],
        "metrics": {},
        "took": 0.0,
        "work": 4.0,
        "since": 0.0,
        "slow": 1.0,
        "ticket": -1,
    }
    sim._retime_training()  # the engine is busy: 4 s of work take 8
    first = sim.training["ticket"]
    assert sim.events[-1][0] == pytest.approx(8.0)
    sim.now, sim.idle = 2.0, {0}  # at 2 s the engine idles: 1 s of work done, 3 left
    sim._retime_training()
    assert sorted(e[0] for e in sim.events if e[2] == "trained") == pytest.approx([5.0, 8.0])
    sim._on_trained(-1, first)  # the void end changes nothing
    assert sim.training is not None and sim.ctl.counters.steps == 0


def test_this_machine_is_fitted_from_a_lockstep_run(tmp_path):
    """fit_run recovers per-call costs from a run directory made with known ones."""
    cfg = make_config("fixture")
    record_config(cfg, tmp_path)
    (tmp_path / "samples.jsonl").write_text('{"prompt": "abc", "length": 5}\n' * 4)
    rows = cfg.rl.prompts_per_step * cfg.rl.group_size
    chunk = cfg.engine.slots * cfg.engine.decode_chunk
    lines = []
    for step, (chunks, longest) in enumerate([(3, 20), (5, 40), (4, 60), (6, 30)] * 2):
        padded = rows * bucket_length(longest + 4, cfg.trainer.bucket_minimum)
        made = rows * (step + 1)
        gen = 0.05 * chunks + 0.002 * rows
        rec = {
            "step": step + 1,
            "time/generate": gen,
            "time/verify": 1e-4 * rows,
            "time/train": 0.5 + 1e-4 * padded,
            "time/publish": 0.01,
            "time/other": 0.03,
            "engine/slot_steps": chunks * chunk,
            "length/max": longest,
            "count/rollouts_generated": made,
            "count/groups_produced": 3 * (step + 1),
            "count/groups_filtered": step + 1,
        }
        lines.append(json.dumps(rec))
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    m = fit_run(tmp_path)
    assert m.chunk_s == pytest.approx(0.05) and m.prefill_s == pytest.approx(0.002)
    assert m.train_call_s == pytest.approx(0.5) and m.train_token_s == pytest.approx(1e-4)
    assert m.verify_s == pytest.approx(1e-4) and m.reload_s == pytest.approx(0.01)
    assert m.other_s == pytest.approx(0.02) and m.colocated_slowdown == 1.0
    assert m.unsolved == pytest.approx(0.25)  # 8 groups filtered of 32 made


def test_verifier_unsolved_prompts_and_latency():
    clock = VirtualClock()
    verifier = SimVerifier(clock, p=0.5, base_s=1.0, per_rollout_s=0.5, unsolved=0.3, seed=1)
    prompts = [Prompt(u, "t", "", np.ones(2, np.int32)) for u in range(2000)]
    rollouts = [
        Rollout(p, s, np.ones(1, np.int32), np.zeros(1, np.float32), np.zeros(1, np.int32), "eos")
        for p in prompts
        for s in range(4)
    ]
    rewards = np.array([s.reward for s in verifier.score(rollouts)]).reshape(2000, 4)
    assert clock() == pytest.approx(1.0 + 0.5 * 8000)  # sigma 0: every rollout per_rollout_s
    never = (rewards.sum(1) == 0).mean()  # unsolved prompts + solvable ones that missed 4 times
    assert never == pytest.approx(0.3 + 0.7 * 0.5**4, abs=0.03)


# ---- a device measured by the accelerator check (benchmarks/accelerator_check.py) -------------

CPU_CHECK = Path(__file__).parents[1] / "data" / "accelerator_check_cpu.json"


def test_decode_efficiency_between_measured_slot_counts_is_linear_in_log_slots():
    dev = Device("d", 1.0, 1.0, 1.0, 1.0, decode_eff=0.5, decode_eff_at=((1, 0.2), (4, 0.6)))
    assert [dev.decode_eff_for(n) for n in (1, 2, 4, 64)] == pytest.approx([0.2, 0.4, 0.6, 0.6])
    assert Device("d", 1.0, 1.0, 1.0, 1.0, decode_eff=0.5).decode_eff_for(7) == 0.5


def test_a_device_calibrated_from_the_cpu_check_reproduces_its_measured_steps():
    """tests/data/accelerator_check_cpu.json is the CPU dry run of the check (tiny model). The
    calibrated device's roofline of each measured step, at the measured efficiency, IS that
    step; the rates are the check's; memory and link stay the base preset's."""
    from minirl.sim.measured_device import device_from_check

    report = json.loads(CPU_CHECK.read_text())
    copy = report["limits"]["copy_bytes_per_s"]
    dev = device_from_check(report, DEVICES["h100"])
    assert dev.peak_flops == report["limits"]["matmul_flops_per_s"]["bfloat16"]
    assert dev.hbm_bytes_per_s == copy
    assert (dev.hbm_bytes, dev.link_bytes_per_s) == (80e9, 900e9)
    decode = [r for r in report["rows"] if r["kind"] == "decode" and r["dtype"] == "bfloat16"]
    assert [n for n, _ in dev.decode_eff_at] == [1, 4]
    # By hand, tiny (D 256, L 4, K 2, Dh 64, F 768, V 64) at 1 slot and 40 positions, bf16:
    # matmul params 4 x (2 x 256^2 + 2 x 256 x 128 + 3 x 256 x 768) + 256 x 64 = 3,162,112;
    # bytes 2 x (3,162,112 + 256) + 41 x 4 x 2 x 2 x 64 x 2 = 6,408,704;
    # FLOPs 2 x 3,162,112 + 4 x 4 x 4 x 64 x 40 = 6,488,064.
    roofline = max(6_408_704 / copy, 6_488_064 / dev.peak_flops)
    assert dev.decode_eff_at[0][1] == pytest.approx(roofline / decode[0]["step_s"])
    costs = Costs(SHAPES["tiny"], dev)
    for row in decode:
        assert costs.decode_chunk(row["slots"], row["context"], 1) == pytest.approx(row["step_s"])
    (train,) = [r for r in report["rows"] if r["kind"] == "train"]
    assert dev.mfu == pytest.approx(
        8 * 3_162_112 * train["tokens"] / dev.peak_flops / train["step_s"]
    )
    assert costs.train_step(train["tokens"]) == pytest.approx(train["step_s"])
    fills = [costs.prefill(r["prefill_rows"], 16) / r["prefill_s"] for r in decode]
    assert sum(fills) / len(fills) == pytest.approx(1.0)  # the mean prefill at its mean efficiency


def test_plan_calibrated_by_a_check_and_its_errors(capsys, tmp_path):
    from minirl.cli import main

    args = ["plan", "--model", "tiny", "--device", "h100", "--max-new-tokens", "32"]
    args += ["--prompt-len", "16", "--prompts", "4", "--group-size", "2", "--slots", "4"]
    args += ["--steps", "2", "--engine-devices", "1", "--trainer-devices", "1", "--json"]
    assert main(args) == 0
    (datasheet,) = json.loads(capsys.readouterr().out)
    assert main([*args, "--calibrate-device", str(CPU_CHECK)]) == 0
    (measured,) = json.loads(capsys.readouterr().out)
    # a 2-core CPU's rates are ~10^4 below an H100's datasheet: the planned step is far slower
    assert measured["seconds_per_step"] > 100 * datasheet["seconds_per_step"]
    not_json, empty = tmp_path / "a.json", tmp_path / "b.json"
    not_json.write_text("{")
    empty.write_text("{}")
    no_rows = json.loads(CPU_CHECK.read_text())
    no_rows["rows"] = [r for r in no_rows["rows"] if r["kind"] != "decode"]
    (tmp_path / "c.json").write_text(json.dumps(no_rows))
    noisy = json.loads(CPU_CHECK.read_text())
    noisy["rows"][0]["step_s"] = -1e-4
    (tmp_path / "d.json").write_text(json.dumps(noisy))
    for bad, says in [
        (["--calibrate-device", str(tmp_path / "none.json")], "No such file"),
        (["--calibrate-device", str(not_json)], "not JSON"),
        (["--calibrate-device", str(empty)], "not a finished accelerator check"),
        (["--calibrate-device", str(tmp_path / "c.json")], "no bfloat16 matmul rate or"),
        (["--calibrate-device", str(tmp_path / "d.json")], "timing noise"),
        (["--calibrate-device", str(CPU_CHECK), "--calibrate", str(tmp_path)], "give one"),
        (["--calibrate-device", str(CPU_CHECK), "--decode-eff", "0"], "must be in (0, 1]"),
    ]:
        assert main(args + bad) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err


def test_moe_costs_by_hand_on_qwen3_30b_a3b():
    """FLOPs from the active parameters (8 of 128 experts), bytes from all of them."""
    cfg = SHAPES["qwen3-30b-a3b"]
    attn = 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048  # q, k, v, o
    router, expert, head = 2048 * 128, 3 * 2048 * 768, 2048 * 151936
    active = 48 * (attn + router + 8 * expert) + head  # 3,041,656,832
    stored = 48 * (attn + router + 128 * expert) + head  # 30,220,746,752
    dev = Device("d", peak_flops=1e14, hbm_bytes_per_s=1e12, hbm_bytes=1e12, link_bytes_per_s=1e9)
    costs = Costs(cfg, dataclasses.replace(dev, decode_eff=1.0))
    # One step of 1 row at context 0: memory-bound, 2 bytes x (stored + one embedding row) + the
    # KV of 1 position (48 layers x 2 x 4 heads x 128 x 2 bytes).
    nbytes = 2 * (stored + 2048) + 48 * 2 * 4 * 128 * 2
    assert costs.decode_chunk(rows=1, context=0, steps=1) == pytest.approx(nbytes / 1e12)
    # 4096 rows: compute-bound, 2 x active FLOPs per row (+ attention: context 0).
    assert costs.decode_chunk(4096, 0, 1) == pytest.approx(2 * 4096 * active / 1e14)
    assert costs.train_step(1000) == pytest.approx(8 * active * 1000 / (1e14 * 0.4))
    assert costs.reload() == pytest.approx(2 * stored / 1e9)
