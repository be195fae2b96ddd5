"""The gateway's endpoints and the app behind them, for the length of a run.

    serve_gateway: GatewayServer up (its token: gateway.token, or generated for the run, and
                   written to RUN_DIR/gateway_token) ─► the gateway's expiry loop ─►
                   `gateway.app` started with OPENAI_BASE_URL / OPENAI_API_KEY (the token)
                   set ─► (run) ─► app stopped (SIGTERM, then SIGKILL), waiting calls
                   answered, server down
    unless_app_exits: the run, stopped with a clear error if the app exits first

`gateway.app` runs as a user would expect of `flexmarl run --team agents/x.py` beside it, from
any directory: its first word `python` (or `python3`) is the Python running FlexMARL
(sys.executable, which has `openai` and `httpx`), and a relative path in it that is not in the
current directory is looked up in the package root, as team.path is (app_command).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shlex
import signal
import sys
from pathlib import Path
from typing import Awaitable, Callable

from flexmarl.config.load import PACKAGE_ROOT
from flexmarl.config.sections import GatewayConfig
from flexmarl.console import phase
from flexmarl.gateway.api import TOKEN_FILE, GatewayServer
from flexmarl.gateway.backend import Gateway
from flexmarl.orchestrator.orchestrator import WorkflowError

log = logging.getLogger(__name__)


async def serve_gateway(stack: contextlib.AsyncExitStack, gateway: Gateway, g: GatewayConfig,
                        on_gateway: Callable[[str], None] | None, *, stop_timeout_s: float,
                        run_dir: Path | None = None) -> asyncio.subprocess.Process | None:
    """Serve the OpenAI-compatible endpoints (until `stack` closes) and start gateway.app;
    at the end the app gets `stop_timeout_s` (supervisor.stop_timeout_s) after SIGTERM. The
    token clients need goes to `run_dir`/gateway_token before `on_gateway` is called."""
    server = await stack.enter_async_context(GatewayServer(gateway, host=g.host, port=g.port,
                                                           token=g.token))
    if run_dir is not None:
        write_token(run_dir / TOKEN_FILE, server.token)
    elif not g.token:
        log.warning("gateway: its token was generated and there is no run directory to write "
                    "it to: only gateway.app gets it (OPENAI_API_KEY); set gateway.token to "
                    "call the gateway from elsewhere")
    expiry = asyncio.create_task(gateway.expire_loop(), name="gateway.expire")
    stack.callback(expiry.cancel)
    stack.callback(gateway.close)  # before the server stops: waiting calls answered at once
    (on_gateway or (lambda url: log.warning("gateway at %sv1", url)))(server.url)
    if not g.app:
        return None
    env = {**os.environ, "OPENAI_BASE_URL": server.url + "v1",
           "OPENAI_API_KEY": server.token, "FLEXMARL_GATEWAY": server.url}
    command = app_command(g.app)
    app = await asyncio.create_subprocess_shell(command, env=env, start_new_session=True)
    phase(f"gateway app started (pid {app.pid}): {command}")

    async def stop_app() -> None:
        if app.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(app.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(app.wait(), stop_timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(app.pid, signal.SIGKILL)
                await app.wait()
    stack.push_async_callback(stop_app)
    return app


def write_token(path: Path, token: str) -> None:
    """`token` in `path`, readable by its owner only (0600 from its creation: never readable by
    others, even for a moment; an older file is replaced, not reused with its mode)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)  # no newline: a client reading the file whole sends it as-is


async def unless_app_exits(run: Awaitable, app: asyncio.subprocess.Process | None) -> None:
    """Await `run`; if the gateway's app exits first, stop it and say so (its episodes were
    the run's only data)."""
    if app is None:
        await run
        return
    work = asyncio.ensure_future(run)
    ended = asyncio.ensure_future(app.wait())
    try:
        await asyncio.wait([work, ended], return_when=asyncio.FIRST_COMPLETED)
    finally:
        ended.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
    if not work.cancelled():
        work.result()
        return
    # A WorkflowError: the app is the run's workflow, and the CLI says so in one line.
    raise WorkflowError(f"the gateway app (gateway.app, pid {app.pid}) exited with code "
                        f"{app.returncode} before the run ended; its output is above")


PYTHON_WORDS = ("python", "python3")
"""A gateway.app that starts with one of these runs with the run's own Python."""


def app_command(command: str, *, cwd: Path | None = None, root: Path = PACKAGE_ROOT) -> str:
    """`command` (gateway.app) as the shell runs it: a first word in PYTHON_WORDS becomes
    sys.executable, and each relative path in it that does not exist under `cwd` (the current
    directory) but does under `root` (the package root) becomes that absolute path. A command
    the shell's quoting rules cannot split is left as it is."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    cwd = cwd or Path.cwd()
    out = command
    for word in {w for w in words if "/" in w and not w.startswith(("/", "~", "-", "$"))}:
        if not (cwd / word).exists() and (root / word).exists():
            out = re.sub(rf"(?<![^\s'\"]){re.escape(word)}(?![^\s'\"])",
                         lambda _m: shlex.quote(str(root / word)), out)
    if words and words[0] in PYTHON_WORDS:
        out = re.sub(rf"^\s*{re.escape(words[0])}(?=\s|$)", shlex.quote(sys.executable), out)
    return out
