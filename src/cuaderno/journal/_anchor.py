"""The journal's high-water mark, kept outside the database file: a journal rolled back is refused.

Restoring an older copy of a journal, or deleting or truncating its hot ``-wal`` (the commits not
yet folded into the database file live only there), returns every run in it to an earlier step
without any row failing its hash chain: the journal is simply shorter. A resume would then run
again the effects whose receipts the world already holds. Nothing inside the file can tell: the
file *is* the older state. So each store that commits an event also writes, beside the journal,
``<journal>-anchor``: the rowid of the last event row it committed and that row's hash (rows are
only ever appended, so a later commit never has a smaller rowid). At open and at every ``load``
the journal must still hold that row, with that hash:

- no such row: the journal holds fewer rows than this machine saw committed (an older copy, a lost
  ``-wal``): :class:`JournalRolledBack`;
- another hash there: it is not the journal this machine wrote at this path (another copy, or an
  older one that was written to since): :class:`JournalRolledBack` too.

Cost: one ``pwrite`` of about 80 bytes after each commit, without fsync (measured with
``benchmarks/bench_journal.py``; it is not a second sync). Without fsync the anchor survives the
death of the process (the kernel has it) but may lose its last updates in a power cut; it is
written only *after* the commit it records, so it can lag the journal but never lead it, and a
lag only makes the check weaker, never a false refusal. Under ``synchronous="NORMAL"`` the
journal itself may lose its last commits in a power cut, and then the refusal is true.

What cannot be detected (the anchor is one small file, not a signature):

- the anchor deleted or restored along with the journal (a backup of the whole folder), or the
  journal moved to another path or another machine (each path has its own anchor);
- the same file opened under a second name (a hard link, or a path through another mount): that
  name has its own ``-wal`` and its own anchor, and a hot ``-wal`` under the first name is
  invisible to it;
- several processes committing at once: the anchor holds whichever of the last commits wrote
  it last (it may lag by the commits of that race);
- a rollback that only loses takeovers, releases or summary rebuilds (they write no event row),
  and a journal written meanwhile by a cuaderno that does not keep an anchor.

An anchor that cannot be read (torn by a power cut) is treated as absent and rewritten by the next
commit. To accept a rollback deliberately, open the journal with ``accept_rollback=True`` (the
anchor is moved to the journal's last row), or delete the anchor file.
"""

from __future__ import annotations

import os
import sqlite3
import zlib

from cuaderno.errors import JournalRolledBack

__all__ = ["INCARNATION_META", "Anchor", "JournalRolledBack", "check", "last_row"]

_MAGIC = b"cuaderno-anchor 1 "

INCARNATION_META = "tables_oid"
"""PostgreSQL's counterpart of the anchor: the ``cuaderno_meta`` key holding the object id of the
journal's events table as the journal recorded it. A ``pg_restore`` of a dump creates the tables
anew and brings the old record back with the rows, so the two differ (see
``PgServer._check_incarnation``)."""


def anchor_path(journal: str) -> str:
    return os.path.realpath(journal) + "-anchor"


class Anchor:
    """The anchor file of one journal path, opened on the first write and kept open."""

    def __init__(self, journal: str) -> None:
        self.path = anchor_path(journal)
        self._fd = -1

    def read(self) -> tuple[int, str] | None:
        """The last row recorded (rowid, row hash), or ``None`` (no anchor, or one that cannot be read)."""
        try:
            with open(self.path, "rb") as f:
                data = f.read(256)
        except OSError:
            return None
        return _parse(data)

    def write(self, rowid: int, row_hash: str) -> None:
        """Record the last committed row. Best effort: an anchor that cannot be written only makes
        the next check weaker (the journal already committed), so an error is not raised."""
        body = _MAGIC + f"{rowid} {row_hash} ".encode("ascii", "replace")
        record = body + f"{zlib.crc32(body):08x}\n".encode()
        try:
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            # One write at offset 0, padded to a fixed size so that a shorter record never leaves the
            # tail of a longer one behind (the CRC would catch it, but the anchor would be lost).
            os.pwrite(self._fd, record.ljust(120, b" "), 0)
        except OSError:
            self.close()

    def reset(self) -> None:
        """Forget the anchor (a journal created anew at this path)."""
        self.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1


def _parse(data: bytes) -> tuple[int, str] | None:
    data = data.rstrip(b" ")
    if not data.startswith(_MAGIC) or not data.endswith(b"\n"):
        return None
    body, _, crc = data[:-1].rpartition(b" ")
    body += b" "
    try:
        if int(crc, 16) != zlib.crc32(body):
            return None
        rowid, row_hash = body[len(_MAGIC):].decode("ascii").split()
        return int(rowid), row_hash
    except ValueError:
        return None


def last_row(db: sqlite3.Connection) -> tuple[int, str] | None:
    """The journal's last event row (rowid, row hash), or ``None`` when it holds none."""
    row = db.execute("SELECT rowid, row_hash FROM cuaderno_events ORDER BY rowid DESC LIMIT 1").fetchone()
    return None if row is None else (int(row[0]), str(row[1]))


def check(db: sqlite3.Connection | None, journal: str, mark: tuple[int, str] | None) -> None:
    """Refuse a journal that does not hold the row ``mark`` (read from the anchor *before* the read
    transaction ``db`` is in began: a commit recorded in the anchor is then in its snapshot).
    ``db`` is ``None`` for a file without an events table.

    Raises:
        JournalRolledBack: the row is missing, or holds another hash.
    """
    if mark is None:
        return
    rowid, row_hash = mark
    row = None if db is None else db.execute("SELECT row_hash, run_id, seq FROM cuaderno_events WHERE rowid=?",
                                             (rowid,)).fetchone()
    if row is not None and str(row[0]) == row_hash:
        return
    last = None if db is None else last_row(db)
    holds = last[0] if last else 0
    accept = (f"Nothing was changed. If this is deliberate, open it with accept_rollback=True (or delete "
              f"{anchor_path(journal)!r}); the runs then go on from the steps this journal holds, and effects done "
              "after them will be done again")
    if row is None:
        raise JournalRolledBack(
            f"journal {journal!r} is older than the last one this machine saw: it holds {holds:,} event rows, and "
            f"row {rowid:,} was committed here before (an older copy was restored, or its -wal was deleted or "
            f"truncated). Resuming from it would repeat effects that already happened. {accept}",
            path=journal, seen_row=rowid, holds_row=holds)
    raise JournalRolledBack(
        f"journal {journal!r} is not the one this machine last wrote at this path: its row {rowid:,} (run "
        f"{row[1]!r}, event {row[2]}) is not the row committed there (another copy, or an older one written to "
        f"since). Resuming from it could repeat effects that already happened. {accept}",
        path=journal, seen_row=rowid, holds_row=holds)
