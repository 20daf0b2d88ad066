"""GSM8K-like word problems, generated: quantities in sentences, two reasoning steps, a number.

    python experiments/word_problems.py --out data/wp --train 20000 --test 500
    # -> data/wp/train.jsonl, data/wp/test.jsonl: {"question": ..., "answer": "...\\n#### 42"}

Why: no dataset may be downloaded here, yet issue #15's proof must run the user's path on a
file of word problems with worked solutions, as GSM8K is. This generator writes such a file.
Five templates (buy and give away, packs of items, boxes plus loose items, wages minus spending,
sharing equally then more), with names, objects and small numbers varied; each solution is two
lines of arithmetic and the GSM8K gold line `#### N` (and `solution_text`: the same lines ending
in `\\boxed{N}`, what a model is taught to write).

Deterministic by construction: problem i of a split is a pure function of (seed, split, i)
(numpy Philox keyed on a hash, as minirl/data/task_api.py draws its tasks), and the split of a
problem is a hash of its text, so train and test never share a problem.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from minirl.data.task_api import split_of, stream

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jin", "Kai", "Lea"]
THINGS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "coins", "shells"]
TEST_FRACTION = 0.05


def _problem(rng: np.random.Generator) -> tuple[str, list[str], int]:
    """(question, reasoning lines, answer) for one random template."""
    name, thing = NAMES[rng.integers(len(NAMES))], THINGS[rng.integers(len(THINGS))]
    a, b, c = (int(x) for x in rng.integers(2, 10, 3))
    kind = int(rng.integers(5))
    if kind == 0:
        c = min(c, a + b - 1)
        q = (
            f"{name} has {a} {thing}. {name} buys {b} more and then gives {c} away. "
            f"How many {thing} does {name} have now?"
        )
        return q, [f"{a} + {b} = {a + b}", f"{a + b} - {c} = {a + b - c}"], a + b - c
    if kind == 1:
        c = min(c, a * b - 1)
        q = (
            f"{name} buys {a} packs of {thing}. Each pack has {b} {thing}. {name} loses {c} of "
            f"them. How many {thing} are left?"
        )
        return q, [f"{a} * {b} = {a * b}", f"{a * b} - {c} = {a * b - c}"], a * b - c
    if kind == 2:
        q = (
            f"A box holds {a} {thing}. {name} has {b} full boxes and {c} loose {thing}. "
            f"How many {thing} does {name} have in all?"
        )
        return q, [f"{a} * {b} = {a * b}", f"{a * b} + {c} = {a * b + c}"], a * b + c
    if kind == 3:
        c = min(c, a * b - 1)
        q = (
            f"{name} earns {a} dollars an hour and works {b} hours. Then {name} spends {c} "
            f"dollars. How many dollars does {name} have left?"
        )
        return q, [f"{a} * {b} = {a * b}", f"{a * b} - {c} = {a * b - c}"], a * b - c
    total = a * b
    q = (
        f"{name} shares {total} {thing} equally among {b} friends. Then each friend finds {c} "
        f"more. How many {thing} does each friend have?"
    )
    return q, [f"{total} / {b} = {a}", f"{a} + {c} = {a + c}"], a + c


def problem(seed: int, split: str, index: int) -> dict:
    """Problem `index` of `split`: the first draw (attempt 0, 1, ...) whose text hashes there."""
    for attempt in range(1000):
        question, lines, answer = _problem(stream("word-problems", seed, split, index, attempt))
        if split_of("word-problems", question, TEST_FRACTION) == split:
            return {
                "question": question,
                "answer": "\n".join(lines) + f"\n#### {answer}",
                "solution_text": "\n".join(lines) + f"\nThe answer is \\boxed{{{answer}}}.",
            }
    raise RuntimeError(f"no {split} problem found for index {index}")


def write(out: Path, split: str, count: int, seed: int) -> Path:
    """Write `count` problems of `split` to out/<split>.jsonl (distinct questions)."""
    out.mkdir(parents=True, exist_ok=True)
    path, seen = out / f"{split}.jsonl", set()
    with open(path, "w") as f:
        i = 0
        while len(seen) < count:
            row = problem(seed, split, i)
            i += 1
            if row["question"] not in seen:
                seen.add(row["question"])
                f.write(json.dumps(row) + "\n")
    return path


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--train", type=int, default=20000)
    p.add_argument("--test", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for split, count in (("train", args.train), ("test", args.test)):
        print(write(args.out, "test" if split == "test" else "train", count, args.seed))


if __name__ == "__main__":
    main()
