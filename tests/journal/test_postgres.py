"""PostgresCheckpointer beyond the conformance suite: bad input, liveness across processes, the CLI.

Runs against the machine's PostgreSQL (see ``_pg``), each test in schemas of its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _pg import PG_URL, new_schema, pg_schemas, schema_url  # noqa: F401 - the fixture
from psycopg import sql
from typer.testing import CliRunner

from cuaderno import open_journal
from cuaderno.cli import app
from cuaderno.errors import FencedOut, JournalError, RunBusy, SchemaTooNew, UsageError
from cuaderno.events import StepEvent
from cuaderno.journal.postgres import SCHEMA_VERSION, PostgresCheckpointer

pytestmark = pytest.mark.postgres

HOLDER = str(Path(__file__).resolve().parent / "_pg_holder.py")


def _start(run: str) -> StepEvent:
    return StepEvent(run_id=run, step_id="run", phase="start", kind="run", fingerprint="f",
                     payload={"task": "t", "versions": {"schema": 1}})


def _tables(schema: str) -> dict[str, Any]:
    """Every cuaderno table of the schema, as rows: what 'nothing was written' is checked against."""
    with psycopg.connect(PG_URL) as conn:
        names = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname=%s ORDER BY 1",
                                            (schema,)).fetchall()]
        return {n: conn.execute(sql.SQL("SELECT * FROM {}.{} ORDER BY 1").format(
            sql.Identifier(schema), sql.Identifier(n))).fetchall() for n in names}


@pytest.fixture
def journal(pg_schemas: list[str]) -> Iterator[PostgresCheckpointer]:  # noqa: F811
    pg_schemas.append(new_schema())
    store = PostgresCheckpointer(PG_URL, schema=pg_schemas[-1])
    yield store
    store.close()


# -- settings and schema ------------------------------------------------------------------------


def test_settings_and_migrations(journal: PostgresCheckpointer) -> None:
    with journal._conn() as conn:  # a pool connection, as appends use
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
        versions = conn.execute("SELECT version FROM cuaderno_migrations ORDER BY 1").fetchall()
        assert [v for (v,) in versions] == list(range(1, SCHEMA_VERSION + 1))
        key = conn.execute("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                           "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'cuaderno_events'::regclass "
                           "AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)").fetchall()
        assert [k for (k,) in key] == ["run_id", "step_id", "phase"]
    # The lock connection: the server notices a vanished holder's host in about 30 s, not hours.
    journal.append([_start("r")])
    journal.acquire("r", "w")
    assert journal._holds is not None
    assert journal._holds.execute("SHOW tcp_keepalives_idle").fetchone() == ("10",)
    assert journal._holds.execute("SHOW synchronous_commit").fetchone() == ("on",)


def test_open_journal_opens_a_postgres_url(pg_schemas: list[str]) -> None:  # noqa: F811
    pg_schemas.append(new_schema())
    store = open_journal(schema_url(pg_schemas[-1]) + "&compress=off")
    try:
        assert isinstance(store, PostgresCheckpointer)
        store.append([_start("r"), StepEvent(run_id="r", step_id="x", phase="result", kind="tool",
                                             payload={"text": "y" * 2000})])
        # compress=off: the payload rests as plain JSON (readable with the server's own JSON functions)
        assert {row[8] for row in _tables(pg_schemas[-1])["cuaderno_events"]} == {"json"}
    finally:
        store.close()
    again = open_journal(schema_url(pg_schemas[-1]), create=False, readonly=True)
    try:
        assert [e.step_id for e in again.load("r")] == ["run", "x"]
        with pytest.raises(UsageError, match="read-only"):
            again.append([_start("other")])
    finally:
        again.close()


def test_compressed_by_default(journal: PostgresCheckpointer) -> None:
    journal.append([_start("r"), StepEvent(run_id="r", step_id="x", phase="result", kind="tool",
                                           payload={"text": "words and more words " * 100})])
    assert {row[8] for row in _tables(str(journal.schema))["cuaderno_events"]} == {"json", "json+zstd"}
    assert journal.load("r")[1].payload == {"text": "words and more words " * 100}


# -- bad input: one clear error, nothing written -----------------------------------------------


@pytest.mark.parametrize(("url", "needle"), [
    ("postgresql://127.0.0.1:1/test", "cannot open it"),  # nothing listens there
    ("postgresql://127.0.0.1:5432/no_such_database_here", "no_such_database_here"),
    ("postgresql://127.0.0.1:5432/test?nonsense=1", "nonsense"),
    ("postgresql://127.0.0.1:5432/test?schema=1bad", "schema must be a plain SQL name"),
    ("postgresql://127.0.0.1:5432/test?compress=maybe", "compress='maybe'"),
])
def test_a_wrong_url_is_one_clear_error(url: str, needle: str, pg_schemas: list[str]) -> None:  # noqa: F811
    with pytest.raises((JournalError, UsageError)) as caught:
        open_journal(url)
    message = str(caught.value)
    assert needle in message and "\n" not in message


def test_a_database_without_the_schema_is_refused_and_nothing_is_created(pg_schemas: list[str]) -> None:  # noqa: F811
    schema = new_schema()
    pg_schemas.append(schema)
    for readonly in (False, True):
        with pytest.raises(JournalError, match="not a cuaderno journal.*nothing was changed"):
            open_journal(schema_url(schema), create=False, readonly=readonly)
    with psycopg.connect(PG_URL) as conn:
        assert conn.execute("SELECT 1 FROM pg_namespace WHERE nspname=%s", (schema,)).fetchone() is None
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    with pytest.raises(JournalError, match="not a cuaderno journal"):
        open_journal(schema_url(schema), create=False)
    assert _tables(schema) == {}


def test_a_newer_schema_is_refused_and_nothing_is_written(journal: PostgresCheckpointer) -> None:
    journal.append([_start("r")])
    schema = str(journal.schema)
    with psycopg.connect(PG_URL) as conn:
        conn.execute(sql.SQL("INSERT INTO {}.cuaderno_migrations (version) VALUES (%s)").format(
            sql.Identifier(schema)), (SCHEMA_VERSION + 1,))
    before = _tables(schema)
    for kwargs in ({}, {"create": False}, {"readonly": True}):
        with pytest.raises(SchemaTooNew, match=f"version {SCHEMA_VERSION + 1} is newer"):
            open_journal(schema_url(schema), **kwargs)
    # The store opened before the upgrade refuses too, at its next read or takeover.
    with pytest.raises(SchemaTooNew):
        journal.load("r")
    with pytest.raises(SchemaTooNew):
        journal.acquire("r", "w")
    assert _tables(schema) == before


# -- liveness across processes ------------------------------------------------------------------


def _spawn_holder(url: str, run: str, where: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, HOLDER, url, run, str(where)], env=env)
    held = where / "held"
    deadline = time.monotonic() + 60
    while not held.exists():  # the holder's own record that it holds the run
        assert proc.poll() is None, "the holder died before taking the run"
        assert time.monotonic() < deadline, "the holder never took the run"
        time.sleep(0.01)
    return proc, json.loads(held.read_text())


def _wait_outcome(proc: subprocess.Popen[bytes], where: Path) -> str:
    (where / "go").touch()
    assert proc.wait(timeout=60) == 0
    return (where / "outcome").read_text()


def test_a_holder_whose_connection_dies_is_taken_over_and_fenced(journal: PostgresCheckpointer,
                                                                 tmp_path: Path) -> None:
    run = "r-kill-conn"
    journal.append([_start(run)])
    proc, held = _spawn_holder(schema_url(str(journal.schema)), run, tmp_path)
    try:
        with pytest.raises(RunBusy, match="holder"):
            journal.acquire(run, "taker")
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (held["backend"],)).fetchone() == (True,)
            # Terminating is asynchronous: wait until the server has ended that backend (its locks go with it).
            while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid=%s", (held["backend"],)).fetchone():
                time.sleep(0.01)
        epoch = journal.acquire(run, "taker")
        assert epoch == held["epoch"] + 1
        # Its lock went, its process did not: the step it is in may still run (R23).
        earlier = journal.earlier_holder(run)
        assert earlier is not None and earlier["liveness"] == "alive" and str(held["pid"]) in earlier["holder"]
        assert _wait_outcome(proc, tmp_path) == "FencedOut"  # the old holder's next write is refused
        assert [e.step_id for e in journal.load(run)] == ["run"]  # and nothing of it was written
        with pytest.raises(FencedOut):
            journal.append([_start(run)], epoch=held["epoch"])
        proc.wait(timeout=60)
        assert journal.earlier_holder(run) is None  # its process is gone now: nothing of it can still run
    finally:
        proc.kill()
        proc.wait()


def test_a_taker_that_dies_before_settling_passes_the_live_holder_on(journal: PostgresCheckpointer,
                                                                      tmp_path: Path) -> None:
    """Holder H lives but its lock session was ended; K takes the run over (H may still run its
    step) and is SIGKILLed before it settles anything; J takes it over from K, which is provably
    gone. H is still alive: J must know (the 4-worker chaos run found 7 duplicate receipts when
    only the last holder was reckoned with)."""
    run = "r-chain"
    journal.append([_start(run)])
    (tmp_path / "h").mkdir()
    (tmp_path / "k").mkdir()
    h, held = _spawn_holder(schema_url(str(journal.schema)), run, tmp_path / "h")
    k: subprocess.Popen[bytes] | None = None
    try:
        _terminate(held["backend"])
        k, _ = _spawn_holder(schema_url(str(journal.schema)), run, tmp_path / "k")
        k.send_signal(signal.SIGKILL)
        k.wait()
        deadline = time.monotonic() + 30
        while True:  # K's lock goes once the server has noticed its closed socket
            try:
                journal.acquire(run, "j")
                break
            except RunBusy:
                assert time.monotonic() < deadline, "the killed taker's lock never went"
                time.sleep(0.05)
        earlier = journal.earlier_holder(run, 1)
        assert earlier is not None and f"process {held['pid']}" in earlier["holder"], earlier
        h.kill()
        h.wait()
        assert journal.earlier_holder(run, 1) is None  # gone now
    finally:
        for proc in (h, k):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def _terminate(backend: int) -> None:
    """``pg_terminate_backend`` one of this test's own sessions, and wait until it has exited."""
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (backend,)).fetchone() == (True,)
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid=%s", (backend,)).fetchone():
            time.sleep(0.01)


