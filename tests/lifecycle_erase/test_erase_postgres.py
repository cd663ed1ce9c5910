"""Erasing a run in a PostgreSQL journal (issue 35, part 2), measured in a private cluster whose
data directory the test can read: after ``erase`` and a CHECKPOINT, the table files (the events
table, the runs table and their TOAST tables) hold no byte of the run's content. The server's WAL
(``pg_wal``) still does until its segments are recycled: counted, reported, not claimed."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from _erase_world import run_with_secret, secret
from _pgcluster import PrivateCluster, private_cluster  # noqa: F401 - the fixture

from cuaderno import RunErased
from cuaderno.journal.postgres import PostgresCheckpointer
from cuaderno.operations import erase, export_lines, shown

pytestmark = pytest.mark.postgres


def _table_files(cluster: PrivateCluster) -> list[Path]:
    """Every file of the two tables, their TOAST tables and their forks, after a CHECKPOINT."""
    out: list[Path] = []
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        for table in ("cuaderno_events", "cuaderno_runs"):
            toast = conn.execute("SELECT reltoastrelid::regclass::text FROM pg_class WHERE relname=%s",
                                 (table,)).fetchone()
            assert toast is not None
            for rel in (table, toast[0]):
                row = conn.execute("SELECT pg_relation_filepath(%s)", (rel,)).fetchone()
                assert row is not None
                out += [p for p in cluster.data.glob(row[0] + "*") if p.is_file()]
    return out


def _count(files: list[Path], needle: str) -> int:
    return sum(p.read_bytes().count(needle.encode()) for p in files if p.is_file())


@pytest.mark.parametrize("thorough", [False, True])
async def test_erased_content_leaves_the_table_files(private_cluster: PrivateCluster, thorough: bool,  # noqa: F811
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    gone, kept = secret(), secret()
    with PostgresCheckpointer(private_cluster.url) as store:
        await run_with_secret(store, "gone", gone)
        await run_with_secret(store, "kept", kept)
        before = store.load("gone")
        assert _count(_table_files(private_cluster), gone) > 0  # the test can fail
        done = erase(store, "gone", reason="ticket 9", thorough=thorough)
        assert (done.rows, done.scrubbed) == (len(before), True)
        tables = _table_files(private_cluster)
        base = [p for p in (private_cluster.data / "base").rglob("*") if p.is_file()]
        wal = [p for p in (private_cluster.data / "pg_wal").rglob("*") if p.is_file()]
        assert _count(tables, gone) == 0
        assert _count(base, gone) == 0  # every relation of every database
        assert _count(tables, kept) > 0
        with capsys.disabled():
            print(f"\n[erase postgres thorough={thorough}] occurrences after erase + CHECKPOINT: table files "
                  f"{_count(tables, gone)}, base/ {_count(base, gone)}, pg_wal {_count(wal, gone)} (not reached)")
        cp, after = shown(store, "gone")
        assert [e.row_hash for e in after] == [e.row_hash for e in before] and all(e.erased for e in after)
        assert cp.status == "completed" and cp.outcome is not None and cp.outcome["erased"]["reason"] == "ticket 9"
        with pytest.raises(RunErased):
            list(export_lines(store, "gone"))
        assert erase(store, "gone").already
