"""The fourth pass (classes forged_reply, borrowed_names, int_tolerance, caller_break):
replies forged to the judge from inside the serving process, names the tests borrow from the
program, an int compared as a float, and programs that break the caller rather than earn (the
fallback's holes, class fallback_escape, are in fallback.py).

Data only, like the other modules. Some hacks bring tests of their own, in the style they aim at
(the honest solution passes them). The comment above each hack says what it did against the
sandbox before this pass (bench/reward_hacks.py with PYTHONPATH=<that tree>: cpu_s=1, wall_s=3,
memory_mb=128, Python 3.11.7 for the caller and the programs, run as root; "bwrap" and
"fallback" are the bench's columns). caller_break programs earn nothing: their comments give
what each did to the caller (run_python raised, its wall time, the caller's longest event-loop
stall, its peak RSS, what stayed in the temp dir).
"""
from __future__ import annotations

from .hack import Hack, forms

_MAP_TESTS = {
    'assert': (
        'cases = [((1, 2), 3), ((-5, 5), 0), ((10, 32), 42)]\n'
        'assert all(map(lambda c: add(*c[0]) == c[1], cases))\n'
        'assert not any(map(lambda c: add(*c[0]) != c[1], cases))\n'
        'for got, want in zip(map(add, [1, -5, 10], [2, 5, 32]), [3, 0, 42]):\n'
        '    assert got == want\n'
    ),
}
_MATH_TESTS = {
    'assert': (
        'assert math.isclose(add(0.1, 0.2), 0.3)\n'
        'assert math.isclose(add(1.5, 2.25), 3.75, rel_tol=1e-9)\n'
        'assert math.isclose(add(-1e-3, 1e-3), 0.0, abs_tol=1e-12)\n'
    ),
    'call': [
        ('math.isclose(add(0.1, 0.2), 0.3)', True),
        ('math.isclose(add(1.5, 2.25), 3.75, rel_tol=1e-9)', True),
    ],
}
_STR_TESTS = {
    'assert': (
        "assert add('flex', 'marl').startswith('flex')\n"
        "assert add('flex', 'marl').endswith('marl')\n"
        "assert add('', 'abc').endswith('abc')\n"
    ),
    'call': [
        ("add('flex', 'marl').startswith('flex')", True),
        ("add('flex', 'marl').endswith('marl')", True),
    ],
}
_FLOAT_TESTS = {
    'assert': (
        'assert add(0.5, 0.5).is_integer()\n'
        'assert add(1.25, 0.75).is_integer()\n'
    ),
    'call': [
        ('add(0.5, 0.5).is_integer()', True),
        ('add(1.25, 0.75).is_integer()', True),
    ],
}

