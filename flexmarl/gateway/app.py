"""The gateway's endpoints and the app behind them, for the length of a run.

    serve_gateway: GatewayServer up (its token: gateway.token, or generated for the run, and
                   written to RUN_DIR/gateway_token) ─► the gateway's expiry loop ─►
                   `gateway.app` started with OPENAI_BASE_URL / OPENAI_API_KEY (the token)
                   set ─► (run) ─► app stopped (SIGTERM, then SIGKILL), waiting calls
                   answered, server down
    unless_app_exits: the run, stopped with a clear error if the app exits first
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import Awaitable, Callable

from flexmarl.config.sections import GatewayConfig
from flexmarl.gateway.api import TOKEN_FILE, GatewayServer
from flexmarl.gateway.backend import Gateway

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
    app = await asyncio.create_subprocess_shell(g.app, env=env, start_new_session=True)
    log.warning("gateway app started (pid %d): %s", app.pid, g.app)

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
    raise RuntimeError(f"the gateway app (gateway.app, pid {app.pid}) exited with code "
                       f"{app.returncode} before the run ended; its output is above")
