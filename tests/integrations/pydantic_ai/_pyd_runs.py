"""Running the agent program (``_program.py``) as real processes, and the CLI on its journal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ZYGOTE = Path(__file__).with_name("_zygote.py")


@dataclass(frozen=True)
class Ran:
    code: int
    out: dict[str, Any] | None

    @property
    def killed(self) -> bool:
        return self.code == -signal.SIGKILL

    @property
    def status(self) -> str | None:
        return None if self.out is None else self.out.get("status")


class Runner:
    """One :mod:`_zygote` process: each :meth:`run` is a forked child of it (a process of its own)."""

    def __init__(self) -> None:
        env = {**os.environ}
        env.pop("CUADERNO_CRASH_AT", None)
        self.proc = subprocess.Popen([sys.executable, str(ZYGOTE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self.tmp = tempfile.mkdtemp(prefix="pyd-zygote-")
        self.n = 0

    def run(self, journal: Path | str, provider_url: str, receipts_url: str, run_id: str, prompt: str, *,
            crash_at: str | None = None, kind: str = "lookup", kill_after: float | None = None,
            program: str = "cuaderno") -> Ran:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.n += 1
        cmd = {"program": program, "args": [str(journal), provider_url, receipts_url, run_id, prompt, kind], "crash_at": crash_at,
               "kill_after": kill_after, "out": os.path.join(self.tmp, f"out{self.n}.json")}
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        ran = Ran(answer["code"], answer["out"])
        assert ran.code in (0, 3, -signal.SIGKILL), ran
        return ran

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def cli(journal: Path | str, *args: str) -> subprocess.CompletedProcess[str]:
    """``cuaderno --db JOURNAL ARGS`` as a user types it."""
    return subprocess.run([sys.executable, "-m", "cuaderno", "--db", str(journal), *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
