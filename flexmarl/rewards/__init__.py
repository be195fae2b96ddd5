"""Reward functions for team workflows: answer matching, sandboxed code runs, bounds.

A workflow computes a value and hands it to `ctx.reward(completion, value)`:

    ctx.reward(c, numeric_match(c.text, task))                     # sync: call it
    ctx.reward(c, await code_reward(extract_code(c.text), tests))  # async: await it

| function                                   | kind  | returns                                  |
|--------------------------------------------|-------|------------------------------------------|
| extract_answer(text, how="auto")           | sync  | str or None: boxed / answer: / number    |
| exact_match(text, answer)                  | sync  | 1.0 if equal once stripped               |
| numeric_match(text, answer, *, rel_tol)    | sync  | 1.0 if the numbers agree within rel_tol  |
| math_equal(text, answer, *, timeout_s)     | sync  | 1.0 if math_verify finds them equal      |
| format_reward(text, pattern)               | sync  | 1.0 if the regex fullmatches the text    |
| extract_code(text)                         | sync  | the last ```python block, else the text  |
| run_python(code, *, tests, stdin, limits)  | async | ExecResult(passed, cause, cases, ...)    |
| code_reward(code, tests, **limits)         | async | 1.0 if the program passes its tests      |
| IOCase(stdin, stdout), CallCase(call, exp) | data  | test cases judged outside the program    |
| isolation()                                | sync  | Isolation: bwrap in force, or what lacks |
| allow_unsafe_sandbox(allow)                | sync  | UNSAFE: run code without bubblewrap      |
| set_interpreter(path)                      | sync  | the Python (3.11+) that runs programs    |
| set_max_concurrent(n), max_concurrent()    | sync  | the bound on sandboxed runs at once      |
| bounded(limit)                             | sync  | decorator bounding an async reward       |
| score_all(fn, items, *, limit)             | async | fn over items, bounded, in order         |

`answer` is a str, a number, or a Task (anything with `.answer`). `tests` is a list of IOCase
(stdin/stdout), a list of CallCase or (call, expected) pairs, or a str of asserts;
`flexmarl.rewards.cases` says how each is judged. The sandbox's guarantees and its limits are in
`flexmarl.rewards.sandbox`'s docstring, the isolation in `flexmarl.rewards.confinement`'s.

    match.py          answer extraction and matching: pure, synchronous rewards on the text
    sandbox.py        model-written Python in separate, limited processes: run_python,
                      code_reward
    processes.py      the sandbox's processes as the caller sees them: pipes, end, directory
    _bootstrap.py     the sandbox's first code in a child interpreter: limits, audit hook, then
                      one of three roles
    _judge.py         the judge: free-form asserts against the program's names, every reply
                      checked against its request
    _protocol.py      what both ends of the sandbox's pipes share: exit codes, the value codec,
                      error reports
    cases.py          a code task's tests in three forms, parent side: what reaches the
                      sandbox, and the verdict
    confinement.py    where sandboxed programs run: bubblewrap, or (explicitly unsafe) the audit
                      hook alone; the seccomp filter; the loader of the sandbox's code
    _seccomp_exec.py  the fallback's launcher: installs a seccomp filter, then execs the
                      sandboxed interpreter
    bounds.py         how many async reward calls run at once: bounded, score_all, LoopBound

The rule the code rewards keep: **the verdict never lives where the program runs.** No expected
value, no completion line that grants a pass, nothing that decides the verdict is ever in the
program's process: stdin/stdout and call cases are compared in the calling process, free-form
asserts run in a judge process of their own that sees only the plain values the program returns.
A program that reads all of its own process, or forges every line on its pipes, finds and
gains nothing (tests/test_judge.py dumps it; tests/reward_hacks/ tries the rest).
"""
from flexmarl.rewards.bounds import LoopBound, bounded, score_all
from flexmarl.rewards.match import (
    HOW, MATH_TAIL_CHARS, exact_match, extract_answer, extract_code, format_reward, math_equal,
    numeric_match)
from flexmarl.rewards.cases import CallCase, IOCase
from flexmarl.rewards.confinement import (
    Isolation, SandboxUnavailable, allow_unsafe_sandbox, isolation, set_interpreter)
from flexmarl.rewards.sandbox import (
    CAUSES, MAX_BOX_BYTES, MAX_REPLY_BYTES, ExecResult, code_reward, max_concurrent,
    network_isolated, run_python, set_max_concurrent)

__all__ = [
    "CAUSES", "HOW", "MATH_TAIL_CHARS", "MAX_BOX_BYTES", "MAX_REPLY_BYTES", "CallCase",
    "ExecResult", "IOCase", "Isolation", "LoopBound", "SandboxUnavailable",
    "allow_unsafe_sandbox", "bounded", "code_reward", "exact_match", "extract_answer",
    "extract_code", "format_reward", "isolation", "math_equal",
    "max_concurrent", "network_isolated", "numeric_match", "run_python", "score_all",
    "set_interpreter", "set_max_concurrent"]
