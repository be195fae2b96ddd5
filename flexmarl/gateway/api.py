"""The gateway's HTTP face: the OpenAI chat/completions wire format over a `Backend`.

Agents written against any OpenAI client (base_url = server.url + "v1") get their samples from
the run's policies: `model` names the agent, the episode id names the trajectory the turn belongs
to. This module only parses, validates and renders; the Backend (flexmarl.gateway.backend) generates,
records and rewards. `Routes` has one method per route below; `make_app` wires them up.

    GET  /v1/models                        the agents, as models
    GET  /v1/models/{id}                   one agent (404 model_not_found)
    POST /v1/chat/completions      --+
    POST /v1/completions           --+-->  backend.generate(agent, episode, prompt, n, params)
    POST /v1/episodes/{ep}/reward  ----->  backend.reward(ep, body)
    POST /v1/episodes/{ep}/end     ----->  backend.end(ep)
    GET  /v1/flexmarl/status       ----->  backend.status()

Episode id: the `X-Episode-Id` header, else the body's `user` field (settable from any client).
Every error is OpenAI-shaped, {"error": {"message", "type", "param", "code"}}, so clients raise
their usual exceptions. Departures from OpenAI, by design:
  * `stream: true` works, but each sample arrives as one piece: the engine returns whole samples,
    so a stream is role chunk, content chunk, finish chunk per choice (then usage, then [DONE]).
  * `seed` is accepted and ignored: the gateway derives each request's seed from its id (and the
    run seed), so a run replays; other sampling fields not listed in _sampling are ignored.
  * No tools/functions/response_format, no top_logprobs, no echo/suffix: 400, not silence.
    Completions' `logprobs: k` gives the sampled tokens' logprobs; top_logprobs stays null.
  * 4xx errors carry `x-should-retry: false`: OpenAI clients would otherwise retry a 409.
  * Each choice carries "flexmarl": {"sample_id", "version"}: the experience store's key for the
    turn and the policy version that produced it.
  * Completions' logprobs.text_offset counts from the start of the completion, not the prompt.
A client that disconnects cancels its handler, and so the backend call (handler_cancellation).
Doors, checked on every route before it runs (each route reads or changes the run's episodes):
  * Host: bound to loopback, only a loopback name (localhost, 127.0.0.1, [::1]) may be the
    `Host`; anything else is 421, so a web page that points its own name at 127.0.0.1 (DNS
    rebinding) gets nothing. Beyond loopback any Host passes (the token guards it).
  * Token: every route needs `Authorization: Bearer TOKEN` (what OpenAI clients send as
    api_key), on loopback too, else 401. The token is gateway.token, or when that is unset one
    generated per run (GatewayServer.token): the run hands it to gateway.app as OPENAI_API_KEY
    and writes it to RUN_DIR/gateway_token (mode 0600). Bound beyond loopback, the server refuses
    to start without gateway.token (clients elsewhere must know it in advance).
  * A POST/PUT/PATCH with a body must say `Content-Type: application/json`, else 415: a web page
    can send text/plain cross-origin without asking (a CORS "simple request"), never JSON.
"""
from __future__ import annotations

import hmac
import logging
import secrets
import time
from typing import Any, Awaitable, Callable, Protocol

import orjson
from aiohttp import web

