"""The HTTP servers' doors: who may reach the gateway and the dashboard, and how.

Gateway (flexmarl.gateway.api), over the fake backend of tests/helpers/fake_backend.py: every
route needs the token, on loopback too (generated when none is given); a body must be JSON (a web
page's text/plain "simple request" is 415); a Host that is not a loopback name is 421 (DNS
rebinding); the app the run starts gets the token as OPENAI_API_KEY, and RUN_DIR/gateway_token
(0600) holds it. Dashboard (flexmarl.observe.server): the same Host check, and `?token=` traded
once for an HttpOnly, SameSite=Strict cookie.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import stat
import sys

import aiohttp
import pytest

from flexmarl.config.sections import GatewayConfig
from flexmarl.gateway.api import TOKEN_FILE, GatewayServer
from flexmarl.gateway.app import serve_gateway
from flexmarl.observe.server import StatusServer

from tests.helpers.fake_backend import CHAT, FakeBackend

pytestmark = pytest.mark.timeout(60)

# Every route that writes: (path, JSON body). Reward and end change an episode; chat and
# completions open episodes and turns.
WRITES = [("/v1/chat/completions", CHAT),
          ("/v1/completions", {"model": "solver", "prompt": "x", "user": "e1"}),
          ("/v1/episodes/e1/reward", {"team": 1.0}),
          ("/v1/episodes/e2/end", {})]


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


async def post(http: aiohttp.ClientSession, url: str, **kw) -> tuple[int, dict]:
    async with http.post(url, **kw) as r:
        return r.status, await r.json()


# ----------------------------------------------------------------------------- gateway

async def test_gateway_writes_need_the_token_even_on_loopback():
    fake = FakeBackend()
    async with GatewayServer(fake) as server, aiohttp.ClientSession() as http:  # no token given
        assert len(server.token) >= 32 and server.token != GatewayServer(fake).token
        for path, body in WRITES:
            for headers in ({}, bearer("wrong"), {"Authorization": server.token}):
                status, out = await post(http, server.url + path.lstrip("/"), json=body,
                                         headers=headers)
                assert status == 401 and out["error"]["code"] == "invalid_api_key", (path, out)
                assert "Bearer" in out["error"]["message"]
                assert TOKEN_FILE in out["error"]["message"]  # where to find it
        assert fake.calls == []
        for path, body in WRITES:  # the legitimate path: token, JSON, a loopback Host
            status, out = await post(http, server.url + path.lstrip("/"), json=body,
                                     headers=bearer(server.token))
            assert status == 200, (path, out)
        assert [kind for kind, _ in fake.calls] == ["generate", "generate", "reward", "end"]


async def test_gateway_bodies_must_be_json():
    fake = FakeBackend()
    async with GatewayServer(fake) as server, \
            aiohttp.ClientSession(headers=bearer(server.token)) as http:
        for path, _ in WRITES:
            for content_type in ("text/plain", "application/x-www-form-urlencoded",
                                 "multipart/form-data; boundary=x"):
                status, out = await post(http, server.url + path.lstrip("/"), data=b"{}",
                                         headers={"Content-Type": content_type})
                assert status == 415, (path, content_type, out)
                err = out["error"]
                assert err["code"] == "unsupported_media_type"
                assert "application/json" in err["message"]
        assert fake.calls == []
        status, _ = await post(http, server.url + "v1/episodes/e1/reward", data=b'{"team": 1}',
                               headers={"Content-Type": "application/json; charset=utf-8"})
        assert status == 200
        # No body (agents/openai_duo_app.py's end; aiohttp labels it octet-stream): nothing
        # to read, so nothing to check.
        async with http.post(server.url + "v1/episodes/e1/end") as r:
            assert r.status == 200 and r.request_info.headers["Content-Length"] == "0"


async def test_gateway_answers_loopback_names_only():
    fake = FakeBackend()
    async with GatewayServer(fake) as server, \
            aiohttp.ClientSession(headers=bearer(server.token)) as http:
        url = server.url + "v1/episodes/e1/reward"
        for host in ("evil.example", f"evil.example:{server.port}", "127.0.0.1.evil.example",
                     "localhost.evil.example", ""):
            status, out = await post(http, url, json={"team": 1}, headers={"Host": host})
            assert status == 421, (host, out)
            assert out["error"]["code"] == "misdirected_request"
            assert "localhost" in out["error"]["message"] and server.url in out["error"]["message"]
        # Checked before the token: a rebinding page has none to offer anyway.
        status, _ = await post(http, url, json={"team": 1},
                               headers={"Host": "evil.example", **bearer("wrong")})
        assert status == 421
        assert fake.calls == []
        # Any loopback name, any port (an SSH tunnel may forward another one here).
        for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}",
                     f"[::1]:{server.port}", "LOCALHOST:9000", "127.0.0.1"):
            status, out = await post(http, url, json={"team": 1}, headers={"Host": host})
            assert status == 200, (host, out)
    # Bound beyond loopback, any name reaches it (it has a token: required there).
    assert GatewayServer(fake, host="0.0.0.0", token="t").misdirected("evil.example") is None


class FakeGateway(FakeBackend):
    """What serve_gateway needs of flexmarl.gateway.backend.Gateway beyond the Backend."""

    async def expire_loop(self) -> None:
        await asyncio.Event().wait()

    def close(self) -> None:
        pass


APP = """
import json, os, sys, urllib.request
key, base = os.environ["OPENAI_API_KEY"], os.environ["OPENAI_BASE_URL"]
request = urllib.request.Request(base + "/episodes/e1/reward", data=b'{"team": 1}',
                                 method="POST", headers={"Authorization": "Bearer " + key,
                                                         "Content-Type": "application/json"})
