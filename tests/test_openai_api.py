"""The OpenAI-compatible HTTP layer (flexmarl.gateway.api) against an in-memory fake backend.

The official `openai` client proves the wire format (requests it builds reach the backend as
meant, responses it gets parse, errors map to its exception classes); raw aiohttp proves each
error path returns the OpenAI error shape with the right status. Loopback only, no engine.
"""
from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import pytest

from flexmarl.gateway.api import GatewayServer
from tests.helpers.fake_backend import CHAT, FakeBackend

pytestmark = pytest.mark.timeout(30)

TOKEN = "test-token-123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
async def server(fake):
    async with GatewayServer(fake, token=TOKEN) as s:
        yield s


@pytest.fixture
async def client(server):
    c = openai.AsyncOpenAI(base_url=server.url + "v1", api_key=TOKEN, max_retries=0,
                           default_headers={"X-Episode-Id": "e1"})
    yield c
    await c.close()


@pytest.fixture
async def http(server):
    async with aiohttp.ClientSession(base_url=server.url, headers=AUTH) as s:
        yield s


async def call(http: aiohttp.ClientSession, method: str, path: str, *, data: Any = None,
               json: Any = None, headers: dict | None = None) -> tuple[int, Any]:
    async with http.request(method, path, data=data, json=json, headers=headers) as r:
        assert r.content_type == "application/json", await r.text()
        return r.status, await r.json()


def assert_error(got: tuple[int, Any], status: int, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, says: str = "") -> dict:
    """`got` is an OpenAI error body with this status; returns the error object."""
    got_status, body = got
    assert got_status == status, body
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert says.lower() in err["message"].lower(), err
    assert err["type"] == type, err
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


# ----------------------------------------------------------------------------- official client

