"""An in-memory journal for tests. It round-trips payloads through the codec, like a real store."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import RunClosed, RunNotFound
from cuaderno.events import StepEvent
from cuaderno.journal._append import RawRow, check_chain, decode_row, plan_append, plan_rebuild
from cuaderno.journal._claims import work_for
from cuaderno.journal.base import CLOSED_STATUSES, payload_limit

__all__ = ["MemoryCheckpointer"]


class MemoryCheckpointer:
    """A :class:`~cuaderno.journal.base.Checkpointer` kept in this process's memory."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[tuple[str, str], RawRow]] = {}
        self._checkpoints: dict[str, str] = {}
        self._lock = threading.Lock()

    def append(self, events: Sequence[StepEvent], *, epoch: int | None = None,
               expect_seq: int | None = None) -> list[StepEvent]:
        if not events:
            return []
        run_id = events[0].run_id
        with self._lock:
            stored = self._checkpoints.get(run_id)
            cp = Checkpoint.loads(stored) if stored else Checkpoint(run_id=run_id)
            rows = self._rows.get(run_id, {})

            def existing(ev: StepEvent) -> StepEvent | None:
                row = rows.get((ev.step_id, ev.phase))
                return None if row is None else decode_row(row)

            new, out = plan_append(cp, events, existing, epoch, expect_seq, payload_limit(self))
            if new:
                rows = self._rows.setdefault(run_id, {})
                for ev, payload in new:
                    rows[(ev.step_id, ev.phase)] = (ev.run_id, ev.step_id, ev.phase, ev.seq, ev.kind, ev.name,
                                                    ev.decision, ev.fingerprint, ev.codec, payload,
                                                    ev.created_at, ev.row_hash, ev.salt)
                # Re-insert so that dict order is update order: list_runs() is newest first.
                self._checkpoints.pop(run_id, None)
                self._checkpoints[run_id] = cp.dumps()
            return out

    def load(self, run_id: str) -> list[StepEvent]:
        with self._lock:
            stored = self._checkpoints.get(run_id)
            if stored is None:
                raise RunNotFound(run_id)
            rows = sorted(self._rows.get(run_id, {}).values(), key=lambda r: r[3])
            head = Checkpoint.loads(stored)
        return check_chain(run_id, rows, head.last_hash, head.last_seq)

    def rebuild_checkpoint(self, run_id: str, *, trust_journal: bool = False) -> tuple[Checkpoint, list[str]]:
        """Rebuild the run's stored summary from its journal (see
        :meth:`cuaderno.journal.sqlite.SqliteCheckpointer.rebuild_checkpoint`)."""
        with self._lock:
            text = self._checkpoints.get(run_id)
            if text is None:
                raise RunNotFound(run_id)
            rows = sorted(self._rows.get(run_id, {}).values(), key=lambda r: r[3])
            cp, differ = plan_rebuild(run_id, rows, text, None, trust_journal)
            if differ:
                self._checkpoints[run_id] = cp.dumps()
        return cp, differ

    def checkpoint(self, run_id: str) -> Checkpoint | None:
        with self._lock:
            stored = self._checkpoints.get(run_id)
        return Checkpoint.loads(stored) if stored else None

    def list_runs(self, *, status: str | None = None, limit: int = 100) -> list[Checkpoint]:
        with self._lock:
            cps = [Checkpoint.loads(s) for s in self._checkpoints.values()]
        cps = [c for c in cps if status is None or c.status == status]
        return cps[::-1][:max(int(limit), 0)]

    def acquire(self, run_id: str, owner: str, *, force: bool = False, open_only: bool = False) -> int:
        # One process holds this store, so every takeover comes from the process that holds it.
        with self._lock:
            stored = self._checkpoints.get(run_id)
            if stored is None:
                raise RunNotFound(run_id)
            cp = Checkpoint.loads(stored)
            if open_only and cp.status in CLOSED_STATUSES:
                raise RunClosed(run_id, cp.status)
            cp.epoch += 1
            self._checkpoints[run_id] = cp.dumps()
            return cp.epoch

    def release(self, run_id: str, epoch: int) -> None:
        pass  # nobody else can be waiting: see acquire

    def close(self) -> None:
        pass

    # -- SupportsClaims (what a worker polls) ----------------------------------------------------

    def open_runs(self, *, limit: int = 1000) -> list[Checkpoint]:
        """Runs a worker may have to move on, least recently updated first (see
        :class:`~cuaderno.journal.base.SupportsClaims`)."""
        with self._lock:
            cps = [Checkpoint.loads(s) for s in self._checkpoints.values()]  # dict order: update order
        wanted = [c for c in cps if work_for(c) is not None]
        return wanted[:max(int(limit), 0)]

    def holders(self, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Nobody else: one process holds a memory journal, and its loops hold runs among
        themselves (:mod:`cuaderno.loop.holds`), not in the journal."""
        return {}

