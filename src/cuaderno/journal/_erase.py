"""Erasing a run's content while its structure and hash chain stay.

What a run's journal holds splits in two. Its *structure*: each row's header (run, step id,
phase, kind, tool name, decision, fingerprint, seq, time) and the summary's status, counters,
cost and chain head. Its *content*: each row's payload (the task, the model's messages, tool
arguments and results, answers, evidence) and the parts of the summary copied from payloads
(the outcome, pending arguments, uncertain evidence, a cancellation's record). Erasing keeps the
first and makes the second unreadable.

How the chain survives: a row written since schema 4 (SQLite) / 3 (PostgreSQL) links over its
*keyed content digest*, of its payload under a random key of its own (the row's ``salt``; keyed
BLAKE2b since schema 8, HMAC-SHA256 before, see :func:`cuaderno.events.content_digest`), not over
the payload. Erasing such a row
replaces its payload with that digest and sets its key to NULL: every link still recomputes
(nothing but the digest was ever hashed), and with the key gone a short value ("yes", a card
number) cannot be confirmed by hashing guesses against the digest.

A row of the first chain version (written before that schema) linked over its payload bytes,
which erasure removes: its hash can no longer be recomputed. So erasure first checks the run's
whole chain as it is (every row, both versions, against the summary's head), and only then
erases; such a row keeps its stored hash, which later checks take as it is: they still check
that ``seq`` has no gap, that a version-2 row after it links to it and that the summary's head
is the last row's hash (:func:`cuaderno.events.verifiable`), but no longer the row's own header
fields (for a run of only such rows, nothing between its first row and its head).

One transaction: the summary is rewritten (the outcome replaced by the erasure's record, with
who decided each approval) and every row's payload replaced, or nothing is; in a journal
encrypted at rest (:mod:`._sealing`) the run's wrapped data key is deleted in it too. A kill before the
commit leaves the run as it was; after it, the run is erased and a later ``erase`` (idempotent)
finishes what follows the commit: making the files forget the old bytes (the backend's
``_scrub``: SQLite's ``secure_delete`` and a truncating WAL checkpoint, PostgreSQL's VACUUM).

Only an ended run with no work left is erased (:class:`~cuaderno.errors.RunStillOpen`
otherwise): an open run's next step needs its content. An erased run refuses every append
(:class:`~cuaderno.errors.RunErased`, in :func:`~cuaderno.journal._append.plan_append`), and
reading an erased row's payload raises it too, so a resume, a fork or an export with content
stop with that error, while ``show`` lists the timeline with content marked erased.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from cuaderno import faults
from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import JournalCorrupt, RunNotFound, RunStillOpen, UsageError
from cuaderno.events import CODEC_ERASED, StepEvent, content_digest
from cuaderno.journal import _claims
from cuaderno.journal._append import RawRow, check_chain, is_erased
from cuaderno.journal._offload import release
from cuaderno.journal._sql_write import SqlWriter
from cuaderno.journal.base import CLOSED_STATUSES

__all__ = ["Erasure", "SqlEraser", "SupportsErase", "erased_summary"]

_MAX_REASON = 500
"""Characters of an erasure's reason (it is kept: a ticket number, a request's id)."""


@dataclass(frozen=True)
class Erasure:
    """What an :meth:`SqlEraser.erase_run` did.

    Attributes:
        run_id: the run.
        rows: rows whose content this call erased (0 when it was erased before).
        already: the run had been erased before this call (it only scrubbed the files again).
        scrubbed: whether the files were made to forget the old bytes (SQLite: the ``-wal`` was
            checkpointed and truncated; PostgreSQL: the tables were vacuumed). ``False`` when
            another connection kept that from finishing: run ``erase`` again later.
        detail: what the scrub did or why it did not finish.
    """

    run_id: str
    rows: int
    already: bool
    scrubbed: bool
    detail: str


@runtime_checkable
class SupportsErase(Protocol):
    """A journal that can erase a run's content (the SQL stores; see the module)."""

    def erase_run(self, run_id: str, *, reason: str = "", thorough: bool = False) -> Erasure: ...


def erased_summary(cp: Checkpoint, events: Sequence[StepEvent], *, reason: str, at: float) -> Checkpoint:
    """The summary of an erased run: ``cp``'s structure (status, counters, cost, chain head,
    versions, tenant), its content gone. The outcome becomes the erasure's record, which keeps
    who decided each approval (their decision stays in the rows' headers) and the run's status
    at erasure; the task's fingerprint, pending arguments, uncertain evidence and a
    cancellation's record are dropped, their step ids kept."""
    approvers: dict[str, Any] = {}
    for ev in events:
        if ev.kind == "approval" and ev.phase.startswith("decision") and not ev.erased:
            approvers[ev.step_id] = ev.payload.get("approver")
    out = Checkpoint.from_json(cp.to_json())
    out.epoch = cp.epoch
    out.outcome = {"erased": {"at": at, "reason": reason, "status": cp.status, "approvers": approvers}}
    out.task_fingerprint = None  # a plain hash of the task: it would confirm a guessed one
    out.pending = {step: {"erased": True} for step in cp.pending}
    out.uncertain = {step: {"erased": True} for step in cp.uncertain}
    if cp.cancel_requested is not None:
        out.cancel_requested = {"erased": True}
    return out


