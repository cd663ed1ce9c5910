"""PostgresCheckpointer.append_group: a group in a few statements, storing what its appends alone store.

Runs against the machine's PostgreSQL (see ``_pg``), each test in schemas of its own.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import _group_twins as twins
import psycopg
import pytest
from _group_twins import frozen  # noqa: F401 - the fixture
from _pg import PG_URL, new_schema, pg_schemas  # noqa: F401 - the fixture
from psycopg import pq, sql

from cuaderno.journal._group import GroupBatch
from cuaderno.journal.keys import StaticKeys, master_key
from cuaderno.journal.postgres import _NEW_RUN_LOCK, PostgresCheckpointer, _int4

pytestmark = pytest.mark.postgres

@pytest.fixture
def stores(pg_schemas: list[str]) -> Iterator[list[PostgresCheckpointer]]:  # noqa: F811
    """Two journals of one database; the second store is opened with one connection (see _Trace)."""
    made: list[PostgresCheckpointer] = []
    for size in (8, 1):
        pg_schemas.append(new_schema())
        made.append(PostgresCheckpointer(PG_URL, schema=pg_schemas[-1], pool_size=size))
    with twins.all_closed(made):
        yield made


def _tables(store: PostgresCheckpointer) -> tuple[list[Any], list[Any]]:
    """The journal's rows and summary rows as stored (every column but the holder's description, the
    rows' digest keys and hashes: each row's key is random, so two journals of the same events
    chain to other hashes; each store's chain is checked on load)."""
    assert store.schema is not None
    with psycopg.connect(PG_URL) as conn:
        events = conn.execute(sql.SQL("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, "
                                      "payload, created_at FROM {}.cuaderno_events ORDER BY run_id, seq")
                              .format(sql.Identifier(store.schema))).fetchall()
        runs = conn.execute(sql.SQL("SELECT run_id, status, epoch, updated_at, checkpoint FROM {}.cuaderno_runs "
                                    "ORDER BY run_id").format(sql.Identifier(store.schema))).fetchall()
    for run_id, *_ in runs:
        store.load(run_id)  # the chain checks out
    return events, [(*r[:4], twins.headless(r[4])) for r in runs]


def _writers(store: PostgresCheckpointer, after: dict[str, int]) -> set[str]:
    """The transactions (xmin) that wrote the rows of each run of ``after`` past its seq there."""
    assert store.schema is not None
    with psycopg.connect(PG_URL) as conn:
        rows = conn.execute(sql.SQL("SELECT DISTINCT e.xmin::text FROM {}.cuaderno_events e JOIN unnest(%s::text[], "
                                    "%s::bigint[]) AS a(run_id, seq) ON e.run_id = a.run_id AND e.seq > a.seq")
                            .format(sql.Identifier(store.schema)), (list(after), list(after.values()))).fetchall()
    return {r[0] for r in rows}


@pytest.mark.usefixtures("frozen")
def test_a_group_stores_what_its_appends_alone_store(stores: list[PostgresCheckpointer]) -> None:
    """Two batches of one run (existing, and new), runs with and without a row yet, a holder's
    epoch and a compare-and-set: the group stores, column for column, what the same appends
    made one by one store, in one transaction; and so do the groups after it (the cached
    summaries) and a group after another store changed a run (the summaries read again)."""
    grouped, alone = stores
    for batches in twins.rounds(stores):
        seqs = {r: (grouped.checkpoint(r) or SimpleNamespace(last_seq=0)).last_seq for r in "abcde"}
        outs = grouped.append_group(batches)
        assert twins.shape(outs) == twins.shape(twins.alone(alone, batches))
        assert not any(isinstance(o, Exception) for o in outs)
        assert len(_writers(grouped, seqs)) == 1  # every row of the group, by one transaction
        assert _tables(grouped) == _tables(alone)
    # Another store (another worker) writes a run: this store's summary of it is stale, and read again.
    with PostgresCheckpointer(PG_URL, schema=grouped.schema) as other:
        other.append([twins.ev("c", "s10")])
    alone.append([twins.ev("c", "s10")])
    batches = [GroupBatch([twins.ev(r, "s11")]) for r in "abcde"]
    assert twins.shape(grouped.append_group(batches)) == twins.shape(twins.alone(alone, batches))
    assert _tables(grouped) == _tables(alone)
    for r in "abcde":
        assert [e.seq for e in grouped.load(r)] == list(range(1, len(grouped.load(r)) + 1))


@pytest.mark.parametrize("fresh", [False, True], ids=["existing", "new"])
@pytest.mark.usefixtures("frozen")
def test_run_ids_and_summaries_of_any_text(stores: list[PostgresCheckpointer], fresh: bool) -> None:
    """Run ids sent as arrays, sorted by code point whatever the database's collation: quotes,
    backslashes, braces, commas, spaces, accents, emoji; and summaries whose
    JSON holds every character an array's text form would escape."""
    grouped, alone = stores
    runs = [" ", "a", "B", 'q"uote', "back\\slash", "{brace,comma}", "NULL", "é", "éz", "日本", "🙂"]
    if not fresh:
        for s in stores:
            for r in runs:
                s.append([twins.start(r)])
    batches = [GroupBatch([twins.ev(r, "s0", note='"{,}\\ NULL é 🙂')]) for r in reversed(runs)]
    batches += [GroupBatch([twins.start(r)]) for r in ("zz", "0")] if not fresh else []
    outs = grouped.append_group(batches)
    assert not any(isinstance(o, Exception) for o in outs), outs
    assert len(_writers(grouped, {**dict.fromkeys(runs, 0 if fresh else 1), "zz": 0, "0": 0})) == 1
    assert twins.shape(outs) == twins.shape(twins.alone(alone, batches))
    assert _tables(grouped) == _tables(alone)
    batches = [GroupBatch([twins.ev(r, "s1")]) for r in runs]
    # the cached summaries
    assert twins.shape(grouped.append_group(batches)) == twins.shape(twins.alone(alone, batches))
    assert _tables(grouped) == _tables(alone)


