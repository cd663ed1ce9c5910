"""What every backend that stores rows needs besides the append algorithm (:mod:`._append`):
checking the values it reads back from its own columns, and the duplicate-key redo.

They lived privately in ``journal/sqlite.py``; a second backend (PostgreSQL) needs the same ones,
so they are here, next to the algorithm, and the backends import them.
"""

from __future__ import annotations

from collections.abc import Sequence

from cuaderno.errors import JournalCorrupt
from cuaderno.events import StepEvent

__all__ = ["Duplicate", "checked_epoch", "decode_small_payloads", "no_existing", "schema_version", "storable"]


class Duplicate(Exception):
    """An optimistic insert met a stored key: redo the append with lookups."""


def storable(run_id: object) -> bool:
    """Whether ``run_id`` (a run id, a step id, a status) could ever have been stored: text
    without NUL that encodes as UTF-8. Appends refuse every other id (see
    :func:`~cuaderno.journal.base.validate_event`), so a read or a takeover of one answers "not
    found" at once, the same in every backend, without sending it to the database: PostgreSQL
    refuses a NUL in text with an error, and a lone surrogate cannot be encoded for either."""
    if not isinstance(run_id, str) or "\x00" in run_id:
        return False
    try:
        run_id.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def no_existing(ev: StepEvent) -> StepEvent | None:
    """The ``existing`` lookup of an optimistic append: nothing is looked up (see :class:`Duplicate`)."""
    return None


def schema_version(value: object) -> int:
    """A recorded schema version: a whole number from 1 (a file records one only once its
    tables exist; 0 or less would send the migration to the wrong step)."""
    try:
        version = int(str(value))
    except ValueError:
        raise JournalCorrupt(f"the journal's schema version {value!r:.40} is not a number") from None
    if version < 1:
        raise JournalCorrupt(f"the journal's schema version {version} is not one any cuaderno writes; nothing was "
                             "changed")
    return version


def checked_epoch(run_id: str, value: object) -> int:
    """A run's epoch column, checked: every write folds it into the summary, and a reader refuses a
    summary whose epoch is not a count, so a damaged one must stop here, before anything is written.

    Raises:
        JournalCorrupt: not a non-negative integer.
    """
    if type(value) is not int or value < 0:
        raise JournalCorrupt(f"run {run_id!r}: its epoch is {value!r:.40}, not a count; the run's fencing record is "
                             "damaged, nothing was written")
    return value


def decode_small_payloads(events: Sequence[StepEvent]) -> None:
    """Decode the payloads of a loaded journal's small events now, so that damage shows at load,
    not later (model responses and tool results, the large ones, decode on first use)."""
    for ev in events:
        if ev.kind != "model" and ev.kind != "tool" and not ev.erased:
            ev.payload  # noqa: B018
