"""What SQLite's refusals mean, for :mod:`cuaderno.journal._sqlite_file` and the store: a lock
(another connection's, retried) told apart from the file's damage, and each refusal to open named
by its cause with what to do. Kept apart from the file's life (opening, schema, transactions)
because these read only an error and a path."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from cuaderno.errors import JournalCorrupt, JournalError, JournalLocked
from cuaderno.journal._paths import file_size


def errorname(exc: BaseException) -> str:
    """SQLite's name of the error (``SQLITE_BUSY_SNAPSHOT``, ...); empty when it has none."""
    return str(getattr(exc, "sqlite_errorname", ""))


def locked(exc: sqlite3.Error) -> bool:
    """Whether SQLite failed because of another connection's lock, not because of the file."""
    return errorname(exc).startswith(("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_PROTOCOL")) or index_half_written(exc)


def index_half_written(exc: BaseException) -> bool:
    """Whether SQLite refused a read-only read because the -shm's header is damaged while another
    process has the journal open (``SQLITE_READONLY_RECOVERY``): a writer was killed between the
    two copies of that header, and rebuilding it needs a connection that may write. Transient: it
    is not the file's damage (the database file and the -wal are whole)."""
    return errorname(exc) == "SQLITE_READONLY_RECOVERY"


OPEN_RACE_S = 5.0
"""How long an open that met another process's creation of the same journal is retried."""


def open_race(exc: sqlite3.OperationalError, path: str, readonly: bool) -> bool:
    """Whether an open may have failed on another process creating the journal at that moment: a
    lock, or a file that exists but could not be opened (a missing file or folder, or a read-only
    store, fails at once)."""
    name = errorname(exc)
    if name.startswith(("SQLITE_BUSY", "SQLITE_PROTOCOL")):
        return True
    return name.startswith("SQLITE_CANTOPEN") and not readonly and file_size(path) > 0


def open_failure(path: str, exc: sqlite3.DatabaseError, busy_timeout_ms: float) -> JournalError:
    """What SQLite's refusal to open ``path`` means, named by its cause: only a file that is not
    a database, or a damaged one, is :class:`JournalCorrupt`; a lock, a permission or the disk
    is a :class:`JournalError` that says what to do (:class:`JournalLocked` for a lock). Nothing was
    changed in any case (a -shm SQLite had to rebuild aside: see :func:`_read_only`)."""
    name = errorname(exc)
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return JournalLocked(f"{path!r} is locked by another process (waited {busy_timeout_ms / 1000:g} s for it); "
                             "nothing was changed")
    if name.startswith("SQLITE_PROTOCOL"):
        return JournalLocked(f"{path!r} could not be opened: SQLite could not read its index of the -wal "
                             f"({Path(path).name}-shm) consistently ({exc}): another process may be rebuilding it, "
                             "or this one may not write the -shm to rebuild it. Nothing was changed; try again, and "
                             "if it persists while no process uses the journal, give this process write access to "
                             "its folder (or copy the journal and its -wal, without the -shm, to one)")
    if index_half_written(exc):
        return JournalLocked(f"{path!r} could not be opened read-only: a process was killed while it updated SQLite's "
                             f"index of the -wal ({Path(path).name}-shm), and the processes that still have the "
                             f"journal open have not written since (waited {busy_timeout_ms / 1000:g} s); the next "
                             "write rebuilds it, and only a connection that may write can. Nothing was changed; "
                             "try again, or open it writable")
    if name == "SQLITE_READONLY_DIRECTORY":
        return JournalError(f"{path!r} cannot be opened: its folder is not writable, and SQLite creates "
                            f"{Path(path).name}-wal and -shm beside a WAL journal even to read it; give write access "
                            "to the folder, or copy the journal to one; nothing was changed")
    if name.startswith("SQLITE_READONLY"):
        return JournalError(f"{path!r} is read-only for this process; open it read-only to read it (readonly=True; "
                            "the CLI's list and show do), or give write access; nothing was changed")
    if name.startswith("SQLITE_CANTOPEN") and not Path(path).exists():
        return JournalError(f"{path!r} does not exist: there is no journal there; nothing was created")
    if name.startswith(("SQLITE_CANTOPEN", "SQLITE_IOERR", "SQLITE_FULL", "SQLITE_NOMEM", "SQLITE_PERM",
                        "SQLITE_AUTH")):
        return JournalError(f"{path!r} cannot be opened: {exc} ({name}); nothing was changed")
    return JournalCorrupt(f"{path!r} is not a readable cuaderno journal: {exc}")