def test_the_lock_session_is_not_ended_by_idle_timeouts(pg_schemas: list[str]) -> None:  # noqa: F811
    """A server, database or role ``idle_session_timeout`` (here the connection string's own
    options, so that the shared server's settings stay as they are) would end the lock session
    while a tool body runs and free the run for another worker (R23). The lock session and the
    pooled ones set it to 0 for themselves."""
    pg_schemas.append(new_schema())
    url = f"{PG_URL}?options=-c%20idle_session_timeout%3D300%20-c%20idle_in_transaction_session_timeout%3D300"
    store = PostgresCheckpointer(url, schema=pg_schemas[-1])
    try:
        store.append([_start("r")])
        epoch = store.acquire("r", "w")
        assert store._holds is not None
        assert store._holds.execute("SHOW idle_session_timeout").fetchone() == ("0",)
        assert store._holds.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("0",)
        backend = store.holder_pid()
        time.sleep(1.0)  # three times the timeout it was opened with
        assert list(store.holders(["r"])) == ["r"] and store.holder_pid() == backend
        store.append([StepEvent(run_id="r", step_id="s", phase="intent", kind="tool", payload={})], epoch=epoch)
    finally:
        store.close()


def test_a_holder_whose_lock_session_was_ended_takes_its_lock_back_before_its_next_write(
        journal: PostgresCheckpointer) -> None:
    """Before, the holder went on writing through its pool with no lock at all (anyone could take
    the run over meanwhile); now its next write notices and takes the lock back first."""
    journal.append([_start("r")])
    epoch = journal.acquire("r", "w")
    backend = journal.holder_pid()
    assert backend is not None
    _terminate(backend)
    time.sleep(0.05)  # the server's goodbye reaches the idle lock socket
    journal.append([StepEvent(run_id="r", step_id="s", phase="intent", kind="tool", payload={})], epoch=epoch)
    assert journal.holder_pid() not in (None, backend)
    other = PostgresCheckpointer(PG_URL, schema=journal.schema)
    try:
        with pytest.raises(RunBusy):
            other.acquire("r", "taker")
    finally:
        other.close()


