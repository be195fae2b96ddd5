"""Sandbox benchmark: code rewards per second, per test form and isolation, side by side.

The honest `add(a, b)` program (and the stdin/stdout sum program), scored --programs times per
row with code_reward, `max_concurrent()` at a time (the usable cores), as a code team's rollout
scores its completions. Rows:
- asserts (3 free-form asserts), calls (3 call cases), io (3 stdin/stdout cases, so 3 processes
  per program), script (no tests: one start, the floor);
- each under bubblewrap (where it runs here) and on the audit-hook fallback, in the same run.
programs/s = programs / wall seconds of the row; ms/program = 1000 / that x concurrency (one
program's latency). `vs fallback` is the bwrap row's programs/s over the fallback's.

    .venv/bin/python bench/sandbox.py [--json] [--programs 200]

With --json the last line is one JSON object: per row programs_per_s and ms_per_program, and
the isolation in force. The code before issue 37 (asserts appended to the program, no call or
io forms, no bwrap) is measured by running this script against an older tree:
PYTHONPATH=<old checkout> python bench/sandbox.py; it then runs the asserts and script rows,
and io as `stdin=` runs compared here (what a user did then).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time

from flexmarl import rewards
from flexmarl.rewards import code_reward, max_concurrent, run_python

ADD = "def add(a, b):\n    return a + b\n"
SUM = "a, b = map(int, input().split())\nprint(a + b)\n"
ASSERTS = "assert add(1, 2) == 3\nassert add(-5, 5) == 0\nassert add(10, 32) == 42"
IO = [("1 2\n", "3"), ("-5 5\n", "0"), ("10 32\n", "42")]
CALLS = [("add(1, 2)", 3), ("add(-5, 5)", 0), ("add(10, 32)", 42)]
LIMITS = {"cpu_s": 2.0, "wall_s": 10.0, "memory_mb": 256}
NEW_API = hasattr(rewards, "IOCase")


async def score(form: str) -> float:
    if form == "asserts":
        return await code_reward(ADD, ASSERTS, **LIMITS)
    if form == "script":
        return await code_reward(ADD, "", **LIMITS)
    if form == "calls":
        return await code_reward(ADD, CALLS, **LIMITS)
    if NEW_API:
        return await code_reward(SUM, [rewards.IOCase(i, o) for i, o in IO], **LIMITS)
    for stdin, out in IO:  # the old way: one stdin= run per case, compared by the caller
        result = await run_python(SUM, stdin=stdin, **LIMITS)
        if not (result.passed and result.stdout.split() == out.split()):
            return 0.0
    return 1.0


async def row(form: str, programs: int) -> dict:
    await score(form)  # warm: the isolation probe, imports
    start = time.perf_counter()
    scores = await asyncio.gather(*(score(form) for _ in range(programs)))
    wall = time.perf_counter() - start
    assert all(s == 1.0 for s in scores), f"{form}: the honest program did not pass"
    rate = programs / wall
    return {"programs_per_s": rate, "ms_per_program": 1000.0 / rate * max_concurrent()}


def fallback() -> None:
    """Make the sandbox believe bwrap is missing (the audit-hook path)."""
    from flexmarl.rewards import confinement
    confinement._state.clear()
    confinement._candidates = lambda: []


async def main(args: argparse.Namespace) -> dict:
    forms = ["asserts", "calls", "io", "script"] if NEW_API else ["asserts", "io", "script"]
    out: dict = {"api": "new" if NEW_API else "old", "programs": args.programs,
                 "concurrency": max_concurrent(), "rows": {}}
    if NEW_API:
        found = rewards.isolation()
        out["isolation"] = found.mechanism
        kinds = ["bwrap", "fallback"] if found.mechanism == "bwrap" else ["fallback"]
    else:
        kinds = ["old"]
    for kind in kinds:
        if kind == "fallback":
            fallback()
        for form in forms:
            out["rows"][f"{form}/{kind}"] = await row(form, args.programs)
    print(f"code rewards, {args.programs} programs per row, {max_concurrent()} at a time "
          f"({'this tree' if NEW_API else 'old API'})")
    print(f"{'form':8s} {'isolation':9s} {'programs/s':>10s} {'ms/program':>10s} "
          f"{'vs fallback':>11s}")
    for key, r in out["rows"].items():
        form, kind = key.split("/")
        base = out["rows"].get(f"{form}/fallback")
        ratio = f"{r['programs_per_s'] / base['programs_per_s']:10.2f}x" if (
            base and kind == "bwrap") else ""
        print(f"{form:8s} {kind:9s} {r['programs_per_s']:10.1f} {r['ms_per_program']:10.1f} "
              f"{ratio:>11s}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--programs", type=int, default=200)
    parsed = ap.parse_args()
    result = asyncio.run(main(parsed))
    if parsed.json:
        print(json.dumps(result))
