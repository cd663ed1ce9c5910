"""Journals the retention and backup tests build by hand: closed runs of a given age, open ones,
a cancelled run with compensations left, and how to count what a journal holds per run."""

from __future__ import annotations

import sqlite3
from typing import Any

from cuaderno.events import StepEvent
from cuaderno.journal.base import Checkpointer

VERSIONS = {"schema": 1, "loop": "loop-2", "policy": "policy-7"}
DAY = 86_400.0


def start(run_id: str) -> StepEvent:
    return StepEvent(run_id=run_id, step_id="run", phase="start", kind="run", fingerprint="f",
                     payload={"task": f"task of {run_id}", "versions": VERSIONS})


def model(run_id: str, turn: int, text: str = "hello") -> StepEvent:
    return StepEvent(run_id=run_id, step_id=f"t{turn:04d}.model", phase="result", kind="model",
                     fingerprint=f"m{turn}", payload={"response": {"text": text, "usage": {"input_tokens": 3}}})


def end(run_id: str, status: str = "completed", **extra: Any) -> StepEvent:
    return StepEvent(run_id=run_id, step_id="run", phase="end", kind="run", payload={"status": status, **extra})


def closed_run(store: Checkpointer, run_id: str, status: str = "completed", turns: int = 2, text: str = "hello",
               **extra: Any) -> str:
    """A run that ended with ``status`` (``turns`` model results, one append each)."""
    store.append([start(run_id)])
    for t in range(turns):
        store.append([model(run_id, t, text)])
    store.append([end(run_id, status, **extra)])
    return run_id


def open_run(store: Checkpointer, run_id: str) -> str:
    """A run still ``running`` (nobody holds it)."""
    store.append([start(run_id), model(run_id, 0)])
    return run_id


def needs_human(store: Checkpointer, run_id: str) -> str:
    store.append([start(run_id), StepEvent(run_id=run_id, step_id="t0000.tool00", phase="uncertain", kind="tool",
                                           name="transfer", payload={"tool": "transfer", "effect_key": "ek"})])
    return run_id


def cancelled_with_cleanup(store: Checkpointer, run_id: str) -> str:
    """A cancelled run whose record schedules one compensation, none run yet."""
    store.append([start(run_id)])
    store.append([end(run_id, "cancelled", cleanup=[{"tool": "refund", "of": "t0000.tool00", "arguments": {}}])])
    return run_id


def _connect(journal: str) -> Any:
    """A plain connection to the journal's tables (a SQLite path, or a PostgreSQL URL with schema=)."""
    if journal.startswith("postgresql://"):
        from urllib.parse import parse_qs, urlsplit

        import psycopg

        parts = urlsplit(journal)
        schema = parse_qs(parts.query)["schema"][0]
        conn = psycopg.connect(parts._replace(query="").geturl(), autocommit=True)
        conn.execute(f'SET search_path TO "{schema}"')
        return conn
    return sqlite3.connect(journal, isolation_level=None)


def _param(journal: str, sql: str) -> str:
    return sql.replace("?", "%s") if journal.startswith("postgresql://") else sql


def age(journal: str, seconds: float, run_ids: list[str] | None = None) -> None:
    """Make runs look last updated ``seconds`` earlier (a test's clock: nothing sleeps)."""
    db = _connect(journal)
    try:
        if run_ids is None:
            db.execute(_param(journal, "UPDATE cuaderno_runs SET updated_at = updated_at - ?"), (seconds,))
        else:
            for r in run_ids:
                db.execute(_param(journal, "UPDATE cuaderno_runs SET updated_at = updated_at - ? WHERE run_id=?"),
                           (seconds, r))
    finally:
        db.close()


def counts(journal: str) -> tuple[dict[str, int], dict[str, int]]:
    """Per run: event rows in the journal, and ``last_seq`` in its summary (equal for a whole run)."""
    import json

    db = _connect(journal)
    try:
        # One snapshot for both reads: a worker driving a run between two autocommit reads would
        # make a whole run look half (its rows counted before a commit, its summary after it).
        db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ" if journal.startswith("postgresql://") else "BEGIN")
        rows = dict(db.execute("SELECT run_id, count(*) FROM cuaderno_events GROUP BY run_id").fetchall())
        seqs = {r: json.loads(c)["last_seq"] for r, c in db.execute("SELECT run_id, checkpoint FROM cuaderno_runs")}
        db.execute("COMMIT")
    finally:
        db.close()
    return rows, seqs


def half_runs(journal: str) -> list[str]:
    """Runs whose rows and summary disagree (a run pruned in part): rows without a summary, a summary
    without all its rows."""
    rows, seqs = counts(journal)
    return sorted(r for r in rows.keys() | seqs.keys() if rows.get(r, 0) != seqs.get(r, 0))
