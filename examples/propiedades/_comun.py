"""Shared plumbing for the property examples: run a pass in a child process, count what happened.

Every count printed by an example comes from a record cuaderno did not write: the fake model
provider's billing log (one line per billed generation, with the pid that paid it) and the tools'
own receipt files or the ledger service's receipts. The journal is only cuaderno's word; these
are the world's.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from cuaderno.testing.records import append_synced as append_receipt
from cuaderno.testing.records import read_records as read_lines

__all__ = ["KEEP_ENV", "append_receipt", "check", "cuaderno_cli", "died", "entry", "journal_note", "journal_url",
           "per_pid", "pid_of", "read_lines", "run_pass", "example_dir"]

HERE = Path(__file__).resolve().parent

KEEP_ENV = "CUADERNO_KEEP"
"""``CUADERNO_KEEP=DIR python examples/propiedades/NN_x.py`` keeps the example's journal under DIR."""


@contextmanager
def example_dir(prefix: str) -> Iterator[Path]:
    """The directory an example writes its journal (``runs.db``) and the world's records to.

    A temporary directory deleted at exit, unless ``CUADERNO_KEEP=DIR`` is set: then a new
    directory under DIR, kept, so the ``cuaderno`` command line can look at the runs. A new one on
    every run, never a fixed path: the next run of the example would resume the kept runs and
    count nothing.
    """
    keep = os.environ.get(KEEP_ENV)
    if not keep:
        with tempfile.TemporaryDirectory(prefix=prefix) as d:
            yield Path(d)
        return
    root = Path(keep).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    yield Path(tempfile.mkdtemp(prefix=prefix, dir=root))


def journal_url(work: Path) -> str:
    """The URL of the example's journal: what the library (``open_journal``) and the command line
    (``--db``) both take, so the two processes name one journal the same way."""
    return f"sqlite:///{(work / 'runs.db').resolve()}"


def cuaderno_cli(work: Path, *args: str) -> str | None:
    """The exact ``cuaderno`` command on the example's journal, or None when it is not kept."""
    if not os.environ.get(KEEP_ENV):
        return None
    return shlex.join(["cuaderno", "--db", str(work / "runs.db"), *args])


def journal_note(work: Path, *args: str) -> str:
    """One line saying how to look at the journal: the exact command when it is kept, else how to keep it."""
    command = cuaderno_cli(work, *args)
    if command is not None:
        return f"journal kept; look at it with: {command}"
    script = Path(sys.argv[0]).resolve()
    try:
        shown = str(script.relative_to(Path.cwd()))
    except ValueError:
        shown = str(script)
    return (f"(the journal is deleted at exit; to run `cuaderno {shlex.join(args)}` on it, keep it: "
            f"{KEEP_ENV}=/tmp/cuaderno python {shlex.quote(shown)} prints the exact command)")


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
