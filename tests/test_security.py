"""Security: CURVE on tcp:// (allowed keys served, everyone else gets nothing and is logged),
plain tcp:// only on loopback, `flexmarl keygen`, the HTTP token, no pickle or eval anywhere."""
from __future__ import annotations

import asyncio
import logging
import re
import stat
from pathlib import Path

import aiohttp
import pytest
import zmq
import zmq.auth

from flexmarl.launch.cli import main as cli_main
from flexmarl.observe.server import StatusServer
from runtime.actor import Actor
from runtime.errors import RequestTimeout
from runtime.config import SupervisorConfig, TransportConfig
from runtime.keys import load_keys, read_key_file, write_keys
from runtime.protocol import Ping, Pong
from runtime.supervisor import Supervisor, WorkerSpec
from runtime.curve import Gatekeeper, is_loopback
from runtime.transport import bind, connect

ROOT = Path(__file__).resolve().parents[1]
REFUSED_WAIT_S = 1.0


class Echo(Actor):
    """Answers Ping with Pong (the Actor base does); nothing else."""


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """name -> (secret key file, public key) for a server, an allowed client and a stranger."""
    d = tmp_path_factory.mktemp("keys")
    out = {}
    for name in ("server", "client", "stranger"):
        _, secret_path, public = write_keys(d, name)
        out[name] = (str(secret_path), public)
    return out


async def _refused(conn) -> None:
    """The request gets no answer at all and fails at its own deadline. (A DEALER whose
    handshake was refused has no pipe to send on, so the send itself may wait: the request's
    deadline covers that wait; the outer wait_for only guards the test against a hang.)"""
    with pytest.raises(RequestTimeout):
        await asyncio.wait_for(conn.request(Ping(1, b"hello?"), timeout_s=REFUSED_WAIT_S),
                               REFUSED_WAIT_S + 5)


async def test_curve_serves_allowed_keys_and_refuses_everyone_else(keys, caplog):
    server_file, server_pub = keys["server"]
    client_file, client_pub = keys["client"]
    stranger_file, stranger_pub = keys["stranger"]
    served = TransportConfig(curve_secret_key_file=server_file, curve_allowed=(client_pub,))
    allowed = TransportConfig(curve_secret_key_file=client_file, curve_server_key=server_pub)
    stranger = TransportConfig(curve_secret_key_file=stranger_file, curve_server_key=server_pub)
    actor = Echo("curve", "tcp://127.0.0.1:0", transport=served)
    caplog.set_level(logging.WARNING, logger="runtime.transport")
    async with actor.serving():
        assert actor._listener._sock.getsockopt(zmq.MECHANISM) == zmq.CURVE
        assert actor._listener._sock.getsockopt(zmq.CURVE_SERVER) == 1
        async with connect(actor.address, allowed) as good:
            assert await good.request(Ping(1, b"a"), timeout_s=5) == Pong(1, b"a")
            assert all(s.getsockopt(zmq.MECHANISM) == zmq.CURVE for s in good._socks)
            async with connect(actor.address) as plain:  # no CURVE at all
                await _refused(plain)
            assert await good.request(Ping(2, b"b"), timeout_s=5) == Pong(2, b"b")
            async with connect(actor.address, stranger) as other:  # CURVE, key not allowed
                await _refused(other)
            assert await good.request(Ping(3, b"c"), timeout_s=5) == Pong(3, b"c")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(stranger_pub in w and "not allowed" in w for w in warnings), warnings
    assert any("does not use CURVE" in w for w in warnings), warnings
    # Once per peer, not once per reconnect attempt.
    assert sum(stranger_pub in w for w in warnings) == 1
    assert not any(client_pub in w for w in warnings)


