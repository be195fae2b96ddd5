"""The sandbox's processes as the caller sees them: their pipes, their end, their directory.

    Channel      a child's two control pipes: its lines in (each at most max_line), requests out
    Child        one sandboxed interpreter in its own session, stdout and stderr drained, capped
    supervise    wait for children (and the talk on their pipes) at most wall_s; kill and reap
    remove       a fallback run's directory, removed without recursion or following links

Used by `flexmarl.rewards.sandbox` only; nothing here knows what a test or a verdict is.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 << 10
REAP_TIMEOUT_S = 5.0  # SIGKILLed processes die at once; this only guards against a stuck reap


class Channel:
    """The parent's ends of a child's two control pipes: the child's lines in, requests out."""

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self.ctl_r, self.ctl_w = os.pipe()
        self.req_r, self.req_w = os.pipe()
        self.child_fds = (self.ctl_w, self.req_r)
        self.reader: asyncio.StreamReader | None = None
        self.transports: list = []
        self.writer: asyncio.StreamWriter | None = None
        self.overflowed = False
        self._opening: asyncio.Future | None = None
        self._closed = False

    async def open(self) -> None:
        """Once the child holds its ends: close ours of them, and take the others to the loop.
        Never cancelled midway (shielded: a caller cancelled meanwhile leaves it to finish, and
        `close` to it): a transport half made when cancelled could leave a descriptor closed
        twice, the second time under whatever another thread opened with its number."""
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._connect())
        await asyncio.shield(self._opening)

    async def _connect(self) -> None:
        for fd in self.child_fds:
            os.close(fd)
        self.child_fds = ()
        loop = asyncio.get_running_loop()
        # The reader holds at most about one line of max_line (it stops reading from the
        # pipe past its limit): the program cannot make this process hold more.
        self.reader = asyncio.StreamReader(limit=self.max_line + 1)
        ctl_r, self.ctl_r = self.ctl_r, -1
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(self.reader), os.fdopen(ctl_r, "rb", 0))
        self.transports.append(transport)
        req_w, self.req_w = self.req_w, -1
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(req_w, "wb", 0))
        self.transports.append(transport)
        self.writer = asyncio.StreamWriter(transport, protocol, None, loop)
        if self._closed:  # closed while this was connecting: its transports go now
            self._close_transports()

    async def send(self, data: bytes) -> bool:
        """False once the child has closed its end (it ended, or broke the protocol)."""
        try:
            self.writer.write(data)
            await self.writer.drain()
            return True
        except (BrokenPipeError, ConnectionResetError, RuntimeError):
            return False

    async def line(self) -> bytes | None:
        """The child's next line; None at its end, or past max_line (then `overflowed`)."""
        try:
            line = await self.reader.readline()
        except (ValueError, asyncio.LimitOverrunError):
            self.overflowed = True
            return None
        if len(line) > self.max_line:
            self.overflowed = True
            return None
        return line if line.endswith(b"\n") else None

    async def unasked(self) -> bool:
        """Whether the child wrote anything more before its end (call after the last answer
        and stop_sending: a serving program then exits)."""
        if self.reader is None:
            return False
        try:
            return bool(await self.reader.read(1))
        except (ValueError, OSError):
            return True

    def stop_sending(self) -> None:
        """EOF on the requests pipe: a serving program answers the rest and exits."""
        if self.writer is not None:
            self.writer.transport.close()

    def close(self) -> None:
        """Close what this channel holds; what a connect still in flight holds, when it ends."""
        self._closed = True
        if self._opening is not None and not self._opening.done():
            return  # its descriptors are its own until it ends (_connect closes them then)
        self._close_transports()
        for fd in (self.ctl_r, self.req_w, *self.child_fds):
            if fd >= 0:
                os.close(fd)
        self.ctl_r = self.req_w = -1
        self.child_fds = ()

    def _close_transports(self) -> None:
        for transport in self.transports:
            transport.close()


