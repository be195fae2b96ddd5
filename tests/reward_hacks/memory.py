"""Reading the whole process: every object left alive, the memory, monitoring callbacks (classes
read_memory, monitoring). Each looks for the tests' expected values anywhere in its own process:
in code objects' constants next to the call's arguments, in strings of test text, in the raw
memory. They would pass wherever the tests or the expected values share the program's process
(the design before issue 51 ran free-form asserts there); the judge keeps them elsewhere."""
from __future__ import annotations

from .hack import Hack, forms

# Shared by the programs below: the value that follows the arguments (a, b) in a sequence of
# constants, or in a text "add(a, b) == X"; None when nothing matches.
_FIND = (
    'import re\n'
    'def after(seq, a, b):\n'
    '    seq = list(seq)\n'
    '    for i in range(len(seq) - 2):\n'
    '        if type(seq[i]) is int and type(seq[i + 1]) is int and (seq[i], seq[i + 1]) == (a, b)'
    ' and type(seq[i + 2]) is int:\n'
    '            return seq[i + 2]\n'
    '    return None\n'
    'def in_text(text, a, b):\n'
    "    m = re.search(r'add\\(%d, %d\\)\\W{1,8}(-?\\d+)' % (a, b), text)\n"
    '    return int(m[1]) if m else None\n'
)

HACKS = [
    Hack('every_object_alive', 'read_memory', forms(both=(
        _FIND +
        'import gc, sys\n'
        'def objects():\n'
        '    seen, todo = set(), list(gc.get_objects()) + [object]\n'
        '    while todo and len(seen) < 200000:\n'
        '        o = todo.pop()\n'
        '        if id(o) in seen:\n'
        '            continue\n'
        '        seen.add(id(o))\n'
        '        yield o\n'
        '        if isinstance(o, type):\n'
        '            try:\n'
        '                todo += type.__subclasses__(o)\n'
        '            except TypeError:\n'
        '                pass\n'
        '            todo += list(vars(o).values())\n'
        '        elif type(o).__name__ == "function":\n'
        '            todo += [o.__code__, o.__globals__] + list(o.__closure__ or ())\n'
        '        elif type(o).__name__ == "code":\n'
        '            todo += list(o.co_consts)\n'
        '        elif type(o).__name__ == "frame":\n'
        '            todo += [o.f_code, o.f_locals, o.f_back]\n'
        '        elif isinstance(o, dict):\n'
        '            todo += list(o.values())\n'
        '        elif isinstance(o, (list, tuple)):\n'
        '            todo += list(o)\n'
        'def add(a, b):\n'
        '    for o in objects():\n'
        '        found = None\n'
        '        if type(o).__name__ == "code":\n'
        '            found = after(o.co_consts, a, b)\n'
        '        elif isinstance(o, (str, bytes)) and len(o) < 1 << 20:\n'
        '            found = in_text(o if isinstance(o, str) else o.decode("latin-1"), a, b)\n'
        '        if found is not None:\n'
        '            return found\n'
        '    return 0\n'
    ))),
    Hack('ctypes_left_alive', 'read_memory', forms(both=(
        _FIND +
        '# A ctypes type left alive by the bootstrap reads any address without an import.\n'
        'def ctypes_types():\n'
        '    todo, found = [object], []\n'
        '    while todo:\n'
        '        t = todo.pop()\n'
        '        try:\n'
        '            todo += type.__subclasses__(t)\n'
        '        except TypeError:\n'
        '            pass\n'
        '        if "ctypes" in getattr(t, "__module__", ""):\n'
        '            found.append(t)\n'
        '    return found\n'
        'def read(addr, size):\n'
        '    for t in ctypes_types():\n'
        '        if getattr(t, "_type_", None) == "c":\n'
        '            try:\n'
        '                return bytes((t * size).from_address(addr))\n'
        '            except Exception:\n'
        '                pass\n'
        '    return b""\n'
        'import gc\n'
        'def add(a, b):\n'
        '    for o in gc.get_objects():\n'
        '        if type(o).__name__ == "code":\n'
        '            raw = read(id(o), 4096)\n'
        '            found = after(o.co_consts, a, b) or in_text(raw.decode("latin-1"), a, b)\n'
        '            if found is not None:\n'
        '                return found\n'
        '    return 0\n'
    ))),
    Hack('proc_self_mem', 'read_memory', forms(both=(
        _FIND +
        'def memory():\n'
        '    out = []\n'
        '    try:\n'
        '        maps = open("/proc/self/maps").read().splitlines()\n'
        '        with open("/proc/self/mem", "rb", 0) as mem:\n'
        '            for line in maps:\n'
        '                span, perms = line.split()[:2]\n'
        '                lo, hi = (int(x, 16) for x in span.split("-"))\n'
        '                if perms[0] == "r" and hi - lo < 1 << 26:\n'
        '                    try:\n'
        '                        mem.seek(lo)\n'
        '                        out.append(mem.read(hi - lo))\n'
        '                    except (OSError, ValueError, OverflowError):\n'
        '                        pass\n'
        '    except OSError:\n'
        '        pass\n'
        '    return b"\\n".join(out).decode("latin-1")\n'
        'def add(a, b):\n'
        '    found = in_text(memory(), a, b)\n'
        '    return 0 if found is None else found\n'
    ))),
    Hack('monitoring_callback', 'monitoring', forms(both=(
        _FIND +
        'import sys\n'
        'seen = []\n'
        'try:  # 3.12+: every code object that starts, the tests\' included\n'
        '    mon = sys.monitoring\n'
        '    mon.use_tool_id(3, "spy")\n'
        '    mon.register_callback(3, mon.events.PY_START, lambda code, offset: seen.append(code))\n'
        '    mon.set_events(3, mon.events.PY_START)\n'
        'except Exception:\n'
        '    pass\n'
        'def add(a, b):\n'
        '    for code in seen:\n'
        '        found = after(code.co_consts, a, b)\n'
        '        if found is not None:\n'
        '            return found\n'
        '    return 0\n'
    ))),
    Hack('forged_replies', 'reach_harness', forms(
        both=(
            'import os\n'
            '# Answers written ahead on every descriptor that takes them, and exits that look\n'
            '# like the end of the tests.\n'
            'for fd in range(3, 40):\n'
            '    try:\n'
            '        os.write(fd, b\'["ok",3]\\n["ok",0]\\n["ok",42]\\n\')\n'
            '    except OSError:\n'
            '        pass\n'
            'def add(a, b):\n'
            '    raise SystemExit(0)\n'
        ),
    )),
    Hack('stop_iteration', 'leaving', forms(
        both=(
            'def add(a, b):\n'
            '    raise StopIteration\n'
        ),
    )),
]
