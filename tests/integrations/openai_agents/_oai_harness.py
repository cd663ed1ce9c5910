"""What the OpenAI Agents kill tests share: the fake provider process, running the agent in a
child process (killed or not), and reading the two truths (billing, receipts) against the journal."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from cuaderno.journal import open_journal
from cuaderno.journal._compress import stored_payload
from cuaderno.testing.ledger import read_receipts

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[2] / "src"


class ProviderProcess:
    """The fake provider (``_oai_provider.py``) as a subprocess, billing to ``billing``."""

    def __init__(self, billing: Path, delay: float = 0.0) -> None:
        self.billing = billing
        self.delay = delay
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0

    def __enter__(self) -> ProviderProcess:
        self.proc = subprocess.Popen([sys.executable, str(HERE / "_oai_provider.py"), "--billing", str(self.billing),
                                      "--delay", str(self.delay)], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("PROVIDER READY port="), line
        self.port = int(line.strip().split("=")[1])
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def bills(self) -> list[dict[str, Any]]:
        if not self.billing.exists():
            return []
        return [json.loads(line) for line in self.billing.read_text().splitlines() if line.strip()]

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            if self.proc.stdout is not None:
                self.proc.stdout.close()


def run_agent(journal: Path | str, provider: str, ledger: str, run_id: str, *flags: str, crash_at: str | None = None,
              script: Path | None = None, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run (or resume) the agent in a new process; ``crash_at`` arms a named point."""
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{HERE}", **(extra_env or {})}
    env.pop("CUADERNO_CRASH_AT", None)
    if crash_at:
        env["CUADERNO_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, str(script or HERE / "_oai_agent.py"), str(journal), provider, ledger,
                           run_id, *flags], capture_output=True, text=True, env=env, timeout=120)


def outcome(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The child's last JSON line, or how it died."""
    if proc.returncode == -9:
        return {"status": "killed"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def journal_events(journal: Path | str, run_id: str) -> list[dict[str, Any]]:
    """The run's events, read straight from the SQLite file (as stored), or through the journal
    for a PostgreSQL URL."""
    if "://" in str(journal):
        store = open_journal(str(journal), create=False)
        try:
            return [{"step_id": e.step_id, "phase": e.phase, "kind": e.kind, "payload": e.payload}
                    for e in store.load(run_id)]
        finally:
            store.close()
    con = sqlite3.connect(journal)
    try:
        rows = con.execute("SELECT step_id, phase, kind, codec, payload FROM cuaderno_events WHERE run_id=? "
                           "ORDER BY seq", (run_id,)).fetchall()
    finally:
        con.close()
    return [{"step_id": s, "phase": p, "kind": k, "payload": stored_payload(c, pl)} for s, p, k, c, pl in rows]


@dataclass
class Truth:
    """What the outside records say against the journal, for one run.

    ``duplicated``: receipts beyond the first for one effect key (a transfer made twice).
    ``rebilled_journaled``: requests the provider billed for a model step beyond its first that
    the journal does not count as a re-send of unknown fate (inference paid twice silently, e.g.
    a journaled answer asked for again): must be 0.
    ``rebilled_in_flight``: extra requests for a step whose earlier send's fate was unknown (a
    kill in flight), each counted by the journal as possibly billed twice (``counted_twice``).
    ``unkeyed``: billed requests that carried no idempotency key."""

    receipts: int = 0
    duplicated: int = 0
    billed: int = 0
    rebilled_journaled: int = 0
    rebilled_in_flight: int = 0
    counted_twice: int = 0
    unkeyed: int = 0
    effects: Counter[str] = field(default_factory=Counter)


def truth(journal: Path | str, run_id: str, ledger_db: Path, bills: list[dict[str, Any]]) -> Truth:
    t = Truth()
    events = journal_events(journal, run_id) if "://" in str(journal) or Path(journal).exists() else []
    keys = {e["payload"]["effect_key"] for e in events if e["kind"] == "tool" and e["phase"] == "intent"}
    receipts = [r for r in read_receipts(ledger_db) if r["key"] in keys]
    per_key = Counter(r["key"] for r in receipts)
    t.receipts = len(receipts)
    t.duplicated = sum(n - 1 for n in per_key.values())
    t.effects = Counter(r["effect"] for r in receipts)
    model_keys: dict[str, int] = {}  # key -> re-sends the journal counts as possibly billed twice
    for e in events:
        if e["kind"] == "model" and e["phase"].startswith("intent"):
            doubled = e["payload"].get("after") in ("crash", "ambiguous")
            model_keys[e["payload"]["key"]] = model_keys.get(e["payload"]["key"], 0) + int(doubled)
            t.counted_twice += int(doubled)
    mine = [b for b in bills if b.get("key") in model_keys]
    t.billed = len(mine)
    t.unkeyed = sum(1 for b in bills if not b.get("key") or b.get("key") != b.get("x_key"))
    for key, n in Counter(b["key"] for b in mine).items():
        counted = model_keys[key]
        t.rebilled_in_flight += min(n - 1, counted)
        t.rebilled_journaled += max(0, n - 1 - counted)  # billed again, and the journal does not say so
    return t