class Child:
    """One sandboxed interpreter in its own session; stdout and stderr drained, capped."""

    def __init__(self, proc: asyncio.subprocess.Process, stdin: bytes, limit: int,
                 bwrap: bool, merged: bool) -> None:
        self.proc, self.limit, self.bwrap, self.merged = proc, limit, bwrap, merged
        self.out, self.err = bytearray(), bytearray()
        self.flooded = asyncio.Event()
        self.done = asyncio.ensure_future(self._run(stdin))

    async def _drain(self, stream: asyncio.StreamReader | None, buf: bytearray) -> None:
        while stream is not None and (chunk := await stream.read(CHUNK_BYTES)):
            room = self.limit - len(buf)
            buf += chunk[:room]
            if len(chunk) > room:
                self.flooded.set()
                return

    async def _feed(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            await self.proc.stdin.drain()
            self.proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the program exited without reading all its input

    async def _run(self, stdin: bytes) -> None:
        # merged: stdout and stderr on one pipe (the judge's), kept as stderr
        await asyncio.gather(self._drain(self.proc.stdout, self.err if self.merged else self.out),
                             self._drain(self.proc.stderr, self.err), self._feed(stdin))
        await self.proc.wait()

    @property
    def returncode(self) -> int | None:
        code = self.proc.returncode
        if self.bwrap and code is not None and 128 < code < 128 + signal.NSIG:
            code = 128 - code  # bwrap reports death by signal N as 128 + N
        return code

    def end(self) -> None:
        """SIGKILL its process group now; its pipes then end, and `done` with them."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    async def kill(self) -> None:
        self.done.cancel()
        await asyncio.gather(self.done, return_exceptions=True)
        await kill_group(self.proc)


async def remove(workdir: str) -> None:
    """Remove a fallback run's directory without recursing here or following a link out: a
    flat directory of files directly, anything else by `chmod -R u+rwx` (a program may have
    taken its own permissions away) and `rm -rf` (coreutils walk any depth, never follow
    links)."""
    try:
        with os.scandir(workdir) as entries:
            flat = [e for e, _ in zip(entries, range(256))]
        if len(flat) < 256 and all(not e.is_dir(follow_symlinks=False) for e in flat):
            for entry in flat:
                os.unlink(entry.path)
            os.rmdir(workdir)
            return
    except OSError:
        pass
    for argv in (["chmod", "-R", "u+rwx", "--", workdir], ["rm", "-rf", "--", workdir]):
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL)
            await proc.wait()
        except OSError as exc:
            log.warning("cannot remove the sandbox directory %s: %s", workdir, exc)
            return


@contextlib.contextmanager
def closing(channel: Channel):
    try:
        yield channel
    finally:
        channel.close()


async def supervise(children: list[Child], talk, wall_s: float) -> str | None:
    """Wait for the children to exit (and the talk on their pipes to end), at most `wall_s`.
    The cause if they had to be killed; every child's process group is killed and reaped."""
    finished = asyncio.ensure_future(asyncio.gather(
        *(child.done for child in children), *([talk] if talk is not None else [])))
    floods = [asyncio.ensure_future(child.flooded.wait()) for child in children]
    try:
        done, _ = await asyncio.wait((finished, *floods), timeout=wall_s,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (finished, *floods):
            task.cancel()
        await asyncio.gather(finished, *floods, return_exceptions=True)
        for child in children:
            await child.kill()
    if any(child.flooded.is_set() for child in children):
        return "output_limit"
    if finished in done:
        finished.result()  # an unexpected error of our own pipes, not the program's
        return None
    return "timeout"


async def kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the program's process group (it leads it: start_new_session) and reap it.

    Also after a normal exit, for any process it managed to leave behind; such a straggler
    keeps the group id in use, so the id cannot meanwhile name someone else's group. Under
    bwrap, the program's own PID namespace ends with it (--die-with-parent).
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        await asyncio.wait_for(proc.wait(), REAP_TIMEOUT_S)
    except asyncio.TimeoutError:
        pass  # SIGKILLed yet not reaped: left to the event loop's child watcher
