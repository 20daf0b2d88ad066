"""Where a step's time goes: a `jax.profiler` trace summarised by op and source line (issue #20).

    python benchmarks/profile_ops.py decode --shape qwen2.5-0.5b --slots 32
    python benchmarks/profile_ops.py train --shape qwen2.5-0.5b --rows 4 --length 128
    python benchmarks/profile_ops.py run DIR --step 3     # DIR: trl_side_by_side.py --rounds 0 --dir DIR

It compiles the step with XLA's HLO dump on (`--xla_dump_to`, set before jax is imported; the
persistent compilation cache is off here, or nothing would be compiled and dumped), runs it under
`jax.profiler.trace`, and reads the Perfetto trace: on CPU every XLA thunk is an event naming its
HLO op and module. Each op is mapped, through the optimized HLO's metadata, to the line of
Python that produced it (`minirl/modeling/model.py:290 dot_general`); times are summed per line and
printed per call, largest first, with their share of all op time; then the share of each
module (prefill, decode, the optimizer update...) and of each source file within it. The decode workload is the
roofline benchmark's (16-token prompts, temperature 1); `train` is one GRPO `Trainer.train_step`.
Random weights; nothing is downloaded. `run` is one whole step (`--step`, after the earlier ones
compiled everything) of `minirl train` on the side-by-side benchmark's work in DIR, traced from
the end of the step before: here a module's op time over the step's wall time is how many of the
cores it kept busy on average. Run it alone: it measures time.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import sys
import tempfile
from pathlib import Path

DUMP = tempfile.mkdtemp(prefix="minirl-hlo-")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={DUMP} --xla_dump_hlo_as_text"
)

import jax  # noqa: E402
from flax import nnx  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from roofline import decode_engine, decode_requests, grpo_trainer, train_batch  # noqa: E402

from minirl.modeling.model import ModelConfig, init_model  # noqa: E402

jax.config.update("jax_enable_compilation_cache", False)

_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\S+).*?metadata=\{([^}]*)\}")
_MODULE = re.compile(r"^HloModule\s+([\w.\-]+)")
_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def _tables(text: str) -> dict[str, dict[str, str]]:
    """The optimized HLO text's trailing tables (`id value` lines under each heading)."""
    tables, current = {name: {} for name in _TABLES}, None
    for line in text.splitlines():
        if line in _TABLES:
            current = line
        elif current and line.strip():
            key, _, value = line.strip().partition(" ")
            tables[current][key] = value.strip('"')
        else:
            current = None
    return tables


def _frame(tables: dict, frame_id: str | None) -> str:
    """'file.py:line function' of a stack frame id: the line of Python that made the op."""
    fields = lambda text: dict(re.findall(r"(\w+)=(\d+)", text))  # noqa: E731
    if frame_id not in tables["StackFrames"]:
        return "?"
    frame = fields(tables["StackFrames"][frame_id])
    location = fields(tables["FileLocations"].get(frame["file_location_id"], ""))
    path = tables["FileNames"].get(location.get("file_name_id", ""), "?")
    function = tables["FunctionNames"].get(location.get("function_name_id", ""), "?")
    return f"{Path(path).name}:{location.get('line', '?')} {function.split('.')[-1]}"


def _computations_with_dot(text: str) -> set[str]:
    """Names of the HLO computations (fusion bodies) that contain a dot."""
    names, current = set(), None
    for line in text.splitlines():
        header = re.match(r"^%?([\w.\-]+) \(", line)
        if header:
            current = header.group(1)
        elif current and " dot(" in line:
            names.add(current)
    return names


def source_lines(dump_dir: str) -> dict[tuple[str, str], str]:
    """(module name, instruction name) -> "file:line function: primitive -> output shape", from
    the optimized HLO text of every module XLA dumped (the shape tells the matmuls of one line
    apart: a q projection from an MLP or the LM head)."""
    where = {}
    for path in Path(dump_dir).glob("*after_optimizations.txt"):
        text = path.read_text()
        module = _MODULE.search(text)
        if module is None:
            continue
        tables = _tables(text)
        with_dot = _computations_with_dot(text)
        for line in text.splitlines():
            m = _INSTRUCTION.match(line)
            if not m:
                continue
            meta = dict(re.findall(r'(\w+)=("[^"]*"|\d+)', m.group(3)))
            primitive = meta.get("op_name", '""').strip('"').rsplit("/", 1)[-1]
            called = re.search(r"calls=%?([\w.\-]+)", line)
            if called and called.group(1) in with_dot and primitive != "dot_general":
                primitive += " (fused with a dot_general)"  # a fusion is named by its root op
            source = _frame(tables, meta.get("stack_frame_id"))
            shape = "tuple" if m.group(2).startswith("(") else m.group(2).split("{")[0]
            where.setdefault((module.group(1), m.group(1)), f"{source}: {primitive} -> {shape}")
    return where


