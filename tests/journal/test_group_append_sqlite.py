"""SqliteCheckpointer.append_group: the shared group write (every new row in one ``executemany``,
every summary in one more, the summaries not cached read in one statement), storing what its
appends alone store.

The twin of ``test_group_append_postgres.py`` for SQLite: two journals, one written by groups, the
other by the same appends one by one, compared column for column (with every append stamped at
one time).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _group_twins as twins
import pytest
from _group_twins import frozen  # noqa: F401 - the fixture

from cuaderno import SqliteCheckpointer
from cuaderno.errors import FencedOut
from cuaderno.journal import sqlite
from cuaderno.journal._group import GroupBatch
from cuaderno.journal.keys import StaticKeys, master_key


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[list[SqliteCheckpointer]]:
    made = [SqliteCheckpointer(tmp_path / "grouped.db"), SqliteCheckpointer(tmp_path / "alone.db")]
    with twins.all_closed(made):
        yield made


def _tables(store: SqliteCheckpointer) -> tuple[list[Any], list[Any]]:
    """The journal's rows and summary rows as stored (but for the holder's description, the rows'
    digest keys and hashes, random per row; each store's chain is checked on load)."""
    with sqlite3.connect(store.path) as db:
        events = db.execute("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, "
                            "created_at FROM cuaderno_events ORDER BY run_id, seq").fetchall()
        runs = db.execute("SELECT run_id, status, epoch, updated_at, checkpoint FROM cuaderno_runs "
                          "ORDER BY run_id").fetchall()
    db.close()
    for run_id, *_ in runs:
        store.load(run_id)  # the chain checks out
    return events, [(*r[:4], twins.headless(r[4])) for r in runs]


class _Reads:
    """The statements a store's connection runs that read summaries, by kind, in one group's
    transaction."""

    def __init__(self, store: SqliteCheckpointer) -> None:
        self.store, self.seen = store, []
        store._db.set_trace_callback(self.seen.append)

    def count(self) -> dict[str, int]:
        out = {"one": 0, "several": 0}
        # Every group in one transaction, none rolled back (then appended batch by batch).
        assert self.seen.count("BEGIN IMMEDIATE") == 1 and "ROLLBACK" not in self.seen, self.seen
        for s in self.seen:
            if s.startswith("SELECT epoch, checkpoint FROM cuaderno_runs WHERE run_id="):
                out["one"] += 1
            elif s.startswith("SELECT run_id, epoch, checkpoint FROM cuaderno_runs WHERE run_id IN"):
                out["several"] += 1
        self.seen.clear()
        return out


@pytest.mark.parametrize("json_each", [True, False], ids=["json_each", "without"])
@pytest.mark.usefixtures("frozen")
def test_a_group_stores_what_its_appends_alone_store(stores: list[SqliteCheckpointer],
                                                      monkeypatch: pytest.MonkeyPatch, json_each: bool) -> None:
    """Two batches of one run, runs with and without a row yet, a holder's epoch and a
    compare-and-set: the group stores, column for column, what the same appends one by one
    store; so do the groups after it (the cached summaries: none read) and a group after
    another connection committed (every summary read again: in one statement where SQLite has
    ``json_each``, else run by run)."""
    monkeypatch.setattr(sqlite, "_JSON_EACH", json_each)
    grouped, alone = stores
    groups = twins.rounds(stores)
    reads = _Reads(grouped)
    # The first group reads "b" (its summary dropped by the takeover), "c" and "d" (new runs);
    # the second none: every summary is this connection's last write.
    for batches, read in zip(groups, (3, 0), strict=True):
        outs = grouped.append_group(batches)
        assert twins.shape(outs) == twins.shape(twins.alone(alone, batches))
        assert not any(isinstance(o, Exception) for o in outs)
        assert _tables(grouped) == _tables(alone)
        assert reads.count() == ({"one": 0, "several": min(read, 1)} if json_each else {"one": read, "several": 0})
    # Another connection writes a run: this store's summaries may all be stale, and are read again.
    with SqliteCheckpointer(grouped.path) as other:
        other.append([twins.ev("c", "s10")])
    alone.append([twins.ev("c", "s10")])
    batches = [GroupBatch([twins.ev(r, "s11")]) for r in "abcde"]
    assert twins.shape(grouped.append_group(batches)) == twins.shape(twins.alone(alone, batches))
    assert reads.count() == ({"one": 0, "several": 1} if json_each else {"one": 5, "several": 0})
    assert _tables(grouped) == _tables(alone)
    for r in "abcde":
        assert [e.seq for e in grouped.load(r)] == list(range(1, len(grouped.load(r)) + 1))
    assert [e.step_id for e in grouped.load("c")][-2:] == ["s10", "s11"]


