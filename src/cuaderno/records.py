"""JSON-lines records kept by the "outside world": a fake provider's billing log (the scripted
gateway's ``billing_log``), and in tests and examples a tool's receipts or an HTTP request log.

Each line is appended and fsynced before the call returns, with the writing process's pid, so a
record survives the SIGKILL that follows it and says which process caused it. These files are
the independent evidence the crash tests and examples count from, never cuaderno's own journal.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["append_synced", "read_records"]


def append_synced(path: str | os.PathLike[str], record: Mapping[str, object]) -> None:
    """Append one JSON line (with ``pid``) and fsync it before returning."""
    line = (json.dumps({**record, "pid": os.getpid()}, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record in a file (none when it does not exist)."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
