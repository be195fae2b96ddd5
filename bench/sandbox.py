"""Sandbox benchmark: code rewards per second, per test form and isolation, side by side.

The honest `add(a, b)` program (and the stdin/stdout sum program), scored --programs times per
row with code_reward, `max_concurrent()` at a time (the usable cores), as a code team's rollout
scores its completions. Rows:
- asserts (3 free-form asserts), calls (3 call cases), io (3 stdin/stdout cases, so 3 processes
  per program), script (no tests: one start, the floor);
- each under bubblewrap (where it runs here) and on the audit-hook fallback, in the same run.
programs/s = programs / wall seconds of the row; ms/program = 1000 / that x concurrency (one
program's latency). `vs fallback` is the bwrap row's programs/s over the fallback's.

    .venv/bin/python bench/sandbox.py [--json] [--programs 200] [--baseline REF]

With --baseline REF (a git revision, e.g. the commit before a change), the same rows are
measured on that revision's code in the same invocation (a temporary `git worktree`, run as a
child process of this script with PYTHONPATH on it), row by row alternating this tree and the
baseline, and a `vs base` column gives this tree's programs/s over the baseline's.

With --json the last line is one JSON object: per row programs_per_s and ms_per_program, the
isolation in force, and with a baseline its rows and the ratios. The code before issue 37
(asserts appended to the program, no call or io forms, no bwrap) is measured by running this
script against an older tree: PYTHONPATH=<old checkout> python bench/sandbox.py; it then runs
the asserts and script rows, and io as `stdin=` runs compared here (what a user did then).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
    """Make the sandbox believe bwrap is missing (the audit-hook path), and opt into it (a tree
    of issue 61 or later refuses it otherwise)."""
    from flexmarl.rewards import confinement
    confinement._state.clear()
    confinement._candidates = lambda: []
    if hasattr(confinement, "allow_unsafe_sandbox"):
        confinement.allow_unsafe_sandbox(True)


def rows() -> list[tuple[str, str]]:
    forms = ["asserts", "calls", "io", "script"] if NEW_API else ["asserts", "io", "script"]
    if NEW_API:
        kinds = ["bwrap", "fallback"] if rewards.isolation().mechanism == "bwrap" else [
            "fallback"]
    else:
        kinds = ["old"]
    return [(form, kind) for kind in kinds for form in forms]


async def measure(form: str, kind: str, programs: int) -> dict:
    if kind == "fallback":
        fallback()
    return await row(form, programs)


class Baseline:
    """The same script on another revision's code, one row at a time, in a child process."""

    def __init__(self, ref: str) -> None:
        root = Path(__file__).resolve().parent.parent
        self.dir = tempfile.mkdtemp(prefix="flexmarl-bench-base-")
        subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", self.dir, ref],
                       check=True, capture_output=True)
        self.root, self.ref = root, ref

    def row(self, form: str, kind: str, programs: int) -> dict | None:
        env = {**os.environ, "PYTHONPATH": self.dir}
        done = subprocess.run([sys.executable, __file__, "--row", f"{form}/{kind}",
                               "--programs", str(programs)], env=env, capture_output=True,
                              text=True, cwd=self.dir)
        if done.returncode != 0:
            print(f"baseline {self.ref} row {form}/{kind} failed: {done.stderr[-500:]}")
            return None
        return json.loads(done.stdout.strip().splitlines()[-1])

    def close(self) -> None:
        subprocess.run(["git", "-C", str(self.root), "worktree", "remove", "--force", self.dir],
                       capture_output=True)


async def main(args: argparse.Namespace) -> dict:
    out: dict = {"api": "new" if NEW_API else "old", "programs": args.programs,
                 "concurrency": max_concurrent(), "rows": {}}
    if NEW_API:
        out["isolation"] = rewards.isolation().mechanism
    base = Baseline(args.baseline) if args.baseline else None
    if base:
        out["baseline"], out["baseline_rows"], out["vs_baseline"] = args.baseline, {}, {}
    try:
        for form, kind in rows():
            key = f"{form}/{kind}"
            out["rows"][key] = await measure(form, kind, args.programs)
            if base:
                # The fallback row of this tree ran last: the baseline runs in a fresh process.
                theirs = base.row(form, kind, args.programs)
                if theirs:
                    out["baseline_rows"][key] = theirs
                    out["vs_baseline"][key] = round(out["rows"][key]["programs_per_s"] /
                                                    theirs["programs_per_s"], 2)
    finally:
        if base:
            base.close()
    print(f"code rewards, {args.programs} programs per row, {max_concurrent()} at a time "
          f"({'this tree' if NEW_API else 'old API'}"
          f"{f'; baseline {args.baseline} in the same run' if base else ''})")
    print(f"{'form':8s} {'isolation':9s} {'programs/s':>10s} {'ms/program':>10s} "
          f"{'vs fallback':>11s}" + (f" {'base p/s':>9s} {'vs base':>8s}" if base else ""))
    for key, r in out["rows"].items():
        form, kind = key.split("/")
        other = out["rows"].get(f"{form}/fallback")
        ratio = f"{r['programs_per_s'] / other['programs_per_s']:10.2f}x" if (
            other and kind == "bwrap") else ""
        line = (f"{form:8s} {kind:9s} {r['programs_per_s']:10.1f} {r['ms_per_program']:10.1f} "
                f"{ratio:>11s}")
        if base and key in out["baseline_rows"]:
            line += (f" {out['baseline_rows'][key]['programs_per_s']:9.1f} "
                     f"{out['vs_baseline'][key]:7.2f}x")
        print(line)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--programs", type=int, default=200)
    ap.add_argument("--baseline", default="",
                    help="a git revision to measure side by side (e.g. HEAD~1)")
    ap.add_argument("--row", default="", help=argparse.SUPPRESS)  # one row, as JSON (baseline)
    parsed = ap.parse_args()
    if parsed.row:
        form, kind = parsed.row.split("/")
        print(json.dumps(asyncio.run(measure(form, kind, parsed.programs))))
        sys.exit(0)
    result = asyncio.run(main(parsed))
    if parsed.json:
        print(json.dumps(result))