@pytest.mark.usefixtures("frozen")
def test_run_ids_of_any_text_are_read_in_one_statement(stores: list[SqliteCheckpointer]) -> None:
    """Run ids sent to ``json_each`` as a JSON array: quotes, backslashes, brackets, accents,
    emoji; each run's summary is its own."""
    grouped, alone = stores
    runs = [" ", "a", "B", 'q"uote', "back\\slash", "[brack,et]", "null", "é", "日本", "🙂"]
    for s in stores:
        for r in runs:
            s.append([twins.start(r)])
    with SqliteCheckpointer(grouped.path) as other:
        other.append([twins.ev("é", "x")])
    alone.append([twins.ev("é", "x")])
    reads = _Reads(grouped)
    batches = [GroupBatch([twins.ev(r, "s0")]) for r in reversed(runs)]
    assert twins.shape(grouped.append_group(batches)) == twins.shape(twins.alone(alone, batches))
    assert reads.count() == {"one": 0, "several": 1}
    assert _tables(grouped) == _tables(alone)


@pytest.mark.usefixtures("frozen")
def test_a_refused_batch_is_refused_alone_and_the_others_are_written(stores: list[SqliteCheckpointer]) -> None:
    twins.a_refused_batch_is_refused_alone(*stores, _tables)


def test_a_takeover_by_another_connection_fences_the_group(stores: list[SqliteCheckpointer]) -> None:
    """A run taken over by another connection since this store cached its summary: the group's
    read finds the new epoch, and the old holder's batch is refused alone."""
    grouped, _ = stores
    for r in ("a", "b", "c"):
        grouped.append([twins.start(r)])
    epoch = grouped.acquire("b", "me")
    grouped.append_group([GroupBatch([twins.ev(r, "s0")], epoch=epoch if r == "b" else None) for r in "abc"])
    with SqliteCheckpointer(grouped.path) as other:
        assert other.acquire("b", "thief", force=True) == epoch + 1
    outs = grouped.append_group([GroupBatch([twins.ev(r, "s1")], epoch=epoch if r == "b" else None) for r in "abc"])
    assert isinstance(outs[1], FencedOut)
    assert [len(o) for o in (outs[0], outs[2]) if isinstance(o, list)] == [1, 1]
    assert [e.step_id for e in grouped.load("b")] == ["run", "s0"]


def test_a_group_seals_and_offloads(tmp_path: Path) -> None:
    keys = StaticKeys(master_key(os.urandom(32)))
    with SqliteCheckpointer(tmp_path / "j.db", keys=keys) as grouped:
        twins.a_group_seals_and_offloads(grouped, lambda: SqliteCheckpointer(tmp_path / "j.db", keys=keys))
    with sqlite3.connect(tmp_path / "j.db") as db:
        codecs = sorted(c for (c,) in db.execute("SELECT codec FROM cuaderno_events"))
    db.close()
    assert codecs.count("json+blob+aesgcm") == 3  # sealed too: no payload rests in plaintext


def test_json_each_is_probed_on_the_first_group_read_not_on_import() -> None:
    """Importing the store opens no database (``json_each`` was probed at import before); the
    first group read of several summaries probes it once, and the answer is kept."""
    code = """if True:
        import sqlite3
        opened = []
        connect = sqlite3.connect
        sqlite3.connect = lambda *a, **k: (opened.append(a[0]), connect(*a, **k))[1]
        from cuaderno.journal import sqlite
        assert ":memory:" not in opened and sqlite._JSON_EACH is None, opened
        first = sqlite._json_each()
        assert sqlite._JSON_EACH is first and sqlite._json_each() is first
        assert opened.count(":memory:") == 1, opened
    """
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
