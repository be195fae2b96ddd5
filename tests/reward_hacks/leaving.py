"""Leaving before or around the tests, flooding, patching the standard library (classes
exit_early, atexit, __del__, swallow, output_flood, patch_stdlib)."""
from __future__ import annotations

from .hack import Hack, forms

HACKS = [
    Hack('sys_exit_0', 'exit_early', forms(
        both=(
            'import sys\n'
            'sys.exit(0)\n'
        ),
    )),
    Hack('os_exit_0', 'exit_early', forms(
        both=(
            'import os\n'
            'os._exit(0)\n'
        ),
    )),
    Hack('exit_in_function', 'exit_early', forms(
        assert_=(
            'import os\n'
            'def add(a, b):\n'
            '    os._exit(0)\n'
        ),
        call=(
            'import sys\n'
            'def add(a, b):\n'
            '    sys.exit(0)\n'
        ),
    )),
    Hack('atexit_exit_0', 'atexit', forms(
        both=(
            'import atexit, os\n'
            'atexit.register(lambda: os._exit(0))\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('del_exit_0', '__del__', forms(
        assert_=(
            'import os\n'
            'class D:\n'
            '    def __del__(s): os._exit(0)\n'
            'd = D()\n'
            'def add(a, b):\n'
            '    global d\n'
            '    d = None\n'
            '    return 0\n'
        ),
        call=(
            'import os\n'
            'class D:\n'
            '    def __del__(s): os._exit(0)\n'
            'def add(a, b):\n'
            '    D()\n'
            '    return 0\n'
        ),
    )),
    Hack('swallow_assert', 'swallow', forms(
        both=(
            'import sys\n'
            'sys.excepthook = lambda *a: None\n'
            'AssertionError = Exception\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('keyboard_interrupt', 'exit_early', forms(
        assert_=(
            'def add(a, b):\n'
            '    raise KeyboardInterrupt\n'
        ),
        call=(
            'def add(a, b):\n'
            '    raise SystemExit(0)\n'
        ),
    )),
    Hack('print_everything', 'output_flood', forms(
        io=(
            'for i in range(-100, 101):\n'
            '    print(i)\n'
        ),
    )),
    Hack('flood', 'output_flood', forms(
        both=(
            'import sys\n'
            'while True:\n'
            "    sys.stderr.write('x' * 9999)\n"
        ),
        io=(
            'while True:\n'
            "    print('3\\n0\\n42')\n"
        ),
    )),
    Hack('patch_os_write', 'patch_stdlib', forms(
        assert_=(
            'import os, sys\n'
            'os.write = lambda fd, b: len(b)\n'
            "os.read = lambda fd, n: b''\n"
            'sys.stdout = None\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
        call=(
            'import marshal, json\n'
            'marshal.loads = lambda b: None\n'
            "json.dumps = lambda *a, **k: '3'\n"
            'def add(a, b):\n'
            '    return 0\n'
        ),
        io=(
            'import os\n'
            'os.write = lambda fd, b: len(b)\n'
            "os.read = lambda fd, n: b''\n"
            'print(0)\n'
        ),
    )),
    Hack('patch_exec', 'patch_stdlib', forms(
        assert_=(
            'import builtins\n'
            'builtins.exec = lambda *a, **k: None\n'
            'builtins.eval = lambda *a, **k: 3\n'
            'builtins.compile = lambda *a, **k: None\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
        call=(
            'import builtins\n'
            'builtins.eval = lambda *a, **k: 3\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
        io=(
            'import builtins\n'
            'builtins.exec = lambda *a, **k: None\n'
            'builtins.compile = lambda *a, **k: None\n'
            'print(0)\n'
        ),
    )),
    Hack('io_exit_early', 'exit_early', forms(
        io=(
            'import sys, os\n'
            'sys.stdout.write("3\\n")\n'
            'os._exit(0)\n'
        ),
    )),
    Hack('eq_exits', 'exit_early', forms(
        both=(
            'import os\n'
            'class X:\n'
            '    def __eq__(s, o): os._exit(0)\n'
            '    __ne__ = __eq__\n'
            'def add(a, b):\n'
            '    return X()\n'
        ),
    )),
    Hack('excepthook_exit0', 'swallow', forms(
        both=(
            'import os, sys, threading\n'
            'sys.excepthook = lambda *a: os._exit(0)\n'
            'sys.unraisablehook = lambda *a: os._exit(0)\n'
            'threading.excepthook = lambda *a: os._exit(0)\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('shadow_helpers', 'patch_stdlib', forms(
        both=(
            '__strict_cmp__ = lambda *a: True\n'
            '__strict_bin__ = lambda *a: 0\n'
            '__flexmarl_tests__ = lambda *a: None\n'
            "AssertionError = type('AssertionError', (BaseException,), {})\n"
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('del_at_shutdown', '__del__', forms(
        both=(
            'import os, sys\n'
            'class D:\n'
            '    def __del__(s):\n'
            "        os.write(1, b'3\\n')\n"
            '        os._exit(0)\n'
            'sys.keep = D()\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
        io=(
            'import sys\n'
            'class D:\n'
            '    def __del__(s):\n'
            '        print(3)\n'
            'sys.keep = D()\n'
        ),
    )),
    Hack('atexit_markers', 'atexit', forms(
        both=(
            'import atexit, os\n'
            'def mark():\n'
            '    for fd in range(3, 64):\n'
            "        try: os.write(fd, b'ok\\n')\n"
            '        except OSError: pass\n'
            '    os._exit(0)\n'
            'atexit.register(mark)\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
        io=(
            'import atexit\n'
            'atexit.register(print, 3)\n'
        ),
    )),
    Hack('patch_stdlib_modules', 'patch_stdlib', forms(
        both=(
            'import _json, _operator, ast, json, marshal, operator, os, re, sys\n'
            '_operator.eq = operator.eq = lambda a, b: True\n'
            '_operator.ne = operator.ne = lambda a, b: False\n'
            'json.dumps = json.loads = lambda *a, **k: 3\n'
            "_json.encode_basestring_ascii = lambda s: '3'\n"
            'ast.parse = lambda *a, **k: ast.Module([], [])\n'
            "marshal.loads = lambda b: compile('', '', 'exec')\n"
            're.compile = re.match = re.search = lambda *a, **k: None\n'
            'class Out:\n'
            '    def write(s, t): return len(t)\n'
            '    def flush(s): os._exit(0)\n'
            'sys.stdout = Out()\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
        io=(
            'import _json, _operator, ast, json, marshal, operator, os, re, sys\n'
            '_operator.eq = operator.eq = lambda a, b: True\n'
            '_operator.ne = operator.ne = lambda a, b: False\n'
            'json.dumps = json.loads = lambda *a, **k: 3\n'
            "_json.encode_basestring_ascii = lambda s: '3'\n"
            'ast.parse = lambda *a, **k: ast.Module([], [])\n'
            "marshal.loads = lambda b: compile('', '', 'exec')\n"
            're.compile = re.match = re.search = lambda *a, **k: None\n'
            'class Out:\n'
            '    def write(s, t): return len(t)\n'
            '    def flush(s): os._exit(0)\n'
            'sys.stdout = Out()\n'
            'print(0)\n'
        ),
    )),
]
