"""How a real agent's parallel calls of the editor's tools arrive, and how often a batch splits at an idle time.

What a ``tool_batch_idle`` joins for a model that sends a response's calls at once (docs/tools.md, "Ending a batch";
the 5 ms it suggests for such a model with Codex came from this; Codex's own 0, for models that stream their calls,
from ``make bench-agents``). A model response of three parallel
``get_weather`` calls, ``--responses`` times, through ``lmbridge stdio`` with the agent configured as the interop
suite configures it (Codex: over the stdio relay) against the fake model, which answers at once; the editor answers
each call at once. Printed:

- the gaps between consecutive ``tools/call`` messages of one response as they reached lmbridge's MCP endpoint
  (read off its ``--trace-dir`` wire traces);
- how many editor responses each turn's three calls took at ``--idle``: 1 when the batch held them together, more
  when it split (still correct, but one more round trip through the editor each).

    python -m bench.batch_gaps [--agent codex] [--responses 30] [--idle 0.005] [--window 0.05]

Run it on an idle machine and beside a load (e.g. two ``yes > /dev/null``): the split rate is what a shorter idle
time costs on a busy one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

# The interop suite's kits and installs, as bench.agents has them (it puts tests/ on sys.path).
from bench.agents import KITS, WEATHER_TOOL, Round, _lmbridge, _turn, _user, ensure_installed, write_config
from bridge.fakemodel.server import open_fake_model, parallel, say

CALLS = 3  # per model response


async def measure(agent: str, responses: int, idle: float, window: float, scratch: Path) -> dict[str, Any]:
    """The gaps (ms) between the calls of each response, and the editor responses each turn's calls took."""
    kit = KITS[agent]
    async with open_fake_model() as model:
        table, project = Round(kit, model, scratch, {}).table()
        trace = project.parent / "trace"
        config = write_config(
            project.parent / "lmbridge.toml",
            {kit.id: table},
            sessions={"tool_batch_idle": idle, "tool_batch_window": window},
        )
        model.add(say("Hello."))
        responses_per_turn: list[int] = []
        async with _lmbridge(config, project, extra=("--trace-dir", str(trace))) as (client, _pid):
            await client.initialize(workspaceFolders=[str(project)])
            history = [_user("Hello?")]
            history += await _turn(client, kit.id, history, [WEATHER_TOOL])
            for turn in range(responses):
                cities = [f"City{turn}-{index}" for index in range(CALLS)]
                model.add(parallel(*(kit.editor_tool("get_weather", {"city": c}) for c in cities)), say("Told."))
                history.append(_user("And the weather?"))
                added = await _turn(client, kit.id, history, [WEATHER_TOOL])
                responses_per_turn.append(
                    sum(1 for m in added if any(p.get("type") == "tool_call" for p in m["content"]))
                )
                history += added
        if model.errors:
            raise RuntimeError(f"the fake model saw unscripted requests: {model.errors[:3]}")
    arrivals: dict[str, list[float]] = {}
    for path in trace.glob("*-mcp_*.ndjson"):
        with path.open("rb") as handle:
            for line in handle:
                record = json.loads(line)
                message = record["msg"]
                if record["dir"] == "in" and message.get("method") == "tools/call":
                    turn_of = message["params"]["arguments"]["city"].rsplit("-", 1)[0]
                    arrivals.setdefault(turn_of, []).append(float(record["ts"]))
    gaps = sorted(
        (later - earlier) * 1000
        for times in arrivals.values()
        for earlier, later in zip(sorted(times), sorted(times)[1:], strict=False)
    )
    return {"gaps_ms": gaps, "responses_per_turn": responses_per_turn}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_gaps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", default="codex", choices=sorted(KITS))
    parser.add_argument("--responses", type=int, default=30, help="model responses of 3 parallel calls (default 30)")
    parser.add_argument("--idle", type=float, default=0.005, help="tool_batch_idle, seconds (default 0.005)")
    parser.add_argument("--window", type=float, default=0.05, help="tool_batch_window, seconds (default 0.05)")
    args = parser.parse_args(argv)
    if args.responses < 1 or not 0 <= args.idle <= args.window:
        parser.error("--responses must be positive and 0 <= --idle <= --window")
    ensure_installed([args.agent])
    with tempfile.TemporaryDirectory(prefix="lmbridge-batch-gaps-") as scratch:
        result = trio.run(measure, args.agent, args.responses, args.idle, args.window, Path(scratch))
    gaps, per_turn = result["gaps_ms"], result["responses_per_turn"]
    split = sum(1 for n in per_turn if n > 1)
    print(f"{args.agent}, tool_batch_idle {args.idle * 1000:g} ms, {args.responses} responses of {CALLS} calls")
    if gaps:
        print(
            f"  gaps between calls of one response: n={len(gaps)} median {statistics.median(gaps):.2f} ms, "
            f"p90 {gaps[int(0.9 * (len(gaps) - 1))]:.2f} ms, max {gaps[-1]:.2f} ms"
        )
    print(f"  turns whose calls took more than one editor response: {split} of {len(per_turn)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
