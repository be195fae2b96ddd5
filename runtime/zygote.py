"""A fork server: worker processes forked from one that imported their modules once.

A worker started as `python -m runtime.worker` spends seconds importing before it does anything
(torch, transformers and a model's code: about 4 s of CPU each on this project's 2-core
machine, where a run starts six workers and a replacement starts one more). With
`SupervisorConfig.preload` set, the supervisor starts one zygote per supervisor instead, which
imports those modules (never runs them: no thread, no event loop, no CUDA context exists when
it forks), and each worker is a fork of it, ready in a fraction of a second:

    supervisor ──(unix socket: spawn {boot, env} + the worker's stderr fd)──► zygote
        zygote: fork ─► child: new session, stderr/stdout onto the passed fd, environment
                replaced by the spec's, runtime.worker.main(boot) (the same code as exec'd)
        zygote ──► {"pid"}; later {"exited": pid, "returncode"} when it reaps the child

The supervisor sees each worker through a ZygoteProcess (pid, returncode, wait(): the stand-in
a WorkerHandle takes, as runtime.ray_cluster's RayProcess). The zygote dies with its
supervisor (PR_SET_PDEATHSIG, and it exits when the socket closes), and its children with it.

What a fork shares: the preloaded modules' state as of the zygote's start. Environment
variables a preloaded module read at import (not ones read later: CUDA_VISIBLE_DEVICES,
OMP_NUM_THREADS, VLLM_*) keep the supervisor's values of that moment. Not shared: the global
random generators. Each child reseeds `random`'s, numpy's and torch's (those the zygote has
imported) from the OS right after the fork, so two workers that never seed draw different
numbers, as two fresh interpreters would; a worker that seeds itself is unaffected.
"""
from __future__ import annotations

import asyncio
import importlib
import json
import os
import random
import selectors
import signal
import socket
import struct
import sys
from typing import Any

_HEADER = struct.Struct("!I")
_MAX_FDS = 2


def _send(sock: socket.socket, obj: Any, fds: list[int] = ()) -> None:
    data = json.dumps(obj).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [payload], list(fds))
    else:
        sock.sendall(payload)


def _recv_exact(sock: socket.socket, n: int, fds: list[int]) -> bytes:
    buf = b""
    while len(buf) < n:
        data, got, _, _ = socket.recv_fds(sock, n - len(buf), _MAX_FDS)
        if not data:
            raise EOFError("the zygote's socket closed")
        fds.extend(got)
        buf += data
    return buf


def _recv(sock: socket.socket) -> tuple[Any, list[int]]:
    fds: list[int] = []
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, fds))
    return json.loads(_recv_exact(sock, size, fds)), fds


# ----------------------------------------------------------------------------- the zygote

def _reseed() -> None:
    """Fresh OS entropy for the global generators a fork would otherwise copy from the zygote:
    `random`'s (CPython reseeds it after os.fork already: done here too, said in one place),
    numpy's legacy global RandomState and torch's default generators, each only if its module
    is imported (nothing is imported for it). torch.manual_seed seeds the CUDA generators too,
    lazily: no CUDA context is created here."""
    random.seed()  # os.urandom
    if (np_random := sys.modules.get("numpy.random")) is not None:
        np_random.seed()  # seed(None): from the OS
    if (torch := sys.modules.get("torch")) is not None:
        torch.manual_seed(int.from_bytes(os.urandom(8), "little"))


def _child(boot: dict, env: dict[str, str], out_fd: int, both: bool) -> None:
    """In the forked child: become the worker `python -m runtime.worker` would have been."""
    _reseed()
    from runtime import worker
    if "setproctitle" in sys.modules:  # what tools that find workers read (worker_name);
        # before the environment is replaced: setproctitle needs the original one in place
        sys.modules["setproctitle"].setproctitle(worker.TITLE_PREFIX + boot["name"])
    os.setsid()
    os.dup2(out_fd, 2)
    if both:
        os.dup2(out_fd, 1)
    os.close(out_fd)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(env)
    if "torch" in sys.modules and env.get("OMP_NUM_THREADS", "").isdigit():
        # torch sizes its thread pool on first use; OpenMP read the zygote's environment.
        sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))
    boot = {**boot, "supervisor_pid": os.getppid()}  # its parent now: the zygote
    try:
        worker.main([json.dumps(boot)])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
        os._exit(code)
    except BaseException:
        import traceback
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def serve(fd: int, preload: list[str], supervisor_pid: int) -> None:
    """The zygote's loop: spawn requests from the socket, exits of its children to it."""
    from runtime.worker import _die_with_parent
    _die_with_parent(supervisor_pid)
    try:  # imported here, before a child replaces its environment (it moves environ)
        import setproctitle  # noqa: F401
    except ImportError:
        pass
    for module in preload:
        importlib.import_module(module)
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector through the pipe
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    _send(sock, {"ready": os.getpid()})
    while True:
        for key, _ in sel.select():
            if key.fileobj is sock:
                try:
                    msg, fds = _recv(sock)
                except (EOFError, OSError):
                    os._exit(0)  # the supervisor is gone: its workers get SIGTERM (pdeathsig)
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    sock.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    signal.set_wakeup_fd(-1)
                    _child(msg["boot"], msg["env"], fds[0], msg["stdout"])
                for f in fds:
                    os.close(f)
                _send(sock, {"pid": pid})
            else:
                os.read(wake_r, 4096)
        while True:  # reap every child that exited
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _send(sock, {"exited": pid, "returncode": os.waitstatus_to_exitcode(status)})


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m runtime.zygote CONFIG_JSON (started by runtime.supervisor)")
    config = json.loads(sys.argv[1])
    serve(config["fd"], config["preload"], config["supervisor_pid"])