async def test_chat_reaches_backend_and_parses(client, fake):
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "2+2?"},
                                             {"type": "text", "text": "show work"}]}]
    r = await client.chat.completions.create(model="solver", messages=messages, n=2,
                                             temperature=0.7, max_tokens=64, stop="END",
                                             seed=5)
    assert fake.generated() == [("solver", "e1", [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2+2?\nshow work"}], 2,
        {"temperature": 0.7, "max_tokens": 64, "stop": ["END"]})]
    assert r.id == "chatcmpl-e1_0_0" and r.object == "chat.completion" and r.model == "solver"
    assert r.system_fingerprint == "flexmarl-v3"
    assert [c.index for c in r.choices] == [0, 1]
    assert [c.message.content for c in r.choices] == ["t100 ét200 ", "t101 ét201 "]
    assert [c.message.role for c in r.choices] == ["assistant", "assistant"]
    assert [c.finish_reason for c in r.choices] == ["stop", "length"]
    assert r.choices[0].logprobs is None
    assert r.choices[1].model_extra["flexmarl"] == {"sample_id": "e1_0_1", "version": 3}
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (5, 6, 11)


async def test_chat_logprobs_and_unknown_finish_reason(client, fake):
    r = await client.chat.completions.create(
        model="checker", messages=[{"role": "user", "content": "x"}], n=3, logprobs=True,
        max_completion_tokens=9, max_tokens=4, top_p=0.5, extra_body={"top_k": 20})
    # The newer name wins; top_k is vLLM's extension, passed on for the trainer's scoring.
    assert fake.generated()[0][4] == {"top_p": 0.5, "top_k": 20, "max_tokens": 9}
    assert r.choices[2].finish_reason == "stop"  # the backend said "abort"
    content = r.choices[0].logprobs.content
    assert [(t.token, t.logprob, t.bytes, t.top_logprobs) for t in content] == [
        ("t100 ", -0.5, list(b"t100 "), []), ("é", -0.25, [0xC3, 0xA9], []),
        ("t200 ", -1.0, list(b"t200 "), [])]


async def test_chat_stream(client, fake):
    stream = await client.chat.completions.create(
        model="solver", messages=[{"role": "user", "content": "hi"}], n=2, stream=True,
        stream_options={"include_usage": True})
    text: dict[int, str] = {0: "", 1: ""}
    finish, roles, usage, ids, extras = {}, set(), None, set(), {}
    async for chunk in stream:
        assert chunk.object == "chat.completion.chunk" and chunk.model == "solver"
        ids.add(chunk.id)
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            roles.add(c.delta.role)
            if c.finish_reason:
                finish[c.index] = c.finish_reason
                extras[c.index] = c.model_extra["flexmarl"]
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
    assert text == {0: "t100 ét200 ", 1: "t101 ét201 "}
    assert finish == {0: "stop", 1: "length"} and "assistant" in roles
    assert ids == {"chatcmpl-e1_0_0"}
    assert extras[1] == {"sample_id": "e1_0_1", "version": 3}
    assert usage is not None and usage.total_tokens == 11


async def test_completions_str_and_token_ids_with_logprobs(client, fake):
    r = await client.completions.create(model="solver", prompt="Once upon", max_tokens=3)
    assert r.id == "cmpl-e1_0_0" and r.object == "text_completion"
    assert r.choices[0].text == "t100 ét200 " and r.choices[0].logprobs is None
    r = await client.completions.create(model="checker", prompt=[1, 2, 3], logprobs=0,
                                        stop=["a", "b"], extra_headers={"X-Episode-Id": "e2"})
    assert fake.generated() == [("solver", "e1", "Once upon", 1, {"max_tokens": 3}),
                                ("checker", "e2", [1, 2, 3], 1, {"stop": ["a", "b"]})]
    lp = r.choices[0].logprobs
    assert lp.tokens == ["t100 ", "é", "t200 "] and lp.token_logprobs == [-0.5, -0.25, -1.0]
    assert lp.text_offset == [0, 5, 6] and lp.top_logprobs is None
    assert r.usage.prompt_tokens == 3 and r.usage.completion_tokens == 3


async def test_completions_stream(client):
    stream = await client.completions.create(model="solver", prompt="x", stream=True, n=2)
    text, finish = {0: "", 1: ""}, {}
    async for chunk in stream:
        assert chunk.object == "text_completion" and chunk.usage is None
        for c in chunk.choices:
            text[c.index] += c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert text == {0: "t100 ét200 ", 1: "t101 ét201 "} and finish == {0: "stop", 1: "length"}


async def test_models(client):
    page = await client.models.list()
    assert [m.id for m in page.data] == ["solver", "checker"]
    assert {m.owned_by for m in page.data} == {"flexmarl"}
    m = await client.models.retrieve("checker")
    assert m.id == "checker" and m.created == page.data[1].created
    with pytest.raises(openai.NotFoundError) as e:
        await client.models.retrieve("nobody")
    assert e.value.code == "model_not_found"


async def test_user_field_is_the_episode_without_header(server, fake):
    async with openai.AsyncOpenAI(base_url=server.url + "v1", api_key=TOKEN,
                                  max_retries=0) as c:
        await c.chat.completions.create(model="solver", extra_body={"user": "e2"},
                                        messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.BadRequestError) as e:
            await c.chat.completions.create(model="solver",
                                            messages=[{"role": "user", "content": "x"}])
    assert [g[1] for g in fake.generated()] == ["e2"]
    assert e.value.param == "user" and "X-Episode-Id" in e.value.message


async def test_client_errors(client, server, fake):
    with pytest.raises(openai.NotFoundError) as e:
        await client.chat.completions.create(model="planner", messages=[
            {"role": "user", "content": "x"}])
    assert e.value.code == "model_not_found" and "solver, checker" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        await client.chat.completions.create(model="solver", temperature=2.5, messages=[
            {"role": "user", "content": "x"}])
    assert e.value.param == "temperature"
    with pytest.raises(openai.NotFoundError) as e:  # the backend's own ApiError
        await client.chat.completions.create(model="solver", messages=[
            {"role": "user", "content": "x"}], extra_headers={"X-Episode-Id": "e9"})
    assert e.value.code == "episode_not_found"
    async with openai.AsyncOpenAI(base_url=server.url + "v1", api_key="wrong",
                                  max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError) as e:
            await bad.models.list()
    assert e.value.code == "invalid_api_key"
    assert len(fake.generated()) == 1  # validation failed before the backend, every other time


async def test_ended_episode_is_not_retried(server, fake):
    # OpenAI clients retry 409 by default; the gateway's x-should-retry: false stops that.
    async with openai.AsyncOpenAI(base_url=server.url + "v1", api_key=TOKEN, max_retries=2,
                                  default_headers={"X-Episode-Id": "done"}) as c:
        with pytest.raises(openai.ConflictError):
            await c.chat.completions.create(model="solver", messages=[
                {"role": "user", "content": "x"}])
    assert len(fake.generated()) == 1


# ----------------------------------------------------------------------------- raw HTTP errors

async def test_body_not_a_json_object(http):
    assert_error(await call(http, "POST", "/v1/chat/completions", data=b"{not json",
                            headers={"Content-Type": "application/json"}), 400,
                 param="body", says="not valid JSON")
    assert_error(await call(http, "POST", "/v1/chat/completions", json=[CHAT]), 400,
                 param="body", says="JSON object")


@pytest.mark.parametrize("change, param, says", [
    ({"model": None}, "model", "model"),
    ({"model": 3}, "model", "model"),
    ({"messages": []}, "messages", "non-empty"),
    ({"messages": "hi"}, "messages", "list"),
    ({"messages": ["hi"]}, "messages[0]", "object"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "robot"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "string"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": [
        {"type": "text", "text": "ok"}, {"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[1].content", "image_url"),
    ({"n": 0}, "n", "n"), ({"n": 17}, "n", "n"), ({"n": True}, "n", "n"),
    ({"top_p": 0}, "top_p", "top_p"), ({"temperature": "hot"}, "temperature", "temperature"),
    ({"top_k": -2}, "top_k", "top_k"), ({"top_k": 1.5}, "top_k", "top_k"),
    ({"max_tokens": 0}, "max_tokens", ">= 1"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ({"stream": "yes"}, "stream", "boolean"),
    ({"stream_options": {"include_usage": 1}}, "stream_options.include_usage", "boolean"),
    ({"logprobs": 1}, "logprobs", "boolean"),
    ({"top_logprobs": 2}, "top_logprobs", "not supported"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "not supported"),
    ({"response_format": {"type": "json_object"}}, "response_format", "not supported"),
    ({"user": None}, "user", "X-Episode-Id"),
])
async def test_chat_validation(http, fake, change, param, says):
    body = {**CHAT, **change}
    assert_error(await call(http, "POST", "/v1/chat/completions", json=body), 400, param=param,
                 says=says)
    assert fake.generated() == []


async def test_chat_accepts_defaults_and_unknown_fields(http, fake):
    body = {**CHAT, "tools": [], "response_format": {"type": "text"}, "top_logprobs": 0,
            "frequency_penalty": 0, "metadata": {"x": 1}, "parallel_tool_calls": False}
    status, r = await call(http, "POST", "/v1/chat/completions", json=body)
    assert status == 200 and r["choices"][0]["message"]["content"] == "t100 ét200 "
    assert fake.generated()[0][4] == {}  # only what the request set


@pytest.mark.parametrize("change, says", [
    ({"prompt": ["a", "b"]}, "one prompt per request"),
    ({"prompt": [[1, 2], [3]]}, "one prompt per request"),
    ({"prompt": []}, "non-empty"),
    ({"prompt": [1, -2]}, "token ids"),
    ({"echo": True}, "not supported"),
    ({"suffix": "end"}, "not supported"),
    ({"logprobs": 6}, "between 0 and 5"),
])
async def test_completions_validation(http, fake, change, says):
    body = {"model": "solver", "prompt": "x", "user": "e1", **change}
    param = next(iter(change))
    assert_error(await call(http, "POST", "/v1/completions", json=body), 400, param=param,
                 says=says)
    assert fake.generated() == []


async def test_routing_errors(http):
    assert_error(await call(http, "GET", "/v1/nope"), 404, code="not_found", says="/v1/nope")
    err = assert_error(await call(http, "GET", "/v1/chat/completions"), 405,
                       code="method_not_allowed", says="POST")
    assert "GET" in err["message"]


async def test_body_too_large(fake):
    async with GatewayServer(fake, max_body_bytes=1024, token=TOKEN) as s, \
            aiohttp.ClientSession(base_url=s.url, headers=AUTH) as http:
        body = {**CHAT, "messages": [{"role": "user", "content": "x" * 4096}]}
        assert_error(await call(http, "POST", "/v1/chat/completions", json=body), 413,
                     code="request_too_large")
        status, _ = await call(http, "POST", "/v1/chat/completions", json=CHAT)
        assert status == 200  # the limit is on size, not on the route
    assert len(fake.generated()) == 1


async def test_backend_bug_is_500_server_error(http, caplog):
    err = assert_error(await call(http, "POST", "/v1/chat/completions",
                                  json={**CHAT, "user": "boom"}), 500, type="server_error")
    assert err["message"] == "RuntimeError: engine fell over"
    assert any(r.exc_info and "engine fell over" in str(r.exc_info[1]) for r in caplog.records)


async def test_auth_required_on_every_route(server):
    async with aiohttp.ClientSession(base_url=server.url) as http:
        for method, path in [("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
                             ("GET", "/v1/flexmarl/status"), ("GET", "/v1/nope")]:
            for headers in [{}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN}]:
                assert_error(await call(http, method, path, json=CHAT, headers=headers), 401,
                             code="invalid_api_key")


async def test_episode_routes(http, fake):
    status, r = await call(http, "POST", "/v1/episodes/e1/reward", json={"solver": 1.0})
    assert (status, r) == (200, {"episode": "e1", "accepted": True})
    assert_error(await call(http, "POST", "/v1/episodes/e1/reward", json=[1.0]), 400,
                 param="body")
    assert_error(await call(http, "POST", "/v1/episodes/e1/end", json={"why": "x"}), 400,
                 says="no body")
    assert (await call(http, "POST", "/v1/episodes/e1/end"))[0] == 200
    assert (await call(http, "POST", "/v1/episodes/e2/end", json={}))[0] == 200
    assert_error(await call(http, "POST", "/v1/episodes/e1/end"), 409, code="episode_ended")
    assert_error(await call(http, "POST", "/v1/episodes/zz/reward", json={}), 404,
                 code="episode_not_found")
    # an id with "/" (the gateway's GROUP/ANYTHING) is one episode, not a route miss
    assert (await call(http, "POST", "/v1/episodes/grp/7/reward", json={"team": 1}))[0] == 200
    assert (await call(http, "POST", "/v1/episodes/grp/7/end"))[0] == 200
    assert [c for c in fake.calls if c[0] == "reward"] == [
        ("reward", ("e1", {"solver": 1.0})), ("reward", ("zz", {})),
        ("reward", ("grp/7", {"team": 1}))]
    assert [c for c in fake.calls if c[0] == "end"] == [("end", "e1"), ("end", "e2"),
                                                        ("end", "e1"), ("end", "grp/7")]
    status, r = await call(http, "GET", "/v1/flexmarl/status")
    assert status == 200 and r["versions"] == {"solver": 3} and "e1" not in r["open_episodes"]


async def test_client_disconnect_cancels_backend_call(server, fake):
    async with aiohttp.ClientSession(base_url=server.url, headers=AUTH,
                                     timeout=aiohttp.ClientTimeout(total=0.3)) as http:
        with pytest.raises(asyncio.TimeoutError):
            await http.post("/v1/chat/completions", json={**CHAT, "user": "slow"})
    await asyncio.wait_for(fake.cancelled.wait(), 5)


def test_refuses_non_loopback_without_token(fake):
    with pytest.raises(ValueError, match="without a token"):
        GatewayServer(fake, host="0.0.0.0")
    GatewayServer(fake, host="0.0.0.0", token=TOKEN)  # with a token: allowed
    assert GatewayServer(fake, host="::1").token  # loopback: one is generated