from flexmarl.observe.server import HttpServer
from flexmarl.team import Completion

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool", "developer")
MAX_N = 16
MAX_STOP = 4
OWNER = "flexmarl"
TOKEN_FILE = "gateway_token"
"""Where in the run directory the run writes the gateway's token (mode 0600)."""
WITH_BODY = ("POST", "PUT", "PATCH")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    """An error the client should see as-is: HTTP `status` and an OpenAI error body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}
        # OpenAI clients retry 409 (and 408, 429, 5xx) on their own; a backend's 4xx (episode
        # ended, unknown episode) answers the same on every retry, so tell them not to.
        headers = {"x-should-retry": "false"} if 400 <= self.status < 500 else {}
        return web.Response(status=self.status, body=orjson.dumps(body),
                            content_type="application/json", headers=headers)


class Backend(Protocol):
    """What the gateway forwards to (flexmarl.gateway.backend implements it; tests use a fake)."""

    def models(self) -> list[str]: ...
    async def generate(self, agent: str, episode: str, prompt: str | list[dict] | list[int],
                       n: int, params: dict) -> list[Completion]:
        """`n` samples. `prompt`: chat messages [{"role", "content": str}], or a completion
        prompt (str or token ids). `params`: only what the request set among temperature, top_p,
        max_tokens, stop (list[str]). May raise ApiError (404 unknown episode, 409 ended)."""
        ...
    def token_texts(self, agent: str, token_ids: list[int]) -> list[str]: ...
    async def reward(self, episode: str, body: dict) -> dict: ...
    async def end(self, episode: str) -> dict: ...
    async def status(self) -> dict: ...


# ----------------------------------------------------------------------------- validation

def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, message, param=param)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true is not 1


def _opt_int(body: dict, name: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not _is_int(v) or v < lo or (hi is not None and v > hi):
        bounds = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise _bad(name, f"`{name}` must be an integer {bounds}, got {v!r}")
    return v


def _opt_bool(body: dict, name: str, where: str | None = None) -> bool | None:
    v = body.get(name)
    if v is not None and not isinstance(v, bool):
        raise _bad(where or name, f"`{where or name}` must be a boolean, got {v!r}")
    return v


def _sampling(body: dict) -> tuple[int, dict]:
    """`n` and the backend's params, from the fields chat and completions share."""
    n = _opt_int(body, "n", 1, MAX_N) or 1
    params: dict = {}
    for name, ok, bounds in (("temperature", lambda v: 0 <= v <= 2, "between 0 and 2"),
                             ("top_p", lambda v: 0 < v <= 1, "in (0, 1]")):
        v = body.get(name)
        if v is not None:
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and ok(v)):
                raise _bad(name, f"`{name}` must be a number {bounds}, got {v!r}")
            params[name] = float(v)
    # top_k is vLLM's extension of the OpenAI API (-1 or 0: off); the trainer scores every
    # sample under the temperature, top_k and top_p it was sampled with.
    top_k = _opt_int(body, "top_k", -1)
    if top_k is not None:
        params["top_k"] = max(top_k, 0)
    max_tokens = _opt_int(body, "max_tokens", 1)
    max_completion_tokens = _opt_int(body, "max_completion_tokens", 1)
    if max_completion_tokens is not None:  # the newer name wins, as in OpenAI's API
        params["max_tokens"] = max_completion_tokens
    elif max_tokens is not None:
        params["max_tokens"] = max_tokens
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if (not isinstance(stop, list) or len(stop) > MAX_STOP
                or not all(isinstance(s, str) and s for s in stop)):
            raise _bad("stop", f"`stop` must be a string or a list of at most {MAX_STOP} "
                               "non-empty strings")
        params["stop"] = stop
    _opt_int(body, "seed", -(1 << 63))  # checked, then ignored: seeds come from request ids
    return n, params


