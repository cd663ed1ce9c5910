"""Shared plumbing for the property examples: run a pass in a child process, count what happened.

Every count printed by an example comes from a record cuaderno did not write: the fake model
provider's billing log (one line per billed generation, with the pid that paid it) and the tools'
own receipt files or the ledger service's receipts. The journal is only cuaderno's word; these
are the world's.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn

from cuaderno.testing.records import append_synced as append_receipt
from cuaderno.testing.records import read_records as read_lines

__all__ = ["append_receipt", "check", "died", "entry", "per_pid", "pid_of", "read_lines", "run_pass"]

HERE = Path(__file__).resolve().parent


def entry(main: Callable[[], int], child: Callable[..., Awaitable[None]]) -> NoReturn:
    """``script`` runs ``main()``; ``script --child WORKDIR ARGS...`` runs one pass of it (a child)."""
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        asyncio.run(child(Path(sys.argv[2]), *sys.argv[3:]))
        raise SystemExit(0)
    raise SystemExit(main())


def run_pass(script: str, workdir: Path, *args: str, crash_at: str | None = None,
             extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``script --child WORKDIR ARGS`` in a new process; arm one crash point if asked."""
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    if crash_at:
        env["CUADERNO_CRASH_AT"] = crash_at
    env.update(extra_env or {})
    return subprocess.run([sys.executable, script, "--child", str(workdir), *args], env=env, text=True,
                          capture_output=True, timeout=120)


def per_pid(records: list[dict[str, Any]]) -> Counter[int]:
    """How many records each process wrote."""
    return Counter(int(r["pid"]) for r in records)


def pid_of(proc: subprocess.CompletedProcess[str]) -> int:
    """The child's pid, which every child prints first as ``pid=N``."""
    for line in proc.stdout.splitlines():
        if line.startswith("pid="):
            return int(line.split("=", 1)[1])
    raise RuntimeError(f"child printed no pid; stderr:\n{proc.stderr}")


def died(proc: subprocess.CompletedProcess[str]) -> str:
    """How a pass ended, in words."""
    if proc.returncode == -9:
        return "killed (SIGKILL)"
    return f"exit {proc.returncode}"


def check(condition: bool, message: str) -> None:
    """Fail the example (exit 1) when what it printed is not what the property promises."""
    if not condition:
        print(f"FAILED: {message}", file=sys.stderr)
        raise SystemExit(1)