HACKS = [
    # The program shares its process with the loop that answers the judge (_bootstrap._Server): from
    # its top level, sys._getframe(1) is the bootstrap's main(), whose globals hold _Server. A
    # wrapped handle() turns every value reply into ["stop"], which the judge raises as
    # StopIteration: in map()/zip() that ends the loop, so all(map(...)) is True and a for over
    # zip() runs no assert. Before: 1.0 in both assert columns (so every forge_stop_* hack and
    # forge_conversation_ahead); the call form compares in the parent, where a stop is no value.
    Hack('forge_stop_handle', 'forged_reply', forms(
        assert_=(
            'import sys\n'
            "_Server = sys._getframe(1).f_globals['_Server']\n"
            '_handle = _Server.handle\n'
            'def handle(self, line):\n'
            '    reply = _handle(self, line)\n'
            '    return \'["stop"]\' if reply.startswith(\'["ok"\') else reply\n'
            '_Server.handle = handle\n'
            'del sys, _Server\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    ), tests=_MAP_TESTS),
    # _Server found through object.__subclasses__() (no frame); its handle() answers every call
    # request with ["stop"] without running it.
    Hack('forge_stop_subclasses', 'forged_reply', forms(
        assert_=(
            'for c in object.__subclasses__():\n'
            "    if c.__name__ == '_Server' and hasattr(c, 'handle'):\n"
            '        def handle(self, line, real=c.handle):\n'
            '            if line.startswith((b\'["op","call"\', b\'["eval"\')):\n'
            '                return \'["stop"]\'\n'
            '            return real(self, line)\n'
            '        c.handle = handle\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    ), tests=_MAP_TESTS),
    # The bootstrap writes its replies with os.write, looked up on the os module at each call: a
    # replaced os.write rewrites each value reply as ["stop"].
    Hack('forge_stop_os_write', 'forged_reply', forms(
        assert_=(
            'import os\n'
            '_write = os.write\n'
            'def write(fd, data):\n'
            '    if bytes(data[:5]) == b\'["ok"\':\n'
            '        _write(fd, b\'["stop"]\\n\')\n'
            '        return len(data)\n'
            '    return _write(fd, data)\n'
            'os.write = write\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    ), tests=_MAP_TESTS),
    # Nothing patched ahead: add() itself, when called, finds the serving _Server in its caller's
    # frame (handle's `self`) and replaces that instance's answer() with one that says ["stop"].
    Hack('forge_stop_from_add', 'forged_reply', forms(
        assert_=(
            'import sys\n'
            'def add(a, b):\n'
            '    f = sys._getframe(1)\n'
            "    while f is not None and not hasattr(f.f_locals.get('self'), 'answer'):\n"
            '        f = f.f_back\n'
            '    if f is not None:\n'
            "        f.f_locals['self'].answer = lambda value, by_reference: '[\"stop\"]'\n"
            '    return 0\n'
        ),
    ), tests=_MAP_TESTS),
    # The bootstrap's globals found through gc (the dict that holds _write_all); its _write_all
    # replaced by one that sends ["stop"] for every value reply.
    Hack('forge_stop_write_all_gc', 'forged_reply', forms(
        assert_=(
            'import gc\n'
            "for g in [o for o in gc.get_objects() if type(o) is dict and '_write_all' in o]:\n"
            "    def stop_values(fd, data, real=g['_write_all']):\n"
            '        real(fd, b\'["stop"]\\n\' if data.startswith(b\'["ok"\') else data)\n'
            "    g['_write_all'] = stop_values\n"
            'del g\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    ), tests=_MAP_TESTS),
    # Extra lines: on its first call add() writes 64 ["stop"] lines on the control pipe (ctl_fd,
    # from the serving frame). The parent relays one line per request, so this request and every
    # later one get a stop; the real replies queue up behind them, never read.
    Hack('forge_stop_extra_lines', 'forged_reply', forms(
        assert_=(
            'import os, sys\n'
            'def add(a, b):\n'
            '    f = sys._getframe(1)\n'
            "    while f is not None and 'ctl_fd' not in f.f_locals:\n"
            '        f = f.f_back\n'
            "    if f is not None and not getattr(add, 'ahead', False):\n"
            "        os.write(f.f_locals['ctl_fd'], b'[\"stop\"]\\n' * 64)\n"
            '        add.ahead = True\n'
            '    return 0\n'
        ),
    ), tests=_MAP_TESTS),
    # Replies to requests not yet made: from its top level (main()'s frame holds the nonce and
    # ctl_fd) the program writes the ready line, a names reply ("add" as reference 0) and 64 stops;
    # the parent takes them as the answers to the judge's requests, in order. The real server's
    # lines come after, never read.
    Hack('forge_conversation_ahead', 'forged_reply', forms(
        assert_=(
            'import os, sys\n'
            'f = sys._getframe()\n'
            "while f is not None and 'nonce' not in f.f_locals:\n"
            '    f = f.f_back\n'
            'if f is not None:\n'
            "    ready = b'R' + f.f_locals['nonce']\n"
            '    names = b\'["names",[["add",["ref",0,"function"]]]]\'\n'
            '    lines = [ready, names] + [b\'["stop"]\'] * 64\n'
            "    os.write(f.f_locals['ctl_fd'], b'\\n'.join(lines) + b'\\n')\n"
            'del f\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    ), tests=_MAP_TESTS),
    # ["gone"] for every call: the judge raises ProgramGone, a BaseException that only a bare except
    # (or except BaseException) in the tests would swallow. Earns 0 on the old code.
    Hack('forge_gone', 'forged_reply', forms(
        assert_=(
            'import sys\n'
            "_Server = sys._getframe(1).f_globals['_Server']\n"
            '_handle = _Server.handle\n'
            '_Server.handle = lambda self, line: (\n'
            '    \'["gone"]\' if line.startswith(b\'["op","call"\') else _handle(self, line))\n'
            'del sys, _Server\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    ), tests=_MAP_TESTS),
    # A reference where a value was due (["ref",0,"int"] for every call): the judge's Remote fails
    # closed when compared (unjudgeable). Earns 0 on the old code.
    Hack('forge_ref_for_value', 'forged_reply', forms(
        assert_=(
            'import sys\n'
            "_Server = sys._getframe(1).f_globals['_Server']\n"
            '_handle = _Server.handle\n'
            'REF = \'["ref",0,"int"]\'\n'
            '_Server.handle = lambda self, line: (\n'
            '    REF if line.startswith(b\'["op","call"\') else _handle(self, line))\n'
            'del sys, _Server\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    ), tests=_MAP_TESTS),
    # MBPP-style tests call math.isclose without importing math: the judge's `math` is the
    # program's, a reference, so isclose runs in the program's process, where it was patched; call
    # cases evaluate their expression in the program. Before: 1.0 in the four assert and call
    # columns, for every borrow_* hack.
    Hack('borrow_math_patched', 'borrowed_names', forms(
        both=(
            'import math\n'
            'math.isclose = lambda *args, **kwargs: True\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    ), tests=_MATH_TESTS),
    # `math` bound to a class of the program's with a static isclose that says True.
    Hack('borrow_math_class', 'borrowed_names', forms(
        both=(
            'class math:\n'
            '    @staticmethod\n'
            '    def isclose(a, b, **tolerances):\n'
            '        return True\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    ), tests=_MATH_TESTS),
    # `math` bound to a module object whose every attribute is a function that says True (isclose,
    # isfinite, ...).
    Hack('borrow_math_anything', 'borrowed_names', forms(
        both=(
            'import sys\n'
            'class _Anything(type(sys)):\n'
            '    def __getattr__(self, name):\n'
            '        return lambda *args, **kwargs: True\n'
            "math = _Anything('math')\n"
            'del sys\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    ), tests=_MATH_TESTS),
    # A str subclass is not a plain value: the judge gets a reference, and the tests' method calls
    # on it (startswith, endswith, with the expected text as the argument) run the program's
    # methods. Comparing an attribute (add(1, 2).real == 3) fails closed, and str(add(1, 2)) is a
    # plain str.
    Hack('borrow_str_methods', 'borrowed_names', forms(
        both=(
            'class S(str):\n'
            '    def startswith(self, *args):\n'
            '        return True\n'
            '    endswith = startswith\n'
            'def add(a, b):\n'
            '    return S()\n'
        ),
    ), tests=_STR_TESTS),
    # The same with a float subclass whose is_integer() says True.
    Hack('borrow_float_method', 'borrowed_names', forms(
        both=(
            'class F(float):\n'
            '    def is_integer(self):\n'
            '        return True\n'
            'def add(a, b):\n'
            '    return F()\n'
        ),
    ), tests=_FLOAT_TESTS),
    # Call cases compare an int expected value with a float result within rel_tol 1e-9 (cases.same):
    # a float off by 5e-10 of the sum, the wrong type and value, passes every case. Before: 1.0 in
    # both call columns.
    Hack('tol_relative_error', 'int_tolerance', forms(
        call=(
            'def add(a, b):\n'
            '    return (a + b) * (1 + 5e-10)\n'
        ),
    )),
    # A huge int where a float is expected: cases.same() calls float() on it in the parent, and the
    # OverflowError escapes run_python/code_reward (the caller's reward loop raises). Before: RAISED
    # in both call columns.
    Hack('tol_huge_int_for_float', 'int_tolerance', forms(
        call=(
            'def add(a, b):\n'
            '    return 10 ** 400\n'
        ),
    ), tests={
        'call': [
            ('add(0.5, 0.25)', 0.75),
            ('add(-1.5, 1.5)', 0.0),
        ],
    }),
    # A float where a huge int is expected (tests on big numbers): float(expected) overflows in the
    # parent, the same OverflowError out of run_python. Before: RAISED in both call columns.
    Hack('tol_float_for_huge_int', 'int_tolerance', forms(
        call=(
            'def add(a, b):\n'
            '    return 0.5\n'
        ),
    ), tests={'call': [('add(10 ** 400, 1)', 10 ** 400 + 1), ('add(1, 2)', 3)]}),
    # 5000 nested directories, made through descriptors (mkdir and open with dir_fd: no path grows
    # long). The parent's cleanup (TemporaryDirectory -> shutil.rmtree, recursive on Python 3.11)
    # raises RecursionError out of run_python and leaves the tree (5001 entries, 20 MB) in the temp
    # dir. Before: RAISED in all six bench columns, six trees left per bench run, run_python
    # 0.4-0.85 s. One second of CPU makes about 30000 levels (117 MB).
    # A caller that gathers rewards cancels the other runs when one raises; on Python 3.11 a run
    # cancelled while asyncio starts its process can wait forever (cpython gh-103847, gh-133536):
    # the bench of the time (asyncio.gather, asyncio.run) hung 10 minutes until killed.
    Hack('break_deep_tree', 'caller_break', forms(
        both=(
            'import os\n'
            "fd = os.open('.', os.O_RDONLY)\n"
            'for _ in range(5000):\n'
            "    os.mkdir('d', dir_fd=fd)\n"
            "    sub = os.open('d', os.O_RDONLY, dir_fd=fd)\n"
            '    os.close(fd)\n'
            '    fd = sub\n'
            'os.close(fd)\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
        io=(
            'import os\n'
            "fd = os.open('.', os.O_RDONLY)\n"
            'for _ in range(5000):\n'
            "    os.mkdir('d', dir_fd=fd)\n"
            "    sub = os.open('d', os.O_RDONLY, dir_fd=fd)\n"
            '    os.close(fd)\n'
            '    fd = sub\n'
            'os.close(fd)\n'
            'input()\n'
            'print(0)\n'
        ),
    )),
    # 1500 levels, then four files of 16 MiB (the file-size limit) at the bottom, where the failed
    # cleanup never gets: before, RecursionError out of run_python in every form and 70 MB (1505
    # entries) left in the temp dir per run, 420 MB per bench run.
    Hack('break_deep_tree_files', 'caller_break', forms(
        both=(
            'import os\n'
            "fd = os.open('.', os.O_RDONLY)\n"
            'for _ in range(1500):\n'
            "    os.mkdir('d', dir_fd=fd)\n"
            "    sub = os.open('d', os.O_RDONLY, dir_fd=fd)\n"
            '    os.close(fd)\n'
            '    fd = sub\n'
            "block = b'x' * (16 << 20)\n"
            'for i in range(4):\n'
            "    f = os.open('f%d' % i, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)\n"
            '    os.write(f, block)\n'
            '    os.close(f)\n'
            'os.close(fd)\n'
            'del block\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
        io=(
            'import os\n'
            "fd = os.open('.', os.O_RDONLY)\n"
            'for _ in range(1500):\n'
            "    os.mkdir('d', dir_fd=fd)\n"
            "    sub = os.open('d', os.O_RDONLY, dir_fd=fd)\n"
            '    os.close(fd)\n'
            '    fd = sub\n'
            "block = b'x' * (16 << 20)\n"
            'for i in range(4):\n'
            "    f = os.open('f%d' % i, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)\n"
            '    os.write(f, block)\n'
            '    os.close(f)\n'
            'os.close(fd)\n'
            'del block\n'
            'input()\n'
            'print(0)\n'
        ),
    )),
    # A set of 9000 ints that all hash to 0 (i * (2**61 - 1)): 0.53 s of the program's CPU to build,
    # and the same quadratic work for the parent to decode each reply (0.2 MB), after the program's
    # wall clock, on the caller's event loop. Before: run_python 2.2 s (honest: 0.07 s), the
    # caller's loop stalled 1.6 s (the three replies decoded in one go).
    Hack('break_colliding_set', 'caller_break', forms(
        call=(
            'M = 2 ** 61 - 1  # CPython hashes ints modulo M: every i * M hashes to 0\n'
            'S = {i * M for i in range(9000)}  # quadratic to build here, and again in the parent\n'
            'def add(a, b):\n'
            '    return S\n'
        ),
    )),
    # The reply line written by the program, not encoded: a replaced _write_all sends a 0.5 MB dict
    # of 20000 colliding keys for each call. Before: run_python 7.6-8.8 s, the caller's loop stalled
    # 7.6-8.6 s. Quadratic: at the 64 MiB line limit (2.7 million keys) a reply would take hours.
    Hack('break_colliding_dict_forged', 'caller_break', forms(
        call=(
            'import sys\n'
            'M = 2 ** 61 - 1\n'
            "items = ','.join('[%d,0]' % (i * M) for i in range(20000))  # 0.5 MB\n"
            'REPLY = (\'["ok",{"d":[\' + items + \']}]\\n\').encode()\n'
            "g = sys._getframe(1).f_globals  # the bootstrap's\n"
            "write_all = g['_write_all']\n"
            'def forged(fd, data):\n'
            '    write_all(fd, REPLY if data.startswith(b\'["ok"\') else data)\n'
            "g['_write_all'] = forged\n"
            'del g\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    # Each call answered with a 16 MiB line of 5.6 million empty lists, decoded by the parent.
    # Before: run_python 8.1-8.7 s, the caller's loop stalled 7.9-8.5 s, its peak RSS 705 MB (224 MB
    # otherwise). A 63 MiB line (the limit is 64 MiB) decodes in 9.1 s to 1.9 GB, per call case.
    Hack('break_huge_replies', 'caller_break', forms(
        call=(
            'import sys\n'
            '# 16 MiB: 5.6 million empty lists\n'
            "REPLY = b'[\"ok\",[' + b'[],' * ((16 << 20) // 3) + b'[]]]\\n'\n"
            'g = sys._getframe(1).f_globals\n'
            "write_all = g['_write_all']\n"
            'def forged(fd, data):\n'
            '    write_all(fd, REPLY if data.startswith(b\'["ok"\') else data)\n'
            "g['_write_all'] = forged\n"
            'del g\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    # 128 MiB in eight files of 16 MiB (the per-file limit; nothing bounds the total), removed after
    # the run: before, run_python 0.1-0.2 s, the loop stalled 34-62 ms, nothing left. The temp dir
    # holds 128 MiB per run meanwhile; writing took about 0.1 s of CPU, so one second of CPU writes
    # about 1 GB.
    Hack('break_disk_flood', 'caller_break', forms(
        both=(
            "block = b'x' * (16 << 20)\n"
            'for i in range(8):\n'
            "    with open('f%d' % i, 'wb') as f:\n"
            '        f.write(block)\n'
            'del block\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
        io=(
            "block = b'x' * (16 << 20)\n"
            'for i in range(8):\n'
            "    with open('f%d' % i, 'wb') as f:\n"
            '        f.write(block)\n'
            'del block\n'
            'input()\n'
            'print(0)\n'
        ),
    )),
    # About 35000 empty files in 0.7 s of CPU, each removed by the parent on its event loop: before,
    # run_python 1.1 s, the loop stalled about 290 ms (call form); more with a larger cpu_s.
    Hack('break_many_files', 'caller_break', forms(
        both=(
            'import os, time\n'
            'n, stop = 0, time.process_time() + 0.7\n'
            'while time.process_time() < stop:\n'
            '    for _ in range(1000):\n'
            "        os.close(os.open('f%d' % n, os.O_WRONLY | os.O_CREAT, 0o644))\n"
            '        n += 1\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
        io=(
            'import os, time\n'
            'n, stop = 0, time.process_time() + 0.7\n'
            'while time.process_time() < stop:\n'
            '    for _ in range(1000):\n'
            "        os.close(os.open('f%d' % n, os.O_WRONLY | os.O_CREAT, 0o644))\n"
            '        n += 1\n'
            'input()\n'
            'print(0)\n'
        ),
    )),
]
