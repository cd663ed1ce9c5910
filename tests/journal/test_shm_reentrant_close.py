"""A writable connection may close inside a section of ``journal._shm`` that holds its lock:
the garbage collector, run by an allocation there, finalizes a collected store, and the shared
rate limit's side connection (a writer of that module) closes with it, on the same thread. Seen
as a hang of a Pydantic AI rate test (the finalizer ran in ``_clear``); it must not deadlock."""

from __future__ import annotations

import threading
from pathlib import Path

from cuaderno.journal import _shm


def test_a_writer_closed_while_the_lock_is_held_on_its_thread_does_not_deadlock(tmp_path: Path) -> None:
    path = str(tmp_path / "j.db")
    db = _shm.writable_connection(path, 1.0)
    done = threading.Event()

    def close_as_a_finalizer_would() -> None:
        with _shm._lock:  # as inside _clear or writer, when the collector runs a finalizer there
            db.close()
        done.set()

    worker = threading.Thread(target=close_as_a_finalizer_would, daemon=True)
    worker.start()
    worker.join(5)
    assert done.is_set(), "closing a writer inside _shm's lock deadlocked its thread"
    # Released once: a new writer of the file opens and nothing is left registered.
    assert _shm.key(path) not in _shm._writers
    _shm.writable_connection(path, 1.0).close()