@pytest.mark.usefixtures("frozen")
def test_a_refused_batch_is_refused_alone_and_the_others_are_written(stores: list[PostgresCheckpointer]) -> None:
    twins.a_refused_batch_is_refused_alone(*stores, _tables)


def test_a_group_seals_and_offloads(pg_schemas: list[str]) -> None:  # noqa: F811
    keys = StaticKeys(master_key(os.urandom(32)))
    pg_schemas.append(new_schema())
    with PostgresCheckpointer(PG_URL, schema=pg_schemas[-1], keys=keys) as grouped:
        twins.a_group_seals_and_offloads(grouped, lambda: PostgresCheckpointer(PG_URL, schema=pg_schemas[-1],
                                                                                keys=keys))


class _Trace:
    """Counts the round trips of a store of one connection: each time the client, having sent,
    waits for the server (in libpq's protocol trace, a run of frontend messages, then backend ones)."""

    def __init__(self, store: PostgresCheckpointer) -> None:
        assert store._pool is not None and store._pool.max_size == 1
        with store._pool.connection() as conn:
            self.pgconn = conn.pgconn
        self.trips = 0

    def __enter__(self) -> _Trace:
        self.file = tempfile.TemporaryFile(mode="w+")
        self.pgconn.trace(self.file.fileno())
        self.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        return self

    def __exit__(self, *exc: object) -> None:
        self.pgconn.untrace()  # flushes libpq's buffer
        with self.file:
            self.file.seek(0)
            sides = [line[0] for line in self.file.read().splitlines() if line[:1] in ("F", "B")]
        self.trips = sum(1 for a, b in zip(sides, sides[1:], strict=False) if a == "F" and b == "B")


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "read-again"])
def test_a_group_of_existing_runs_costs_the_same_few_round_trips_whatever_its_size(
        stores: list[PostgresCheckpointer], cached: bool) -> None:
    store = stores[1]
    runs = [f"r{i:02d}" for i in range(24)]
    for r in runs:
        store.append([twins.start(r)])
    trace = _Trace(store)
    trips = {}
    for n in (1, 4, 24):
        if not cached:
            store._cache.clear()  # as after another worker wrote every run
        with trace:
            outs = store.append_group([GroupBatch([twins.ev(r, f"s{n}")]) for r in runs[:n]])
        assert not any(isinstance(o, Exception) for o in outs)
        trips[n] = trace.trips
    # BEGIN, the rows locked, (the summaries read,) the new rows, the summaries, COMMIT; a group
    # of several runs sends its new rows with its summaries, in one statement.
    assert trips == {1: 5 if cached else 6, 4: 4 if cached else 5, 24: 4 if cached else 5}, trips
    if not cached:
        store._cache.clear()
    with trace:  # a run's first append adds its creation lock and a second look at its row
        store.append_group([GroupBatch([twins.ev(r, "s99")]) for r in runs] + [GroupBatch([twins.start("zz")])])
    assert trace.trips == (4 if cached else 5) + 2
    for i, r in enumerate(runs):
        assert [e.step_id for e in store.load(r)] == ["run", *(f"s{n}" for n in (1, 4, 24) if i < n), "s99"]
    assert [e.step_id for e in store.load("zz")] == ["run"]


def test_a_new_run_out_of_lock_order_is_not_waited_for(stores: list[PostgresCheckpointer]) -> None:
    """A group whose new run sorts before a run whose row it has locked must not wait for that
    run's creation lock (a group holding it could be waiting for the locked row: a deadlock):
    while another transaction holds it, the group is appended batch by batch, and lands."""
    store = stores[0]
    store.append([twins.start("b")])
    with psycopg.connect(PG_URL, autocommit=True) as other, other.transaction():
        other.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_NEW_RUN_LOCK, _int4(store._journal_id + "a")))
        outs: list[Any] = []
        worker = threading.Thread(target=lambda: outs.extend(store.append_group(
            [GroupBatch([twins.ev("b", "s0")]), GroupBatch([twins.start("a")])])))
        worker.start()
        time.sleep(0.5)
        assert worker.is_alive()  # the batch of "a", alone, waits for the creator (in order)
        assert [e.step_id for e in store.load("b")] == ["run", "s0"]  # "b" did not wait for "a"
    worker.join(10)
    assert not worker.is_alive()
    assert twins.shape(outs) == [[("b", "s0", "intent", 2)], [("a", "run", "start", 1)]]
    assert len(_writers(store, {"a": 0, "b": 1})) == 2  # appended one by one
    # Not held: the same shape is one transaction.
    outs = store.append_group([GroupBatch([twins.ev("b", "s1")]), GroupBatch([twins.start("a0")])])
    assert not any(isinstance(o, Exception) for o in outs)
    assert len(_writers(store, {"a0": 0, "b": 2})) == 1