async def test_shared_key_pair_is_the_default_allow_list(keys):
    """With only curve_secret_key_file set, listeners accept and connections expect that pair."""
    cluster = TransportConfig(curve_secret_key_file=keys["server"][0])
    async with bind("tcp://127.0.0.1:0", cluster) as listener:
        async def serve_one() -> None:
            env = await listener.recv()
            await listener.reply(env, Pong(env.msg.seq, env.msg.payload))

        task = asyncio.create_task(serve_one())
        async with connect(listener.address, cluster) as conn:
            assert await conn.request(Ping(5, b"x"), timeout_s=5) == Pong(5, b"x")
        await task
        stranger = TransportConfig(curve_secret_key_file=keys["stranger"][0],
                                   curve_server_key=keys["server"][1])
        async with connect(listener.address, stranger) as conn:
            await _refused(conn)
    gatekeeper = Gatekeeper.instance()
    for _ in range(50):  # a closed listener's allow-list is dropped (its monitor says so)
        if not any(g.endpoint == listener.address for g in gatekeeper._guarded.values()):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the gatekeeper still guards a closed listener")


async def test_worker_process_serves_curve_and_never_sees_the_secret_in_argv(
        keys, no_leftover_children):
    secret_file, public = keys["server"]
    cluster = TransportConfig(curve_secret_key_file=secret_file, curve_allowed=(public,))
    sup = Supervisor(config=SupervisorConfig(stop_timeout_s=3.0), transport=cluster)
    async with sup.serving():
        worker = await sup.start_worker(WorkerSpec(name="w", entry="tests.helpers.workers:echo",
                                                   bind="tcp://127.0.0.1:0"))
        async with connect(worker.address, cluster) as conn:
            assert await conn.request(Ping(9, b"w"), timeout_s=10) == Pong(9, b"w")
        async with connect(worker.address) as plain:
            await _refused(plain)
        argv = Path(f"/proc/{worker.pid}/cmdline").read_bytes()
        assert secret_file.encode() in argv and load_keys(secret_file)[1].encode() not in argv


async def test_plain_tcp_only_on_loopback(keys):
    with pytest.raises(ValueError, match="transport.curve_secret_key_file"):
        bind("tcp://0.0.0.0:0")
    with pytest.raises(ValueError, match="plaintext_tcp_beyond_loopback"):
        bind("tcp://*:0")
    async with bind("tcp://0.0.0.0:0", TransportConfig(
            curve_secret_key_file=keys["server"][0])) as listener:
        assert listener.address.startswith("tcp://0.0.0.0:")
    async with bind("tcp://0.0.0.0:0", TransportConfig(plaintext_tcp_beyond_loopback=True)):
        pass
    async with bind("tcp://127.0.0.1:0"), bind("tcp://[::1]:0"), bind("ipc://*"):
        pass  # loopback and local transports stay as they were
    assert is_loopback("127.0.0.5") and is_loopback("[::1]") and is_loopback("localhost")
    assert not any(map(is_loopback, ["0.0.0.0", "*", "10.0.0.1", "eth0", "example.org"]))


def test_transport_config_validates_curve_fields(keys, tmp_path):
    secret_file, public = keys["server"]
    with pytest.raises(ValueError, match="transport.curve_server_key"):
        TransportConfig(curve_secret_key_file=secret_file, curve_server_key="short")
    with pytest.raises(ValueError, match="transport.curve_allowed"):
        TransportConfig(curve_secret_key_file=secret_file, curve_allowed=(public, "x" * 39))
    with pytest.raises(ValueError, match="need transport.curve_secret_key_file"):
        TransportConfig(curve_allowed=(public,))
    with pytest.raises(ValueError, match="transport.curve_secret_key_file"):
        TransportConfig(curve_secret_key_file=str(tmp_path / "missing.key_secret"))
    with pytest.raises(ValueError, match="no secret key"):
        TransportConfig(curve_secret_key_file=secret_file[:-len("_secret")])  # the public half
    cfg = TransportConfig(curve_secret_key_file=secret_file, curve_allowed=[public])  # from JSON
    assert cfg.curve_allowed == (public,)