def _streaming(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = bool(_opt_bool(body, "stream"))
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise _bad("stream_options", "`stream_options` must be an object")
    return stream, bool(_opt_bool(options, "include_usage", "stream_options.include_usage"))


def _unsupported(body: dict, names: tuple[str, ...], default: Callable[[Any], bool]) -> None:
    for name in names:
        if name in body and not default(body[name]):
            raise _bad(name, f"`{name}` is not supported by the flexmarl gateway")


def _messages(body: dict) -> list[dict]:
    """The chat messages as {"role", "content": str}; text parts joined with newlines (as
    vLLM's OpenAI server joins them, so a prompt renders the same through either)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "`messages` must be a non-empty list of message objects")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, f"`{where}` must be an object with `role` and `content`")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise _bad(f"{where}.role", f"`{where}.role` must be one of {', '.join(ROLES)}; "
                                        f"got {role!r}")
        if isinstance(content, list):
            bad = sorted({str(p.get("type")) if isinstance(p, dict) else type(p).__name__
                          for p in content
                          if not (isinstance(p, dict) and p.get("type") == "text"
                                  and isinstance(p.get("text"), str))})
            if bad:
                raise _bad(f"{where}.content", f"`{where}.content`: only text parts "
                           f"({{\"type\": \"text\", \"text\": str}}) are supported; got "
                           f"{', '.join(bad)}")
            content = "\n".join(p["text"] for p in content)
        elif not isinstance(content, str):
            raise _bad(f"{where}.content", f"`{where}.content` must be a string or a list of "
                                           "text parts")
        out.append({"role": role, "content": content})
    return out


def _prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(_is_int(t) and t >= 0 for t in prompt):
            return prompt
        if any(isinstance(t, (str, list)) for t in prompt):
            raise _bad("prompt", "one prompt per request: `prompt` must be a string or a list "
                                 "of token ids, not a list of prompts")
    raise _bad("prompt", "`prompt` must be a non-empty string or a non-empty list of "
                         "non-negative token ids")


# ----------------------------------------------------------------------------- rendering

def _finish(c: Completion) -> str:
    return "length" if c.finish_reason == "length" else "stop"


def _usage(completions: list[Completion]) -> dict:
    prompt = len(completions[0].prompt_ids)  # one prompt, n samples of it
    completion = sum(len(c.token_ids) for c in completions)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _extra(c: Completion) -> dict:
    return {"sample_id": c.sample_id, "version": c.version}


def _chat_logprobs(backend: Backend, c: Completion) -> dict:
    texts = backend.token_texts(c.agent, c.token_ids)
    return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()),
                         "top_logprobs": []} for t, lp in zip(texts, c.logprobs)]}


def _text_logprobs(backend: Backend, c: Completion) -> dict:
    texts = backend.token_texts(c.agent, c.token_ids)
    offsets, at = [], 0
    for t in texts:
        offsets.append(at)
        at += len(t)
    return {"tokens": texts, "token_logprobs": list(c.logprobs), "top_logprobs": None,
            "text_offset": offsets}


async def _sse(request: web.Request, head: dict, pieces: list[dict], usage: dict | None
               ) -> web.StreamResponse:
    """Server-sent events: one chunk per piece of a choice, then `usage` (if asked for) in a
    last chunk of its own, then [DONE]. Everything is generated before the first byte, so any
    error before this point still got an ordinary JSON error response."""
    if usage is not None:  # as OpenAI does: every chunk has "usage", null but in the last
        head = {**head, "usage": None}
    chunks = [{**head, "choices": [piece]} for piece in pieces]
    if usage is not None:
        chunks.append({**head, "choices": [], "usage": usage})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
    await response.prepare(request)
    for chunk in chunks:
        await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS),
                        content_type="application/json")


# ----------------------------------------------------------------------------- the app

def make_app(backend: Backend, *, token: str,
             misdirected: Callable[[str], str | None] | None = None,
             max_body_bytes: int = 8 << 20) -> web.Application:
    """The aiohttp application; `GatewayServer` serves it, tests may too. `token`: what every
    request must carry; `misdirected(Host header)`: None if that Host may reach the app, else
    why not (421; HttpServer.misdirected). Without it any Host passes."""
    return Routes(backend, token=token, misdirected=misdirected).app(max_body_bytes)


class Routes:
    """One method per route, over one Backend; `app()` wires them into an aiohttp app."""

    def __init__(self, backend: Backend, *, token: str,
                 misdirected: Callable[[str], str | None] | None = None) -> None:
        if not token:  # every route changes or reads the run: none is open
            raise ValueError("the gateway needs a token (GatewayServer generates one)")
        self.backend = backend
        self.token = token
        self.secret = token.encode()
        self.misdirected = misdirected
        self.created = int(time.time())  # models' "created", fixed for the app's life

    def app(self, max_body_bytes: int) -> web.Application:
        app = web.Application(middlewares=[self.errors, self.doors],
                              client_max_size=max_body_bytes)
        app.add_routes([
            web.get("/v1/models", self.list_models),
            web.get("/v1/models/{model}", self.get_model),
            web.post("/v1/chat/completions", self.chat),
            web.post("/v1/completions", self.completions),
            # Episode ids may hold "/" (the gateway's GROUP/ANYTHING), so {episode} spans
            # segments.
            web.post("/v1/episodes/{episode:.+}/reward", self.reward),
            web.post("/v1/episodes/{episode:.+}/end", self.end),
            web.get("/v1/flexmarl/status", self.status),
        ])
        return app

    # ------------------------------------------------------------------ middlewares

    @web.middleware
    async def errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        # Outermost, so aiohttp's own 404/405/413 and the doors' 421/401/415 are OpenAI-shaped.
        try:
            return await handler(request)
        except ApiError as exc:
            return exc.response()
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _http_error(request, exc)
        except Exception as exc:  # a bug in the backend or here: report it, keep serving
            log.exception("gateway: %s %s failed", request.method, request.path)
            return ApiError(500, f"{type(exc).__name__}: {exc}", type="server_error").response()

    @web.middleware
    async def doors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Host, then token, then Content-Type (the module docstring says why each)."""
        refused = self.misdirected and self.misdirected(request.headers.get("Host", ""))
        if refused:
            raise ApiError(421, refused, code="misdirected_request")
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                                 self.secret):
            response = ApiError(
                401, "missing or wrong API key: this gateway needs its token as "
                "`Authorization: Bearer TOKEN` (an OpenAI client's api_key). The token is "
                "gateway.token if set, else generated for the run: the run writes it to "
                f"RUN_DIR/{TOKEN_FILE} and gives it to gateway.app as OPENAI_API_KEY",
                code="invalid_api_key").response()
            response.headers["WWW-Authenticate"] = 'Bearer realm="flexmarl"'
            return response
        if (request.method in WITH_BODY and request.body_exists
                and request.content_type != "application/json"):
            raise ApiError(415, f"the request body must be JSON sent as `Content-Type: "
                                f"application/json`, not {request.content_type!r}",
                           param="Content-Type", code="unsupported_media_type")
        return await handler(request)

    # ------------------------------------------------------------------ routes

    async def list_models(self, request: web.Request) -> web.Response:
        return _json({"object": "list", "data": [self._model(m) for m in self.backend.models()]})

    async def get_model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name not in self.backend.models():
            raise ApiError(404, f"no agent named {name!r}", param="model",
                           code="model_not_found")
        return _json(self._model(name))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        agent = self._agent_of(body)
        messages = _messages(body)
        n, params = _sampling(body)
        stream, include_usage = _streaming(body)
        logprobs = bool(_opt_bool(body, "logprobs"))
        if _opt_int(body, "top_logprobs", 0):
            raise _bad("top_logprobs", "`top_logprobs` is not supported (the engine returns "
                                       "only the sampled tokens' logprobs)")
        _unsupported(body, ("tools", "functions"), lambda v: not v)
        _unsupported(body, ("response_format",),
                     lambda v: v is None or (isinstance(v, dict) and v.get("type") == "text"))
        episode = _episode_of(request, body)
        completions = await self.backend.generate(agent, episode, messages, n, params)
        head = {"id": "chatcmpl-" + completions[0].sample_id, "created": int(time.time()),
                "model": agent, "system_fingerprint": f"flexmarl-v{completions[0].version}"}
        lps = [_chat_logprobs(self.backend, c) if logprobs else None for c in completions]
        if not stream:
            return _json({**head, "object": "chat.completion", "choices": [
                {"index": i, "message": {"role": "assistant", "content": c.text},
                 "finish_reason": _finish(c), "logprobs": lps[i], "flexmarl": _extra(c)}
                for i, c in enumerate(completions)], "usage": _usage(completions)})
        pieces = []
        for i, c in enumerate(completions):
            pieces += [{"index": i, "delta": {"role": "assistant", "content": ""},
                        "logprobs": None, "finish_reason": None},
                       {"index": i, "delta": {"content": c.text}, "logprobs": lps[i],
                        "finish_reason": None},
                       {"index": i, "delta": {}, "logprobs": None, "finish_reason": _finish(c),
                        "flexmarl": _extra(c)}]
        return await _sse(request, {**head, "object": "chat.completion.chunk"}, pieces,
                          _usage(completions) if include_usage else None)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        agent = self._agent_of(body)
        prompt = _prompt(body)
        n, params = _sampling(body)
        stream, include_usage = _streaming(body)
        # An int asks for the sampled tokens' logprobs; the alternatives (>0) come back null.
        logprobs = _opt_int(body, "logprobs", 0, 5)
        _unsupported(body, ("echo", "suffix"), lambda v: not v)
        episode = _episode_of(request, body)
        completions = await self.backend.generate(agent, episode, prompt, n, params)
        head = {"id": "cmpl-" + completions[0].sample_id, "object": "text_completion",
                "created": int(time.time()), "model": agent,
                "system_fingerprint": f"flexmarl-v{completions[0].version}"}
        lps = [_text_logprobs(self.backend, c) if logprobs is not None else None
               for c in completions]
        if not stream:
            return _json({**head, "choices": [
                {"index": i, "text": c.text, "logprobs": lps[i], "finish_reason": _finish(c),
                 "flexmarl": _extra(c)} for i, c in enumerate(completions)],
                "usage": _usage(completions)})
        pieces = []
        for i, c in enumerate(completions):
            pieces += [{"index": i, "text": c.text, "logprobs": lps[i], "finish_reason": None},
                       {"index": i, "text": "", "logprobs": None, "finish_reason": _finish(c),
                        "flexmarl": _extra(c)}]
        return await _sse(request, head, pieces, _usage(completions) if include_usage else None)

    async def reward(self, request: web.Request) -> web.Response:
        body = await _body(request)
        return _json(await self.backend.reward(request.match_info["episode"], body))

    async def end(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if raw.strip() and _parse(raw) != {}:
            raise _bad("body", "ending an episode takes no body (or `{}`)")
        return _json(await self.backend.end(request.match_info["episode"]))

    async def status(self, request: web.Request) -> web.Response:
        return _json(await self.backend.status())

    # ------------------------------------------------------------------ helpers

    def _model(self, name: str) -> dict:
        return {"id": name, "object": "model", "created": self.created, "owned_by": OWNER}

    def _agent_of(self, body: dict) -> str:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise _bad("model", "`model` (the agent's name) must be a non-empty string")
        agents = self.backend.models()
        if model not in agents:
            raise ApiError(404, f"no agent named {model!r}; the agents are: "
                                f"{', '.join(agents)}", param="model", code="model_not_found")
        return model


def _episode_of(request: web.Request, body: dict) -> str:
    episode = request.headers.get("X-Episode-Id") or body.get("user")
    if not isinstance(episode, str) or not episode:
        raise _bad("user", "no episode id: set the `X-Episode-Id` header, or the body's "
                           "`user` field (e.g. extra_body={\"user\": EPISODE})")
    return episode


async def _body(request: web.Request) -> dict:
    """The request's JSON object; over client_max_size, read() raises aiohttp's 413."""
    return _parse(await request.read())


def _parse(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _bad("body", f"the request body is not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise _bad("body", f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _http_error(request: web.Request, exc: web.HTTPException) -> web.Response:
    """aiohttp's own errors (no route, wrong method, body too large), OpenAI-shaped."""
    allowed = exc.headers.get("Allow", "")
    message, code = {
        404: (f"no route {request.method} {request.path}", "not_found"),
        405: (f"{request.method} is not allowed on {request.path} (allowed: {allowed})",
              "method_not_allowed"),
        413: (f"request body too large ({exc.text})", "request_too_large"),
    }.get(exc.status, (exc.text or exc.reason, None))
    response = ApiError(exc.status, message, code=code).response()
    if allowed:
        response.headers["Allow"] = allowed
    return response


class GatewayServer(HttpServer):
    """`async with GatewayServer(backend, host=..., port=0) as server: server.url + "v1"`,
    clients sending `server.token` (the given token, or one generated here)."""

    what = "gateway"
    port_hint = "set gateway.port (0 picks a free one)"
    # A client that gives up cancels its generate() call rather than leaving the engine to
    # finish a sample nobody will read.
    handler_cancellation = True

    def __init__(self, backend: Backend, *, host: str = "127.0.0.1", port: int = 0,
                 token: str = "", max_body_bytes: int = 8 << 20) -> None:
        self._listen_on(host, port, token, "gateway.token")  # beyond loopback: refused without
        # On loopback too: any local process (or a web page) could otherwise end or reward
        # the run's episodes.
        self.token = token or secrets.token_urlsafe(32)
        self.app = make_app(backend, token=self.token, misdirected=self.misdirected,
                            max_body_bytes=max_body_bytes)
