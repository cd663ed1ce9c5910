"""SqliteCheckpointer.append_group: the shared group write (every new row in one ``executemany``,
every summary in one more, the summaries not cached read in one statement), storing what its
appends alone store.

The twin of ``test_group_append_postgres.py`` for SQLite: two journals, one written by groups, the
other by the same appends one by one, compared column for column (with every append stamped at
one time).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cuaderno import SqliteCheckpointer
from cuaderno.errors import FencedOut, RunChanged
from cuaderno.events import StepEvent
from cuaderno.journal import _append, sqlite
from cuaderno.journal._group import GroupBatch

NOW = 1_700_000_000.25


def _start(run: str) -> StepEvent:
    return StepEvent(run_id=run, step_id="run", phase="start", kind="run", payload={"task": "t"})


def _ev(run: str, step: str, phase: str = "intent", **payload: Any) -> StepEvent:
    return StepEvent(run_id=run, step_id=step, phase=phase, kind="tool", name="lookup",
                     payload={"text": "x" * 300, **payload})  # compressed (256 bytes and more)


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[list[SqliteCheckpointer]]:
    made = [SqliteCheckpointer(tmp_path / "grouped.db"), SqliteCheckpointer(tmp_path / "alone.db")]
    try:
        yield made
    finally:
        for s in made:
            s.close()


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every append stamps the same time, so that two journals can be compared column for column."""
    monkeypatch.setattr(_append, "time", SimpleNamespace(time=lambda: NOW))


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
    return events, [(*r[:4], _headless(r[4])) for r in runs]


def _headless(summary: str) -> dict[str, Any]:
    data = json.loads(summary)
    data.pop("last_hash")
    return dict(data)


def _shape(outs: list[Any]) -> list[Any]:
    return [type(o).__name__ if isinstance(o, Exception) else [(e.run_id, e.step_id, e.phase, e.seq)
                                                              for e in o] for o in outs]


def _alone(store: SqliteCheckpointer, batches: list[GroupBatch]) -> list[Any]:
    outs: list[Any] = []
    for b in batches:
        try:
            outs.append(store.append(b.events, epoch=b.epoch, expect_seq=b.expect_seq))
        except Exception as exc:
            outs.append(exc)
    return outs


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
def test_a_group_stores_what_its_appends_alone_store(stores: list[SqliteCheckpointer], frozen: None,
                                                      monkeypatch: pytest.MonkeyPatch, json_each: bool) -> None:
    """Two batches of one run, runs with and without a row yet, a holder's epoch and a
    compare-and-set: the group stores, column for column, what the same appends one by one
    store; so do the groups after it (the cached summaries: none read) and a group after
    another connection committed (every summary read again: in one statement where SQLite has
    ``json_each``, else run by run)."""
    monkeypatch.setattr(sqlite, "_JSON_EACH", json_each)
    grouped, alone = stores
    epochs = []
    for s in stores:
        for r in ("a", "b", "e"):
            s.append([_start(r)])
        epochs.append(s.acquire("b", "me"))
    assert epochs[0] == epochs[1]
    epoch = epochs[0]
    rounds = [
        [GroupBatch([_ev("b", "s0")], epoch=epoch), GroupBatch([_ev("a", "s0"), _ev("a", "s0", "result")]),
         GroupBatch([_start("d")]), GroupBatch([_ev("a", "s1")], expect_seq=3),
         GroupBatch([_start("c"), _ev("c", "s0")]), GroupBatch([_ev("d", "s0")], points=("tool.K1",)),
         GroupBatch([_ev("e", "s0")]), GroupBatch([_ev("a", "s2"), _ev("a", "s2")])],  # a key twice in a batch
        [GroupBatch([_ev(r, "s9")]) for r in ("e", "d", "c", "b", "a")],
    ]
    reads = _Reads(grouped)
    # The first group reads "b" (its summary dropped by the takeover), "c" and "d" (new runs);
    # the second none: every summary is this connection's last write.
    for batches, read in zip(rounds, (3, 0), strict=True):
        outs = grouped.append_group(batches)
        assert _shape(outs) == _shape(_alone(alone, batches))
        assert not any(isinstance(o, Exception) for o in outs)
        assert _tables(grouped) == _tables(alone)
        assert reads.count() == ({"one": 0, "several": min(read, 1)} if json_each else {"one": read, "several": 0})
    # Another connection writes a run: this store's summaries may all be stale, and are read again.
    with SqliteCheckpointer(grouped.path) as other:
        other.append([_ev("c", "s10")])
    alone.append([_ev("c", "s10")])
    batches = [GroupBatch([_ev(r, "s11")]) for r in "abcde"]
    assert _shape(grouped.append_group(batches)) == _shape(_alone(alone, batches))
    assert reads.count() == ({"one": 0, "several": 1} if json_each else {"one": 5, "several": 0})
    assert _tables(grouped) == _tables(alone)
    for r in "abcde":
        assert [e.seq for e in grouped.load(r)] == list(range(1, len(grouped.load(r)) + 1))
    assert [e.step_id for e in grouped.load("c")][-2:] == ["s10", "s11"]