def test_keygen_writes_a_private_pair_and_never_overwrites(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        cli_main(["keygen", "--dir", str(tmp_path / "k"), "--name", "node7"])
    assert done.value.code == 0
    public_file, secret_file = tmp_path / "k" / "node7.key", tmp_path / "k" / "node7.key_secret"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    public, _ = load_keys(secret_file)
    assert read_key_file(public_file) == (public, None)
    assert public in capsys.readouterr().out
    zmq.auth.load_certificate(secret_file)  # ZeroMQ's own tools read it too
    before = secret_file.read_text()
    with pytest.raises(SystemExit) as done:
        cli_main(["keygen", "--dir", str(tmp_path / "k"), "--name", "node7"])
    assert done.value.code == 2 and "refusing to overwrite" in capsys.readouterr().err
    assert secret_file.read_text() == before


# ----------------------------------------------------------------------------- HTTP

def _server(**kw) -> StatusServer:
    return StatusServer(lambda: {"run": "secret-run-data"}, lambda: b"flexmarl_up 1\n", **kw)


async def test_http_without_token_on_loopback():
    async with _server() as server, aiohttp.ClientSession() as http:
        async with http.get(server.url + "api/status") as resp:
            assert resp.status == 200 and await resp.json() == {"run": "secret-run-data"}


def test_http_beyond_loopback_needs_a_token():
    with pytest.raises(ValueError, match="observe.token"):
        _server(host="0.0.0.0")
    _server(host="0.0.0.0", token="s3cret")  # constructs; not started here


async def test_http_token_guards_every_route():
    async with _server(token="s3cret") as server, aiohttp.ClientSession() as http:
        for path in ("", "api/status", "metrics"):
            url = server.url + path
            for headers, query in (({}, ""), ({"Authorization": "Bearer wrong"}, ""),
                                   ({}, "?token=wrong"), ({"Authorization": "Basic s3cret"}, "")):
                async with http.get(url + query, headers=headers) as resp:
                    assert resp.status == 401, (path, headers, query)
                    body = await resp.text()
                    assert "secret-run-data" not in body and "flexmarl_up" not in body
            async with http.get(url, headers={"Authorization": "Bearer s3cret"}) as resp:
                assert resp.status == 200, path
            # ?token= once: a cookie, and the same URL without it (tests/test_doors.py)
            async with http.get(url + "?token=s3cret", allow_redirects=False) as resp:
                assert resp.status == 303 and "HttpOnly" in resp.headers["Set-Cookie"], path
        async with http.get(server.url + "static/dashboard.js") as resp:
            assert resp.status == 200  # the page's own code, no run data
            assert 'fetch("/api/status" + location.search' in await resp.text()


# ----------------------------------------------------------------------------- no code from input

_FORBIDDEN = [
    (r"^\s*(import|from)\s+(c?pickle|dill|cloudpickle|shelve|marshal)\b", "pickle-like import"),
    (r"\b(pickle|marshal|dill|cloudpickle)\.loads?\(", "unpickling"),
    (r"(?<![\w.])(eval|exec)\(", "eval/exec"),
    (r"\b(broadcast|all_gather|gather|scatter|send|recv)_object(_list)?\(",
     "torch.distributed object (pickle) collective"),
    (r"trust_remote_code\s*=\s*True", "remote code from a model directory"),
]


_ALLOWED = {
    # The restricted unpickler for DCP's metadata: it finds a fixed list of classes only
    # (tests/test_checkpoint.py shows os.system and eval payloads refused unrun).
    ("flexmarl/training/safe_dcp.py", "pickle-like import"),
    # The code sandbox's loader (LOADER, a string run by the sandboxed interpreter): it loads
    # and runs the sandbox's own modules, compiled by the caller and handed to the child in a
    # memfd the caller wrote; nothing of it comes from input.
    ("flexmarl/rewards/confinement.py", "unpickling"),
    ("flexmarl/rewards/confinement.py", "eval/exec"),
}


def test_no_pickle_or_eval_in_the_source():
    found = []
    for path in sorted([*(ROOT / "runtime").rglob("*.py"), *(ROOT / "flexmarl").rglob("*.py")]):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            for pattern, what in _FORBIDDEN:
                if re.search(pattern, code) and (
                        str(path.relative_to(ROOT)), what) not in _ALLOWED:
                    found.append(f"{path.relative_to(ROOT)}:{number}: {what}: {line.strip()}")
            if "torch.load(" in code and "weights_only=True" not in code:
                found.append(f"{path.relative_to(ROOT)}:{number}: torch.load without "
                             f"weights_only=True: {line.strip()}")
    assert not found, "\n".join(found)
