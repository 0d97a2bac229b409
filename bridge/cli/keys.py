"""``lmbridge keys add|list|revoke``: the keys of a shared daemon (docs/daemon.md#keys).

A running daemon takes the change in within a second: a new key works, a revoked one is refused and its running
turns end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when the command runs: every lmbridge start builds this parser (bridge.cli)
    from bridge.daemon.keys import KeysFile

__all__ = ["add_keys_parser", "run_keys"]


def add_keys_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    keys = commands.add_parser("keys", help="the keys of a shared daemon: one per person, each its own conversations")
    keys.add_argument(
        "--keys-file",
        metavar="FILE",
        help="the keys file (default: keys.json beside the token file, $XDG_STATE_HOME/lmbridge/)",
    )
    keys.add_argument("--token-file", metavar="FILE", help="the daemon's token file (the keys file goes beside it)")
    actions = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="make a key; it is printed once, only its digest is stored")
    add.add_argument("name", help="who or what it is for (letters, digits, . _ @ -)")
    add.add_argument("--expires", metavar="WHEN", help="90m, 12h, 30d, 2w from now, or a date (UTC): 2027-01-31")
    add.add_argument(
        "--scope",
        metavar="SCOPES",
        help="comma-separated, of chat, models, metrics, admin (default: chat,models)",
    )
    add.add_argument("--agents", metavar="IDS", help="comma-separated agent ids it may use (default: all)")
    add.add_argument("--json", action="store_true", help="print the key and its record as JSON")
    listing = actions.add_parser("list", help="the keys: names, scopes, created, last used, expiry (never the key)")
    listing.add_argument("--json", action="store_true")
    revoke = actions.add_parser("revoke", help="revoke a key: refused from the next request, its turns ended")
    revoke.add_argument("name")


def run_keys(args: argparse.Namespace) -> int:
    from bridge.daemon.keys import KeysFile, keys_path_for
    from bridge.daemon.security import ServeError, beside_token

    keys = KeysFile(beside_token(args.keys_file, args.token_file, keys_path_for))
    try:
        if args.keys_command == "add":
            return _add(keys, args)
        if args.keys_command == "list":
            return _list(keys, args.json)
        record = keys.revoke(args.name)
        print(f"revoked {record.name!r}: a running daemon refuses it within a second", file=sys.stderr)
        return 0
    except ServeError as exc:
        print(f"lmbridge keys: {exc}", file=sys.stderr)
        return 2


def _add(keys: KeysFile, args: argparse.Namespace) -> int:
    from bridge.daemon.keys import DEFAULT_SCOPES, parse_expiry, parse_scopes, when

    expires = parse_expiry(args.expires) if args.expires else None
    agents = parse_scopes(args.agents) if args.agents else None
    scopes = parse_scopes(args.scope or ",".join(DEFAULT_SCOPES))
    record, key = keys.add(args.name, scopes=scopes, expires=expires, agents=agents)
    if args.json:
        print(json.dumps({"key": key, **_shown(record.to_json())}))
    else:
        print(key)
        print(
            f"key {record.name!r} ({', '.join(record.scopes)}; expires {when(record.expires)}): shown once, "
            f"only its digest is kept in {keys.path}",
            file=sys.stderr,
        )
    return 0


def _list(keys: KeysFile, as_json: bool) -> int:
    from bridge.daemon.keys import when

    records = keys.load()
    used = keys.last_used()
    now = time.time()
    rows = [
        {
            **_shown(record.to_json()),
            "lastUsed": used.get(record.id),
            "expired": record.expired(now),
        }
        for record in records
    ]
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no keys in {keys.path} (the token file's holder is the owner)", file=sys.stderr)
        return 0
    print(f"{'NAME':<24} {'SCOPES':<26} {'CREATED':<17} {'LAST USED':<17} {'EXPIRES':<17} AGENTS")
    for record in records:
        expires = when(record.expires) + (" (expired)" if record.expired(now) else "")
        agents = ",".join(record.agents) if record.agents is not None else "all"
        print(
            f"{record.name:<24} {','.join(record.scopes):<26} {when(record.created):<17} "
            f"{when(used.get(record.id)):<17} {expires:<17} {agents}"
        )
    return 0


def _shown(record: dict[str, object]) -> dict[str, object]:
    """A record as ``keys`` shows it: without its digest (of no use to anyone but the daemon)."""
    return {name: value for name, value in record.items() if name != "sha256"}
