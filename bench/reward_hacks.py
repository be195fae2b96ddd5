"""Reward-hack report: which programs of the corpus (tests/reward_hacks/) earn a code reward,
per test form, under the isolation in force here and on the audit-hook fallback.

    .venv/bin/python bench/reward_hacks.py [--json] [--hacks NAME,...] [--corpus PATH]
                                           [--python all|PATH,...]

Rows: the honest solution and every hack; columns: the assert, call and stdin/stdout forms, under
bwrap (where it runs here) and on the unsafe fallback (opted into here); a cell is the reward
(1.0 = the hack passed, '-' where the hack has no program for that form, RAISED where
run_python raised), once per sandbox interpreter (`--python all`: every Python 3.11+ this
machine has; the ones skipped are named with why), then what each program cost the caller: the
longest stall of this process's event loop while its forms ran (ms) and this process's RSS
after it (MB). A hack judged by tests of its own (MBPP-style `math.isclose`, methods on a
result) brings them (`Hack.tests`). Limits are the test suite's FAST ones (cpu_s=1, wall_s=3,
memory_mb=128). With --json the last line is one JSON object: per Python/isolation and form,
the hacks that passed, the honest solution's rewards, what raised, the longest stall and the
largest RSS.

Against an older tree (PYTHONPATH=<old checkout> python bench/reward_hacks.py) it runs what a
user could write then, and says "old API": the call form as the equivalent asserts
(`assert add(1, 2) == 3` ...), the stdin/stdout form as `run_python(code, stdin=...)` runs whose
output this script compares (`result.passed and result.stdout.split() == expected.split()`).
The corpus is read from this script's tree (or --corpus), whatever tree `flexmarl` comes from.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

from flexmarl import rewards
from flexmarl.rewards import code_reward, run_python

LIMITS = {"cpu_s": 1.0, "wall_s": 3.0, "memory_mb": 128}
ASSERTS = "assert add(1, 2) == 3\nassert add(-5, 5) == 0\nassert add(10, 32) == 42"
CALLS = [("add(1, 2)", 3), ("add(-5, 5)", 0), ("add(10, 32)", 42)]
IO = [("1 2\n", "3\n"), ("-5 5\n", "0\n"), ("10 32\n", "42\n")]
FORMS = ("assert", "call", "io")
NEW_API = hasattr(rewards, "IOCase")
DEFAULT_CORPUS = Path(__file__).resolve().parent.parent / "tests" / "reward_hacks"


def load_corpus(path: Path):
    """(HONEST, HACKS) from a corpus package (a folder) or file, imported by path (not as
    tests.reward_hacks, so that an older tree's own corpus, or none, does not matter)."""
    if path.is_dir():
        spec = importlib.util.spec_from_file_location(
            "reward_hacks", path / "__init__.py", submodule_search_locations=[str(path)])
    else:
        spec = importlib.util.spec_from_file_location("reward_hacks", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["reward_hacks"] = module  # dataclasses looks its module up
    spec.loader.exec_module(module)
    return module.HONEST, module.HACKS


async def reward(code: str, form: str, tests: object = None) -> float:
    if tests is not None:  # the hack's own tests (a style of tests it aims at)
        if form == "io":
            tests = [rewards.IOCase(i, o) for i, o in tests]
        return await code_reward(code, tests, **LIMITS)
    if form == "assert" or (form == "call" and not NEW_API):
        return await code_reward(code, ASSERTS, **LIMITS)
    if form == "call":
        return await code_reward(code, [rewards.CallCase(c, e) for c, e in CALLS], **LIMITS)
    if NEW_API:
        return await code_reward(code, [rewards.IOCase(i, o) for i, o in IO], **LIMITS)
    for stdin, out in IO:
        result = await run_python(code, stdin=stdin, **LIMITS)
        if not (result.passed and result.stdout.split() == out.split()):
            return 0.0
    return 1.0


def rss_mb() -> float:
    """This process's resident memory now, MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


async def ticking(run) -> tuple[object, float]:
    """`run`'s result and the longest gap between ticks of a 10 ms timer meanwhile: how long
    the caller's event loop was blocked."""
    ticks = [time.monotonic()]

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.01)
            ticks.append(time.monotonic())

    ticker = asyncio.create_task(tick())
    try:
        result = await run
    finally:
        ticker.cancel()
    # Up to now, not to the last tick: work at the very end of `run` blocks the loop too.
    ticks.append(time.monotonic())
    return result, max(b - a for a, b in zip(ticks, ticks[1:]))


async def guarded(name: str, code: str, form: str, tests: object, raised: list[str]) -> object:
    """reward(), or "RAISED" (the error kept in `raised`) where run_python raised."""
    try:
        return await reward(code, form, tests)
    except Exception as exc:  # noqa: BLE001 - what this report exists to count
        raised.append(f"{name}/{form}: {exc!r}"[:300])
        return "RAISED"


async def table(programs: list[tuple[str, dict[str, str], dict[str, object]]]
                ) -> tuple[dict[str, dict[str, object]], dict[str, dict], list[str]]:
    """Per program: its reward per form ("RAISED" where run_python raised), what it cost the
    caller (the longest event-loop stall, ms, and this process's RSS after it, MB), and the
    errors raised."""
    out: dict[str, dict[str, object]] = {}
    costs: dict[str, dict] = {}
    raised: list[str] = []
    for name, by_form, tests in programs:
        forms = [form for form in FORMS if form in by_form]

        scores, stall = await ticking(asyncio.gather(
            *(guarded(name, by_form[form], form, tests.get(form), raised) for form in forms)))
        out[name] = dict(zip(forms, scores))
        costs[name] = {"stall_ms": round(stall * 1000, 1), "rss_mb": round(rss_mb(), 1)}
    return out, costs, raised


_CANDIDATES = None


def isolate(kind: str) -> None:
    """Run what follows under bwrap, or on the audit-hook fallback (as on a machine without
    bwrap)."""
    global _CANDIDATES
    from flexmarl.rewards import confinement
    if _CANDIDATES is None:
        _CANDIDATES = confinement._candidates
    confinement._state.pop("isolation", None)
    confinement._candidates = (lambda: []) if kind == "fallback" else _CANDIDATES
    if hasattr(confinement, "allow_unsafe_sandbox"):  # issue 61 on: the fallback is opt-in
        confinement.allow_unsafe_sandbox(kind == "fallback")


def interpreters(spec: str) -> tuple[list[str], list[str]]:
    """The Pythons to run the corpus under ("": this one; "all": every 3.11+ found here, under
    /usr/bin and pyenv) and what was skipped, with why."""
    if not spec:
        return [sys.executable], []
    if spec != "all":
        return spec.split(","), []
    import glob
    import os
    import re

    from flexmarl.rewards.confinement import _describe
    found, skipped, seen = [], [], set()
    for path in [sys.executable, *sorted(glob.glob("/usr/bin/python3.*")),
                 *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/*/bin/python3.*")))]:
        real = os.path.realpath(path)
        if real in seen or not re.fullmatch(r"python3\.\d+", os.path.basename(path)) or \
                not os.access(real, os.X_OK):
            continue
        seen.add(real)
        try:
            _describe(real)
            found.append(real)
        except ValueError as exc:
            skipped.append(f"{real}: {str(exc).split(': ', 1)[-1]}")
    return found, skipped


async def main(corpus: Path, only: set[str] | None, pythons: str) -> dict:
    honest, hacks = load_corpus(corpus)
    if only:
        unknown = only - {h.name for h in hacks}
        if unknown:
            raise SystemExit(f"no such hacks in {corpus}: {sorted(unknown)}")
        hacks = [h for h in hacks if h.name in only]
    programs = [("honest", honest, {})] + [(h.name, h.programs, getattr(h, "tests", {}))
                                           for h in hacks]
    tree = str(Path(rewards.__file__).resolve().parents[2])
    result: dict = {"api": "new" if NEW_API else "old", "tree": tree, "hacks": len(hacks),
                    "programs": sum(len(p) for _, p, _ in programs), "limits": LIMITS,
                    "passed": {}, "honest": {}, "seconds": {}, "pythons": {}, "raised": {},
                    "stall_ms_max": {}, "rss_mb_max": {}}
    found, skipped = interpreters(pythons) if NEW_API else ([sys.executable], [])
    result["skipped_pythons"] = skipped
    klass = {h.name: h.klass for h in hacks}
    for python in found:
        kinds = ["old"]
        if NEW_API:
            from flexmarl.rewards.confinement import set_interpreter
            isolate("bwrap")
            version = set_interpreter(python)
            kinds = ["bwrap", "fallback"] if rewards.isolation().mechanism == "bwrap" else [
                "fallback"]
        else:
            version = sys.version.split()[0]
        result["pythons"][python] = version
        tables, costs = {}, {}
        for kind in kinds:
            isolate(kind) if NEW_API else None
            start = time.monotonic()
            tables[kind], costs[kind], errors = await table(programs)
            key = f"{version}/{kind}"
            result["seconds"][key] = round(time.monotonic() - start, 1)
            result["raised"][key] = errors
            result["stall_ms_max"][key] = max(c["stall_ms"] for c in costs[kind].values())
            result["rss_mb_max"][key] = max(c["rss_mb"] for c in costs[kind].values())
            result["passed"][key] = {form: [n for n, row in tables[kind].items()
                                            if n != "honest" and row.get(form) == 1.0]
                                     for form in FORMS}
            result["honest"][key] = tables[kind]["honest"]
        print(f"\nPython {version} ({python}): {len(hacks)} hacks, reward per form "
              f"({'new API' if NEW_API else 'old API'}, flexmarl from {tree}; "
              f"cpu_s={LIMITS['cpu_s']:g}, wall_s={LIMITS['wall_s']:g}, "
              f"memory_mb={LIMITS['memory_mb']}); '-' where a hack has no program for the form")
        head = "".join(f" {k[:8]:>8s}:{f[:2]}" for k in kinds for f in FORMS)
        cost_head = "".join(f" {k[:5]:>5s}:stall ms  rss MB" for k in kinds)
        print(f"{'program':24s} {'class':16s}{head}{cost_head}")
        for name in tables[kinds[0]]:
            cells = "".join(f" {tables[k][name].get(f, '-'):>11}" for k in kinds for f in FORMS)
            cells += "".join(f" {costs[k][name]['stall_ms']:>14.1f} {costs[k][name]['rss_mb']:7.1f}"
                             for k in kinds)
            print(f"{name:24s} {klass.get(name, ''):16s}{cells}")
        for kind in kinds:
            key = f"{version}/{kind}"
            print(f"honest solution under {key}: {result['honest'][key]}")
            for form in FORMS:
                passed = result["passed"][key][form]
                print(f"passed under {key}, {form} ({len(passed)}): {', '.join(passed) or 'none'}")
            print(f"raised out of run_python under {key} ({len(result['raised'][key])}): "
                  f"{'; '.join(result['raised'][key]) or 'none'}")
            print(f"caller under {key}: longest event-loop stall "
                  f"{result['stall_ms_max'][key]:.0f} ms, RSS at most "
                  f"{result['rss_mb_max'][key]:.0f} MB (after each program)")
    for line in skipped:
        print(f"skipped {line}")
    result["hacks_passed"] = sum(len(v) for by_form in result["passed"].values()
                                 for v in by_form.values())
    result["raised_total"] = sum(len(v) for v in result["raised"].values())
    print(f"\nhacks earning reward, all Pythons and isolations: {result['hacks_passed']}; "
          f"raised out of run_python: {result['raised_total']}")
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--hacks", default="", help="comma-separated hack names (default: all)")
    ap.add_argument("--python", default="",
                    help="interpreters for the sandbox: comma-separated paths, or 'all' (every "
                         "Python 3.11+ under /usr/bin and ~/.pyenv); default: this one")
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS,
                    help="the corpus package or file (default: tests/reward_hacks/ next to "
                         "this script)")
    parsed = ap.parse_args()
    out = asyncio.run(main(parsed.corpus, {n for n in parsed.hacks.split(",") if n} or None,
                           parsed.python))
    if parsed.json:
        print(json.dumps(out))