def op_times(trace_dir: str) -> dict[tuple[str, str], float]:
    """(module, HLO op) -> total microseconds, from the newest Perfetto trace under trace_dir."""
    path = max(Path(trace_dir).rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    events = json.load(gzip.open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    totals = collections.Counter()
    for e in events:
        args = e.get("args") or {}
        if e.get("ph") == "X" and "hlo_op" in args:
            totals[(args.get("hlo_module", "?"), args["hlo_op"])] += float(e.get("dur", 0.0))
    return totals


def summarise(run, repeats: int) -> collections.Counter:
    """Trace `run()` `repeats` times (after one untraced call that compiles it): microseconds per
    call of every "module  file:line function: primitive -> shape"."""
    run()
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            for _ in range(repeats):
                run()
        totals = op_times(trace_dir)
    where = source_lines(DUMP)
    grouped = collections.Counter()
    for (module, op), us in totals.items():
        grouped[f"{module}  {where.get((module, op), op)}"] += us / repeats
    return grouped


def table(grouped: collections.Counter, top: int) -> list[str]:
    """The `top` largest lines, the rest as "other", then the share of each module and of each
    source file within its module (e.g. how much of a decode step sampling.py is)."""
    everything = sum(grouped.values()) or 1.0
    line = lambda us, name: f"{us / 1e3:10.1f} ms  {100 * us / everything:5.1f}%  {name}"  # noqa: E731
    out = [line(us, name) for name, us in grouped.most_common(top)]
    out.append(line(everything - sum(us for _, us in grouped.most_common(top)), "other"))
    modules, files = collections.Counter(), collections.Counter()
    for name, us in grouped.items():
        module, _, rest = name.partition("  ")
        modules[module] += us
        files[(module, rest.split(":")[0] if ".py:" in rest else "(no source line)")] += us
    out.append("by module, and by source file within it:")
    for module, us in modules.most_common():
        if us < 0.005 * everything:
            break
        out.append(line(us, module))
        for (m, file), file_us in files.most_common():
            if m == module and file_us >= 0.005 * us:
                out.append(f"{'':10}    {100 * file_us / us:5.1f}% of it  {file}")
    return out


def decode_run(cfg: ModelConfig, params, slots: int, new: int):
    engine = decode_engine(cfg, slots, params)
    requests = decode_requests(cfg, slots, new, seed=0)
    return lambda: engine.generate(requests)


def train_run(cfg: ModelConfig, params, rows: int, length: int):
    trainer = grpo_trainer(cfg, params)
    batch = train_batch(rows, length)
    return lambda: trainer.train_step(batch)


def run_step(directory: str, step: int) -> tuple[collections.Counter, dict]:
    """`minirl train` on DIR's work (trl_side_by_side.py's files, minirl's defaults), step `step`
    traced: its microseconds per "module  file:line: primitive -> shape", and its metrics."""
    from trl_side_by_side import WORK, minirl_argv

    from minirl.cli import main as minirl_main
    from minirl.measure.metrics_log import MetricsWriter

    trace_dir, write = tempfile.mkdtemp(prefix="minirl-trace-"), MetricsWriter.write
    traced_step = []  # the traced step's metrics

    def traced(self, metrics, step=None, at=step):  # MetricsWriter.write, then the profiler
        out = write(self, metrics, step=step)
        if step == at - 1:
            jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
        elif step == at:
            jax.profiler.stop_trace()
            traced_step.append(dict(metrics))
        return out

    MetricsWriter.write = traced
    run_dir = Path(tempfile.mkdtemp(prefix="minirl-run-", dir=directory))
    argv = minirl_argv(Path(directory), run_dir, dict(WORK, steps=step))
    if minirl_main(argv) != 0:
        raise SystemExit("minirl train failed")
    where, grouped = source_lines(DUMP), collections.Counter()
    for (module, op), us in op_times(trace_dir).items():
        grouped[f"{module}  {where.get((module, op), op)}"] += us
    return grouped, traced_step[0]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("decode", "train", "run"), help="the step to profile")
    parser.add_argument("dir", nargs="?", help="run: the side-by-side benchmark's work directory")
    parser.add_argument("--step", type=int, default=3, help="run: the step traced (default 3)")
    parser.add_argument("--shape", default="qwen2.5-0.5b", help="a ModelConfig preset")
    parser.add_argument("--dtype", default="float32", help="storage dtype (compute is float32)")
    parser.add_argument("--slots", type=int, default=32, help="decode: slots (default 32)")
    parser.add_argument("--new", type=int, default=40, help="decode: new tokens per request")
    parser.add_argument("--rows", type=int, default=4, help="train: rows (default 4)")
    parser.add_argument("--length", type=int, default=128, help="train: tokens per row")
    parser.add_argument("--repeats", type=int, default=2, help="traced calls (default 2)")
    parser.add_argument("--top", type=int, default=15, help="lines to print (default 15)")
    args = parser.parse_args(argv)
    if args.what == "run":
        if not args.dir or args.step < 2:
            parser.error("run needs DIR (trl_side_by_side.py --rounds 0 --dir DIR) and --step >= 2")
        grouped, m = run_step(args.dir, args.step)
        walls = {k: m[f"time/{k}"] for k in ("step", "generate", "train")}
        print(f"step {args.step} of minirl train on {args.dir}, wall seconds {walls}")
        print("ms of op time (summed over threads: over a phase's wall, the cores it kept busy)")
        print("\n".join(table(grouped, args.top)))
        return
    cfg = ModelConfig.preset(args.shape, dtype="float32", param_dtype=args.dtype)
    params = nnx.to_pure_dict(nnx.split(init_model(cfg, seed=0))[1])
    if args.what == "decode":
        run = decode_run(cfg, params, args.slots, args.new)
        per = f"generate({args.slots} slots x {args.new} new tokens)"
    else:
        run = train_run(cfg, params, args.rows, args.length)
        per = f"train_step({args.rows} x {args.length})"
    del params
    print(f"{args.shape} {args.dtype}: ms per {per}, by HLO module and source line")
    print("\n".join(table(summarise(run, args.repeats), args.top)))


if __name__ == "__main__":
    main()
