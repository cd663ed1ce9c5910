"""Erasing a run whose large payload was offloaded (plain, and sealed under encryption at rest):
no byte run of its stored chunks is left in any file of the journal: SQLite's db, ``-wal`` and
``-shm``; PostgreSQL's table files (events, runs, blobs, blob references and their TOAST tables)
after a CHECKPOINT, measured in a private cluster, with ``thorough`` (``VACUUM FULL``): a plain
``VACUUM`` leaves the deleted chunks' bytes in the blob table's TOAST pages until they are
reused (measured and printed, not claimed; under encryption they are sealed with the run's data
key, which the erasure destroyed). A chunk as stored is what a reader of the
files would find (compressed, and sealed when encrypted): 64 bytes of each are looked for, so
the test holds whatever compression makes of the content. The kept run's chunks stay."""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _erase_world import secret
from _pgcluster import PrivateCluster, private_cluster  # noqa: F401 - the fixture

from cuaderno import open_journal, operations
from cuaderno.events import StepEvent
from cuaderno.journal.keys import StaticKeys, master_key

ABOVE = 10_000


def _events(run_id: str) -> list[StepEvent]:
    half = os.urandom(700_000).hex()  # random hex: about 2.8 MB of JSON, three chunks
    return [StepEvent(run_id=run_id, step_id="run", phase="start", kind="run", payload={"task": "t"}),
            StepEvent(run_id=run_id, step_id="t0000.tool00", phase="result", kind="tool", name="f",
                      payload={"data": f"{half}{secret()}{half}"}),
            StepEvent(run_id=run_id, step_id="run", phase="end", kind="run", payload={"status": "completed"})]


_CHUNKS = ("SELECT b.data FROM cuaderno_blobs b JOIN cuaderno_blob_refs r ON r.digest = b.digest "
           "WHERE r.run_id = ?")


def _chunks(db: Any, run_id: str, style: str = "?") -> list[bytes]:
    rows = db.execute(_CHUNKS.replace("?", style), (run_id,)).fetchall()
    return [bytes(r[0]) for r in rows]


def _probes(chunks: list[bytes]) -> list[bytes]:
    return [c[len(c) // 2:len(c) // 2 + 64] for c in chunks]


def _found(files: list[Path], probes: list[bytes]) -> int:
    return sum(f.read_bytes().count(p) for f in files if f.is_file() for p in probes)


def _store(url: str, encrypted: bool) -> Any:
    store = open_journal(url, keys=StaticKeys(master_key(b"k" * 32)) if encrypted else None)
    store.offload_above = ABOVE
    return store


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
@pytest.mark.parametrize("thorough", [False, True])
def test_sqlite_an_erased_run_s_offloaded_chunks_leave_every_file(tmp_path: Path, encrypted: bool,
                                                                 thorough: bool) -> None:
    path = tmp_path / "j.db"
    store = _store(str(path), encrypted)
    try:
        store.append(_events("gone"))
        store.append(_events("kept"))
    finally:
        store.close()
    with closing(sqlite3.connect(path)) as db:
        gone, kept = _probes(_chunks(db, "gone")), _probes(_chunks(db, "kept"))
    files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
    assert len(gone) == 3 and _found(files, gone) >= 3  # before: in the files (the test can fail)
    store = _store(str(path), encrypted)
    try:
        assert operations.erase(store, "gone", thorough=thorough).scrubbed
        # The files as they are while the store is still open (nothing closed or folded them yet).
        left = {f.name: _found([f], gone) for f in files}
        assert left == dict.fromkeys(left, 0), left
        assert _found(files, kept) >= 3
        assert len(store.load("kept")) == 3
    finally:
        store.close()
    left = {f.name: _found([f], gone) for f in files}
    assert left == dict.fromkeys(left, 0), left


def _table_files(cluster: PrivateCluster) -> list[Path]:
    """Every file of the journal's tables (and their TOAST tables), after a CHECKPOINT."""
    out: list[Path] = []
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        for table in ("cuaderno_events", "cuaderno_runs", "cuaderno_blobs", "cuaderno_blob_refs"):
            toast = conn.execute("SELECT reltoastrelid::regclass::text FROM pg_class WHERE relname=%s",
                                 (table,)).fetchone()
            assert toast is not None
            for rel in (table, toast[0]):
                if rel == "-":  # no TOAST table
                    continue
                row = conn.execute("SELECT pg_relation_filepath(%s)", (rel,)).fetchone()
                assert row is not None
                out += [p for p in cluster.data.glob(row[0] + "*") if p.is_file()]
    return out


@pytest.mark.postgres
@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
@pytest.mark.parametrize("thorough", [False, True])
def test_postgres_an_erased_run_s_offloaded_chunks_leave_the_table_files(
        private_cluster: PrivateCluster, encrypted: bool, thorough: bool,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    store = _store(private_cluster.url, encrypted)
    try:
        store.append(_events("gone"))
        store.append(_events("kept"))
        with psycopg.connect(private_cluster.url) as conn:
            gone, kept = _probes(_chunks(conn, "gone", "%s")), _probes(_chunks(conn, "kept", "%s"))
        assert len(gone) == 3 and _found(_table_files(private_cluster), gone) >= 3  # the test can fail
        assert operations.erase(store, "gone", thorough=thorough).scrubbed
        tables = _table_files(private_cluster)
        base = [p for p in (private_cluster.data / "base").rglob("*") if p.is_file()]
        wal = [p for p in (private_cluster.data / "pg_wal").rglob("*") if p.is_file()]
        with capsys.disabled():
            print(f"\n[erase offloaded postgres encrypted={encrypted} thorough={thorough}] chunk probes after "
                  f"erase + CHECKPOINT: table files {_found(tables, gone)}, base/ {_found(base, gone)}, "
                  f"pg_wal {_found(wal, gone)} (not reached)")
        if thorough:
            assert _found(tables, gone) == 0
            assert _found(base, gone) == 0
        with psycopg.connect(private_cluster.url) as conn:
            assert _chunks(conn, "gone", "%s") == []
            assert conn.execute("SELECT count(*) FROM cuaderno_keys WHERE run_id = 'gone'").fetchone() == (0,)
        assert _found(tables, kept) >= 3
        assert len(store.load("kept")) == 3
    finally:
        store.close()
