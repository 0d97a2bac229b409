"""Agents that think with the editor's models: an agent configured ``model_source = "editor"`` sends its own model
requests to lmbridge, which answers each with one ``editor/chat`` on the conversation's editor.

Owns, per agent process: a route on lmbridge's loopback listener (the one HTTP MCP uses) with a token of its own,
valid for model requests only and gone with the process; the recipe that points the agent there (environment
variables or ``-c`` options, per known agent: ``RECIPES``); which editor answers (the one whose conversation the
process is serving) and which of its models (``editor:<id>``, else the first it shares). The requests themselves are
the HTTP front's (``HttpFront`` with a ``target``): the agent's API in, its API's stream out, errors in its shape.

Loops are impossible by construction: such a request is only ever answered by a model an editor shares, never by
an lmbridge agent (``EditorModels`` refuses to take lmbridge's own models back).
"""

from __future__ import annotations

import fnmatch
import hmac
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.types import Receive, Scope, Send

from bridge.config import AgentConfig, known_agent
from bridge.service.composition import BridgeService
from bridge.service.editor_models import EditorLink
from bridge.service.principals import LOCAL
from bridge.service.shared_models import SharedModel
from session.router import LiveSession
from wire.errors import AgentStartError
from wire.http_server import presented_token
from wire.observe.logger import Logger
from wire.observe.redact import add_secret, remove_secret

from .api import ApiError, EditorTarget
from .app import HttpFront, HttpSettings

__all__ = ["PREFIX", "RECIPES", "AgentModelGateway", "recipe_for"]

PREFIX = "/agent-model/"
# What a route serves: the model APIs only (the stored-responses endpoint is not one an agent needs).
_ENDPOINTS = ("/v1/messages", "/v1/messages/count_tokens", "/v1/responses", "/v1/chat/completions", "/v1/models")
_ROUTE_KEY = "lmbridge.agent_model_route"

# What every agent on the editor's models gets, whatever its recipe: for agents lmbridge has no recipe for.
BASE_URL_VARIABLE = "LMBRIDGE_MODEL_BASE_URL"  # the route's base; APIs under it: /v1/messages, /v1/responses, ...
TOKEN_VARIABLE = "LMBRIDGE_MODEL_TOKEN"  # as ``Authorization: Bearer`` or ``x-api-key``


@dataclass(frozen=True)
class Pointing:
    """How one agent process is pointed at its route: variables to set, to remove, and arguments to add."""

    env: dict[str, str]
    unset: tuple[str, ...] = ()
    args: tuple[str, ...] = ()


