"""Writes arithmetic.jsonl beside this file: the example task file of `team.tasks`.

    python agents/data/make_arithmetic.py

400 additions "Compute a+b." with answer "a+b" (the prompt form the built-in models are
warm-started on): 340 with two 2-digit operands (10-99) and 60 with two 1-digit ones (0-9), no
sum asked twice, in a shuffled order so that the first rows (team.limit) mix both. The operands
are columns too (`a`, `b`): the default team's workflow (agents/smol_duo.py) reads task.a and
task.b, so it trains on this file as it is. The draw is seeded, so running this again writes the
same bytes.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).with_name("arithmetic.jsonl")
TWO_DIGIT, ONE_DIGIT = 340, 60
SEED = "flexmarl.arithmetic-jsonl:0"


def rows() -> list[dict]:
    rng = random.Random(SEED)
    pairs = {2: rng.sample([(a, b) for a in range(10, 100) for b in range(10, 100)], TWO_DIGIT),
             1: rng.sample([(a, b) for a in range(10) for b in range(10)], ONE_DIGIT)}
    problems = [(digits, a, b) for digits, drawn in pairs.items() for a, b in drawn]
    rng.shuffle(problems)
    return [{"id": f"arith-{i:03d}", "prompt": f"Compute {a}+{b}.", "answer": str(a + b),
             "a": a, "b": b, "op": "+", "digits": digits}
            for i, (digits, a, b) in enumerate(problems)]


def text() -> str:
    return "".join(json.dumps(row) + "\n" for row in rows())


if __name__ == "__main__":
    OUT.write_text(text(), encoding="ascii")
    print(f"wrote {OUT} ({TWO_DIGIT + ONE_DIGIT} rows)")
