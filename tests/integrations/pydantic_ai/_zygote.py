"""A process that imports the agent program once and forks one child per run: every run is a
real process of its own (its own memory, its own SQLite connection, SIGKILLed at a named point
with nothing flushed), without paying the framework's imports again for each of hundreds of kills.

Reads one JSON command per line on stdin: ``{"program": ..., "args": [...], "crash_at": ...,
"kill_after": ...}`` (``program``: ``cuaderno``, ``_program.py``, or ``dbos``, the peer
``_peer_dbos.py``; ``args``: its ``main``'s; ``crash_at``: the named point armed in the child; ``kill_after``:
seconds after which the parent SIGKILLs the child from outside, for random kills). Answers one JSON
line per command: ``{"code": exit status (-9 when killed), "out": what the run printed}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Both programs imported once, before any fork: the point of this process.
import _peer_dbos
import _program

from cuaderno import faults

PROGRAMS = {"cuaderno": _program, "dbos": _peer_dbos}


def _child(program: str, args: list[str], crash_at: str | None, out_path: str) -> None:
    faults.arm(crash_at)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            code = asyncio.run(PROGRAMS[program].main(*args))
    except BaseException as exc:  # an unexpected failure is reported, not hidden as a kill
        with open(out_path, "w") as f:
            json.dump({"error": repr(exc)}, f)
        os._exit(2)
    with open(out_path, "w") as f:
        f.write(buf.getvalue())
    os._exit(code)


def serve() -> None:
    for line in sys.stdin:
        cmd = json.loads(line)
        out_path = f"{cmd['out']}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(out_path)
        pid = os.fork()
        if pid == 0:
            _child(cmd.get("program", "cuaderno"), cmd["args"], cmd.get("crash_at"), out_path)
        deadline = None if cmd.get("kill_after") is None else time.monotonic() + float(cmd["kill_after"])
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if deadline is not None and time.monotonic() >= deadline:
                os.kill(pid, signal.SIGKILL)
                deadline = None
            time.sleep(0.002)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        out = None
        if os.path.exists(out_path):
            text = open(out_path).read().strip()
            out = json.loads(text.splitlines()[-1]) if text else None
        sys.stdout.write(json.dumps({"code": code, "out": out}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