def _claude(url: str, token: str) -> Pointing:
    # Claude Code (and its ACP adapter) reads the Anthropic endpoint and key from the environment; a token in
    # ANTHROPIC_AUTH_TOKEN goes as a bearer, in ANTHROPIC_API_KEY as x-api-key: both are set, so that whichever it
    # prefers is this route's. Bedrock, Vertex and Foundry switches would send it elsewhere.
    return Pointing(
        {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": token, "ANTHROPIC_AUTH_TOKEN": token},
        unset=("CLAUDE_CODE_USE_*", "ANTHROPIC_CUSTOM_HEADERS"),
    )


def _codex(url: str, token: str) -> Pointing:
    # Codex takes a model provider of lmbridge's own through -c overrides (TOML values), the token from a variable.
    provider = "model_providers.lmbridge"
    return Pointing(
        {},
        args=(
            "-c",
            'model_provider="lmbridge"',
            "-c",
            f'{provider}.name="lmbridge (the editor\'s model)"',
            "-c",
            f"{provider}.base_url={json.dumps(url + '/v1')}",
            "-c",
            f'{provider}.wire_api="responses"',
            "-c",
            f'{provider}.env_key="{TOKEN_VARIABLE}"',
            # Web search is a tool OpenAI's servers run: an editor's model has none.
            "-c",
            'web_search="disabled"',
        ),
    )


def _opencode(url: str, token: str) -> Pointing:
    # OpenCode merges OPENCODE_CONFIG_CONTENT over its config files: its Anthropic provider pointed here, and chosen.
    content = {
        "provider": {"anthropic": {"options": {"baseURL": url + "/v1", "apiKey": token}}},
        "model": "anthropic/claude-sonnet-4-5",
        "small_model": "anthropic/claude-sonnet-4-5",
    }
    return Pointing({"OPENCODE_CONFIG_CONTENT": json.dumps(content)})


def _generic(url: str, token: str) -> Pointing:
    return Pointing({})


RECIPES: dict[str, Callable[[str, str], Pointing]] = {
    "claude": _claude,
    "codex": _codex,
    "opencode": _opencode,
    "env": _generic,
}


def recipe_for(config: AgentConfig) -> str:
    """The recipe an agent is pointed with: its ``model_recipe``, else its known agent's, else "env" (only the
    ``LMBRIDGE_MODEL_*`` variables)."""
    if config.model_recipe != "auto":
        return config.model_recipe
    known = known_agent(config)
    return known if known in RECIPES else "env"


def pointed(config: AgentConfig, url: str, token: str) -> AgentConfig:
    """``config`` as started on the editor's models: its recipe's variables and arguments added to its own."""
    pointing = RECIPES[recipe_for(config)](url, token)
    own = {k: v for k, v in config.env.items() if not any(fnmatch.fnmatchcase(k, p) for p in pointing.unset)}
    env = {**own, BASE_URL_VARIABLE: url, TOKEN_VARIABLE: token, **pointing.env}
    return config._replace(env=env, unset_env=(*config.unset_env, *pointing.unset), args=(*config.args, *pointing.args))


@dataclass
class _Route:
    agent_id: str
    source: str  # "editor" or "editor:<model id>"
    authorization: bytes  # the token
    principal: str | None = None  # whose conversations its process is for (None: anyone's, in a one-user process)
    process: object = None  # the agent process (bridge.acp.process.AgentProcess), once it runs
    requests: int = 0


@dataclass
class _Launch:
    """A prepared agent process (``bridge.acp.pool.Launch``): its route lives until the process is gone."""

    gateway: AgentModelGateway
    route: str
    config: AgentConfig
    entry: _Route = field(repr=False)

    def started(self, process: object) -> None:
        self.entry.process = process

    def ended(self) -> None:
        self.gateway.forget(self.route)


class AgentModelGateway:
    """The ``Launcher`` for agents on the editor's models, and the application that answers their requests."""

    def __init__(self, service: BridgeService, settings: HttpSettings, *, log: Logger) -> None:
        self._service = service
        self._log = log.bind(part="agent models")
        self._routes: dict[str, _Route] = {}
        self._base: str | None = None
        self._front = HttpFront(service, settings, lambda headers: LOCAL, log=log, target=self._target)

    @property
    def routes(self) -> int:
        return len(self._routes)

    async def prepare(self, config: AgentConfig, principal: str | None = None) -> _Launch | None:
        if not config.model_source:
            return None
        base = await self._mounted(config)
        route, token = secrets.token_hex(8), secrets.token_urlsafe(32)
        add_secret(token)
        if self._service.tracer is not None:
            self._service.tracer.add_secret(token)
        entry = self._routes[route] = _Route(config.id, config.model_source, token.encode(), principal)
        recipe = recipe_for(config)
        if recipe == "env" and config.model_recipe == "auto":
            self._log.warning(
                "no recipe known for this agent's command: it gets only LMBRIDGE_MODEL_BASE_URL and "
                "LMBRIDGE_MODEL_TOKEN, and uses its own provider unless its env or args point it there",
                agent=config.id,
                command=config.command,
            )
        url = f"{base}/{route}"
        self._log.info("agent on the editor's models", agent=config.id, recipe=recipe)
        return _Launch(self, route, pointed(config, url, token), entry)

    def forget(self, route: str) -> None:
        """The route's process is gone: its token is refused from now on."""
        entry = self._routes.pop(route, None)
        if entry is not None:
            remove_secret(entry.authorization.decode())

    async def _mounted(self, config: AgentConfig) -> str:
        if self._base is None:
            listener = await self._service.tools.loopback_listener()
            try:
                if listener is None:
                    raise RuntimeError("no socket could be opened")
                self._base = listener.mount(PREFIX, self.app)
            except RuntimeError as exc:
                raise AgentStartError(config.id, f"cannot listen on 127.0.0.1 for its model requests: {exc}") from None
        return self._base

    # -- requests ---------------------------------------------------------------------------------------------

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        route_id, _, rest = scope["path"][len(PREFIX) :].partition("/")
        entry = self._routes.get(route_id)
        headers = {name.lower(): value for name, value in scope["headers"]}
        presented = presented_token(headers) or b""
        if entry is None or not hmac.compare_digest(presented, entry.authorization):
            # One answer for both: a route's existence is not told to whoever lacks its token.
            self._log.warning("refused an agent's model request: unknown route or wrong token")
            await _refuse(send)
            return
        if "/" + rest not in _ENDPOINTS and not rest.startswith("v1/models/"):
            await _respond(send, 404, "not_found_error", f"no such model endpoint: /{rest}")
            return
        entry.requests += 1
        inner = {**scope, "path": "/" + rest, "raw_path": ("/" + rest).encode(), "root_path": "", _ROUTE_KEY: entry}
        await self._front.app(inner, receive, send)

    def _target(self, scope: Scope, model: str) -> EditorTarget:
        """The editor model that answers a request of the route's agent, whatever model the agent named."""
        entry: _Route = scope[_ROUTE_KEY]
        link, running = self._editor_of(entry)
        shared = self._service.editor_models.shared_by(link)
        # The conversation's choice (an ``agent@model`` entry), else the agent's configured model_source.
        choices = {s.thinks_with for s in running}
        if len(choices) > 1:
            raise ApiError(
                400,
                "invalid_request_error",
                f"lmbridge: the agent {entry.agent_id!r} runs turns of conversations on different models in one "
                f'process; set [agents.{entry.agent_id}] isolation = "session" to know which model answers',
            )
        source = next(iter(choices), "") or entry.source
        wanted = source.partition(":")[2]
        chosen = _choose(shared, wanted)
        if chosen is None:
            if wanted:
                text = (
                    f"the conversation's editor shares no model {wanted!r} (the conversation's choice, or "
                    f"[agents.{entry.agent_id}] model_source); it shares: "
                    + (", ".join(m.id for m in shared) or "none")
                )
            else:
                text = "the conversation's editor shares no models; share one (VS Code: lmbridge.shareEditorModels)"
            raise ApiError(400, "invalid_request_error", f"lmbridge: {text}")
        self._log.debug("agent model request", agent=entry.agent_id, named=model, answered_by=chosen.id)
        # One turn running in the process: the request serves it, and ends when it is cancelled.
        serving = running[0] if len(running) == 1 else None
        cancelled_with = serving.actor.prompt_cancelled() if serving is not None and serving.actor else None
        return EditorTarget(model or chosen.id, chosen, link, cancelled_with)

    def _editor_of(self, entry: _Route) -> tuple[EditorLink, list[LiveSession]]:
        """The editor whose model answers the route's process, and the sessions of the process with a turn running.
        That editor is the one of every conversation the process holds (an HTTP client's conversation counts as the
        one editor that shares models, beside it: ``lmbridge stdio --http``). A process holding conversations of two
        editors cannot tell whose a request is (a model request names no conversation): refused, never guessed —
        ``isolation = "session"`` gives each conversation a process of its own."""
        process = entry.process
        sessions = [s for s in self._service.router.sessions if process is not None and s.agent is process]
        editors: dict[int, object] = {}
        for session in sessions:
            # An HTTP client's conversation: the one editor of its principal that shares models (never another's).
            client = session.client if session.client is not None else self._only_sharing(session.principal)
            editors[id(client) if client is not None else id(session)] = client
        if not sessions:  # no conversation (yet, or left: a late request): the one editor of its key sharing models
            only = self._only_sharing(entry.principal)
            if only is not None:
                editors[id(only)] = only
        if len(editors) > 1:
            raise ApiError(
                400,
                "invalid_request_error",
                f"lmbridge: the agent {entry.agent_id!r} holds conversations of {len(editors)} clients in one "
                f'process; set [agents.{entry.agent_id}] isolation = "session" to know whose model answers',
            )
        client = next(iter(editors.values()), None)
        if client is None:
            raise ApiError(
                400,
                "invalid_request_error",
                f"lmbridge: the agent {entry.agent_id!r} is not serving an editor's conversation, and not exactly one "
                "editor (of the conversation's key) shares models: whose model answers is not known",
            )
        link: EditorLink = client  # type: ignore[assignment]  # an editor connection (else it shares nothing: 400)
        return link, [s for s in sessions if s.serving]

    def _only_sharing(self, principal: str | None) -> EditorLink | None:
        """The editor sharing models, when exactly one of ``principal``'s does (``None``: of anyone's)."""
        sharing = {id(link): link for _name, _model, link in self._service.editor_models.listed(principal)}
        return next(iter(sharing.values())) if len(sharing) == 1 else None


def _choose(shared: list[SharedModel], wanted: str) -> SharedModel | None:
    if wanted:
        return next((m for m in shared if m.id == wanted), None)
    return shared[0] if shared else None


async def _refuse(send: Send) -> None:
    await _respond(send, 401, "authentication_error", "missing or wrong token")


async def _respond(send: Send, status: int, kind: str, message: str) -> None:
    body = json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
