"""The run's HTTP face (aiohttp), on the orchestrator's event loop; loopback by default.

    GET /            the live dashboard (flexmarl/observe/web/index.html; its JS polls /api/status)
    GET /static/...  the dashboard's files, shipped in the package (no build step, no network)
    GET /api/status  the live state as JSON (orjson); schema in flexmarl.observe.monitor
    GET /metrics     Prometheus text exposition (prometheus_client), one scrape = one snapshot

The server only reads: `status()` and `metrics()` are callables (flexmarl.observe.monitor.RunMonitor
provides them), so the same server serves a live run, a simulated one, or a test's fake.

With a `token`, `/`, `/api/status` and `/metrics` answer only requests that carry it, as
`Authorization: Bearer TOKEN` or `?token=TOKEN` (open the dashboard at `/?token=TOKEN`; its JS
passes the page's query on); anything else gets 401 and no data. `/static/` stays open: it is the
package's own JS and CSS, no run data. Bound beyond loopback, the server refuses to start
without a token.
"""
from __future__ import annotations

import hmac
import logging
from pathlib import Path
from typing import Awaitable, Callable

import orjson
from aiohttp import web

from runtime.curve import is_loopback

log = logging.getLogger(__name__)
WEB_DIR = Path(__file__).with_name("web")
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class HttpServer:
    """An aiohttp application served on host:port for the duration of `async with` (port 0: a
    free one, known once started); the dashboard and the OpenAI gateway are two of them."""

    what = "server"
    """Named in errors and logs."""
    port_hint = "pick another port (0 picks a free one)"
    handler_cancellation = False
    """Cancel a handler whose client went away (aiohttp's default is off)."""

    app: web.Application
    host: str
    port: int
    _runner: web.AppRunner | None = None

    def _listen_on(self, host: str, port: int, token: str, token_setting: str) -> None:
        """Where to serve; refused beyond loopback without a token (`token_setting` says
        where to set one)."""
        if not token and not is_loopback(host):
            raise ValueError(f"{self.what}: refusing to serve on {host} (beyond loopback) "
                             f"without a token; set {token_setting} (e.g. to the output of "
                             "`openssl rand -hex 16`), or serve on 127.0.0.1")
        self.host, self.port = host, port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None,
                                     handler_cancellation=self.handler_cancellation)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            raise OSError(exc.errno, f"{self.what}: cannot listen on {self.host}:{self.port} "
                                     f"({exc.strerror}); {self.port_hint}") from None
        if self.port == 0:  # the port the OS picked
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        log.info("%s at %s", self.what, self.url)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class StatusServer(HttpServer):
    """`async with StatusServer(status, metrics, host, port) as server: server.url`."""

    what = "dashboard"
    port_hint = "set observe.port (0 picks a free port) or observe.dashboard = false"

    def __init__(self, status: Callable[[], dict], metrics: Callable[[], bytes], *,
                 host: str = "127.0.0.1", port: int = 0, token: str = "") -> None:
        self._listen_on(host, port, token, "observe.token")
        self._status = status
        self._metrics = metrics
        self._token = token.encode()
        self.app = web.Application(middlewares=[self._check_token] if token else [])
        self.app.add_routes([web.get("/", self._index), web.get("/api/status", self._api_status),
                             web.get("/metrics", self._api_metrics),
                             web.static("/static", WEB_DIR, show_index=False)])

    @web.middleware
    async def _check_token(self, request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                           ) -> web.StreamResponse:
        if not request.path.startswith("/static/"):
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer":
                given = request.query.get("token", "")
            if not hmac.compare_digest(given.strip().encode(), self._token):
                return web.Response(status=401, text="401: this dashboard needs its token "
                                    "(Authorization: Bearer TOKEN, or ?token=TOKEN)\n",
                                    headers={"WWW-Authenticate": 'Bearer realm="flexmarl"'})
        return await handler(request)

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(WEB_DIR / "index.html")

    async def _api_status(self, request: web.Request) -> web.Response:
        body = orjson.dumps(self._status(), option=orjson.OPT_NON_STR_KEYS)
        return web.Response(body=body, content_type="application/json",
                            headers={"Cache-Control": "no-store"})

    async def _api_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self._metrics(),
                            headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})
