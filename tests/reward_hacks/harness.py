"""Reaching the harness: its frames, nonce, pipes, globals, threads and signals (classes
reach_harness, threads, signals)."""
from __future__ import annotations

from .hack import Hack, forms

HACKS = [
    Hack('getframe_walk', 'reach_harness', forms(
        assert_=(
            'import sys\n'
            'def add(a, b):\n'
            '    f = sys._getframe(1)\n'
            '    while f:\n'
            '        for v in f.f_locals.values():\n'
            '            if isinstance(v, int) and v > 2:\n'
            '                return v\n'
            '        f = f.f_back\n'
            '    return 0\n'
        ),
        call=(
            'import sys\n'
            'def add(a, b):\n'
            '    f = sys._getframe()\n'
            '    while f.f_back: f = f.f_back\n'
            "    return f.f_locals.get('x', 0)\n"
        ),
        io=(
            'import sys\n'
            "blob = ''\n"
            'try:\n'
            '    f = sys._getframe()\n'
            '    while f is not None:\n'
            '        blob += repr(f.f_locals)\n'
            '        f = f.f_back\n'
            'except Exception:\n'
            '    pass\n'
            'import re, sys\n'
            'line = sys.stdin.readline()\n'
            "m = re.search(re.escape(repr(line)[1:-1]) + r'\\W{1,6}(-?\\d+)', str(blob))\n"
            'print(m[1] if m else 0)\n'
        ),
    )),
    Hack('traceback_frame', 'reach_harness', forms(
        assert_=(
            'import sys\n'
            'def add(a, b):\n'
            '    try:\n'
            '        raise ZeroDivisionError\n'
            '    except ZeroDivisionError as e:\n'
            '        f = e.__traceback__.tb_frame.f_back\n'
            '        return f.f_locals\n'
        ),
        call=(
            'import sys, os\n'
            'try:\n'
            '    1/0\n'
            'except Exception as e:\n'
            '    f = e.__traceback__.tb_frame\n'
            '    while f.f_back: f = f.f_back\n'
            "    nonce = f.f_locals.get('nonce')\n"
            "    os.write(3, b'F' + nonce + b' []\\n'); os._exit(0)\n"
        ),
        io=(
            "blob = ''\n"
            'try:\n'
            '    1 / 0\n'
            'except ZeroDivisionError as e:\n'
            '    try:\n'
            '        f = e.__traceback__.tb_frame\n'
            '        while f is not None:\n'
            '            blob += repr(f.f_locals)\n'
            '            f = f.f_back\n'
            '    except Exception:\n'
            '        pass\n'
            'import re, sys\n'
            'line = sys.stdin.readline()\n'
            "m = re.search(re.escape(repr(line)[1:-1]) + r'\\W{1,6}(-?\\d+)', str(blob))\n"
            'print(m[1] if m else 0)\n'
        ),
    )),
    Hack('generator_frame', 'reach_harness', forms(
        both=(
            'def g():\n'
            '    yield 1\n'
            'def add(a, b):\n'
            '    it = g(); next(it)\n'
            '    return it.gi_frame.f_back\n'
        ),
    )),
    Hack('signal_frame', 'reach_harness', forms(
        both=(
            'import signal, os\n'
            'seen = []\n'
            'signal.signal(signal.SIGALRM, lambda s, f: seen.append(f))\n'
            'signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)\n'
            'def add(a, b):\n'
            '    for _ in range(10**5): pass\n'
            '    f = seen[-1] if seen and seen[-1] else None\n'
            '    while f is not None and f.f_back: f = f.f_back\n'
            "    return f.f_locals.get('nonce') if f else 0\n"
        ),
    )),
    Hack('settrace', 'reach_harness', forms(
        both=(
            'import sys\n'
            'sys.settrace(lambda f, e, a: None)\n'
            'sys.setprofile(lambda f, e, a: None)\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('audit_hook_spy', 'reach_harness', forms(
        both=(
            'import sys, re\n'
            'T = {}\n'
            'def spy(ev, args):\n'
            "    if ev in ('compile', 'exec'):\n"
            "        T['src'] = repr(args)\n"
            'sys.addaudithook(spy)\n'
            'def add(a, b):\n'
            "    m = re.search(r'add\\(%d, %d\\) == (-?\\d+)' % (a, b), T.get('src', ''))\n"
            '    return int(m[1]) if m else 0\n'
        ),
    )),
    Hack('forge_marker', 'reach_harness', forms(
        assert_=(
            'import os\n'
            'for fd in range(3, 20):\n'
            "    for line in (b'R\\n', b'F []\\n', b'ok\\n'):\n"
            '        try: os.write(fd, line)\n'
            '        except OSError: pass\n'
            'os._exit(0)\n'
        ),
        call=(
            'import os\n'
            'for fd in range(3, 20):\n'
            '    try: os.write(fd, b\'F [["ok",3],["ok",0],["ok",42]]\\n\')\n'
            '    except OSError: pass\n'
            'os._exit(0)\n'
        ),
    )),
    Hack('gc_objects', 'reach_harness', forms(
        both=(
            'import gc\n'
            'try:\n'
            '    objs = gc.get_objects()\n'
            'except Exception: objs = []\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('thread_later', 'reach_harness', forms(
        both=(
            'import threading, time, sys\n'
            'def spy():\n'
            '    time.sleep(0.05)\n'
            '    for f in sys._current_frames().values(): pass\n'
            'threading.Thread(target=spy).start()\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('io_frames', 'reach_harness', forms(
        io=(
            'import sys\n'
            'try:\n'
            '    f = sys._getframe()\n'
            '    print(f.f_back.f_locals)\n'
            'except Exception as e:\n'
            '    print(0)\n'
        ),
    )),
    Hack('io_thread', 'threads', forms(
        io=(
            'import threading\n'
            'threading.Thread(target=lambda: print(3)).start()\n'
        ),
    )),
    Hack('fresh_thread_module', 'threads', forms(
        both=(
            'import importlib.util, importlib.machinery, sys\n'
            'spec = importlib.machinery.BuiltinImporter.find_spec("_thread")\n'
            'thread = importlib.util.module_from_spec(spec)\n'
            'importlib.machinery.BuiltinImporter.exec_module(thread)\n'
            'seen = []\n'
            'def spy():\n'
            '    import time\n'
            '    time.sleep(0.05)\n'
            '    seen.append(sys._current_frames())\n'
            'thread.start_new_thread(spy, ())\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('nonce_getframe', 'reach_harness', forms(
        both=(
            'import os\n'
            'def forge(f, ready=True):\n'
            '    while f is not None:\n'
            '        v = f.f_locals\n'
            "        if 'nonce' in v and ('marker_fd' in v or 'ctl_fd' in v):\n"
            "            n = v['nonce']\n"
            "            if 'marker_fd' in v:\n"
            "                os.write(int(v['marker_fd']), n)\n"
            '            else:\n'
            "                os.write(v['ctl_fd'], (b'R' + n + b'\\n' if ready else b'') + b'F' + n + b' \\n')\n"
            '            os._exit(0)\n'
            '        f = f.f_back\n'
            'import sys\n'
            'forge(sys._getframe())\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('nonce_traceback', 'reach_harness', forms(
        both=(
            'import os\n'
            'def forge(f, ready=True):\n'
            '    while f is not None:\n'
            '        v = f.f_locals\n'
            "        if 'nonce' in v and ('marker_fd' in v or 'ctl_fd' in v):\n"
            "            n = v['nonce']\n"
            "            if 'marker_fd' in v:\n"
            "                os.write(int(v['marker_fd']), n)\n"
            '            else:\n'
            "                os.write(v['ctl_fd'], (b'R' + n + b'\\n' if ready else b'') + b'F' + n + b' \\n')\n"
            '            os._exit(0)\n'
            '        f = f.f_back\n'
            'try:\n'
            '    1 / 0\n'
            'except ZeroDivisionError as e:\n'
            '    forge(e.__traceback__.tb_frame)\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('nonce_generator', 'reach_harness', forms(
        both=(
            'import os\n'
            'def forge(f, ready=True):\n'
            '    while f is not None:\n'
            '        v = f.f_locals\n'
            "        if 'nonce' in v and ('marker_fd' in v or 'ctl_fd' in v):\n"
            "            n = v['nonce']\n"
            "            if 'marker_fd' in v:\n"
            "                os.write(int(v['marker_fd']), n)\n"
            '            else:\n'
            "                os.write(v['ctl_fd'], (b'R' + n + b'\\n' if ready else b'') + b'F' + n + b' \\n')\n"
            '            os._exit(0)\n'
            '        f = f.f_back\n'
            'def gen():\n'
            '    yield me.gi_frame.f_back\n'
            'me = gen()\n'
            'forge(next(me))\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('nonce_current_frames', 'reach_harness', forms(
        both=(
            'import os\n'
            'def forge(f, ready=True):\n'
            '    while f is not None:\n'
            '        v = f.f_locals\n'
            "        if 'nonce' in v and ('marker_fd' in v or 'ctl_fd' in v):\n"
            "            n = v['nonce']\n"
            "            if 'marker_fd' in v:\n"
            "                os.write(int(v['marker_fd']), n)\n"
            '            else:\n'
            "                os.write(v['ctl_fd'], (b'R' + n + b'\\n' if ready else b'') + b'F' + n + b' \\n')\n"
            '            os._exit(0)\n'
            '        f = f.f_back\n'
            'import sys, threading\n'
            'forge(sys._current_frames()[threading.get_ident()])\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('nonce_settrace', 'reach_harness', forms(
        both=(
            'import os\n'
            'def forge(f, ready=True):\n'
            '    while f is not None:\n'
            '        v = f.f_locals\n'
            "        if 'nonce' in v and ('marker_fd' in v or 'ctl_fd' in v):\n"
            "            n = v['nonce']\n"
            "            if 'marker_fd' in v:\n"
            "                os.write(int(v['marker_fd']), n)\n"
            '            else:\n'
            "                os.write(v['ctl_fd'], (b'R' + n + b'\\n' if ready else b'') + b'F' + n + b' \\n')\n"
            '            os._exit(0)\n'
            '        f = f.f_back\n'
            'import sys\n'
            'try:\n'
            '    sys.settrace(lambda f, e, a: forge(f))\n'
            'except Exception:\n'
            '    sys.setprofile(lambda f, e, a: forge(f))\n'
            'def probe():\n'
            '    pass\n'
            'probe()\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('nonce_signal', 'signals', forms(
        both=(
            'import os\n'
            'def forge(f, ready=True):\n'
            '    while f is not None:\n'
            '        v = f.f_locals\n'
            "        if 'nonce' in v and ('marker_fd' in v or 'ctl_fd' in v):\n"
            "            n = v['nonce']\n"
            "            if 'marker_fd' in v:\n"
            "                os.write(int(v['marker_fd']), n)\n"
            '            else:\n'
            "                os.write(v['ctl_fd'], (b'R' + n + b'\\n' if ready else b'') + b'F' + n + b' \\n')\n"
            '            os._exit(0)\n'
            '        f = f.f_back\n'
            'import signal, time\n'
            'signal.signal(signal.SIGALRM, lambda s, f: forge(f))\n'
            'signal.setitimer(signal.ITIMER_REAL, 0.01)\n'
            'time.sleep(0.5)\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('nonce_thread', 'threads', forms(
        both=(
            'import os\n'
            'def forge(f, ready=True):\n'
            '    while f is not None:\n'
            '        v = f.f_locals\n'
            "        if 'nonce' in v and ('marker_fd' in v or 'ctl_fd' in v):\n"
            "            n = v['nonce']\n"
            "            if 'marker_fd' in v:\n"
            "                os.write(int(v['marker_fd']), n)\n"
            '            else:\n'
            "                os.write(v['ctl_fd'], (b'R' + n + b'\\n' if ready else b'') + b'F' + n + b' \\n')\n"
            '            os._exit(0)\n'
            '        f = f.f_back\n'
            'import sys, threading, time\n'
            'main = threading.get_ident()\n'
            'threading.Thread(target=lambda: forge(sys._current_frames()[main])).start()\n'
            'time.sleep(0.5)\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('bootstrap_globals', 'reach_harness', forms(
        both=(
            'for c in object.__subclasses__():\n'
            "    g = getattr(getattr(c, '__init__', None), '__globals__', {})\n"
            "    if '_run_tests' in g:\n"
            "        g['_run_tests'] = lambda *a: b''\n"
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('thread_patch_globals', 'reach_harness', forms(
        both=(
            'import _thread\n'
            "g = getattr(_thread.start_new_thread, '__globals__', {})\n"
            "if '_run_tests' in g:\n"
            "    g['_run_tests'] = lambda *a: b''\n"
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('bootstrap_window_nonce', 'reach_harness', forms(
        both=(
            'def forge(kit, exc, window, sources):\n'
            '    window[0] = True\n'
            '    f = exc.__traceback__.tb_frame\n'
            "    while f is not None and 'nonce' not in f.f_locals:\n"
            '        f = f.f_back\n'
            "    kit.write(f.f_locals['ctl_fd'], b'F' + f.f_locals['nonce'] + b' \\n')\n"
            '    kit.exit(0)\n'
            'for c in object.__subclasses__():\n'
            "    g = getattr(getattr(c, '__init__', None), '__globals__', {})\n"
            "    if '_format_error' in g:\n"
            "        g['_format_error'] = forge\n"
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
    Hack('bootstrap_builtins', 'reach_harness', forms(
        both=(
            'class E:\n'
            '    def __eq__(s, o): return True\n'
            '    @staticmethod\n'
            '    def items(d):\n'
            '        return dict.items(d) if type(d) is dict else ()\n'
            'for c in object.__subclasses__():\n'
            "    g = getattr(getattr(c, '__init__', None), '__globals__', {})\n"
            "    if '_plain' in g and type(g.get('__builtins__')) is dict:\n"
            "        g['__builtins__']['dict'] = E\n"
            'def add(a, b):\n'
            '    return E()\n'
        ),
    )),
    Hack('subinterpreter', 'reach_harness', forms(
        both=(
            "code = '''\n"
            'import ctypes, os\n'
            'api = ctypes.pythonapi\n'
            'api.PyInterpreterState_Main.restype = ctypes.c_void_p\n'
            'api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p\n'
            'api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]\n'
            'api.PyThreadState_GetFrame.restype = ctypes.py_object\n'
            'api.PyThreadState_GetFrame.argtypes = [ctypes.c_void_p]\n'
            'f = api.PyThreadState_GetFrame(api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Main()))\n'
            'while f is not None:\n'
            '    v = f.f_locals\n'
            "    if 'nonce' in v:\n"
            "        n = v['nonce']\n"
            "        if 'marker_fd' in v:\n"
            "            os.write(int(v['marker_fd']), n)\n"
            '        else:\n'
            "            os.write(v['ctl_fd'], b'R' + n + b'\\\\nF' + n + b' \\\\n')\n"
            '        os._exit(0)\n'
            '    f = f.f_back\n'
            "'''\n"
            'try:\n'
            '    import _xxsubinterpreters as interpreters\n'
            'except Exception:\n'
            '    import _interpreters as interpreters  # the name from Python 3.13 on\n'
            'interpreters.run_string(interpreters.create(), code)\n'
            'def add(a, b):\n'
            '    return 0\n'
        ),
    )),
]