# ----------------------------------------------------------------------------- the supervisor's end

class ZygoteProcess:
    """A worker forked by the zygote, as a WorkerHandle sees a process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._exited = asyncio.get_running_loop().create_future()

    def exited(self, returncode: int | None) -> None:
        if not self._exited.done():
            self.returncode = returncode
            self._exited.set_result(None)

    async def wait(self) -> int | None:
        await asyncio.shield(self._exited)
        return self.returncode


class Zygote:
    """The supervisor's end of one fork server (see the module docstring)."""

    def __init__(self, preload: tuple[str, ...], stdout: bool) -> None:
        self.preload, self.stdout = list(preload), stdout
        self.proc: asyncio.subprocess.Process | None = None
        self._sock: socket.socket | None = None
        self._children: dict[int, ZygoteProcess] = {}
        self._early: dict[int, int] = {}
        """Exits reported before the spawn's reply was read (pid -> returncode)."""
        self._lock = asyncio.Lock()
        self._replies: asyncio.Queue = asyncio.Queue()
        self._reader: asyncio.Task | None = None

    async def start(self, ready_timeout_s: float, out_fd: int) -> None:
        """Start the zygote, its stderr (and stdout, if its children's go there too) onto
        `out_fd`: what its interpreter prints while it imports goes where the workers' does."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        config = {"fd": theirs.fileno(), "preload": self.preload, "supervisor_pid": os.getpid()}
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "runtime.zygote", json.dumps(config),
                pass_fds=[theirs.fileno()], start_new_session=True, stderr=out_fd,
                stdout=out_fd if self.stdout else None)
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        self._reader = asyncio.ensure_future(self._read())
        reply = await asyncio.wait_for(self._replies.get(), ready_timeout_s)
        if "ready" not in reply:
            raise RuntimeError(f"the zygote answered {reply!r} instead of ready")

    @property
    def alive(self) -> bool:
        return self._reader is not None and not self._reader.done()

    async def spawn(self, boot: dict, env: dict[str, str], out_fd: int) -> ZygoteProcess:
        """Fork a worker with `boot` (runtime.worker's), `env` and stderr (and, if the
        zygote was built so, stdout) onto `out_fd`."""
        async with self._lock:  # one spawn's reply at a time
            loop = asyncio.get_running_loop()
            data = json.dumps({"boot": boot, "env": env, "stdout": self.stdout}).encode()
            payload = _HEADER.pack(len(data)) + data
            while True:  # the fd goes with the first bytes; a full socket buffer is brief
                try:
                    sent = socket.send_fds(self._sock, [payload], [out_fd])
                    break
                except BlockingIOError:
                    await asyncio.sleep(0.005)
            if sent < len(payload):
                await loop.sock_sendall(self._sock, payload[sent:])
            reply = await self._replies.get()
            if "pid" not in reply:
                raise RuntimeError(f"the zygote could not fork: {reply!r}")
            proc = ZygoteProcess(reply["pid"])
            self._children[proc.pid] = proc
            if proc.pid in self._early:
                proc.exited(self._early.pop(proc.pid))
            return proc

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        buf = b""
        try:
            while True:
                data = await loop.sock_recv(self._sock, 65536)
                if not data:
                    return
                buf += data
                while len(buf) >= _HEADER.size:
                    (size,) = _HEADER.unpack(buf[:_HEADER.size])
                    if len(buf) < _HEADER.size + size:
                        break
                    msg = json.loads(buf[_HEADER.size:_HEADER.size + size])
                    buf = buf[_HEADER.size + size:]
                    if "exited" in msg:
                        child = self._children.pop(msg["exited"], None)
                        if child is None:
                            self._early[msg["exited"]] = msg["returncode"]
                        else:
                            child.exited(msg["returncode"])
                    else:
                        self._replies.put_nowait(msg)
        finally:  # the zygote is gone (and its children with it: pdeathsig)
            for child in self._children.values():
                child.exited(-signal.SIGKILL)
            self._children.clear()
            self._replies.put_nowait({"error": "the zygote exited"})

    async def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        if self.proc is not None and self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
            await self.proc.wait()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)


if __name__ == "__main__":
    main()
