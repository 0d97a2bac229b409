"""The HTTP API as an ASGI application (Starlette routing, served by Hypercorn's Trio worker).

Owns what happens to a request before and around its turn: the token (``Authorization: Bearer`` or ``x-api-key``,
every endpoint) and the Origin rule (decided by the daemon's ``authorize``), the body limit (413), JSON and model
checks (400 naming the field, never 422), the model (404), the limit on turns running at once (429 with
``retry-after``), the conversation and working-directory headers, and the response: one JSON body, or a stream of
server-sent events whose status line waits for the first output so that errors found before it get their HTTP
status (502 for an agent that failed). A stream that stays silent is started anyway after ``stream_start_after``
seconds and kept alive with pings; a client that goes away cancels its turn at once (the socket is watched, not
the next write).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio
from pydantic import ValidationError
from starlette.types import Message, Receive, Scope, Send

from bridge.config import EDITOR_MODELS_PREFIX
from bridge.service.composition import BridgeService
from bridge.service.editor_models import EditorLink
from bridge.service.principals import LOCAL, Principal
from bridge.service.shared_models import SharedModel
from wire.cancel import CancelRequest
from wire.errors import ScopeMissing
from wire.http_server import is_loopback, read_body
from wire.observe.logger import Logger
from wire.rpc.protocol import parse, to_json

from .anthropic_messages import CountTokensBody, Messages
from .api import ApiBody, ApiError, ApiStream, EditorTarget, HttpApi, HttpTurnResult, ParsedRequest
from .openai_chat import ChatCompletions
from .openai_responses import Responses, ResponseStore
from .turns import TurnRunner

__all__ = ["Authorize", "HttpFront", "HttpSettings", "Target"]

# The daemon's rules for a request's headers: whose request it is, else (HTTP status, reason) to refuse it.
Authorize = Callable[[list[tuple[bytes, bytes]]], "Principal | tuple[int, str]"]  # raw headers: Origin may repeat
# For a front that serves one editor model whatever the request names (an agent's own model requests): the target
# of a request, from its ASGI scope and the model it named; ``ApiError`` when there is none.
Target = Callable[[Scope, str], EditorTarget]

HEALTH_PATH = "/healthz"  # answered without a token: ready (200) or draining (503), nothing else
METRICS_PATH = "/metrics"
CONVERSATION_HEADER = b"x-lmbridge-conversation"
CWD_HEADER = b"x-lmbridge-cwd"


@dataclass(frozen=True)
class HttpSettings:
    max_body_bytes: int = 64 * 1024 * 1024
    max_turns: int = 32  # turns running at once, over every API
    stream_start_after: float = 10.0  # seconds a stream waits for the agent's first output before it starts anyway
    ping_interval: float = 15.0  # a silent stream gets a keep-alive event this often
    activity: str = "native"  # "native": reasoning/thinking where the API has it; "text": text lines everywhere
    stored_responses: int = 2048  # Responses API objects kept for previous_response_id and GET
    default_cwd: str | None = None
    allowed_origins: tuple[str, ...] = ()  # browser origins: answered with CORS headers (checked by ``authorize``)
    open_metrics: bool = False  # /metrics for any client on loopback, without a key (a local Prometheus)


class _Endpoint:
    """A handler as a raw ASGI application, which is how Starlette routes to it (a turn needs ``receive`` itself,
    to watch for the client going away), behind the scope of a key it needs (403 without)."""

    def __init__(self, handler: Callable[..., Awaitable[None]], needs: str, args: tuple[Any, ...]) -> None:
        self._handler = handler
        self._needs = needs
        self._args = args

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            _principal(scope).require(self._needs)
        except ScopeMissing as missing:
            error = ApiError(403, "permission_error", missing.message)
            await _respond_json(send, 403, _error_shape(scope).error_body(error))
            return
        await self._handler(scope, receive, send, *self._args)


PRINCIPAL = "lmbridge.principal"  # the ASGI scope's key for whose request it is


def _principal(scope: Scope) -> Principal:
    principal: Principal = scope[PRINCIPAL]
    return principal


class _ClientGone(Exception):
    """The client disconnected before its request was read."""


class HttpFront:
    """``app`` is the ASGI application."""

    def __init__(
        self,
        service: BridgeService,
        settings: HttpSettings,
        authorize: Authorize,
        *,
        log: Logger,
        target: Target | None = None,
    ) -> None:
        """``target``: every request is answered by the editor model it returns (``/v1/models`` lists that one
        only); without it, a request's model names an agent or ``editor/<id>``."""
        from starlette.routing import Route, Router

        self.service = service
        self._target = target
        self.settings = settings
        self._authorize = authorize
        self.log = log.bind(front="http")
        self.runner = TurnRunner(service, activity=settings.activity, default_cwd=settings.default_cwd)
        # An agent's route answers lean: its response objects do not repeat the request's instructions and tools
        # (tens of KB an event, which the agent parses and ignores); a client of the HTTP API gets the whole object.
        self.responses = Responses(ResponseStore(settings.stored_responses), echo=target is None)
        chat, messages = ChatCompletions(), Messages()
        self.on_refused: Callable[[str, str], None] | None = None  # told (reason, peer) of each request refused
        # The daemon's metrics in the Prometheus text format, and its content type (None: /metrics is not served).
        self.metrics: tuple[Callable[[], bytes], str] | None = None
        self._turns: dict[CancelRequest, Principal] = {}  # the cancel signals of the turns running now: whose
        self._idle = trio.Event()
        self._idle.set()
        self._router = Router(
            [
                Route(METRICS_PATH, self._asgi(self._metrics, "metrics"), methods=["GET"]),
                Route("/v1/models", self._asgi(self._models, "models"), methods=["GET"]),
                Route("/v1/models/{model:path}", self._asgi(self._model, "models"), methods=["GET"]),
                Route("/v1/chat/completions", self._asgi(self._turn, "chat", chat), methods=["POST"]),
                Route("/v1/responses", self._asgi(self._turn, "chat", self.responses), methods=["POST"]),
                Route("/v1/responses/{response_id}", self._asgi(self._stored_response, "chat"), methods=["GET"]),
                Route("/v1/messages", self._asgi(self._turn, "chat", messages), methods=["POST"]),
                Route("/v1/messages/count_tokens", self._asgi(self._count_tokens, "chat"), methods=["POST"]),
            ],
            default=self._not_found,
        )

    @property
    def running(self) -> int:
        return len(self._turns)

    def cancel_turns(self, ended: Callable[[Principal], bool] | None = None) -> list[str]:
        """End every running turn (the daemon is stopping), or those whose principal has ``ended`` (its key was
        revoked): each response ends as a cancelled turn. The names of the principals whose turns were ended."""
        names = []
        for cancel, principal in list(self._turns.items()):
            if (ended is None or ended(principal)) and not cancel.is_set():
                cancel.set()
                names.append(principal.name)
        return names

    async def wait_idle(self) -> None:
        await self._idle.wait()

    # -- the application ------------------------------------------------------------------------------------------

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == HEALTH_PATH and scope["method"] in ("GET", "HEAD"):
            await self._health(send)
            return
        if scope["path"] == METRICS_PATH and self.settings.open_metrics and _from_loopback(scope):
            await self._metrics(scope, receive, send)
            return
        headers = {name.lower(): value for name, value in scope["headers"]}
        api = _error_shape(scope)
        origin = headers.get(b"origin")
        if origin is not None and self._origin_allowed(origin):
            send = _with_cors(send, origin.decode("latin-1"))
            if scope["method"] == "OPTIONS":  # a CORS preflight: it carries no token, and needs none
                await _respond(send, 204, b"", extra=_PREFLIGHT)
                return
        checked = self._authorize(scope["headers"])
        if not isinstance(checked, Principal):
            status, reason = checked
            self.log.warning("refused an HTTP request", path=scope["path"], reason=reason)
            if self.on_refused is not None:
                client = scope.get("client")
                self.on_refused(reason, client[0] if client else "")
            error = ApiError(status, "authentication_error" if status == 401 else "permission_error", reason)
            extra = [(b"www-authenticate", b"Bearer")] if status == 401 else []
            await _respond_json(send, status, api.error_body(error), extra=extra)
            return
        # From here until its answer's first bytes are written, busier keys' work waits (``LoopShare``).
        share = self.service.share
        start = self.service.starting(checked)
        if start is not None:
            answer = send

            async def send(message: Message) -> None:
                await answer(message)
                if message["type"] == "http.response.body":
                    share.started(start)

        try:
            await self._router({**scope, PRINCIPAL: checked}, receive, send)
        finally:
            share.started(start)

    async def _health(self, send: Send) -> None:
        """For a load balancer: ready, or not (draining: the daemon is stopping). No token, and nothing more."""
        draining = self.service.draining
        status = "draining" if draining else "ready"
        await _respond_json(send, 503 if draining else 200, {"status": status}, extra=[(b"cache-control", b"no-store")])

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.metrics is None:
            await self._not_found(scope, receive, send)
            return
        exposition, content_type = self.metrics
        await _respond(send, 200, exposition(), extra=[(b"content-type", content_type.encode())])

    def _origin_allowed(self, origin: bytes) -> bool:
        return origin.decode("latin-1") in self.settings.allowed_origins

    def _asgi(self, handler: Callable[..., Awaitable[None]], needs: str, *args: Any) -> _Endpoint:
        return _Endpoint(handler, needs, args)

    async def _not_found(self, scope: Scope, receive: Receive, send: Send) -> None:
        api = _error_shape(scope)
        error = ApiError(404, "not_found_error", f"no such endpoint: {scope['method']} {scope['path']}")
        await _respond_json(send, 404, api.error_body(error))

    # -- endpoints ------------------------------------------------------------------------------------------------

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._target is not None:
            try:
                target = self._target(scope, "")
            except ApiError as error:
                await _respond_json(send, error.status, _error_shape(scope).error_body(error))
                return
            data = [_shared_object(target.model.id, target.model, target.link)]
            await _respond_json(send, 200, {"object": "list", "data": data})
            return
        principal = _principal(scope)
        service = self.runner.service
        data = [_model_object(entry.id, entry.name) for entry in service.models(principal)]
        data += [_shared_object(name, model, link) for name, model, link in service.editor_models.listed(principal.id)]
        await _respond_json(send, 200, {"object": "list", "data": data})

    async def _model(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = scope["path_params"]["model"]
        try:
            if self._target is not None:
                target = self._target(scope, name)
                body = _shared_object(name, target.model, target.link)
            elif name.startswith(EDITOR_MODELS_PREFIX + "/"):
                probe = ParsedRequest(name, [], [], principal=_principal(scope))
                self.runner.resolve_into(probe)
                assert probe.editor_model is not None
                target = probe.editor_model
                body = _shared_object(target.name, target.model, target.link)
            else:
                entry = self.runner.resolve(name, _principal(scope))
                body = _model_object(entry.id, entry.name)
        except ApiError as error:
            await _respond_json(send, 404, ChatCompletions.error_body(error))
            return
        await _respond_json(send, 200, body)

    async def _stored_response(self, scope: Scope, receive: Receive, send: Send) -> None:
        response_id = scope["path_params"]["response_id"]
        stored = self.responses.store.get(response_id, _principal(scope).id)
        if stored is None:
            error = ApiError(404, "not_found_error", f"no stored response {response_id!r}", param="response_id")
            await _respond_json(send, 404, Responses.error_body(error))
            return
        await _respond_json(send, 200, stored)

    async def _count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            request = await self._parse(scope, receive, _MESSAGES, CountTokensBody)
            body = Messages.count_tokens(request)
        except _ClientGone:
            return
        except ApiError as error:
            await _respond_json(send, error.status, Messages.error_body(error))
            return
        await _respond_json(send, 200, body)

    async def _turn(self, scope: Scope, receive: Receive, send: Send, api: HttpApi) -> None:
        headers = {name.lower(): value for name, value in scope["headers"]}
        try:
            request = await self._parse(scope, receive, api, api.body_model)
            conversation = headers.get(CONVERSATION_HEADER)
            if conversation:
                request.conversation = conversation.decode("utf-8", "replace")
            cwd = _cwd(headers.get(CWD_HEADER))
            if self.running >= self.settings.max_turns:
                limit = self.settings.max_turns
                raise ApiError(
                    429,
                    "rate_limit_error",
                    f"{limit} turns are running, the limit (serve.max_turns); retry when one has finished",
                    retry_after=1.0,
                )
            if not isinstance(self._authorize(scope["headers"]), Principal):  # revoked while the body was read
                raise ApiError(401, "authentication_error", "the key was revoked or expired")
            await self._refuse_over_limits(request, receive)
        except _ClientGone:
            return
        except ApiError as error:
            await _respond_error(send, api, error)
            return
        exchange = _Exchange(self, api, request, receive, send)
        self._turns[exchange.cancel] = _principal(scope)
        if self._idle.is_set():  # (a waiter holds the current event: replace it only once it has fired)
            self._idle = trio.Event()
        started = trio.current_time()
        try:
            result = await exchange.run(cwd)
        finally:
            self._turns.pop(exchange.cancel, None)
            if not self._turns:
                self._idle.set()
        # An agent's model requests (a route's front, with a target) come by the dozen a turn, and the editor model
        # call each makes is logged already: their turns are logged at debug level unless they fail.
        log = self.log.debug if self._target is not None and result.error is None else self.log.info
        log(
            "turn done" if result.error is None else "turn failed",
            api=api.name,
            key=_principal(scope).name,
            model=request.model,
            stream=request.stream,
            seconds=round(trio.current_time() - started, 3),
            stop_reason=result.stop_reason,
            error=str(result.error) if result.error else None,
        )

    async def _refuse_over_limits(self, request: ParsedRequest, receive: Receive) -> None:
        """``ApiError`` 429 for a request over one of its key's limits, before its turn is set up; answered after
        ``BridgeService.hold`` (a client that keeps sending them gets its answers late), ``_ClientGone`` if the client
        goes away meanwhile."""
        if request.editor_model is not None:
            agent = EDITOR_MODELS_PREFIX
        else:
            agent = request.entry.agent.id if request.entry is not None else request.model
        refusal = self.service.refusal(request.principal, "http", agent, request.model)
        if refusal is None:
            return
        self.log.debug("refused over a limit", model=request.model, limit=refusal.name)
        gone = CancelRequest()

        async def watch() -> None:  # the body has been read: what comes next is the client going away
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await self.service.hold(request.principal or LOCAL, refusal, gone)
            nursery.cancel_scope.cancel()
        if gone.is_set():
            raise _ClientGone
        raise ApiError.from_error(refusal)

    async def _parse(self, scope: Scope, receive: Receive, api: HttpApi, model: type[ApiBody]) -> ParsedRequest:
        body = await _read_body(scope, receive, self.settings.max_body_bytes)
        try:
            data = parse(body)
        except (ValueError, RecursionError) as exc:
            raise ApiError.bad_request(f"the body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ApiError.bad_request("the body must be a JSON object")
        try:
            validated = model.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            problem = "is required" if first["type"] == "missing" else first["msg"]
            raise ApiError.bad_request(f"{where}: {problem}", where) from None
        principal = _principal(scope)
        request = api.parse(validated, principal.id)
        request.principal = principal
        if not request.history_stored:
            request.body_bytes = len(body)
        if self._target is not None:
            request.editor_model = self._target(scope, request.model)
        else:
            self.runner.resolve_into(request)
        if request.stream is False and api.stream_by_accept and _accepts_event_stream(scope):
            request.stream = "stream" not in data  # asked for by Accept, unless the body said otherwise
        return request


class _Exchange:
    """One turn's response: a JSON body, or an event stream that starts at the first output."""

    def __init__(self, front: HttpFront, api: HttpApi, request: ParsedRequest, receive: Receive, send: Send) -> None:
        self._front = front
        self._api = api
        self._request = request
        self._receive = receive
        self._send = send
        self.cancel = CancelRequest()  # set: the turn ends (the client went away, or the daemon is stopping)
        self._gone = False  # the client went away: nothing more is sent
        self._stream: ApiStream | None = api.stream(request) if request.stream else None
        self._started = False
        self._lock = trio.Lock()
        self._last_write = trio.current_time()

    async def run(self, cwd: str | None) -> HttpTurnResult:
        front = self._front
        result: HttpTurnResult
        target = self._request.editor_model
        unwatch = target.cancelled_with.on_set(self.cancel.set) if target and target.cancelled_with else None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_disconnect)
            if self._stream is not None:
                nursery.start_soon(self._keep_alive)
            try:
                result = await front.runner.run(self._request, self._on_part, self.cancel, cwd=cwd)
            except Exception as exc:  # a malformed history, an agent that would not start, ...
                result = HttpTurnResult("end_turn", None, exc)
            finally:
                if unwatch is not None:
                    unwatch()
            nursery.cancel_scope.cancel()
        if self._gone:
            front.log.info("the client went away; its turn was cancelled", api=self._api.name)
            return result
        error = ApiError.from_error(result.error) if result.error is not None else None
        if self._stream is None:
            if error is not None:
                await _respond_error(self._send, self._api, error)
            else:
                await _respond_json(self._send, 200, self._api.body(self._request, result))
        elif error is not None and not self._started:
            await _respond_error(self._send, self._api, error)
        else:
            ending = self._stream.error(error) if error is not None else self._stream.finish(result)
            await self._write(ending, last=True)
        return result

    async def _on_part(self, part: dict[str, Any]) -> None:
        if self._stream is not None:
            events = self._stream.part(part)
            if events:
                await self._write(events)

    async def _write(self, events: list[bytes], *, last: bool = False) -> None:
        """Send ``events`` (the response's start first, once); ``last``: they end the response, in the same write."""
        assert self._stream is not None
        async with self._lock:
            if self._gone:
                return
            try:
                # Never cut short by a cancel (the turn's, as a part is being written): a send the server has half
                # done leaves its connection unusable. The socket write under it is shielded by the server already.
                with trio.CancelScope(shield=True), trio.move_on_after(_WRITE_TIMEOUT) as stuck:
                    if not self._started:
                        self._started = True
                        await self._send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                        events = self._stream.start() + events
                    await self._send({"type": "http.response.body", "body": b"".join(events), "more_body": not last})
                if stuck.cancelled_caught:  # a client that stopped reading: gone, as far as this turn is concerned
                    self._client_gone()
            except Exception:  # the connection is gone (the watcher will say so too)
                self._client_gone()
            self._last_write = trio.current_time()

    async def _keep_alive(self) -> None:
        assert self._stream is not None
        settings = self._front.settings
        await trio.sleep(settings.stream_start_after)
        if not self._started:
            await self._write([])
        while True:
            await trio.sleep_until(self._last_write + settings.ping_interval)
            if trio.current_time() >= self._last_write + settings.ping_interval:
                await self._write([self._stream.ping()])

    async def _watch_disconnect(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._client_gone()
                return

    def _client_gone(self) -> None:
        self._gone = True
        self.cancel.set()


_WRITE_TIMEOUT = 60.0  # seconds one write may wait for a client that does not read

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
_PREFLIGHT = [
    (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
    (
        b"access-control-allow-headers",
        b"authorization, x-api-key, content-type, anthropic-version, anthropic-beta, "
        b"x-lmbridge-conversation, x-lmbridge-cwd, openai-beta",
    ),
    (b"access-control-max-age", b"600"),
]


_MESSAGES, _CHAT = Messages(), ChatCompletions()


def _error_shape(scope: Scope) -> HttpApi:
    """The API whose error shape a request gets before it reaches its endpoint (Anthropic's under /v1/messages)."""
    return _MESSAGES if scope["path"].startswith("/v1/messages") else _CHAT


def _model_object(model_id: str, name: str) -> dict[str, Any]:
    """An OpenAI model object, with Anthropic's ``display_name`` (both SDKs ignore the other's fields)."""
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "lmbridge", "display_name": name}


def _shared_object(name: str, model: SharedModel, link: EditorLink) -> dict[str, Any]:
    """A model an editor shares, as a model object: owned by the editor, saying which one and what it is."""
    return {
        **_model_object(name, model.name),
        "owned_by": "editor",
        "editor": link.label,
        "editor_model": model.describe(),
    }


def _from_loopback(scope: Scope) -> bool:
    client = scope.get("client")
    return client is not None and is_loopback(client[0])


def _cwd(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    path = raw.decode("utf-8", "replace")
    if not os.path.isabs(path) or not os.path.isdir(path):
        raise ApiError.bad_request(f"x-lmbridge-cwd must name an existing directory by its absolute path: {path!r}")
    return path


def _accepts_event_stream(scope: Scope) -> bool:
    accept = dict(scope["headers"]).get(b"accept", b"")
    return b"text/event-stream" in accept


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    too_large = ApiError(
        413, "request_too_large", f"the request body is over the limit of {limit} bytes (--max-message-bytes)"
    )
    length = dict(scope["headers"]).get(b"content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_large
    body, rest = await read_body(receive, limit)
    if rest is not None and rest["type"] == "http.disconnect":
        raise _ClientGone
    if rest is not None or len(body) > limit:
        raise too_large
    return body


async def _respond_error(send: Send, api: HttpApi, error: ApiError) -> None:
    extra = []
    if error.retry_after is not None:
        extra.append((b"retry-after", str(max(1, round(error.retry_after))).encode()))
    await _respond_json(send, error.status, api.error_body(error), extra=extra)


async def _respond_json(
    send: Send, status: int, body: dict[str, Any], *, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = to_json(body)
    headers = [(b"content-type", b"application/json"), *(extra or [])]
    await _respond(send, status, data, extra=headers)


async def _respond(send: Send, status: int, body: bytes, *, extra: list[tuple[bytes, bytes]]) -> None:
    headers = [(b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _with_cors(send: Send, origin: str) -> Send:
    async def cors_send(message: Message) -> None:
        if message["type"] == "http.response.start" and origin:
            cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"origin")]
            message = {**message, "headers": [*message.get("headers", []), *cors]}
        await send(message)

    return cors_send
