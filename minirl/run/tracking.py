"""Where a run's numbers go besides metrics.jsonl: TensorBoard, Weights & Biases, and samples.

    trackers = Trackers.open(cfg, run_dir, step=0)   # what `log.*` turns on; step: resumed at
    trackers.log(metrics, step)                      # the same keys as metrics.jsonl
    trackers.samples(rows, step)                     # a few rollouts: samples.jsonl, text, table
    trackers.close()

TensorBoard (`log.tensorboard=true`, the `track` extra: tensorboardX, no TensorFlow) writes event
files to RUN_DIR/tensorboard. Keys are metrics.jsonl's ("train/loss", "reward/mean", "eval/pass@1"),
so TensorBoard groups them into panes by their prefix; characters TensorBoard does not allow
in a tag become "_" (`tensorboard_tag`: "lag/[1,3)/tokens" -> "lag/_1_3__tokens"). A resumed run opens its writer with
`purge_step` = the first step it will redo: TensorBoard's reader then drops the points a killed
attempt wrote for those steps, so every curve has one point per step.

W&B (`log.wandb=PROJECT`, the same extra) logs into RUN_DIR/wandb, offline unless an API key is
configured (WANDB_API_KEY or `wandb login`) or WANDB_MODE says otherwise. The W&B run's id is
kept in RUN_DIR/wandb.json, so a resumed run continues the same W&B run; its config holds the run
directory, and wandb.json its URL (both ways linked). W&B keeps the first point logged at a step;
a redone step's second point is dropped by W&B (in lockstep runs the two are equal).

Samples: every `log.samples_every` steps, `log.samples_per_step` rollouts of the batch just
trained on (prompt, completion, reward, the verifier's reason, length, weight versions, lag) go
to RUN_DIR/samples.jsonl, to TensorBoard as text and to W&B as a table; `minirl samples RUN_DIR`
prints them.

A tracker never stops training: an error (a full disk, W&B's network) is reported once through
`log` and that tracker is off for the rest of the run. A tracker that is asked for but not
installed is a ConfigError naming the extra, raised before any work.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from minirl.configlib import optional_import, read_json_object, to_dict
from minirl.measure.metrics_log import MetricsWriter, flatten_metrics
from minirl.store.hashed_files import atomic_write

SAMPLES_FILE = "samples.jsonl"
WANDB_FILE = "wandb.json"


def sample_rows(groups: Sequence, n: int, version: int) -> list[dict[str, Any]]:
    """`n` rollouts of a trained batch, spread over its groups (group i % G, then the next
    sample), as flat records. `version`: the weight version the step produced (lag = version -
    1 - the oldest token's version, as the controller counts it)."""
    rows = []
    for i in range(min(n, sum(len(g.rollouts) for g in groups))):
        group = groups[i % len(groups)]
        if i // len(groups) >= len(group.rollouts):
            continue
        r = group.rollouts[i // len(groups)]
        score = r.score
        rows.append(
            {
                "uid": int(r.prompt.uid),
                "sample": int(r.sample_index),
                "task": r.prompt.task,
                "prompt": r.prompt.text,
                "completion": r.text,
                "reward": float(score.reward) if score else None,
                "reason": score.reason if score else "",
                "length": int(len(r.tokens)),
                "finish": r.finish_reason,
                "oldest_version": r.oldest_version,
                "newest_version": int(r.versions.max()) if len(r.versions) else -1,
                "lag": version - 1 - r.oldest_version,
            }
        )
    return rows


class _TensorBoard:
    name = "tensorboard"

    def __init__(self, run_dir: Path, cfg, step: int):
        from tensorboardX import SummaryWriter

        # purge_step: events of steps >= step+1 written by an earlier attempt are dropped
        # a random suffix: a resume within the same second must not reuse (overwrite) the
        # file of the attempt before it, whose name has the same time and host
        self.writer = SummaryWriter(
            str(run_dir / "tensorboard"),
            purge_step=step + 1,
            flush_secs=10,
            filename_suffix="." + secrets.token_hex(4),
        )
        if step == 0:
            self._config(cfg)

    def _config(self, cfg) -> None:
        from tensorboardX.summary import hparams

        flat = {
            k: v if isinstance(v, int | float | str | bool) else json.dumps(v)
            for k, v in flatten_config(to_dict(cfg)).items()
        }
        for summary in hparams(flat, {"reward/mean": 0.0}):
            self.writer.file_writer.add_summary(summary)
        text = json.dumps(to_dict(cfg), indent=2)
        self.writer.add_text("config", "```\n" + text + "\n```", 0)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            if value is not None:
                self.writer.add_scalar(tensorboard_tag(key), value, step)
        self.writer.flush()  # a killed run keeps every step it logged

    def samples(self, rows: Sequence[dict], step: int) -> None:
        blocks = [
            f"**reward {r['reward']}** ({r['reason']}), {r['length']} tokens, lag "
            f"{r['lag']}\n\n```\n{r['prompt']}\n```\n```\n{r['completion']}\n```"
            for r in rows
        ]
        self.writer.add_text("samples", "\n\n---\n\n".join(blocks), step)

    def close(self) -> None:
        self.writer.close()


class _WandB:
    name = "wandb"

    def __init__(self, run_dir: Path, cfg, step: int):
        import wandb

        link = read_json_object(run_dir / WANDB_FILE) or {}
        run_id = link.get("id") or secrets.token_hex(6)
        mode = os.environ.get("WANDB_MODE") or ("online" if _wandb_key() else "offline")
        self.wandb = wandb
        self.run = wandb.init(
            project=cfg.log.wandb,
            id=run_id,
            resume="allow",
            mode=mode,
            dir=str(run_dir),
            config={**to_dict(cfg), "run_dir": str(run_dir.resolve())},
            settings=wandb.Settings(silent=True),
        )
        url = self.run.get_url() if mode == "online" else None
        link = {
            "id": run_id,
            "project": cfg.log.wandb,
            "mode": mode,
            "url": url,
            "dir": str(Path(self.run.dir).parent),
        }
        atomic_write(run_dir / WANDB_FILE, json.dumps(link, indent=2).encode())

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log({k: v for k, v in metrics.items() if v is not None}, step=step)

    def samples(self, rows: Sequence[dict], step: int) -> None:
        columns = list(rows[0]) if rows else []
        table = self.wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows])
        self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        self.run.finish()


