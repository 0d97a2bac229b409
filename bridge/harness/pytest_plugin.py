"""The pytest plugin (entry point ``pytest11``, name ``lmbridge``): drive an ACP agent through a real lmbridge from
a test, the way an editor would, with the agent's ACP traffic at hand.

Owns the ``acp_agent`` fixture and the command-line options ``--acp-agent ID``, ``--acp-agent-cmd CMD`` and
``--lmbridge-config FILE`` (the agent a bare ``acp_agent()`` starts; default: the built-in demo agent)::

    def test_weather(acp_agent):
        agent = acp_agent(tools=[WEATHER])            # or acp_agent("claude"), acp_agent(command="my-agent --acp")
        reply = agent.chat('/tool get_weather {"city": "Paris"}')
        assert reply.stop_reason == "tool_calls"
        reply = agent.tool_results({"get_weather": "sunny"})
        assert reply.text == "tool get_weather returned: sunny\\n"
        assert [u["update"]["sessionUpdate"] for u in agent.updates]  # every ACP session/update so far
        agent.assert_conformant()                     # the conformance checks, as lmbridge test runs them

Plain (synchronous) tests get ``AcpAgent``, which runs its Trio loop in a thread of its own; Trio tests use
``async with acp_agent.open(...) as agent`` and await the same methods. Imports nothing heavy until a fixture is
used, so loading the plugin costs nothing to projects that do not use it.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

if TYPE_CHECKING:  # the harness modules are imported only when a fixture is used (pytest start-up time)
    from .driver import Driver

__all__ = ["AcpAgent", "AgentFactory", "AsyncAcpAgent", "Reply", "acp_agent", "fake_tool"]

T = TypeVar("T")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lmbridge", "ACP agents through lmbridge (the acp_agent fixture)")
    group.addoption(
        "--acp-agent",
        metavar="ID",
        default=None,
        help="the configured agent acp_agent() starts by default (default: the demo agent)",
    )
    group.addoption(
        "--acp-agent-cmd", metavar="CMD", default=None, help="an ACP agent command line acp_agent() starts by default"
    )
    group.addoption(
        "--lmbridge-config", metavar="FILE", default=None, help="the lmbridge agents file --acp-agent looks in"
    )


def fake_tool(
    name: str,
    result: str | None = None,
    *,
    error: str | None = None,
    results: Sequence[str] = (),
    description: str = "",
    input_schema: dict[str, Any] | None = None,
) -> Any:
    """An editor tool with canned answers for ``turn()`` (templated from the call's input: ``"sunny in {city}"``)."""
    from .scenario import ToolSpec

    return ToolSpec(
        name=name,
        description=description or f"The {name} tool",
        input_schema=input_schema or {"type": "object"},
        result=result,
        error=error,
        results=tuple(results),
    )


@dataclass
class Reply:
    """One response of the agent as the editor got it, and the ACP updates the agent sent meanwhile."""

    parts: list[dict[str, Any]]
    stop_reason: str | None
    error: dict[str, Any] | None
    updates: list[dict[str, Any]] = field(default_factory=list)  # session/update params, in order
    permission_tool: str = "acp_agent_action"

    @property
    def text(self) -> str:
        return "".join(p.get("value", "") for p in self.parts if p.get("type") == "text")

    @property
    def thinking(self) -> str:
        return "".join(p.get("value", "") for p in self.parts if p.get("type") == "thinking")

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The editor-tool calls of this response (the permission tool's excluded)."""
        return [p for p in self.parts if p.get("type") == "tool_call" and p.get("name") != self.permission_tool]

    @property
    def permissions(self) -> list[dict[str, Any]]:
        """The permission requests of this response (their inputs: title, kind, options, ...)."""
        return [
            p.get("input") or {}
            for p in self.parts
            if p.get("type") == "tool_call" and p.get("name") == self.permission_tool
        ]

    @property
    def update_kinds(self) -> list[str]:
        return [(u.get("update") or {}).get("sessionUpdate", "?") for u in self.updates if isinstance(u, dict)]


class AsyncAcpAgent:
    """An agent behind a live lmbridge (Trio). History is kept as an editor keeps it."""

    def __init__(self, driver: Driver, tools: Sequence[Any]) -> None:
        self.driver = driver
        self.tools = list(tools)
        self._last: Reply | None = None

    # -- talking ----------------------------------------------------------------------------------------------

    async def chat(
        self,
        text: str,
        *,
        tools: Sequence[Any] | None = None,
        permission_tool: bool = True,
        cancel_on_text: str | None = None,
    ) -> Reply:
        """The user says ``text``: one ``lm/chat``. Tool calls come back in the reply (answer them with
        ``tool_results``); ``cancel_on_text`` cancels the request once the streamed text contains it."""
        from .driver import user_message
        from .scenario import Cancel

        cancel = Cancel(on_text=cancel_on_text) if cancel_on_text is not None else None
        return await self._round([user_message(text)], tools, permission_tool, cancel)

    async def tool_results(
        self,
        results: dict[str, Any] | Sequence[Any] | Callable[[dict[str, Any]], Any],
        *,
        tools: Sequence[Any] | None = None,
        text: str | None = None,
    ) -> Reply:
        """Answer the tool calls (and permission requests) of the last reply, then one ``lm/chat``.

        ``results``: a dict by ``callId`` or by tool name, a list in the order of the calls, or a function of the
        call; each answer is a text, ``(text, is_error)``, or None to leave that call unanswered. Permission
        requests are answered like tools (``"allow"``, ``"reject"``, an option id). ``text``: user text to send
        along."""
        from .driver import user_message

        last = self._last
        calls = [p for p in (last.parts if last else []) if p.get("type") == "tool_call"]
        if not calls:
            raise AssertionError("the last reply has no tool call to answer")
        content = []
        for index, call in enumerate(calls):
            if callable(results):
                answer = results(call)
            elif isinstance(results, dict):
                answer = results.get(str(call.get("callId")), results.get(str(call.get("name"))))
            else:
                answer = results[index] if index < len(results) else None
            if answer is None:
                continue
            value, is_error = answer if isinstance(answer, tuple) else (answer, False)
            part: dict[str, Any] = {
                "type": "tool_result",
                "callId": call["callId"],
                "content": [{"type": "text", "value": str(value)}],
            }
            if is_error:
                part["isError"] = True
            content.append(part)
        messages = [{"role": "user", "content": content}] if content else []
        if text is not None:
            messages.append(user_message(text))
        return await self._round(messages, tools, True, None)

    async def turn(
        self,
        text: str,
        *,
        tools: Sequence[Any] | None = None,
        permissions: str = "allow",
        cancel_on_text: str | None = None,
        max_rounds: int = 10,
        reverse_results: bool = False,
    ) -> Any:
        """A whole turn: ``text``, then every tool round, answered by ``fake_tool`` tools and ``permissions``
        (allow, always, reject, never, or an option id), results in reverse order with ``reverse_results``. Returns
        the harness's ``TurnResult``."""
        from .scenario import Cancel

        cancel = Cancel(on_text=cancel_on_text) if cancel_on_text is not None else None
        result = await self.driver.turn(
            text,
            tools=list(self.tools if tools is None else tools),
            answer_permission=lambda title: permissions,
            cancel=cancel,
            max_rounds=max_rounds,
            reverse_results=reverse_results,
        )
        self._last = None
        return result

    def new_conversation(self) -> None:
        """Forget the history: the next message starts a new conversation (a new ACP session)."""
        self.driver.history = []
        self._last = None

    async def _round(
        self, messages: list[dict[str, Any]], tools: Sequence[Any] | None, permission_tool: bool, cancel: Any
    ) -> Reply:
        if tools is not None:
            self.tools = list(tools)
        result, events = await self.driver.chat_round(
            messages, tools=self.tools, permission_tool=permission_tool, cancel=cancel
        )
        reply = Reply(
            result.parts,
            result.stop_reason,
            result.error,
            [e.params for e in events if e.dir == "in" and e.method == "session/update"],
            self.driver.permission_tool["name"],
        )
        self._last = reply
        return reply

    # -- what the agent sent ------------------------------------------------------------------------------------

    @property
    def updates(self) -> list[dict[str, Any]]:
        """Every ``session/update`` (params) the agent sent so far."""
        self.driver.poll()
        return [e.params for e in self.driver.log.updates]

    @property
    def wire(self) -> Any:
        """The agent's ACP connection so far (``bridge.harness.traces.AcpLog``: requests, answers, updates)."""
        self.driver.poll()
        return self.driver.log

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.driver.history

    @property
    def stderr(self) -> str:
        """lmbridge's log (the agent's stderr lines are in it)."""
        return self.driver.stderr

    async def check(self, *names: str) -> list[Any]:
        """Run conformance checks (default: all) on the wire so far; returns ``CheckResult``s."""
        from .checks import probe_negotiation, run_checks
        from .scenario import CHECK_NAMES, parse_checks

        selected = parse_checks(names) if names else CHECK_NAMES
        await self.driver.settle()
        probe = None
        if "initialize" in selected:
            probe = await probe_negotiation(self.driver.agent, self.driver.timeouts.initialize)
        labels = {n: f"lm/chat #{n}" for n in range(1, self.driver.turn_number + 1)}
        return run_checks(selected, self.driver.log, file="acp_agent", turn_labels=labels, probe=probe)

    async def assert_conformant(self, *names: str) -> None:
        __tracebackhide__ = True
        failures = [f for result in await self.check(*names) for f in result.failures]
        if failures:
            raise AssertionError(
                "the agent is not conformant:\n"
                + "\n".join(f"- {f.what} ({f.where}): expected {f.expected}; got {f.got}" for f in failures)
            )


class AcpAgent:
    """``AsyncAcpAgent`` for plain tests: each call runs on the agent's own Trio loop, in a thread."""

    def __init__(self, loop: _LoopThread, inner: AsyncAcpAgent) -> None:
        self._loop = loop
        self.inner = inner

    def chat(self, text: str, **options: Any) -> Reply:
        return self._loop.call(lambda: self.inner.chat(text, **options))

    def tool_results(self, results: Any, **options: Any) -> Reply:
        return self._loop.call(lambda: self.inner.tool_results(results, **options))

    def turn(self, text: str, **options: Any) -> Any:
        return self._loop.call(lambda: self.inner.turn(text, **options))

    def check(self, *names: str) -> list[Any]:
        return self._loop.call(lambda: self.inner.check(*names))

    def assert_conformant(self, *names: str) -> None:
        __tracebackhide__ = True
        self._loop.call(lambda: self.inner.assert_conformant(*names))

    def new_conversation(self) -> None:
        self.inner.new_conversation()

    @property
    def updates(self) -> list[dict[str, Any]]:
        return self._loop.call_sync(lambda: self.inner.updates)

    @property
    def wire(self) -> Any:
        return self._loop.call_sync(lambda: self.inner.wire)

    @property
    def history(self) -> list[dict[str, Any]]:
        return self.inner.history

    @property
    def stderr(self) -> str:
        return self.inner.stderr

    def close(self) -> None:
        self._loop.close()


class _LoopThread:
    """A Trio loop in a thread that holds one agent open until ``close``."""

    def __init__(self, opener: Callable[[], Any]) -> None:
        self._opener = opener
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._token: Any = None
        self._stop: Any = None
        self.value: Any = None
        self._thread = threading.Thread(target=self._main, name="acp-agent", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        import trio

        async def hold() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            try:
                async with self._opener() as value:
                    self.value = value
                    self._ready.set()
                    await self._stop.wait()
            except BaseException as exc:
                if not self._ready.is_set():
                    self._error = exc
                else:
                    raise
            finally:
                self._ready.set()

        trio.run(hold)

    def call(self, make: Callable[[], Awaitable[T]]) -> T:
        import trio

        async def run() -> T:
            return await make()

        return trio.from_thread.run(run, trio_token=self._token)

    def call_sync(self, fn: Callable[[], T]) -> T:
        import trio

        return trio.from_thread.run_sync(fn, trio_token=self._token)

    def close(self) -> None:
        import trio

        if self._thread.is_alive():
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
            self._thread.join(timeout=60)


class AgentFactory:
    """What the ``acp_agent`` fixture returns: call it for an ``AcpAgent``, or ``open(...)`` for Trio tests."""

    def __init__(self, config: pytest.Config, directory: Path) -> None:
        self._config = config
        self._directory = directory
        self._count = 0
        self._open: list[AcpAgent] = []

    def _agent(self, agent: str | None, command: str | Sequence[str] | None, env: dict[str, str] | None) -> Any:
        from .driver import resolve_agent

        config_file = self._config.getoption("lmbridge_config")
        if agent is None and command is None:
            agent = self._config.getoption("acp_agent")
            command = self._config.getoption("acp_agent_cmd")
        return resolve_agent(agent, command, config_path=config_file, env=env)

    @asynccontextmanager
    async def open(
        self,
        agent: str | None = None,
        *,
        command: str | Sequence[str] | None = None,
        tools: Sequence[Any] = (),
        timeouts: Any = None,
        thinking: bool = False,
        permission_policy: str = "ask",
        env: dict[str, str] | None = None,
    ) -> AsyncIterator[AsyncAcpAgent]:
        """An agent behind a live lmbridge, for Trio tests (``async with acp_agent.open("demo") as agent``)."""
        from .driver import open_driver
        from .scenario import Timeouts

        self._count += 1
        work = self._directory / f"acp-agent-{self._count}"
        async with open_driver(
            self._agent(agent, command, env),
            work,
            timeouts=timeouts or Timeouts(),
            thinking=thinking,
            permission_policy=permission_policy,
        ) as driver:
            yield AsyncAcpAgent(driver, tools)

    def __call__(self, agent: str | None = None, **options: Any) -> AcpAgent:
        """An agent behind a live lmbridge, for plain tests; closed when the test ends."""
        loop = _LoopThread(lambda: self.open(agent, **options))
        handle = AcpAgent(loop, loop.value)
        self._open.append(handle)
        return handle

    def run_scenario(
        self,
        path: str | Path,
        agent: str | None = None,
        *,
        command: str | None = None,
        checks: Sequence[str] | None = None,
    ) -> Any:
        """Run a scenario file (as ``lmbridge test`` does) and return its ``ScenarioResult``; ``.passed``, and
        ``.all_failures`` with what was expected and what came."""
        import trio

        from .runner import RunOptions, run_scenario
        from .scenario import load_scenario, parse_checks

        if agent is None and command is None:
            agent = self._config.getoption("acp_agent")
            command = self._config.getoption("acp_agent_cmd")
        options = RunOptions(
            agent_id=agent,
            agent_cmd=command,
            config=self._config.getoption("lmbridge_config"),
            checks=parse_checks(list(checks)) if checks is not None else None,
        )
        scenario = load_scenario(path)
        return trio.run(lambda: run_scenario(scenario, options, {}))

    def close(self) -> None:
        for handle in self._open:
            handle.close()
        self._open.clear()


@pytest.fixture
def acp_agent(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A factory of agents behind a live lmbridge stdio: ``acp_agent()``, ``acp_agent("claude")``,
    ``acp_agent(command="my-agent --acp", tools=[...])``; ``acp_agent.open(...)`` in Trio tests."""
    factory = AgentFactory(request.config, tmp_path)
    yield factory
    factory.close()
