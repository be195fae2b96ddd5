"""Worker process entry point: `python -m runtime.worker BOOT_JSON` (started by Supervisor).

Builds the actor from an injectable entry point ("package.module:function", called with a
WorkerContext), serves it, announces Ready to the supervisor on the control lane, heartbeats
(from a thread: runtime.heartbeat), and stops on a Shutdown message, SIGTERM or SIGINT. The boot
JSON comes from the parent process on the command line, never from the network.
"""
from __future__ import annotations

import asyncio
import ctypes
import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from runtime.actor import Actor
from runtime.config import SupervisorConfig, TransportConfig
from runtime.heartbeat import HeartbeatSender
from runtime.protocol import Heartbeat, Ready, Shutdown
from runtime.transport import Connection, connect

log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class WorkerContext:
    """What an entry point gets to build its actor."""

    name: str
    bind: str
    args: dict[str, Any] = field(default_factory=dict)
    transport: TransportConfig = TransportConfig()


TITLE_PREFIX = "runtime.worker:"
"""A forked worker's process title (runtime.zygote): this prefix and its name."""


def worker_name(args: list[str]) -> str | None:
    """The worker a process's command line names: `python -m runtime.worker BOOT_JSON`, or a
    forked worker's title `runtime.worker:NAME` (runtime.zygote); None for any other."""
    args = [a for a in args if a]
    if args and args[0].startswith(TITLE_PREFIX):
        return args[0][len(TITLE_PREFIX):]
    if "runtime.worker" not in args[:-1]:
        return None
    boot = next((a for a in args[args.index("runtime.worker") + 1:] if a.startswith("{")), "")
    try:
        return str(json.loads(boot)["name"])
    except (ValueError, KeyError, TypeError):
        return None


def resolve(entry: str) -> Callable[[WorkerContext], Actor]:
    module, _, attr = entry.partition(":")
    return getattr(importlib.import_module(module), attr)


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGTERM this process when its parent dies (no orphans if killed -9)."""
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


async def serve(boot: dict[str, Any]) -> None:
    name = boot["name"]
    sup_cfg = SupervisorConfig(**boot["supervisor_config"])
    transport = TransportConfig(**boot["transport"])
    ctx = WorkerContext(name=name, bind=boot["bind"], args=boot["args"], transport=transport)
    actor = resolve(boot["entry"])(ctx)
    if not isinstance(actor, Actor):
        raise TypeError(f"entry point {boot['entry']} returned {type(actor).__name__}, "
                        "expected a runtime.actor.Actor")
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        actor.stop()
        # If draining hangs and no supervisor is left to SIGKILL us (it escalates after
        # stop_timeout_s), do not linger as a half-dead process.
        loop.call_later(2 * sup_cfg.stop_timeout_s, os._exit, 1)

    def exit_while_starting(signum: int, frame: Any) -> None:
        # Before it is started a worker has nothing to drain, and its start may hold the event
        # loop for a long while (a vLLM engine loading), during which a loop signal handler
        # would not run: a stop then waited out supervisor.stop_timeout_s and a SIGKILL.
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, exit_while_starting)
    async with connect(boot["supervisor"], transport) as sup:
        async with asyncio.TaskGroup() as tg:
            run = tg.create_task(actor.run(), name=f"{name}.run")
            started = asyncio.ensure_future(actor.started.wait())
            await asyncio.wait([run, started], return_when=asyncio.FIRST_COMPLETED)
            if not actor.started.is_set():
                started.cancel()
                return  # run() failed; the TaskGroup re-raises its error
            for sig in (signal.SIGTERM, signal.SIGINT):  # from now on: stop and drain
                loop.add_signal_handler(sig, on_signal)
            await sup.request(Ready(name, os.getpid(), actor.address or ""), control=True,
                              timeout_s=boot.get("ready_timeout_s") or sup_cfg.ready_timeout_s)
            # From a thread: the actor's handlers may hold this loop for seconds (a model
            # loading, a long native call), which is work, not death.
            pid = os.getpid()
            beats = HeartbeatSender(boot["supervisor"], transport,
                                    lambda seq: Heartbeat(name, pid, seq),
                                    sup_cfg.heartbeat_interval_s, name=f"{name}.heartbeat")
            control = tg.create_task(_control_loop(sup, actor), name=f"{name}.control_loop")
            try:
                await run
            finally:
                control.cancel()
                beats.close()


async def _control_loop(sup: Connection, actor: Actor) -> None:
    while True:
        env = await sup.recv()
        if isinstance(env.msg, Shutdown):
            actor.stop()


def _exit_when_orphaned(parent_pid: int, grace_s: float) -> None:
    """Last resort, in a daemon thread: PR_SET_PDEATHSIG's SIGTERM is handled on the event loop,
    which a blocking call (an engine starting, a stuck entry point) can hold for minutes. Once
    the supervisor is gone, give the normal stop `grace_s`, then exit regardless."""
    while os.getppid() == parent_pid:
        time.sleep(0.25)
    time.sleep(grace_s)
    os._exit(1)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.exit("usage: python -m runtime.worker BOOT_JSON (started by runtime.supervisor)")
    boot = json.loads(argv[0])
    _die_with_parent(boot["supervisor_pid"])
    grace_s = 2 * float(boot.get("supervisor_config", {}).get("stop_timeout_s", 10.0))
    threading.Thread(target=_exit_when_orphaned, args=(boot["supervisor_pid"], grace_s),
                     name="orphan-watchdog", daemon=True).start()
    if boot.get("cpus"):  # before any thread pool exists; children inherit the mask
        os.sched_setaffinity(0, boot["cpus"])
    if boot.get("nice"):  # before any thread exists but the watchdog: threads inherit it
        os.nice(int(boot["nice"]))
    logging.basicConfig(level=os.environ.get("FLEXMARL_LOG", "WARNING"),
                        format=f"%(asctime)s {boot['name']} %(levelname)s %(name)s: %(message)s")
    try:
        import uvloop
        uvloop.run(serve(boot))
    except ImportError:
        asyncio.run(serve(boot))
    # Stopped cleanly: the actor's on_stop released what it owns. Skip interpreter
    # finalization, which for a process that imported torch and vLLM is seconds of garbage
    # collection (and native atexit hooks) that only delay the supervisor's join.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
