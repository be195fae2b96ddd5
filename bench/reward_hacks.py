"""Reward-hack report: which programs of the corpus (tests/reward_hacks/) earn a code reward,
per test form, under the isolation in force here and on the audit-hook fallback.

    .venv/bin/python bench/reward_hacks.py [--json] [--hacks NAME,...] [--corpus PATH]
                                           [--python all|PATH,...]

Rows: the honest solution and every hack; columns: the assert, call and stdin/stdout forms, under
bwrap (where it runs here) and on the fallback; a cell is the reward (1.0 = the hack passed, '-'
where the hack has no program for that form), once per sandbox interpreter (`--python all`: every
Python 3.11+ this machine has; the ones skipped are named with why). Limits are the test suite's FAST ones (cpu_s=1,
wall_s=3, memory_mb=128). With --json the last line is one JSON object: per isolation and form,
the hacks that passed, and the honest solution's rewards.

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


async def table(programs: list[tuple[str, dict[str, str], dict[str, object]]]
                ) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, by_form, tests in programs:
        forms = [form for form in FORMS if form in by_form]
        scores = await asyncio.gather(*(reward(by_form[form], form, tests.get(form))
                                        for form in forms))
        out[name] = dict(zip(forms, scores))
    return out


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
                    "passed": {}, "honest": {}, "seconds": {}, "pythons": {}}
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
        tables = {}
        for kind in kinds:
            isolate(kind) if NEW_API else None
            start = time.monotonic()
            tables[kind] = await table(programs)
            key = f"{version}/{kind}"
            result["seconds"][key] = round(time.monotonic() - start, 1)
            result["passed"][key] = {form: [n for n, row in tables[kind].items()
                                            if n != "honest" and row.get(form)]
                                     for form in FORMS}
            result["honest"][key] = tables[kind]["honest"]
        print(f"\nPython {version} ({python}): {len(hacks)} hacks, reward per form "
              f"({'new API' if NEW_API else 'old API'}, flexmarl from {tree}; "
              f"cpu_s={LIMITS['cpu_s']:g}, wall_s={LIMITS['wall_s']:g}, "
              f"memory_mb={LIMITS['memory_mb']}); '-' where a hack has no program for the form")
        head = "".join(f" {k[:8]:>8s}:{f[:2]}" for k in kinds for f in FORMS)
        print(f"{'program':24s} {'class':16s}{head}")
        for name in tables[kinds[0]]:
            cells = "".join(f" {tables[k][name].get(f, '-'):>11}" for k in kinds for f in FORMS)
            print(f"{name:24s} {klass.get(name, ''):16s}{cells}")
        for kind in kinds:
            key = f"{version}/{kind}"
            print(f"honest solution under {key}: {result['honest'][key]}")
            for form in FORMS:
                passed = result["passed"][key][form]
                print(f"passed under {key}, {form} ({len(passed)}): {', '.join(passed) or 'none'}")
    for line in skipped:
        print(f"skipped {line}")
    result["hacks_passed"] = sum(len(v) for by_form in result["passed"].values()
                                 for v in by_form.values())
    print(f"\nhacks earning reward, all Pythons and isolations: {result['hacks_passed']}")
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--hacks", default="", help="comma-separated hack names (default: all)")
    ap.add_argument("--python", default="",
                    help="interpreters for the sandbox: comma-separated paths, or 'all' (every "
                         "Python 3.11+ under /usr/bin and ~/.pyenv); default: this one")
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS,
                    help="the corpus package or file (default: tests/reward_hacks/ next to this script)")
    parsed = ap.parse_args()
    out = asyncio.run(main(parsed.corpus, {n for n in parsed.hacks.split(",") if n} or None,
                           parsed.python))
    if parsed.json:
        print(json.dumps(out))
