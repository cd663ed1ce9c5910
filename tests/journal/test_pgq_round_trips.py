"""PostgreSQL: the round trips of what a worker does once per run (a summary read, a release),
counted, and what they still refuse and write.

Runs against the machine's PostgreSQL (see ``_pg``), each test in a schema of its own. An exchange
is a wait of psycopg for the server's socket (a wait that returns at once, such as the pool's
``commit`` of an idle autocommit connection, is not one)."""

from __future__ import annotations

import json
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from _pg import PG_URL, new_schema, pg_schemas  # noqa: F401 - the fixture
from psycopg import sql

from cuaderno.errors import SchemaTooNew
from cuaderno.events import StepEvent
from cuaderno.journal._pg_server import SCHEMA_VERSION
from cuaderno.journal._takeover import take_over
from cuaderno.journal.postgres import PostgresCheckpointer

pytestmark = pytest.mark.postgres


@pytest.fixture
def store(pg_schemas: list[str]) -> Iterator[PostgresCheckpointer]:  # noqa: F811
    pg_schemas.append(new_schema())
    opened = PostgresCheckpointer(PG_URL, schema=pg_schemas[-1])
    try:
        yield opened
    finally:
        opened.close()


def _start(run: str) -> StepEvent:
    return StepEvent(run_id=run, step_id="run", phase="start", kind="run", fingerprint="f",
                     payload={"task": "t", "versions": {"schema": 1}})


