"""Reward-hack report: which programs of the corpus (tests/reward_hacks.py) earn a code reward,
per test form, under the isolation in force here and on the audit-hook fallback.

    .venv/bin/python bench/reward_hacks.py [--json]

Rows: the honest solution and every hack; columns: the assert, call and stdin/stdout forms, under
bwrap (where it runs here) and on the fallback; a cell is the reward (1 = the hack passed). With
--json the last line is one JSON object: per isolation and form, the hacks that passed.
Against an older tree (PYTHONPATH=<old checkout> python bench/reward_hacks.py) it runs what a
user could write then: the call form as the equivalent asserts, the stdin/stdout form as
`stdin=` runs whose output this script compares.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
from pathlib import Path

from flexmarl import rewards
from flexmarl.rewards import code_reward, run_python

# The corpus from this script's tree, whatever tree `flexmarl` comes from (PYTHONPATH).
_spec = importlib.util.spec_from_file_location(
    "reward_hacks", Path(__file__).resolve().parent.parent / "tests" / "reward_hacks.py")
_corpus = importlib.util.module_from_spec(_spec)
sys.modules["reward_hacks"] = _corpus  # dataclasses looks its module up
_spec.loader.exec_module(_corpus)
HACKS, HONEST = _corpus.HACKS, _corpus.HONEST

LIMITS = {"cpu_s": 1.0, "wall_s": 3.0, "memory_mb": 128}
ASSERTS = "assert add(1, 2) == 3\nassert add(-5, 5) == 0\nassert add(10, 32) == 42"
CALLS = [("add(1, 2)", 3), ("add(-5, 5)", 0), ("add(10, 32)", 42)]
IO = [("1 2\n", "3\n"), ("-5 5\n", "0\n"), ("10 32\n", "42\n")]
FORMS = ("assert", "call", "io")
NEW_API = hasattr(rewards, "IOCase")


async def reward(code: str, form: str) -> float:
    if form == "assert" or (form == "call" and not NEW_API):
        return await code_reward(code, ASSERTS, **LIMITS)
    if form == "call":
        return await code_reward(code, CALLS, **LIMITS)
    if NEW_API:
        return await code_reward(code, [rewards.IOCase(i, o) for i, o in IO], **LIMITS)
    for stdin, out in IO:
        result = await run_python(code, stdin=stdin, **LIMITS)
        if not (result.passed and result.stdout.split() == out.split()):
            return 0.0
    return 1.0


async def table() -> dict[str, dict[str, float]]:
    programs = [("honest", HONEST)] + [(h.name, h.programs) for h in HACKS]
    out: dict[str, dict[str, float]] = {}
    for name, by_form in programs:
        scores = await asyncio.gather(*(reward(code, form) for form, code in by_form.items()))
        out[name] = dict(zip(by_form, scores))
    return out


def fallback() -> None:
    from flexmarl.rewards import confinement
    confinement._state.clear()
    confinement._candidates = lambda: []


async def main() -> dict:
    kinds = ["old"]
    if NEW_API:
        kinds = ["bwrap", "fallback"] if rewards.isolation().mechanism == "bwrap" else [
            "fallback"]
    result: dict = {"api": "new" if NEW_API else "old", "hacks": len(HACKS), "passed": {}}
    tables = {}
    for kind in kinds:
        if kind == "fallback":
            fallback()
        tables[kind] = await table()
        result["passed"][kind] = {form: sorted(n for n, row in tables[kind].items()
                                               if n != "honest" and row.get(form))
                                  for form in FORMS}
        result.setdefault("honest", {})[kind] = tables[kind]["honest"]
    head = "".join(f" {k[:8]:>8s}:{f[:2]}" for k in kinds for f in FORMS)
    print(f"{len(HACKS)} hacks, reward per form ({'this tree' if NEW_API else 'old API'}); "
          f"'-' where a hack does not target the form")
    print(f"{'program':22s} {'class':16s}{head}")
    klass = {h.name: h.klass for h in HACKS}
    for name in tables[kinds[0]]:
        cells = "".join(f" {tables[k][name].get(f, '-'):>11}" for k in kinds for f in FORMS)
        print(f"{name:22s} {klass.get(name, ''):16s}{cells}")
    for kind in kinds:
        for form in FORMS:
            print(f"passed under {kind}, {form}: {result['passed'][kind][form] or 'none'}")
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    parsed = ap.parse_args()
    out = asyncio.run(main())
    if parsed.json:
        print(json.dumps(out))