def test_run_ids_of_any_text_are_read_in_one_statement(stores: list[SqliteCheckpointer], frozen: None) -> None:
    """Run ids sent to ``json_each`` as a JSON array: quotes, backslashes, brackets, accents,
    emoji; each run's summary is its own."""
    grouped, alone = stores
    runs = [" ", "a", "B", 'q"uote', "back\\slash", "[brack,et]", "null", "é", "日本", "🙂"]
    for s in stores:
        for r in runs:
            s.append([_start(r)])
    with SqliteCheckpointer(grouped.path) as other:
        other.append([_ev("é", "x")])
    alone.append([_ev("é", "x")])
    reads = _Reads(grouped)
    batches = [GroupBatch([_ev(r, "s0")]) for r in reversed(runs)]
    assert _shape(grouped.append_group(batches)) == _shape(_alone(alone, batches))
    assert reads.count() == {"one": 0, "several": 1}
    assert _tables(grouped) == _tables(alone)


def test_a_refused_batch_is_refused_alone_and_the_others_are_written(stores: list[SqliteCheckpointer],
                                                                     frozen: None) -> None:
    grouped, alone = stores
    for s in stores:
        for r in ("a", "b"):
            s.append([_start(r)])
    epoch = grouped.acquire("b", "me")
    assert alone.acquire("b", "me") == epoch
    batches = [GroupBatch([_ev("a", "s0")]), GroupBatch([_ev("b", "s0")], epoch=epoch - 1),  # a stale holder
               GroupBatch([_start("c")]), GroupBatch([_ev("b", "s1")], epoch=epoch),
               GroupBatch([_ev("a", "s1")], expect_seq=1)]  # "a" has moved on (s0, in this group)
    outs = grouped.append_group(batches)
    assert isinstance(outs[1], FencedOut) and isinstance(outs[4], RunChanged)
    assert _shape(outs) == _shape(_alone(alone, batches))
    assert _tables(grouped) == _tables(alone)
    assert [e.step_id for e in grouped.load("b")] == ["run", "s1"]
    # The rolled-back group had folded events into its runs' cached summaries: none of them is used.
    batches = [GroupBatch([_ev(r, "s2")]) for r in "abc"]
    assert _shape(grouped.append_group(batches)) == _shape(_alone(alone, batches))
    assert _tables(grouped) == _tables(alone)


def test_a_takeover_by_another_connection_fences_the_group(stores: list[SqliteCheckpointer]) -> None:
    """A run taken over by another connection since this store cached its summary: the group's
    read finds the new epoch, and the old holder's batch is refused alone."""
    grouped, _ = stores
    for r in ("a", "b", "c"):
        grouped.append([_start(r)])
    epoch = grouped.acquire("b", "me")
    grouped.append_group([GroupBatch([_ev(r, "s0")], epoch=epoch if r == "b" else None) for r in "abc"])
    with SqliteCheckpointer(grouped.path) as other:
        assert other.acquire("b", "thief", force=True) == epoch + 1
    outs = grouped.append_group([GroupBatch([_ev(r, "s1")], epoch=epoch if r == "b" else None) for r in "abc"])
    assert isinstance(outs[1], FencedOut)
    assert [len(o) for o in (outs[0], outs[2]) if isinstance(o, list)] == [1, 1]
    assert [e.step_id for e in grouped.load("b")] == ["run", "s0"]