with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request) as r:
    status = r.status
open(sys.argv[1], "w").write(json.dumps({"key": key, "status": status}))
"""


@pytest.mark.parametrize("given", ["", "my-own-token"])
async def test_the_app_the_run_starts_gets_the_token(tmp_path, given):
    """The legitimate path: gateway.app reads OPENAI_API_KEY and its calls go through; the
    same token is in RUN_DIR/gateway_token, readable by its owner only."""
    (tmp_path / "app.py").write_text(APP)
    fake = FakeGateway()
    config = GatewayConfig(enabled=True, token=given,
                           app=f"{sys.executable} {tmp_path / 'app.py'} {tmp_path / 'out.json'}")
    urls = []
    async with contextlib.AsyncExitStack() as stack:
        app = await serve_gateway(stack, fake, config, urls.append, stop_timeout_s=5,
                                  run_dir=tmp_path)
        assert await asyncio.wait_for(app.wait(), 30) == 0
    token_file = tmp_path / TOKEN_FILE
    token = token_file.read_text()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert token == given if given else len(token) >= 32  # generated: token_urlsafe(32)
    assert json.loads((tmp_path / "out.json").read_text()) == {"key": token, "status": 200}
    assert fake.calls == [("reward", ("e1", {"team": 1}))]
    assert len(urls) == 1


# ----------------------------------------------------------------------------- dashboard

def _dashboard(**kw) -> StatusServer:
    return StatusServer(lambda: {"run": "secret-run-data"}, lambda: b"flexmarl_up 1\n", **kw)


async def test_dashboard_answers_loopback_names_only():
    async with _dashboard() as server, aiohttp.ClientSession() as http:  # no token
        for path in ("", "api/status", "metrics", "static/dashboard.js"):
            async with http.get(server.url + path, headers={"Host": "evil.example"}) as r:
                assert r.status == 421, path
                text = await r.text()
                assert "secret-run-data" not in text and "localhost" in text
        for host in (f"localhost:{server.port}", f"[::1]:{server.port}"):
            async with http.get(server.url + "api/status", headers={"Host": host}) as r:
                assert r.status == 200 and await r.json() == {"run": "secret-run-data"}


async def test_dashboard_trades_the_url_token_for_a_cookie():
    async with _dashboard(token="s3cret") as server, aiohttp.ClientSession() as http:
        async with http.get(server.url + "api/status?token=s3cret&x=1",
                            allow_redirects=False) as r:
            assert r.status == 303
            assert r.headers["Location"] == "/api/status?x=1"  # the token leaves the URL
            [set_cookie] = r.headers.getall("Set-Cookie")
            assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
            assert "s3cret" not in set_cookie
            [(name, morsel)] = r.cookies.items()
        async with http.get(server.url + "?token=s3cret", allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"] == "/"
        cookie = {"Cookie": f"{name}={morsel.value}"}
        async with aiohttp.ClientSession(headers=cookie) as browser:  # cookie only
            for path in ("", "api/status", "metrics"):
                async with browser.get(server.url + path) as r:
                    assert r.status == 200, path
        for headers, query in (({}, "?token=wrong"), ({}, ""),
                               ({"Cookie": f"{name}=forged"}, ""),
                               ({"Cookie": f"{name}=s3cret"}, ""),
                               ({**cookie, "Host": "evil.example"}, "")):
            async with http.get(server.url + "api/status" + query, headers=headers,
                                allow_redirects=False) as r:
                assert r.status in (401, 421), (headers, query)
                assert "Set-Cookie" not in r.headers
                assert "secret-run-data" not in await r.text()
        async with http.get(server.url + "api/status") as r:
            assert r.status == 401 and "?token=" in await r.text()  # says how
        # Prometheus: Bearer, no cookie, no redirect.
        async with http.get(server.url + "metrics", headers=bearer("s3cret"),
                            allow_redirects=False) as r:
            assert r.status == 200 and await r.read() == b"flexmarl_up 1\n"
    # A browser (a cookie jar that keeps 127.0.0.1's cookies) follows the redirect in.
    async with _dashboard(token="s3cret") as server, \
            aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        async with browser.get(server.url + "?token=s3cret") as r:
            assert r.status == 200 and str(r.url) == server.url and len(r.history) == 1
        async with browser.get(server.url + "api/status") as r:
            assert r.status == 200 and await r.json() == {"run": "secret-run-data"}
