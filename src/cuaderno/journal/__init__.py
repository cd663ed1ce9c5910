"""Journals: the contract and its backends.

Besides the backends, what the rest of cuaderno reads of a journal lives here: opening one from a
URL (:func:`open_journal`, :func:`parse_journal_url`), what a run waits for and who may move it on
(:func:`state_of`, :func:`work_for`), the group commit a loop appends through
(:class:`GroupCommit`), the queue of submitted runs (:func:`queue_of`, for :mod:`cuaderno.flow`),
erasing a run's content (:class:`SupportsErase`), rotating the master key of a journal encrypted
at rest (:func:`rekey_journal`), a stored payload as shown to people (:func:`stored_payload`), a
run's offloaded large payloads (:func:`offloaded_payloads`) and the
decoding of payloads read in one batch (:func:`decode_small_payloads`). The modules whose names
start with ``_`` are the journal's own.
"""

from typing import TYPE_CHECKING, Any

from cuaderno.journal._anchor import JournalRolledBack
from cuaderno.journal._claims import state_of, work_for
from cuaderno.journal._compress import stored_payload
from cuaderno.journal._erase import Erasure, SupportsErase
from cuaderno.journal._group import GroupCommit, shared_group
from cuaderno.journal._offload import Offloaded, offloaded_payloads
from cuaderno.journal._open import JournalURL, open_journal, parse_journal_url
from cuaderno.journal._queue_sql import (
    Claim,
    JournalQueue,
    JournalSchedules,
    QueueEntry,
    canonical_versions,
    queue_of,
    schedules_of,
)
from cuaderno.journal._rekey import Rekeyed, rekey_journal
from cuaderno.journal._rows import decode_small_payloads
from cuaderno.journal.base import EVENT_SCHEMA_VERSION, SCHEMA_VERSION, Checkpointer, SupportsRebuild
from cuaderno.journal.memory import MemoryCheckpointer
from cuaderno.journal.sqlite import SqliteCheckpointer

if TYPE_CHECKING:
    from cuaderno.journal.postgres import PostgresCheckpointer

__all__ = ["EVENT_SCHEMA_VERSION", "SCHEMA_VERSION", "Checkpointer", "Claim", "Erasure", "GroupCommit", "JournalQueue", "JournalSchedules",
           "JournalRolledBack", "JournalURL", "MemoryCheckpointer", "Offloaded", "PostgresCheckpointer", "QueueEntry",
           "Rekeyed", "SqliteCheckpointer", "SupportsErase", "SupportsRebuild", "canonical_versions",
           "decode_small_payloads", "offloaded_payloads", "open_journal", "parse_journal_url", "queue_of", "rekey_journal",
           "schedules_of", "shared_group", "state_of", "stored_payload", "work_for"]


def __getattr__(name: str) -> Any:
    # Imported when asked for: a program that uses SQLite never imports a Postgres driver.
    if name == "PostgresCheckpointer":
        from cuaderno.journal.postgres import PostgresCheckpointer

        return PostgresCheckpointer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
