"""Runs the extension's integration tests (``e2e/consumer``) inside a real VS Code, headless, on 127.0.0.1.

Owns the whole run and everything it starts: the toolchain (install.py), a fresh run folder (server data, the
packaged ``.vsix`` installed as a user would, an isolated lmbridge config home, a Chromium profile), VS Code's server
(code-server's copy), headless Chromium opening the workbench with the test payload (devtools.py), the test output
(the extension host's console, forwarded to the page, printed here), and the checks only the outside can make once
the tests have settled: what the user saw in the notification center, that closing the window sent lmbridge its
``shutdown``, and that no lmbridge process is left. Everything started is stopped, also on failure or Ctrl-C.

Exit status: 0 all passed; 1 a test or a check failed; 2 the run could not be set up (what to do is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from devtools import Chromium, DevToolsError, stop_process_group
from install import InstallError, Toolchain, install, say

E2E_DIR = Path(__file__).resolve().parent
EXTENSION_DIR = E2E_DIR.parent
REPO_ROOT = EXTENSION_DIR.parent.parent
CONSUMER_DIR = E2E_DIR / "consumer"
# Another vendor's language model for lmbridge to share: an extension of its own, installed beside lmbridge's.
FAKE_MODELS_VSIX = E2E_DIR / "fake-models" / "lmbridge-e2e-fake-models.vsix"
TESTS_MODULE = CONSUMER_DIR / "out" / "index.js"
EXIT_BINDING = "lmbridgeE2eExit"
TEST_PREFIX = "[e2e]"  # the tests' own lines (consumer/src/harness.ts); the rest goes to console.log in the run folder
NOTIFICATIONS_JS = """
[...document.querySelectorAll('.notifications-center .notification-list-item')].map(item => ({
    text: item.querySelector('.notification-list-item-message')?.textContent ?? item.textContent,
    buttons: [...item.querySelectorAll('.monaco-button')].map(b => b.textContent.trim()),
}))
"""


AGENT_ON_EDITOR_CONFIG = "agent-on-editor.toml"


def write_agent_on_editor(path: Path, home: Path, workspace: Path) -> None:
    """An lmbridge config with Claude Code thinking with the fake vendor's large model (``model_source``), set up as
    the interop suite runs it offline — when the interop suite has installed it (``make test`` does, before this
    run); otherwise the test that needs it says what to do."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from interop.installs import PINS
    from interop.kits import KITS

    if not PINS["claude"].executable.exists():
        say("Claude Code is not installed (.interop-cache): the agent-on-the-editor's-model test will say so")
        return
    import tomli_w

    home.mkdir(parents=True, exist_ok=True)
    table = KITS["claude"].agent_table(model_url="http://127.0.0.1:9", home=home, project=workspace, marker="e2e")
    table.update(name="Claude Code", model_source="editor:e2e-large")
    path.write_text(tomli_w.dumps({"agents": {"claude-on-editor": table}}))


