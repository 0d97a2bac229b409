"""The floor of the history benchmark: a process that reads each request line from stdin and answers it at once.

Standard library only. Its pipe is widened, and it reads as ``lmbridge stdio`` does: 1 MiB at a time while a long
message comes in, into one buffer kept from message to message (a new ``bytes`` per read costs ~1 ms more per 3 MB:
fresh memory), each line copied out of it once; with ``--parse`` it also decodes the line with ``json.loads`` (what
"parsing the request once" costs), and it answers every line with one short line. The time from writing a request to
reading that answer, for a long request and a short one, is what moving (and parsing) the bytes costs any server
written in Python — measured beside lmbridge's own figure in the same run.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys

_CHUNK = 1 << 20


def main() -> None:
    parse = "--parse" in sys.argv[1:]
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    if hasattr(fcntl, "F_SETPIPE_SZ"):
        try:
            fcntl.fcntl(stdin, fcntl.F_SETPIPE_SZ, _CHUNK)
        except OSError:
            pass
    buffer = bytearray(2 * _CHUNK)
    held = 0  # bytes of an incomplete line at the front of ``buffer``
    while True:
        if len(buffer) < held + _CHUNK:
            buffer.extend(bytes(len(buffer)))
        with memoryview(buffer) as view:
            count = os.readv(stdin, (view[held : held + _CHUNK],))
            if not count:
                return
            end, start = held + count, 0
            while (newline := buffer.find(b"\n", held, end)) >= 0:
                line = bytes(view[start:newline])
                if parse:
                    json.loads(line)
                os.write(stdout, b'{"answered":true}\n')
                start = held = newline + 1
            view[: end - start] = view[start:end]
            held = end - start


if __name__ == "__main__":
    main()
