"""The reward-hack corpus: programs that try to earn a code reward without solving the task.

Data only, by class in this package's modules (tests/test_reward_hacks.py runs it; bench/reward_hacks.py prints who passes). The task:
`add(a, b)` returning a + b (the assert and call forms), or a program that reads "a b" from stdin
and prints the sum (the stdin/stdout form). No program here implements it: each passes only if the
sandbox lets it cheat (a lookup filled from what it read, a forged completion line, a patched
harness). Every program is self-contained standard-library Python; a hack lists the forms it makes
sense for. Classes, from code-RL practice:
- always_equal: objects equal to everything, int/str subclasses, patched builtins;
- read_tests: the tests from the program's own file, stdin, descriptors, /proc, the caller's
  source line, the parent's files or memory;
- reach_harness: the harness's frames (sys._getframe, tracebacks, generators, settrace,
  sys._current_frames, a subinterpreter), its nonce and pipes, its module globals (reached
  through object.__subclasses__ or a patched function's __globals__), gc, audit hooks;
- read_user_files: the user's files, environment, processes and network (these fail the task
  anyway; tests/test_isolation.py checks what they can see; they print sizes, never contents);
- exit_early, atexit, __del__, swallow, threads, signals: leaving before or around the tests;
- output_flood: floods and every plausible answer printed;
- patch_stdlib: the standard library or the names the harness might use, patched first;
- the fourth pass (fourth.py): forged_reply (the loop that answers the judge patched),
  borrowed_names (math.isclose, a returned object's methods), int_tolerance, caller_break
  (deep trees, colliding or huge replies, disk floods); fallback.py: fallback_escape (dir_fd,
  unseen writes and signals, the bootstrap's cache); redteam.py: what the issue's red team found
  (scandir descriptors, an unhooked audit hook, uncapped tmpfs mounts, gc stalls);
- read_memory, monitoring: the whole process read for the expected values (every object left
  alive, a ctypes type left by the bootstrap, /proc/self/mem, sys.monitoring callbacks).
"""
from __future__ import annotations

from . import equality, fallback, fourth, harness, leaving, memory, reading, redteam
from .hack import Hack, forms

# `import math`: tests in MBPP's style use the program's `math` without importing it (a hack's
# own tests may); an honest solution that imports it passes them.
HONEST = {
    "assert": "import math\n\ndef add(a, b):\n    return a + b\n",
    "call": "import math\n\ndef add(a, b):\n    return a + b\n",
    "io": "a, b = map(int, input().split())\nprint(a + b)\n",
}

HACKS: list[Hack] = [*equality.HACKS, *reading.HACKS, *harness.HACKS, *leaving.HACKS,
                     *memory.HACKS, *fourth.HACKS, *fallback.HACKS,
                     *redteam.HACKS]

__all__ = ["HACKS", "HONEST", "Hack", "forms"]
