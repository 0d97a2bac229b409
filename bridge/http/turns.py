"""The turn of an HTTP request, whatever its API: run on the session path like the editor front's.

Owns the translation-independent half of a request: resolving its model, the client's tools (the permission tool
passed through when the client offers it, else asked about in words through
``session.permissions.PermissionQuestions``), the turn built once (``BridgeService.turn_request``) and run with
``BridgeService.chat`` (the same calls the editor front makes), and what the client is owed at the end
(``HttpHttpTurnResult``): the parts it saw, whether it was given tool calls, the stop reason and the usage the agent
reported.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

from bridge.config import EDITOR_MODELS_PREFIX
from bridge.service.composition import BridgeService
from bridge.service.models import ModelEntry
from bridge.service.principals import Principal
from bridge.service.view import ClientView
from session.permissions import PermissionQuestions
from session.tokens import estimate_message_tokens, estimate_tokens, estimate_turn_tokens
from wire.cancel import CancelRequest
from wire.errors import UnknownModel
from wire.vocabulary import TOOL_CALLS

from .api import ApiError, EditorTarget, HttpTurnResult, ParsedRequest

__all__ = ["TurnRunner"]

PartCallback = Callable[[dict[str, Any]], Awaitable[None]]


class TurnRunner:
    """Runs the turns of every HTTP API on the bridge service; one per HTTP front."""

    def __init__(self, service: BridgeService, *, activity: str = "native", default_cwd: str | None = None) -> None:
        self.service = service
        self.questions = PermissionQuestions()
        self._activity = activity
        self._default_cwd = default_cwd or os.getcwd()

    def resolve(self, model: str, principal: Principal | None = None) -> ModelEntry:
        """The entry of a model (an agent id, or ``agent/model``) for ``principal``; ``ApiError`` 404 for one
        lmbridge does not offer it."""
        try:
            return self.service.resolve_model(model, principal)
        except UnknownModel as error:
            raise ApiError.from_error(self._unknown(model, error, principal)) from None

    def resolve_into(self, request: ParsedRequest) -> None:
        """Resolve the request's model, once: an agent's entry, or a model an editor shares (``editor/<id>``)."""
        principal = request.principal
        if request.model.startswith(EDITOR_MODELS_PREFIX + "/"):
            who = principal.id if principal is not None else None
            try:
                model, link = self.service.editor_models.resolve(request.model, who)
            except UnknownModel as error:
                raise ApiError.from_error(self._unknown(request.model, error, principal)) from None
            request.editor_model = EditorTarget(request.model, model, link)
        else:
            request.entry = self.resolve(request.model, principal)

    def _unknown(self, model: str, error: UnknownModel, principal: Principal | None) -> UnknownModel:
        """Unknown wherever it was looked for: the error lists the agents' models and the editors' alike (those
        ``principal`` may use)."""
        who = principal.id if principal is not None else None
        shared = [name for name, _model, _link in self.service.editor_models.listed(who)]
        agents = [entry.id for entry in self.service.models(principal)]
        return UnknownModel(model, agents + shared, field=error.data.get("field", "model"))

    async def run(
        self, request: ParsedRequest, on_part: PartCallback, cancel: CancelRequest, *, cwd: str | None = None
    ) -> HttpTurnResult:
        """Run the turn; ``on_part`` gets each part meant for the client (text, thinking, tool calls of its tools).
        A permission request becomes a question in words when the client did not offer the permission tool. A model
        an editor shares answers with one ``editor/chat`` instead (no session, no permission tool)."""
        if request.editor_model is not None:
            return await self._ask_editor(request, request.editor_model, on_part, cancel)
        permission = self.service.permission_tool
        offered = any(tool["name"] == permission["name"] for tool in request.tools)
        tools = request.tools if offered else [*request.tools, permission]
        messages = request.messages if offered else self.questions.restore(request.messages)
        sent: list[dict[str, Any]] = []
        calls = 0
        said = False  # text went out: a question starts on a paragraph of its own

        async def sink(part: dict[str, Any]) -> None:
            nonlocal calls, said
            if part["type"] == "tool_call" and part["name"] == permission["name"] and not offered:
                part = {"type": "text", "value": ("\n\n" if said else "") + self.questions.ask(part)}
            elif part["type"] == "tool_call":
                calls += 1
            said = said or part["type"] == "text"
            sent.append(part)
            await on_part(part)

        native = request.native_reasoning and self._activity == "native"
        entry = request.entry or self.resolve(request.model, request.principal)
        turn = self.service.turn_request(
            entry,
            messages,
            tools,
            cwd=cwd or self._default_cwd,
            view=ClientView(thinking=native, activity_as_thinking=native),
            scope=request.conversation,
            share_running=False,
            choices=self._settings(request, entry),
            principal=request.principal,
        )
        outcome = await self.service.chat(
            turn, sink, cancel, principal=request.principal, front="http", model=request.model
        )
        stop_reason = outcome.stop_reason or "end_turn"
        if stop_reason == TOOL_CALLS and not calls:
            stop_reason = "end_turn"  # only a question was asked: the client's turn to speak
        return HttpTurnResult(stop_reason, outcome.usage, outcome.error, sent)

    async def _ask_editor(
        self, request: ParsedRequest, target: EditorTarget, on_part: PartCallback, cancel: CancelRequest
    ) -> HttpTurnResult:
        _check_context(request, target)
        sent: list[dict[str, Any]] = []

        async def sink(part: dict[str, Any]) -> None:
            sent.append(part)
            await on_part(part)

        async def ask(sink: PartCallback) -> Any:
            return await self.service.editor_models.call(
                target.link,
                target.model,
                list(request.messages),  # type: ignore[arg-type]  # TypedDict messages: the call takes plain dicts
                sink,
                cancel,
                tools=request.tools or None,
                max_tokens=request.max_tokens,
            )

        if request.principal is None or not request.principal.id:
            # The local principal: an agent thinking with the editor's model (the turn that started it is the one
            # limited and recorded), or the one user of ``lmbridge stdio --http``.
            answer = await ask(sink)
        else:
            async with self.service.metered(
                request.principal, "http", EDITOR_MODELS_PREFIX, request.model, cancel
            ) as meter:
                answer = await ask(meter.sink(sink))
                meter.count(answer.usage, lambda: estimate_turn_tokens(request.messages, sent))
                meter.ended(answer.stop_reason, None)
        return HttpTurnResult(answer.stop_reason, answer.usage, None, sent)

    def _settings(self, request: ParsedRequest, entry: ModelEntry) -> tuple[tuple[str, Any], ...]:
        """The client's ``model_options``, and its reasoning effort as the agent's thought-level option when the
        agent offers that value (clients send an effort by habit: one the agent cannot take is not an error)."""
        if request.effort is None:
            return request.settings
        level = next((o for o in entry.options if o.category == "thought_level" and o.kind == "select"), None)
        chosen = dict(request.settings)
        if level is not None and request.effort in level.values and level.id not in chosen:
            chosen[level.id] = request.effort
        return tuple(chosen.items())


# ``_check_context``'s shortcut: the estimate (session.tokens) of a prompt is at most twice its body's length in
# bytes. A text's tokens are at most its characters, which JSON spells with at least as many bytes; a message's 4
# and an image's 85 are less than twice the JSON of a message or an image part; a tool is counted from its repr,
# which is at most twice its JSON and counted a token per 4 characters.
_BOUND = 2


def _check_context(request: ParsedRequest, target: EditorTarget) -> None:
    """A request over the editor model's input limit is refused as the API refuses a prompt too long (an agent
    compacts its history on that error), never cut short: ``ApiError`` 400. Estimated (the editor counts exactly)."""
    limit = target.model.max_input_tokens
    if not limit or 0 < _BOUND * request.body_bytes <= limit:
        return  # the estimate is at most 2 per byte of a body that holds the whole prompt (``_BOUND``): it fits
    used = sum(estimate_message_tokens(message) for message in request.messages)
    used += sum(estimate_tokens(str(tool)) for tool in request.tools)
    if used > limit:
        raise ApiError(
            400,
            "invalid_request_error",
            f"prompt is too long: {used} tokens > {limit} maximum (the editor's model {target.model.id!r}; estimated)",
        )
