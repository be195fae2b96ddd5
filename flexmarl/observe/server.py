"""The run's HTTP face (aiohttp), on the orchestrator's event loop; loopback by default.

    GET /            the live dashboard (flexmarl/observe/web/index.html; its JS polls /api/status)
    GET /static/...  the dashboard's files, shipped in the package (no build step, no network)
    GET /api/status  the live state as JSON (orjson); schema in flexmarl.observe.monitor
    GET /metrics     Prometheus text exposition (prometheus_client), one scrape = one snapshot

The server only reads: `status()` and `metrics()` are callables (flexmarl.observe.monitor.RunMonitor
provides them), so the same server serves a live run, a simulated one, or a test's fake.

Bound to loopback, every route answers only requests whose `Host` is a loopback name (localhost,
127.0.0.1, [::1], any port); any other Host gets 421. A web page can point its own name at
127.0.0.1 (DNS rebinding) and then read the server as its own origin, but its requests still
say its name.

With a `token`, `/`, `/api/status` and `/metrics` answer only requests that carry it: as
`Authorization: Bearer TOKEN` (scripts, Prometheus), or as the cookie a browser gets by opening
`/?token=TOKEN` once: a correct `?token=` answers 303 to the same URL without it, setting an
HttpOnly, SameSite=Strict cookie, so the token leaves the address bar and history. Anything else
gets 401 and no data. `/static/` stays open: it is the package's own JS and CSS, no run data.
Bound beyond loopback, the server refuses to start without a token.
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
        self._token_setting = token_setting

    def host_ok(self, host_header: str) -> bool:
        """Whether a request's `Host` may reach this server. Bound to loopback: only a loopback
        name (localhost, a 127/8 or ::1 literal). DNS rebinding (a page's own name re-pointed
        at 127.0.0.1, so the browser lets it read the answers) always carries the page's name.
        The port is not checked: only something on this machine (an SSH tunnel, a proxy)
        can bring a request addressed to another port here. Bound beyond loopback: any name
        (the machine may have many), and such a server always has a token."""
        if not is_loopback(self.host):
            return True
        if host_header.startswith("["):  # [::1]:PORT
            name = host_header[:host_header.find("]") + 1]
        else:
            name = host_header.partition(":")[0]
        return bool(name) and is_loopback(name.lower())

    def misdirected(self, host_header: str) -> str | None:
        """None if `host_header` may reach this server (host_ok), else the 421 message: what
        to do instead."""
        if self.host_ok(host_header):
            return None
        section = self._token_setting.rpartition(".")[0]
        return (f"{self.what}: it serves on loopback ({self.host}) and answers only requests "
                f"addressed to localhost, 127.0.0.1 or [::1], not Host {host_header!r} (a "
                f"check against DNS rebinding). Open {self.url} instead (a proxy or tunnel in "
                f"front must pass a loopback Host), or, to be reached by other names, serve "
                f"beyond loopback: {section}.host with {section}.token set")

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
        # The cookie holds a value derived from the token, not the token: cookies are sent to
        # every port of a host, so another local server may see it, and it opens only this
        # dashboard (/?token= is still needed to get it).
        self._cookie_value = hmac.new(self._token, b"flexmarl dashboard cookie",
                                      "sha256").hexdigest()
        self.app = web.Application(middlewares=[self._check_host]
                                   + ([self._check_token] if token else []))
        self.app.add_routes([web.get("/", self._index), web.get("/api/status", self._api_status),
                             web.get("/metrics", self._api_metrics),
                             web.static("/static", WEB_DIR, show_index=False)])

    @property
    def _cookie_name(self) -> str:
        # Per port: cookies do not tell ports apart, and two runs' dashboards on one machine
        # must not overwrite each other's.
        return f"flexmarl_dashboard_{self.port}"

    @web.middleware
    async def _check_host(self, request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                          ) -> web.StreamResponse:
        refused = self.misdirected(request.headers.get("Host", ""))
        if refused:
            return web.Response(status=421, text=f"421: {refused}\n")
        return await handler(request)

    @web.middleware
    async def _check_token(self, request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                           ) -> web.StreamResponse:
        if request.path.startswith("/static/"):
            return await handler(request)
        if "token" in request.query:  # a browser's first visit: trade the URL's token for a cookie
            if hmac.compare_digest(request.query["token"].strip().encode(), self._token):
                rest = [(k, v) for k, v in request.query.items() if k != "token"]
                response = web.Response(status=303, headers={
                    "Location": str(request.rel_url.with_query(rest)),
                    "Cache-Control": "no-store"})
                response.set_cookie(self._cookie_name, self._cookie_value, path="/",
                                    httponly=True, samesite="Strict")
                return response
        else:
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() == "bearer":
                if hmac.compare_digest(given.strip().encode(), self._token):
                    return await handler(request)
            elif hmac.compare_digest(request.cookies.get(self._cookie_name, "").encode(),
                                     self._cookie_value.encode()):
                return await handler(request)
        return web.Response(status=401, text="401: this dashboard needs its token "
                            "(observe.token): open /?token=TOKEN once in a browser (it sets a "
                            "cookie), or send Authorization: Bearer TOKEN (scripts, "
                            "Prometheus)\n",
                            headers={"WWW-Authenticate": 'Bearer realm="flexmarl"'})

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(WEB_DIR / "index.html")

    async def _api_status(self, request: web.Request) -> web.Response:
        body = orjson.dumps(self._status(), option=orjson.OPT_NON_STR_KEYS)
        return web.Response(body=body, content_type="application/json",
                            headers={"Cache-Control": "no-store"})

    async def _api_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self._metrics(),
                            headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})