def test_a_holder_whose_lock_went_to_another_writes_nothing_more(journal: PostgresCheckpointer) -> None:
    journal.append([_start("r")])
    epoch = journal.acquire("r", "w")
    backend = journal.holder_pid()
    assert backend is not None
    _terminate(backend)
    taker = PostgresCheckpointer(PG_URL, schema=journal.schema)
    try:
        assert taker.acquire("r", "taker") == epoch + 1
        earlier = taker.earlier_holder("r")  # the holder (this process) is alive: it may be inside a step
        assert earlier is not None and earlier["liveness"] == "alive"
        time.sleep(0.05)
        with pytest.raises(FencedOut):
            journal.append([StepEvent(run_id="r", step_id="s", phase="intent", kind="tool", payload={})],
                           epoch=epoch)
        assert [e.step_id for e in journal.load("r")] == ["run"]
        taker.release("r", epoch + 1)
        assert taker.earlier_holder("r") is None
        # The next taker takes it from a holder that let go, but the first holder is still alive
        # and may be inside a step it started: that is kept through takeovers and releases, for
        # the steps it may have started (rows up to 1), not for later ones.
        assert journal.acquire("r", "w2") == epoch + 2
        kept = journal.earlier_holder("r", 1)
        assert kept is not None and kept["its_rows_up_to"] == 1
        assert journal.earlier_holder("r", 2) is None
    finally:
        taker.close()