class RunError(RuntimeError):
    """The run could not be set up or did not finish; the message says what happened."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_server(port: int, server: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{port}/version"
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RunError(f"VS Code's server exited with status {server.returncode} before it listened")
        try:
            with urllib.request.urlopen(url, timeout=1) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.1)  # a readiness probe of another process, not synchronisation of our own code
    raise RunError(f"VS Code's server did not answer {url} within {timeout:.0f} s")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def remote_uri(port: int, path: Path) -> str:
    return f"vscode-remote://127.0.0.1:{port}{path}"


class Run:
    def __init__(self, tools: Toolchain, lmbridge: Path, vsix: Path, root: Path) -> None:
        self.tools = tools
        self.lmbridge = lmbridge
        self.vsix = vsix
        self.root = root
        self.data = root / "server-data"
        self.extensions = root / "extensions"
        self.workspace = root / "workspace"
        self.state_file = root / "state.json"
        self.server: subprocess.Popen[bytes] | None = None
        self.chromium: Chromium | None = None
        self.session: str | None = None  # the DevTools session of the workbench page
        self.console: list[str] = []
        self.sockets_before = set(Path("/tmp").glob("vscode-ipc-*.sock"))

    def prepare(self) -> None:
        for folder in (self.extensions, self.workspace, self.root / "xdg", self.root / "trace"):
            folder.mkdir(parents=True)
        machine = self.data / "data" / "Machine"
        machine.mkdir(parents=True)
        # lmbridge.* are machine-scoped settings: in a remote window they come from the Machine file.
        (machine / "settings.json").write_text(
            json.dumps({"lmbridge.path": str(self.lmbridge), "lmbridge.traceDir": str(self.root / "trace")})
        )
        user = self.data / "data" / "User"
        user.mkdir(parents=True)
        (user / "settings.json").write_text(
            json.dumps({"workbench.startupEditor": "none", "telemetry.telemetryLevel": "off"})
        )
        write_agent_on_editor(self.root / AGENT_ON_EDITOR_CONFIG, self.root / "claude-home", self.workspace)
        for vsix in (self.vsix, FAKE_MODELS_VSIX):
            started = time.monotonic()
            result = subprocess.run(
                self._server_argv("--install-extension", str(vsix), "--force"),
                check=False,
                env=self._server_env(),
                capture_output=True,
                text=True,
                timeout=120,
            )
            if result.returncode != 0:
                raise RunError(f"installing {vsix} failed (exit {result.returncode}):\n{result.stdout}{result.stderr}")
            say(f"installed {vsix.name} in {time.monotonic() - started:.1f} s")

    def _server_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LMBRIDGE_", "VSCODE_", "npm_"))}
        env.update(
            XDG_CONFIG_HOME=str(self.root / "xdg"),  # lmbridge must not read the config of whoever runs the tests
            XDG_STATE_HOME=str(self.root / "xdg-state"),  # nor remember (sessions, agents' offers) in theirs
            LMBRIDGE_E2E_RUN=str(self.root),
            LMBRIDGE_E2E_STATE=str(self.state_file),
        )
        agent_on_editor = self.root / AGENT_ON_EDITOR_CONFIG
        if agent_on_editor.exists():
            env["LMBRIDGE_E2E_AGENT_ON_EDITOR"] = str(agent_on_editor)
        return env

    def _server_argv(self, *args: str) -> list[str]:
        """VS Code's server with this run's data and extensions folders."""
        return [
            str(self.tools.node),
            str(self.tools.server_main),
            *args,
            "--server-data-dir",
            str(self.data),
            "--extensions-dir",
            str(self.extensions),
        ]

    def start(self, timeout: float) -> dict[str, Any]:
        port = free_port()
        log = open(self.root / "server.log", "wb")  # noqa: SIM115 - kept open for the server's lifetime
        self.server = subprocess.Popen(
            self._server_argv(
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--without-connection-token",
                "--accept-server-license-terms",
                "--disable-telemetry",
                "--enable-smoke-test-driver",
                "--force-disable-user-env",
                "--disable-workspace-trust",
                "--default-folder",
                str(self.workspace),
                "--log",
                "info",
            ),
            env=self._server_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        started = time.monotonic()
        wait_for_server(port, self.server, 60)
        say(f"VS Code's server answers on 127.0.0.1:{port} after {time.monotonic() - started:.1f} s")
        self.chromium = Chromium(self.tools.chromium, self.root / "chromium-profile", self.root / "chromium.log")
        chromium = self.chromium
        target = chromium.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = chromium.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for method in ("Runtime.enable", "Page.enable"):
            chromium.call(method, session=session)
        chromium.call("Runtime.addBinding", {"name": EXIT_BINDING}, session=session)
        chromium.call(
            "Page.addScriptToEvaluateOnNewDocument",
            {
                "source": f"window.codeAutomationExit = (code, logs) => {{ {EXIT_BINDING}(JSON.stringify({{code}})); "
                "return new Promise(() => {}); };"
            },
            session=session,
        )
        payload = [
            ["extensionDevelopmentPath", remote_uri(port, CONSUMER_DIR)],
            ["extensionTestsPath", remote_uri(port, TESTS_MODULE)],
            ["skipWelcome", "true"],
        ]
        query = urllib.parse.urlencode({"payload": json.dumps(payload), "folder": str(self.workspace)})
        chromium.call("Page.navigate", {"url": f"http://127.0.0.1:{port}/?{query}"}, session=session)
        self.session = session
        event = chromium.wait_event(lambda e: e.get("method") == "Runtime.bindingCalled", timeout, self._on_event)
        result: dict[str, Any] = json.loads(event["params"]["payload"])
        say(f"the tests settled after {time.monotonic() - started:.1f} s with exit code {result.get('code')}")
        return result

    def _on_event(self, event: dict[str, Any]) -> None:
        if event.get("method") != "Runtime.consoleAPICalled":
            return
        args = event["params"].get("args", [])
        values = [str(a.get("value", a.get("description", ""))) for a in args]
        if values and values[0].startswith("%c"):
            values = values[2:]  # the extension host's prefix and its CSS
        line = " ".join(values)
        self.console.append(line)
        if line.startswith(TEST_PREFIX):
            print(f"  {line.removeprefix(TEST_PREFIX).strip()}", file=sys.stderr, flush=True)

    def evaluate(self, expression: str) -> Any:
        assert self.chromium is not None
        reply = self.chromium.call(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            session=self.session,
        )
        return reply.get("result", {}).get("value")

    def check_notifications(self, expected: list[dict[str, Any]]) -> list[str]:
        """What the user saw: each expected notification is in the notification center, whole, with its buttons."""
        shown = self.evaluate(NOTIFICATIONS_JS) or []
        say(f"{len(shown)} notification(s) in the notification center; {len(expected)} expected")
        problems = []
        for want in expected:
            found = [n for n in shown if all(piece in n["text"] for piece in want["includes"])]
            if not found:
                problems.append(f"no notification includes {want['includes']}; shown: {json.dumps(shown)}")
            elif not all(button in found[0]["buttons"] for button in want["buttons"]):
                problems.append(
                    f"notification {found[0]['text']!r} offers {found[0]['buttons']}, not {want['buttons']}"
                )
        return problems

    def check_shutdown(self, killed: list[int], timeout: float = 60.0) -> list[str]:
        """Closing the window stopped every lmbridge, each (but those the tests killed) through `shutdown`."""
        daemons: dict[int, Path] = {}
        for trace in sorted((self.root / "trace").glob("*-editor.ndjson")):
            daemons[int(trace.name.split("-")[1])] = trace
        if not daemons:
            return ["no lmbridge traced a single message: the trace setting did not reach it"]
        deadline = time.monotonic() + timeout
        left = set(daemons)
        while left and time.monotonic() < deadline:
            left = {pid for pid in left if pid_alive(pid)}
            if left:
                time.sleep(0.05)  # waiting for other processes to exit; there is nothing to be told by
        problems = [f"lmbridge pid {pid} still runs {timeout:.0f} s after the window closed" for pid in sorted(left)]
        expected = [pid for pid in daemons if pid not in killed]
        say(f"{len(daemons)} lmbridge process(es) ran, {len(left)} still running; {len(expected)} needed `shutdown`")
        for pid, trace in daemons.items():
            if pid in killed:
                continue
            if not any(json.loads(line).get("msg", {}).get("method") == "shutdown" for line in trace.open()):
                problems.append(f"lmbridge pid {pid} was never sent `shutdown` (trace {trace})")
        return problems

    def stop(self) -> None:
        """Stop Chromium and the server (each with its process group), and remove the socket the server leaves."""
        if self.chromium is not None:
            self.chromium.stop()
            self.chromium = None
        if self.server is not None:
            stop_process_group(self.server)
            self.server = None
        for socket_path in set(Path("/tmp").glob("vscode-ipc-*.sock")) - self.sockets_before:
            if not _listened_on(socket_path):  # another run's live server, started meanwhile, keeps its own
                socket_path.unlink(missing_ok=True)


def _listened_on(path: Path) -> bool:
    """Whether a process accepts connections on the unix socket at ``path``."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lmbridge", type=Path, default=REPO_ROOT / ".venv" / "bin" / "lmbridge")
    parser.add_argument("--vsix", type=Path, default=EXTENSION_DIR / "lmbridge-vscode.vsix")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for the whole test run (default 900)")
    parser.add_argument("--keep", action="store_true", help="keep the run folder (logs, traces, profile)")
    args = parser.parse_args(argv)
    for needed, hint in (
        (args.lmbridge, "run `make demo` first"),
        (args.vsix, "run `npm run package` in editors/vscode"),
        (TESTS_MODULE, "run `npm run compile:e2e` in editors/vscode"),
        (FAKE_MODELS_VSIX, "run `npm run compile:e2e` in editors/vscode"),
    ):
        if not needed.exists():
            say(f"{needed} not found: {hint}")
            return 2
    try:
        tools = install()
    except InstallError as error:
        say(f"cannot run the VS Code tests: {error}")
        return 2
    root = Path(tempfile.mkdtemp(prefix="lmbridge-vscode-e2e-"))
    run = Run(tools, args.lmbridge.resolve(), args.vsix.resolve(), root)
    failed = True
    try:
        run.prepare()
        result = run.start(args.timeout)
        problems = [] if result.get("code") == 0 else [f"the tests failed (exit code {result.get('code')})"]
        try:
            state = json.loads(run.state_file.read_text())
        except (OSError, ValueError) as error:
            raise RunError(f"the tests left no state file ({error}): they did not run to the end") from None
        problems += run.check_notifications(state["notifications"])
        problems += run.check_shutdown(state["killed"])
        for problem in problems:
            say(f"FAILED: {problem}")
        failed = bool(problems)
    except (RunError, DevToolsError) as error:
        say(f"FAILED: {error}")
    finally:
        (root / "console.log").write_text("\n".join(run.console))
        run.stop()
        if failed or args.keep:
            say(f"run folder kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    say("PASSED" if not failed else "FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