@contextmanager
def _exchanges(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The statements after which psycopg waited for the server, in order (one per exchange)."""
    seen: list[str] = []
    last = {"q": ""}
    wait, execute = psycopg.Connection.wait, psycopg.Cursor.execute

    def executed(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        last["q"] = str(query)
        return execute(self, query, *args, **kwargs)

    def waited(self: Any, gen: Generator[Any, Any, Any], *args: Any, **kwargs: Any) -> Any:
        yielded = [False]

        def watched() -> Generator[Any, Any, Any]:
            try:
                ready = next(gen)
                while True:
                    yielded[0] = True
                    ready = gen.send((yield ready))
            except StopIteration as stop:
                return stop.value

        try:
            return wait(self, watched(), *args, **kwargs)
        finally:
            if yielded[0]:
                seen.append(last["q"])

    with monkeypatch.context() as m:
        m.setattr(psycopg.Cursor, "execute", executed)
        m.setattr(psycopg.Connection, "wait", waited)
        yield seen


def _owner(store: PostgresCheckpointer, run_id: str) -> dict[str, Any]:
    with psycopg.connect(PG_URL) as conn:
        row = conn.execute(sql.SQL("SELECT owner FROM {}.cuaderno_runs WHERE run_id = %s").format(
            sql.Identifier(str(store.schema))), (run_id,)).fetchone()
    assert row is not None
    found: dict[str, Any] = json.loads(row[0])
    return found


def test_a_summary_read_is_one_exchange_with_the_schema_checked(store: PostgresCheckpointer,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    store.append([_start("r")])
    store.checkpoint("r")  # the pool's connection opened and configured
    with _exchanges(monkeypatch) as seen:
        cp = store.checkpoint("r")
        missing = store.checkpoint("nobody")
    assert cp is not None and cp.run_id == "r" and cp.last_seq == 1 and cp.epoch == 0
    assert missing is None
    assert len(seen) == 2, seen  # one each (the schema's version was a statement of its own)
    with psycopg.connect(PG_URL) as conn:
        conn.execute(sql.SQL("INSERT INTO {}.cuaderno_migrations (version) VALUES (%s)").format(
            sql.Identifier(str(store.schema))), (SCHEMA_VERSION + 1,))
    for run_id in ("r", "nobody"):
        with pytest.raises(SchemaTooNew):
            store.checkpoint(run_id)


@pytest.mark.parametrize("how", ["acquire", "claim"])
def test_a_release_is_one_exchange_and_marks_the_holder_let_go(store: PostgresCheckpointer, how: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    store.append([_start("r")])
    if how == "acquire":
        epoch = store.acquire("r", "w1")
    else:
        taken = take_over(store, ["r"], "w1")
        [(_, epoch)] = taken.taken
    held = _owner(store, "r")
    assert held["held"] is True
    with _exchanges(monkeypatch) as seen:
        store.release("r", epoch)
    # The release's UPDATE (its own transaction), then the run's lock given back on the lock
    # connection: BEGIN, the row's locked read, the UPDATE and COMMIT were four.
    assert len(seen) == 2, seen
    assert _owner(store, "r") == {**held, "held": False}
    assert store.holder_pid() is None
    # Taken again and released: the release marks the record of that takeover.
    again = store.acquire("r", "w2")
    store.release("r", again)
    assert _owner(store, "r")["held"] is False and _owner(store, "r")["owner"] == "w2"


def test_a_release_after_a_forced_takeover_writes_nothing(store: PostgresCheckpointer,
                                                          pg_schemas: list[str]) -> None:  # noqa: F811
    store.append([_start("r")])
    epoch = store.acquire("r", "w1")
    other = PostgresCheckpointer(PG_URL, schema=store.schema)
    try:
        later = other.acquire("r", "w2", force=True)
        taken = _owner(store, "r")
        store.release("r", epoch)  # stale: its record is no longer the row's
        assert _owner(store, "r") == taken and taken["held"] is True
        other.release("r", later)
        assert _owner(store, "r") == {**taken, "held": False}
    finally:
        other.close()


def test_a_release_of_a_record_changed_at_its_epoch_falls_back_to_reading_it(store: PostgresCheckpointer) -> None:
    store.append([_start("r")])
    epoch = store.acquire("r", "w1")
    record = dict(_owner(store, "r"), note="changed")  # another writer's record at the same epoch
    with psycopg.connect(PG_URL) as conn:
        conn.execute(sql.SQL("UPDATE {}.cuaderno_runs SET owner = %s WHERE run_id = %s").format(
            sql.Identifier(str(store.schema))), (json.dumps(record, sort_keys=True), "r"))
    store.release("r", epoch)
    assert _owner(store, "r") == {**record, "held": False}


def test_a_groups_rows_held_back_are_sent_before_its_commit(store: PostgresCheckpointer) -> None:
    """A group's new rows wait for its summaries' upsert, to go in the same statement; a group
    transaction that ends without that upsert still sends them before COMMIT (none is lost)."""
    from cuaderno.events import StepEvent as Ev

    for run in ("a", "b"):
        store.append([_start(run)])
    events = [Ev(run_id="a", step_id=f"s{i}", phase="intent", kind="tool", name="t", payload={"i": i})
              for i in range(2)]
    planned = store._insert_rows  # the rows as the append would store them, taken from an append refused
    seen: list[Any] = []

    def caught(db: Any, rows: Any, held: Any, *, lookups: bool) -> None:
        seen.append(rows)
        raise RuntimeError("caught")  # its transaction rolled back: nothing stored

    store._insert_rows = caught  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError, match="caught"):
            store.append(events)
    finally:
        store._insert_rows = planned  # type: ignore[method-assign]
    assert [e.step_id for e in store.load("a")] == ["run"]
    store._cache.clear()
    [rows] = seen
    with store._write_txn() as cur:
        store._group_summaries(cur, ["a", "b"])
        store._insert_rows(cur, rows, None, lookups=False)
        assert store._group.rows == rows  # held back for the summaries
    with psycopg.connect(PG_URL) as conn:  # the rows alone (the test wrote no summary for them)
        steps = conn.execute(sql.SQL("SELECT step_id FROM {}.cuaderno_events WHERE run_id = 'a' ORDER BY seq").format(
            sql.Identifier(str(store.schema)))).fetchall()
    assert [s for (s,) in steps] == ["run", "s0", "s1"]
    assert store._group.cursor is None and store._group.rows is None


def test_a_load_opens_its_snapshot_in_one_exchange(store: PostgresCheckpointer,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    store.append([_start("r")])
    store.load("r")  # the pool's connection opened and configured
    with _exchanges(monkeypatch) as seen:
        events = store.load("r")
    assert [e.step_id for e in events] == ["run"]
    # BEGIN with its isolation level, the schema, the summary, the rows, COMMIT (BEGIN and SET
    # TRANSACTION were two).
    assert len(seen) == 5, seen
    with store._snapshot("r") as conn:
        assert conn.execute("SHOW transaction_isolation").fetchone() == ("repeatable read",)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    with pytest.raises(RuntimeError), store._snapshot("r") as conn:
        raise RuntimeError("a reader's own error")
    with store._snapshot("r") as conn:  # the pool's connections are left idle either way
        assert conn.execute("SHOW transaction_isolation").fetchone() == ("repeatable read",)
    with store._conn() as conn:
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