def test_reads_and_writes_after_the_server_ended_the_pools_sessions_are_answered(
        journal: PostgresCheckpointer) -> None:
    """A restart (or ``pg_terminate_backend``, an idle timeout) ends every pooled session while it
    sits idle. Before the pool checked a connection on the way out, the next read on each stale
    one failed (``JournalError: read failed: terminating connection ...``) before the pool
    replaced it; now each is dropped unused and the read is answered."""
    journal.append([_start("r1")])
    pool = journal._pool
    assert pool is not None
    with pool.connection() as a, pool.connection() as b:  # two pooled sessions, both idle after this
        pids = [a.info.backend_pid, b.info.backend_pid]
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        for pid in pids:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchone():
            time.sleep(0.01)
    time.sleep(0.05)  # the goodbye reaches the idle sockets
    cp = journal.checkpoint("r1")
    assert cp is not None and cp.last_seq == 1
    assert [e.phase for e in journal.load("r1")] == ["start"]
    assert [c.run_id for c in journal.list_runs()] == ["r1"]
    out = journal.append([StepEvent(run_id="r1", step_id="s1", phase="intent", kind="tool", payload={})])
    assert out[0].seq == 2


def test_a_stopped_holder_keeps_the_run(journal: PostgresCheckpointer, tmp_path: Path) -> None:
    run = "r-stopped"
    journal.append([_start(run)])
    proc, held = _spawn_holder(schema_url(str(journal.schema)), run, tmp_path)
    try:
        os.kill(proc.pid, signal.SIGSTOP)  # its connection stays open: the server keeps its lock
        with pytest.raises(RunBusy):
            journal.acquire(run, "taker")
        os.kill(proc.pid, signal.SIGCONT)
        assert _wait_outcome(proc, tmp_path) == "ok"  # it wakes still holding the run
        assert [e.step_id for e in journal.load(run)] == ["run", "t0000.tool00"]
        # It exited without releasing: the server dropped its lock with its connection.
        assert journal.acquire(run, "taker") == held["epoch"] + 1
    finally:
        proc.kill()
        proc.wait()


def test_release_lets_another_worker_take_over_at_once(journal: PostgresCheckpointer) -> None:
    journal.append([_start("r")])
    other = PostgresCheckpointer(PG_URL, schema=journal.schema)
    try:
        epoch = journal.acquire("r", "a")
        with pytest.raises(RunBusy):
            other.acquire("r", "b")
        assert other.acquire("r", "b", force=True) == epoch + 1  # force takes it anyway
        journal.release("r", epoch)  # superseded: its lock goes too
        third = PostgresCheckpointer(PG_URL, schema=journal.schema)
        try:
            assert third.acquire("r", "c") == epoch + 2
        finally:
            third.close()
    finally:
        other.close()


# -- the command line ---------------------------------------------------------------------------


def test_cli_lists_shows_and_approves_through_a_postgres_url(journal: PostgresCheckpointer) -> None:
    run, step, fp = "r-pay", "t0000.tool00.approval", "fp-1"
    journal.append([_start(run)])
    journal.append([StepEvent(run_id=run, step_id=step, phase="request", kind="approval", name="transfer",
                              decision="require_approval", fingerprint=fp,
                              payload={"tool_step": "t0000.tool00", "arguments": {"amount": 1}})])
    url = schema_url(str(journal.schema))

    def cli(*args: str) -> Any:
        result = CliRunner().invoke(app, ["--db", url, *args], prog_name="cuaderno")
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        return result

    listed = cli("list", "--json")
    assert listed.exit_code == 0, listed.output
    assert [r["run_id"] for r in json.loads(listed.stdout)] == [run]
    shown = cli("show", run)
    assert shown.exit_code == 0 and step in shown.stdout
    approved = cli("approve", run, step, "--fingerprint", fp, "--by", "ana")
    assert approved.exit_code == 0, approved.output
    cp = journal.checkpoint(run)
    assert cp is not None and cp.pending == {}
    missing = CliRunner().invoke(app, ["--db", schema_url(new_schema()), "list"], prog_name="cuaderno")
    assert missing.exit_code == 4 and "not a cuaderno journal" in missing.stderr


def test_a_holder_that_lost_its_lock_to_another_confirms_no_hold_before_a_body(
        journal: PostgresCheckpointer) -> None:
    """The check the loop makes between an effect's durable intent and its body (R23): intact, it
    passes; once the server ended the lock session and another worker took the run, it refuses."""
    journal.append([_start("r")])
    epoch = journal.acquire("r", "w")
    journal.confirm_hold("r", epoch)
    backend = journal.holder_pid()
    assert backend is not None
    _terminate(backend)
    taker = PostgresCheckpointer(PG_URL, schema=journal.schema)
    try:
        assert taker.acquire("r", "taker") == epoch + 1
        time.sleep(0.05)  # the server's goodbye reaches the idle lock socket
        with pytest.raises(FencedOut):
            journal.confirm_hold("r", epoch)
    finally:
        taker.close()
