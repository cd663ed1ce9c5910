"""Which of this process's connections to a journal file may write: SQLite's index of the -wal
(the ``-shm``) is shared by them all.

SQLite maps a file's ``-shm`` once per process, for every connection to that file (its locks are
per process and file), and opens it in the mode of the *first* connection that maps it. A
connection that keeps the ``-shm`` as it is (``readonly_shm=1``, see
:func:`cuaderno.journal._sqlite_file._read_only`) maps it read-only, and every connection of the
process that maps it after that one shares the read-only mapping: a writer opened then gets
``SQLITE_READONLY`` ("attempt to write a readonly database") at its first ``BEGIN IMMEDIATE``,
for as long as it lives. That is what a worker met when its journal opened on a ``-wal`` with
commits in it (read-only until its first write) and the shared rate limiter then opened its own
connection to the file; and a read-only store a process keeps open (a page, a workflow's read of
the journal) did the same to any writer the process opened while it was open.

So the process keeps, per file, who keeps the ``-shm`` read-only and how many writers it has:

- A writer (:func:`writer`) first gets every connection that keeps the ``-shm`` out of the way:
  each is asked to step aside (its store reopens it as a plain read-only connection, which maps
  the ``-shm`` for writing, while that store's lock is free) or, when busy, is waited for, for up
  to the writer's busy timeout (then :class:`~cuaderno.errors.JournalLocked`). Only then does the
  writer connect, so the mapping its first read makes is a writable one.
- While a writer is open or opening, no new connection keeps the ``-shm`` read-only
  (:meth:`Keeper.register` says so): it would share the writer's writable mapping anyway, and keeping
  it read-only then buys nothing.

A file is named by its identity (device and inode), as SQLite names it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable

from cuaderno.errors import JournalLocked

__all__ = ["Keeper", "writable_connection", "writer"]

Key = tuple[int, int] | str

_lock = threading.RLock()
"""Orders writers and keepers. Reentrant: a connection's close may run inside a section that holds
it, when the garbage collector, run by an allocation there, finalizes a store whose side connection
(a shared rate limit's) is a writer of this module: its release takes the lock again on the same
thread (with a plain lock, a deadlock). Every section is a few dict operations, each whole."""
_writers: dict[Key, int] = {}
"""Writers open or opening, per file."""
_keepers: dict[Key, dict[int, Callable[[], bool]]] = {}
"""Connections that keep the -shm read-only, per file: each one's way to step aside (true when it did)."""


def key(path: str) -> Key:
    """The file ``path`` names (its device and inode); its real path before it exists."""
    try:
        st = os.stat(path)
    except OSError:
        return os.path.realpath(path)
    return st.st_dev, st.st_ino


class Keeper:
    """One connection that keeps a file's -shm read-only, registered while it is open."""

    def __init__(self, key: Key, step_aside: Callable[[], bool]) -> None:
        self._key = key
        self._token = id(self)
        _keepers.setdefault(key, {})[self._token] = step_aside

    @classmethod
    def register(cls, path: str, step_aside: Callable[[], bool]) -> Keeper | None:
        """Register a connection about to keep ``path``'s -shm read-only; ``None`` (do not keep it)
        while a writer of this process has the file. Registered before it connects, so that a
        writer opening meanwhile waits for it (one lock orders the two)."""
        k = key(path)
        with _lock:
            return None if _writers.get(k) else cls(k, step_aside)

    def release(self) -> None:
        """The connection is closed (or no longer keeps the -shm read-only); said more than once is
        said once."""
        with _lock:
            kept = _keepers.get(self._key)
            if kept is not None:
                kept.pop(self._token, None)
                if not kept:
                    del _keepers[self._key]


def writer(path: str, busy_timeout_s: float) -> Callable[[], None]:
    """Before a writer connects to ``path``: clear the file of connections of this process that
    keep its -shm read-only (:class:`~cuaderno.errors.JournalLocked` if one is still busy after
    ``busy_timeout_s``), and keep new ones away until the writer closes: the caller calls the
    release it gets then (or at once, if it did not connect)."""
    k = key(path)
    with _lock:
        _writers[k] = _writers.get(k, 0) + 1
    released = False

    def release() -> None:
        nonlocal released
        with _lock:
            if released:
                return
            released = True
            left = _writers.get(k, 1) - 1
            if left:
                _writers[k] = left
            else:
                _writers.pop(k, None)

    try:
        _clear(k, path, busy_timeout_s)
    except BaseException:
        release()
        raise
    return release


def _clear(k: Key, path: str, busy_timeout_s: float) -> None:
    deadline = time.monotonic() + busy_timeout_s
    pause = 0.002
    while True:
        with _lock:
            kept = list(_keepers.get(k, {}).values())
        if not kept:
            return
        for step_aside in kept:
            step_aside()  # steps aside now, or is busy reading: tried again below
        with _lock:
            if not _keepers.get(k):
                return
        if time.monotonic() >= deadline:
            raise JournalLocked(f"journal {path!r}: a read-only connection of this process kept SQLite's index of "
                                f"the journal read-only for {busy_timeout_s:g} s, and a writer opened meanwhile could "
                                "not write; nothing was written; try again")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


class _Released(sqlite3.Connection):
    """A writable connection that says to this module when it closes."""

    release: Callable[[], None] = staticmethod(lambda: None)
    """Set once connected."""

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.release()


def writable_connection(path: str, busy_timeout_s: float) -> sqlite3.Connection:
    """A connection of the caller's own that may write to the journal file ``path`` (autocommit;
    ``BEGIN IMMEDIATE`` for a transaction), opened after every connection of this process that
    kept the file's -shm read-only stepped aside. The caller closes it."""
    release = writer(path, busy_timeout_s)
    try:
        db = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False,
                             factory=_Released)
    except BaseException:
        release()
        raise
    db.release = release
    return db
