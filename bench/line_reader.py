"""The floor of the history benchmark: a process that reads each request line from stdin and answers it at once.

Standard library only. Its pipe is widened and read in chunks as ``lmbridge stdio`` does for a long message; with
``--parse`` it also decodes the line with ``json.loads`` (what "parsing the request once" costs), and it answers
every line with one short line. The time from writing a request to reading that answer, for a long request and a
short one, is what moving (and parsing) the bytes costs any server written in Python — measured beside lmbridge's
own figure in the same run.
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
    pieces: list[bytes] = []
    while data := os.read(stdin, _CHUNK):
        while (end := data.find(b"\n")) >= 0:
            pieces.append(data[:end])
            line, pieces, data = b"".join(pieces), [], data[end + 1 :]
            if parse:
                json.loads(line)
            os.write(stdout, b'{"answered":true}\n')
        if data:
            pieces.append(data)


if __name__ == "__main__":
    main()