def _refuse_open(cp: Checkpoint, events: Sequence[StepEvent]) -> None:
    """Refuse a run that has not ended, or that a worker still has work in (a cancelled run's
    compensations not all journaled as done)."""
    if cp.status not in CLOSED_STATUSES:
        raise RunStillOpen(cp.run_id, cp.status)
    if _claims.cleanup_scheduled(cp):
        assert cp.outcome is not None
        scheduled = len(cp.outcome.get("cleanup") or [])
        done = {ev.step_id for ev in events if ev.step_id.startswith("cleanup") and ev.phase.startswith("result")}
        if len(done) < scheduled:
            raise RunStillOpen(cp.run_id, f"cancelled with {scheduled - len(done)} compensation(s) still to run")


def erased_row(ev: StepEvent) -> bytes:
    """What an erased row keeps in place of its payload (and fingerprint): its keyed digest
    (version 2), or nothing (version 1, whose link covered the payload itself)."""
    if ev.salt is None:
        return b""
    return content_digest(ev.salt, ev.fingerprint, ev.encoded_payload())


class SqlEraser(SqlWriter):
    """A SQL journal's writes with ``erase_run`` (see the module); the stores derive from it."""

    def _before_erase(self, db: Any) -> None:
        """Inside the erasure's transaction, before any row changes (SQLite: ``secure_delete``)."""

    def _scrub(self, thorough: bool) -> tuple[bool, str]:
        """After the commit: make the files forget the old bytes (``thorough``: by rewriting the
        whole file or tables); whether that finished, and what it did."""
        return True, "nothing to scrub"

    def erase_run(self, run_id: str, *, reason: str = "", thorough: bool = False) -> Erasure:
        """Erase the run's content (see the module); idempotent.

        Args:
            reason: kept in the erasure's record (a ticket, a request id); at most 500 characters.
            thorough: after the commit, rewrite the whole journal rather than only the pages the
                erasure changed (SQLite: ``VACUUM``, which also drops stale bytes other runs' older
                summaries left in free space; PostgreSQL: ``VACUUM FULL`` of the two tables, which
                writes them into new files and holds their exclusive lock meanwhile: every other
                writer waits).

        Raises:
            RunNotFound: no such run.
            RunStillOpen: the run has not ended, or has compensations to run; nothing was changed.
            JournalCorrupt: the run's chain does not check out as stored; nothing was changed.
            UsageError: ``reason`` is not a string of at most 500 characters.
        """
        if not isinstance(reason, str) or len(reason) > _MAX_REASON or "\x00" in reason:
            raise UsageError(f"an erasure's reason must be text of at most {_MAX_REASON} characters, without NUL")
        if not self._id_ok(run_id):
            raise RunNotFound(run_id)
        faults.point("erase.E0")  # before the transaction
        with self._reading(run_id), self._txn() as db:
            self._schema_of(db)
            head = db.execute(self._dialect.rebuild_head, (run_id,)).fetchone()  # locked where rows lock
            if head is None:
                raise RunNotFound(run_id)
            cp = self._summary_of(db, run_id, head[1])
            cp.epoch = int(head[0])
            rows: list[RawRow] = db.execute(self._dialect.run_events, (run_id,)).fetchall()
            rows.sort(key=lambda r: r[3])
            already = is_erased(cp)
            events = check_chain(run_id, rows, cp.last_hash, cp.last_seq, self._keys(db))
            todo = [ev for ev in events if not ev.erased]
            if already and todo:
                raise JournalCorrupt(f"run {run_id!r}: its summary says it was erased, yet {len(todo)} of its rows "
                                     "hold content; nothing was changed")
            if not already:
                _refuse_open(cp, events)
                self._before_erase(db)
                summary = erased_summary(cp, events, reason=reason, at=time.time())
                db.execute(self._dialect.rewrite_summary, (summary.status, summary.dumps(), run_id))
                faults.point("erase.E1")  # the summary rewritten, rows not yet
                for ev in todo:
                    db.execute(self._dialect.erase_row, (CODEC_ERASED, erased_row(ev), run_id, ev.step_id, ev.phase))
                # Its rows refer to no blob any more: a blob only it used goes; one another run
                # uses stays (for that run), and nothing of this run points to it.
                release(db, [run_id])
                faults.point("erase.E2")  # every row erased, before COMMIT
            if self._sealer is not None:
                # Encrypted: the run's data key is destroyed too (its summary is stored unsealed:
                # nothing of the content is left in it), so a copy of the journal made before the
                # erasure (a backup) no longer opens the run's rows once the master key that
                # wrapped it is rotated away.
                self._sealer.destroy(db, run_id)
            self._forget([run_id])
            self._drop_keys([run_id])
        faults.point("erase.E3")  # committed, the files not scrubbed yet
        scrubbed, detail = self._scrub(thorough)
        faults.point("erase.E4")  # scrubbed
        return Erasure(run_id, 0 if already else len(todo), already, scrubbed, detail)
