"""The runs list's page of a SQLite journal: which runs, and when each started.

``Checkpointer.list_runs`` has a limit but no offset, and a summary holds neither the task nor
the time the run started. Decoding every summary up to page 40 to show 50 of them would make the
list slower the more runs a journal holds, so the page's run ids and start times are read here
with plain SQL, on a connection of its own that SQLite opens read-only (``mode=ro``: nothing here
can write), and each run's summary is then read through the public ``checkpoint``. The start
event is read without its hash chain (that needs the whole journal, as ``load`` does): it is
shown, never decided on; the run page shows the chain-checked journal.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuaderno.errors import JournalError
from cuaderno.journal import stored_payload

__all__ = ["RunIndex", "RunStart"]


@dataclass(frozen=True, slots=True)
class RunStart:
    """What the list shows of a run beyond its summary."""

    started: float | None
    """``created_at`` of the run's start event (``None``: the journal holds none)."""
    updated: float
    """When its summary was last written (its last step)."""
    task: str | None
    """The task the run was started with, as journaled."""


class RunIndex:
    """Read-only paging over the runs of one SQLite journal, most recently updated first."""

    def __init__(self, path: str, content: Callable[[str, str, str, str, bytes], dict[str, Any]] | None = None) -> None:
        """``content``: how a start row's payload is read (the store's ``stored_content``, which
        opens a row sealed by encryption at rest); the plain decoding without it."""
        self._db = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
        self._lock = threading.Lock()
        self._content = content

    def page(self, status: str | None, offset: int, size: int, *, by_start: bool = False) -> tuple[list[str], int]:
        """The run ids of one page, and how many runs match in all. Newest first: by last update
        as ``list_runs`` orders them, or (``by_start``) by when each run started; the run id
        breaks ties, so pages never overlap."""
        with self._lock:
            total = self._db.execute("SELECT COUNT(*) FROM cuaderno_runs WHERE (? IS NULL OR status = ?)",
                                     (status, status)).fetchone()[0]
            if by_start:
                rows = self._db.execute(
                    "SELECT r.run_id FROM cuaderno_runs r LEFT JOIN cuaderno_events e ON e.run_id = r.run_id "
                    "AND e.step_id = 'run' AND e.phase = 'start' WHERE (? IS NULL OR r.status = ?) "
                    "ORDER BY e.created_at DESC, r.run_id LIMIT ? OFFSET ?", (status, status, size, offset)).fetchall()
            else:
                rows = self._db.execute(
                    "SELECT run_id FROM cuaderno_runs WHERE (? IS NULL OR status = ?) "
                    "ORDER BY updated_at DESC, run_id LIMIT ? OFFSET ?", (status, status, size, offset)).fetchall()
        return [row[0] for row in rows], int(total)

    def starts(self, run_ids: list[str]) -> dict[str, RunStart]:
        """Start time, last update and task of each run (one indexed lookup per run)."""
        out: dict[str, RunStart] = {}
        with self._lock:
            for run_id in run_ids:
                row = self._db.execute(
                    "SELECT r.updated_at, e.created_at, e.codec, e.payload, e.phase FROM cuaderno_runs r "
                    "LEFT JOIN cuaderno_events e ON e.run_id = r.run_id AND e.step_id = 'run' AND e.phase = 'start' "
                    "WHERE r.run_id = ?", (run_id,)).fetchone()
                if row is None:
                    continue
                updated, created, codec, payload, phase = row
                task: Any = None
                if payload is not None:
                    try:
                        if self._content is not None:
                            task = self._content(run_id, "run", phase, codec, payload).get("task")
                        else:
                            task = stored_payload(codec, payload).get("task")
                    except (JournalError, ValueError):  # damaged, or no key: the run page says how
                        task = None
                out[run_id] = RunStart(started=created if isinstance(created, float) else None,
                                       updated=float(updated), task=task if isinstance(task, str) else None)
        return out

    def close(self) -> None:
        with self._lock:
            self._db.close()
