"""metrics.jsonl: one JSON object per training step, flat "a/b/c" keys; and metrics as text tables.

The controller writes a record per step (`MetricsWriter`), `minirl plot` and the tutorials read
them back (`read_metrics`). Non-finite values are written as null, a torn last line (a crash in
mid-write) is skipped (and moved to a side file when the run resumes: `truncate_metrics`), and
an I/O error becomes a warning: metrics never stop a run.

`format_table(rows, columns)` prints metrics (dicts) as a plain-text table; `minirl diagnose`,
the lag table of `minirl plot` and the experiments' summaries all print through it.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from minirl.store.hashed_files import atomic_write

METRICS_FILE = "metrics.jsonl"

# Keys that measure the machine, not the run (clocks, rates, the process's peak memory): they differ
# between any two runs, a resumed one and its uninterrupted twin included; every other key replays.
MACHINE_KEYS = ("time", "per_s", "busy_seconds", "memory/")


def measures_the_machine(key: str) -> bool:
    """True for a metric that is a reading of the machine (see MACHINE_KEYS), not of the run."""
    return any(part in key for part in MACHINE_KEYS)


def replayed(record: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a metrics record that a replay of the same steps reproduces exactly."""
    return {k: v for k, v in record.items() if not measures_the_machine(k)}


def _scalar(value) -> float | None:
    if isinstance(value, (bool, int, float, np.number)):
        return float(value)
    if isinstance(value, np.ndarray) or hasattr(value, "__array__"):
        arr = np.asarray(value)
        if arr.size == 1 and arr.dtype.kind in "biuf":
            return float(arr.reshape(()))
    return None


def flatten_metrics(nested: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """{"lag": {"[1,3)": {"mean_rho": 1.0}}} -> {"lag/[1,3)/mean_rho": 1.0}.

    Leaves that are numbers (Python, numpy or JAX scalars, size-1 arrays) become floats,
    non-finite ones included; anything else (longer arrays, strings, None) is left out.
    """
    flat: dict[str, float] = {}
    for key, value in nested.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat |= flatten_metrics(value, name)
        elif (x := _scalar(value)) is not None:
            flat[name] = x
    return flat


class MetricsWriter:
    """Appends one JSON object per step to `run_dir/metrics.jsonl`, flushed line by line.

    Each line holds "step" (when given), "wall_time" (`clock()`, seconds) and the flattened
    metrics; nan and inf are written as null. The file is opened on the first write (nothing
    happens in the constructor). If a crash left a torn last line, the first write starts a new
    line, so the fragment stays one skippable line. An OSError while writing is turned into a
    warning: metrics never stop a run.
    """

    def __init__(
        self, run_dir, filename: str = METRICS_FILE, clock: Callable[[], float] = time.time
    ):
        self.path = Path(run_dir) / filename
        self._clock = clock
        self._file = None

    def _open(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torn = False
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, "rb") as f:
                f.seek(-1, 2)
                torn = f.read(1) != b"\n"
        self._file = open(self.path, "a", encoding="utf-8")  # closed in close()
        if torn:
            self._file.write("\n")

    def write(self, metrics: Mapping[str, Any], step: int | None = None) -> dict[str, Any]:
        """Write one line; returns the record as written (None for non-finite values)."""
        record: dict[str, Any] = {} if step is None else {"step": int(step)}
        record["wall_time"] = float(self._clock())
        for k, v in flatten_metrics(metrics).items():
            record[k] = v if math.isfinite(v) else None
        return self.write_record(record)

    def write_record(self, record: Mapping[str, Any]) -> Mapping[str, Any]:
        """Write `record` (JSON-able, strings included) as one line, as it is."""
        try:
            if self._file is None:
                self._open()
            self._file.write(json.dumps(record, allow_nan=False, default=str) + "\n")
            self._file.flush()
        except (OSError, ValueError) as err:
            warnings.warn(f"MetricsWriter: could not write {self.path}: {err}", stacklevel=3)
        return record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(run_dir, filename: str = METRICS_FILE) -> list[dict[str, Any]]:
    """The records of `run_dir/metrics.jsonl`, in file order ([] if there is no file).

    Null values come back as None. A last line that is not a JSON object (a write torn by a
    crash) is skipped silently; a bad line elsewhere is skipped with a warning.
    """
    path = Path(run_dir) / filename
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        if isinstance(rec, dict):
            records.append(rec)
        elif i < len(lines) - 1:
            warnings.warn(f"{path}:{i + 1}: skipped a line that is not a JSON object", stacklevel=2)
    return records


def truncate_metrics(run_dir, step: int, filename: str = METRICS_FILE) -> Path | None:
    """Drop the lines of steps after `step` (they are about to be redone): the file is cut at
    the first record with a larger step, or, if there is none, after the last record; damaged
    lines after that point are a torn write of a step being redone, and go with it. A damaged
    line in the kept part (a torn write, anything that is not a JSON object) would stay in the
    file for good, so it is moved aside: its bytes go to a side file `<filename>.torn-<n>`
    first, then the file is rewritten without it (both atomically). Every record is kept byte
    for byte. Returns the side file, or None when nothing was damaged."""
    path = Path(run_dir) / filename
    if not path.exists():
        return None
    lines = path.read_bytes().splitlines(keepends=True)
    cut, last_record = None, 0
    for i, line in enumerate(lines):
        if not _is_record(line):
            continue
        rec = json.loads(line)
        if isinstance(rec.get("step"), int) and rec["step"] > step:
            cut = i
            break
        last_record = i + 1
    kept = lines[: last_record if cut is None else cut]
    damaged = [line for line in kept if line.strip() and not _is_record(line)]
    side = None
    if damaged:
        side = _free_name(path, ".torn-")
        atomic_write(side, b"".join(damaged))
    text = b"".join(line for line in kept if _is_record(line))
    if text and not text.endswith(b"\n"):
        text += b"\n"
    atomic_write(path, text)
    return side


def _is_record(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


def _free_name(path: Path, infix: str) -> Path:
    """`path` + infix + the first unused number (1, 2, ...): earlier side files are kept."""
    n = 1
    while path.with_name(f"{path.name}{infix}{n}").exists():
        n += 1
    return path.with_name(f"{path.name}{infix}{n}")


# ----------------------------------------------------------------------------- text tables


def cell(value, fmt: str = "{}") -> str:
    """One table cell: None or nan -> "–", anything else `fmt.format(value)`."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return fmt.format(value)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """`rows` (dicts) as a plain-text table: a header, a rule, one line per row.

    `columns` are (title, key, format), e.g. ("p95", "p95_abs_dlogp", "{:.2e}"). A column is as
    wide as its widest cell; columns of numbers are right-aligned, others left-aligned; a
    missing key or a nan prints "–".
    """
    cells = [[cell(r.get(key), fmt) for _, key, fmt in columns] for r in rows]
    numeric = [
        all(isinstance(r.get(key), (int, float, type(None))) for r in rows) for _, key, _ in columns
    ]
    widths = [
        max([len(title)] + [len(c[i]) for c in cells]) for i, (title, _, _) in enumerate(columns)
    ]

    def line(texts) -> str:
        parts = [
            t.rjust(w) if n else t.ljust(w) for t, w, n in zip(texts, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    head = line([title for title, _, _ in columns])
    return "\n".join([head, "-" * len(head), *(line(c) for c in cells)])
