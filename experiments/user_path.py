"""Issue #15's proof: the user's path learns. A base model directory and word-problem files in,
`minirl train --model ... --data ... --verifier math` for each seed, a table out.

    python experiments/user_path.py --seeds 0 1 2      # ~12 min a seed on 2 cores
    python experiments/user_path.py --out runs/user_path_lora --set model.lora_rank=16 \\
        --set trainer.learning_rate=3e-3                   # the same with LoRA adapters

Builds (or reuses) the base with experiments/make_base_model.py, then runs the command a user
runs, once per seed, in a fresh process each:

    minirl train --model BASE --data BASE/data/train.jsonl --eval-data BASE/data/test.jsonl \\
        --verifier math --run-dir OUT/seed-S --set rl.seed=S <the settings below>

and prints held-out pass@1 / pass@8 before and after RL (200 test problems x 8 samples, the same
prompts and sampling keys before and after), the bar (the base's pass@8), the RL wall time and
the steps it took, and whether `minirl export` of the result loads in transformers with equal
logits (when transformers is installed). The settings are lesson 12's full mode.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tutorials"))
sys.path.insert(0, str(HERE))


def main(argv=None) -> list[dict]:
    lesson = __import__("12_your_own_model")
    import make_base_model

    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", type=Path, default=Path("runs/user_path"))
    p.add_argument(
        "--set",
        dest="extra",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="more overrides after lesson 12's, e.g. --set model.lora_rank=16 (repeatable)",
    )
    args = p.parse_args(argv)
    base = make_base_model.build(args.out / "base", make_base_model.Build())
    rows = []
    for seed in args.seeds:
        run_dir = args.out / f"seed-{seed}"
        cmd = [
            "minirl",
            "train",
            "--quiet",
            "--model",
            str(base),
            "--data",
            str(base / "data/train.jsonl"),
            "--eval-data",
            str(base / "data/test.jsonl"),
            "--verifier",
            "math",
            "--run-dir",
            str(run_dir),
            "--set",
            f"rl.seed={seed}",
        ]
        for item in lesson.COMMON + lesson.FULL["overrides"] + args.extra:
            cmd += ["--set", item]
        done = run_dir / "summary.json"
        if done.exists() and json.loads(done.read_text()).get("stopped") == "steps":
            print(f"{run_dir}: already trained, reused", flush=True)
        else:
            print("$", " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        summary = json.loads(done.read_text())
        exported = args.out / f"seed-{seed}-exported"  # beside the run: export refuses inside it
        subprocess.run(
            ["minirl", "export", str(run_dir), "--out", str(exported), "--force"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        row = {
            "seed": seed,
            "before": summary["before"],
            "after": summary["after"],
            "steps": summary["counters"]["steps"],
            "rl_seconds": summary["rl_seconds"],
            "transformers": lesson.compare_with_transformers(exported),
        }
        rows.append(row)
        print(json.dumps(row, default=float), flush=True)
    print(
        f"\n{'seed':>4s} {'base pass@1':>11s} {'bar: base pass@8':>16s} {'RL pass@1':>9s} "
        f"{'RL pass@8':>9s} {'steps':>5s} {'RL s':>5s}  reached"
    )
    for r in rows:
        b, a = r["before"], r["after"]
        print(
            f"{r['seed']:4d} {b['pass@1']:11.3f} {b['pass@8']:16.3f} {a['pass@1']:9.3f} "
            f"{a['pass@8']:9.3f} {r['steps']:5d} {r['rl_seconds']:5.0f}  {a['pass@1'] >= b['pass@8']}"
        )
    (args.out / "results.json").write_text(json.dumps(rows, indent=2, default=float))
    return rows


if __name__ == "__main__":
    main()