def tensorboard_tag(key: str) -> str:
    """A metrics.jsonl key as a TensorBoard tag (letters, digits, "_", "-", ".", "/")."""
    return re.sub(r"[^-/\w.]", "_", key)


def _wandb_key() -> bool:
    """Whether W&B has credentials here (then the run goes online)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        import netrc

        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def flatten_config(d: Mapping, prefix: str = "") -> dict[str, Any]:
    """{"rl": {"steps": 3}} -> {"rl.steps": 3}."""
    out = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        out |= flatten_config(value, name + ".") if isinstance(value, Mapping) else {name: value}
    return out


def check_available(cfg) -> None:
    """ConfigError (naming the extra) if `log.*` asks for a tracker that is not installed."""
    wanted = {
        "tensorboard": ("tensorboardX", cfg.log.tensorboard),
        "wandb": ("wandb", bool(cfg.log.wandb)),
    }
    for setting, (module, on) in wanted.items():
        if on:
            optional_import(module, "track", f"log.{setting}")


class Trackers:
    """The trackers `cfg.log` turns on, plus samples.jsonl; each call goes to all of them."""

    def __init__(self, cfg, run_dir, log: Callable[[str], None] = print):
        self.cfg, self.run_dir, self._log = cfg, Path(run_dir), log
        self.parts: list = []
        self._samples = MetricsWriter(run_dir, SAMPLES_FILE)

    @classmethod
    def open(cls, cfg, run_dir, step: int = 0, log: Callable[[str], None] = print) -> Trackers:
        """Start the trackers of a run that continues after `step` (0: a fresh run)."""
        check_available(cfg)
        trackers = cls(cfg, run_dir, log)
        for kind, on in ((_TensorBoard, cfg.log.tensorboard), (_WandB, bool(cfg.log.wandb))):
            if on:
                try:
                    trackers.parts.append(kind(trackers.run_dir, cfg, step))
                except Exception as e:  # noqa: BLE001 - a tracker must never stop training
                    trackers._report(kind.name, e)
        return trackers

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        flat = {k: v for k, v in flatten_metrics(metrics).items() if v == v}  # nan: skipped
        self._each("log", flat, step)

    def samples_due(self, step: int) -> bool:
        every = self.cfg.log.samples_every
        return bool(every) and step % every == 0

    def samples(self, rows: Sequence[dict], step: int) -> None:
        for row in rows:
            self._samples.write_record({"step": step, **row})
        self._each("samples", rows, step)

    def close(self) -> None:
        self._samples.close()
        self._each("close")
        self.parts = []

    def _each(self, method: str, *args) -> None:
        for part in list(self.parts):
            try:
                getattr(part, method)(*args)
            except Exception as e:  # noqa: BLE001 - a tracker must never stop training
                self._report(part.name, e)
                self.parts.remove(part)

    def _report(self, name: str, error: Exception) -> None:
        self._log(
            f"{name} logging failed ({type(error).__name__}: {error}); the run goes on "
            f"without {name}"
        )
