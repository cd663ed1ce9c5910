"""What the journal tests share to prove "refused, and the file left exactly as it was"."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from cuaderno.journal import SqliteCheckpointer


def journal_files(path: Path, sidecars: tuple[str, ...] = ("-wal", "-shm", "-journal")) -> dict[str, str]:
    """Hashes of the journal file and of any of its ``sidecars`` present. While a store has the
    file open, its -shm (SQLite's shared index of the -wal) changes with every read: leave it out."""
    out = {}
    for candidate in (path, *(path.with_name(path.name + s) for s in sidecars)):
        if candidate.exists():
            out[candidate.name] = hashlib.sha256(candidate.read_bytes()).hexdigest()
    return out


def load_refused(path: Path, error: type[Exception], match: str, run_id: str = "r") -> None:
    """Loading ``run_id`` raises ``error`` (matching ``match``) and leaves every file byte-identical."""
    before = journal_files(path)
    with SqliteCheckpointer(path) as store, pytest.raises(error, match=match):
        store.load(run_id)
    assert journal_files(path) == before
