"""Issue 35, part 5: ``cuaderno backup`` copies a SQLite journal while a worker writes to it, and the
copy verifies; ``cuaderno restore`` puts a copy back as a restore the rollback check knows, with the
operator's explicit choice for runs past the backup. SIGKILL inside both leaves nothing half done."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prune_journals import closed_run, model, open_run

from cuaderno import Agent, CuadernoError, ScriptedGateway, Session, open_journal, operations, tool
from cuaderno.errors import JournalRolledBack, RunBusy, UsageError
from cuaderno.journal import work_for
from cuaderno.journal.sqlite import SqliteCheckpointer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))

from _world import World

SRC = Path(__file__).resolve().parents[2] / "src"


def _files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _journal(tmp_path: Path) -> str:
    db = str(tmp_path / "runs.db")
    with SqliteCheckpointer(db) as store:
        closed_run(store, "done")
        open_run(store, "goes-on")
        open_run(store, "stays")
    return db


def test_backup_while_a_worker_writes_opens_and_verifies(tmp_path: Path) -> None:
    from cuaderno.testing.ledger import LedgerProcess

    ledger = LedgerProcess(tmp_path / "ledger.sqlite3", mode="nodedup").start()
    w = World(journal=str(tmp_path / "runs.db"), dir=tmp_path, ledger=ledger, backend="sqlite")
    try:
        runs = [f"live-{i}" for i in range(6)]
        for run_id in runs:  # left running, unheld: the worker drives them while backups are taken
            w.start_runs("agent", [run_id], CUADERNO_CRASH_AT="tool.K5:1", WORKER_TURNS="8").wait(timeout=120)
        w.worker("worker_agent:agent", WORKER_TURNS="8")
        # A backup SIGKILLed after its copy was checked, before the rename: no DEST, the worker unharmed.
        killed = _cli("backup", w.journal, str(tmp_path / "killed.db"), crash_at="backup.C1", cwd=tmp_path)
        assert killed.returncode == -signal.SIGKILL and not (tmp_path / "killed.db").exists()
        copies = []
        while not all(w.statuses().get(r) == "completed" for r in runs) and len(copies) < 40:
            dest = tmp_path / f"copy-{len(copies)}.db"
            report = operations.backup(w.journal, dest)  # verified inside: every chain, every summary
            copies.append((dest, report))
        w.wait_until(lambda: all(w.statuses().get(r) == "completed" for r in runs), what="runs to finish")
        assert len(copies) >= 2
        assert len({r.events for _, r in copies}) >= 2  # taken at different points of the runs
        for dest, report in copies:
            with SqliteCheckpointer(dest, readonly=True) as store:
                assert len(store.list_runs(limit=100)) == report.runs == len(runs)
                for cp in store.list_runs(limit=100):
                    assert store.load(cp.run_id)
        assert set(w.applied_per_key().values()) == {1}
    finally:
        w.reap()
        ledger.stop()


def test_an_old_copy_put_back_by_hand_is_refused_and_a_restore_is_recognised(tmp_path: Path) -> None:
    db = _journal(tmp_path)
    operations.backup(db, tmp_path / "b.db")
    with SqliteCheckpointer(db) as store:
        store.append([model("goes-on", 1)])
        open_run(store, "after")
    shutil.copy(db, tmp_path / "newer.db")
    # By hand: refused, as before.
    hand = tmp_path / "hand"
    hand.mkdir()
    with SqliteCheckpointer(db) as store:
        store.close()
    report = operations.restore(tmp_path / "b.db", db, runs_after_backup="needs-human")
    assert report.replaced_readable and report.marked == ["goes-on"] and report.lost == ["after"]
    assert report.kept_aside is not None and os.path.exists(report.kept_aside)
    with SqliteCheckpointer(db) as store:  # not JournalRolledBack
        statuses = {cp.run_id: cp.status for cp in store.list_runs()}
        assert statuses == {"done": "completed", "goes-on": "needs_human", "stays": "running"}
        evidence = store.checkpoint("goes-on").uncertain["restore"]  # type: ignore[union-attr]
        assert evidence["backup_last_seq"] == 2 and evidence["journal_last_seq"] == 3
    record = operations.restore_record(db)
    assert len(record) == 1 and record[0]["runs_after_backup"] == "needs-human"
    assert record[0]["marked"] == ["goes-on"] and record[0]["runs_not_in_backup"] == ["after"]
    # The replaced journal is whole, aside.
    with SqliteCheckpointer(report.kept_aside, readonly=True, accept_rollback=True) as kept:
        assert kept.checkpoint("after") is not None
    # A real rollback after the restore is still refused.
    with SqliteCheckpointer(db) as store:
        open_run(store, "later")
    with SqliteCheckpointer(db) as store:
        store.close()
    for suffix in ("-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.unlink(db + suffix)
    shutil.copy(tmp_path / "b.db", db)
    with pytest.raises(JournalRolledBack):
        SqliteCheckpointer(db)


@tool
def noop() -> str:
    """Do nothing."""
    return "ok"


def test_a_marked_run_is_never_resumed_silently_and_accept_marks_nothing(tmp_path: Path) -> None:
    db = _journal(tmp_path)
    operations.backup(db, tmp_path / "b.db")
    os.unlink(db)  # the journal is lost: every open run of the backup may have gone on
    report = operations.restore(tmp_path / "b.db", db, runs_after_backup="needs-human")
    assert not report.replaced_readable and sorted(report.marked) == ["goes-on", "stays"]
    agent = Agent(instructions="x", tools=[noop], name="a")
    with SqliteCheckpointer(db) as store:
        cp = store.checkpoint("stays")
        assert cp is not None and cp.status == "needs_human" and work_for(cp) is None  # no worker claims it
        assert "a person to settle restore" in operations.run_state(store, cp)["summary"]
        size = len(store.load("stays"))
        gateway = ScriptedGateway([ScriptedGateway.text("hi")])
        with pytest.raises(CuadernoError):  # refused (UncertainEffect, or the version check before it)
            asyncio.run(agent.run_to_end("t", session=Session("stays", gateway, store)))
        assert len(store.load("stays")) == size and store.checkpoint("stays").status == "needs_human"  # type: ignore[union-attr]
    again = operations.restore(tmp_path / "b.db", db, runs_after_backup="accept")
    assert again.marked == [] and again.choice == "accept"
    with SqliteCheckpointer(db) as store:
        assert {cp.run_id: cp.status for cp in store.list_runs()}["stays"] == "running"
    assert [r["runs_after_backup"] for r in operations.restore_record(db)] == ["accept"]


def test_refusals_change_nothing(tmp_path: Path) -> None:
    db = _journal(tmp_path)
    operations.backup(db, tmp_path / "b.db")
    before = _files(tmp_path)
    with pytest.raises(UsageError, match="never overwrites"):
        operations.backup(db, tmp_path / "b.db")
    with pytest.raises(UsageError, match="needs-human"):
        operations.restore(tmp_path / "b.db", db, runs_after_backup="yes")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="not a backup"):
        operations.restore(db, tmp_path / "other.db", runs_after_backup="accept")
    with pytest.raises(UsageError, match="no backup file"):
        operations.restore(tmp_path / "nope.db", db, runs_after_backup="accept")
    assert _files(tmp_path) == before
    holder = SqliteCheckpointer(db)
    try:
        holder.acquire("stays", "a live worker")
        before = _files(tmp_path)
        with pytest.raises(RunBusy, match="stop the workers"):
            operations.restore(tmp_path / "b.db", db, runs_after_backup="needs-human")
        # The journal and its -wal byte-identical (SQLite's -shm index, and the lock file, are not the journal).
        assert {k: v for k, v in _files(tmp_path).items() if not k.endswith(("-holds", "-shm"))} == \
            {k: v for k, v in before.items() if not k.endswith(("-holds", "-shm"))}
    finally:
        holder.close()


def _cli(*args: str, crash_at: str | None = None, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    env["PYTHONPATH"] = str(SRC)
    if crash_at:
        env["CUADERNO_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, "-m", "cuaderno", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_a_killed_backup_leaves_no_copy_and_a_killed_restore_is_run_again(tmp_path: Path) -> None:
    db = _journal(tmp_path)
    killed = _cli("backup", db, str(tmp_path / "b.db"), crash_at="backup.C1", cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "b.db").exists()  # never a half copy at DEST
    done = _cli("backup", db, str(tmp_path / "b.db"), cwd=tmp_path)
    assert done.returncode == 0 and "verified" in done.stdout, done.stderr
    assert not (tmp_path / "b.db.partial").exists()
    killed = _cli("restore", str(tmp_path / "b.db"), db, "--runs-after-backup", "needs-human",
                  crash_at="restore.R1", cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL
    assert not os.path.exists(db) and any(p.name.startswith("runs.db.before-restore-") for p in tmp_path.iterdir())
    again = _cli("restore", str(tmp_path / "b.db"), db, "--runs-after-backup", "needs-human", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    with SqliteCheckpointer(db) as store:  # the journal was missing: every open run marked
        assert {cp.run_id: cp.status for cp in store.list_runs()} == {
            "done": "completed", "goes-on": "needs_human", "stays": "needs_human"}


def test_cli_messages_and_exit_codes(tmp_path: Path) -> None:
    db = _journal(tmp_path)
    ok = _cli("backup", db, str(tmp_path / "b.db"), cwd=tmp_path)
    assert ok.returncode == 0 and "backed up 3 runs" in ok.stdout
    again = _cli("backup", db, str(tmp_path / "b.db"), cwd=tmp_path)
    assert again.returncode == 2 and again.stderr.startswith("error:") and "never overwrites" in again.stderr
    bad = _cli("restore", str(tmp_path / "b.db"), db, "--runs-after-backup", "maybe", cwd=tmp_path)
    assert bad.returncode == 2 and "needs-human or accept" in bad.stderr
    missing = _cli("restore", str(tmp_path / "b.db"), db, cwd=tmp_path)
    assert missing.returncode == 2 and "--runs-after-backup" in missing.stderr
    restored = _cli("restore", str(tmp_path / "b.db"), db, "--runs-after-backup", "accept", cwd=tmp_path)
    assert restored.returncode == 0 and "kept as" in restored.stdout, restored.stderr
    pruned = _cli("--db", db, "prune", "--older-than", "7d", "--json", cwd=tmp_path)
    assert pruned.returncode == 0 and '"pruned_runs": 0' in pruned.stdout
    wrong = _cli("--db", db, "prune", "--older-than", "soon", cwd=tmp_path)
    assert wrong.returncode == 2 and "not a duration" in wrong.stderr and "Traceback" not in wrong.stderr
    with open_journal(db) as store:
        assert store.checkpoint("done") is not None


def test_a_wal_left_without_its_file_is_moved_aside_and_a_marked_run_can_be_cancelled(tmp_path: Path) -> None:
    """The journal file lost, its -wal and -shm left (a killed writer's): beside the restored file
    they were read as part of it ("database disk image is malformed")."""
    db = _journal(tmp_path)
    operations.backup(db, tmp_path / "b.db")
    keep = SqliteCheckpointer(db)  # keeps the -wal there while the file is deleted under it
    keep.append([model("goes-on", 1)])
    os.unlink(db)
    assert os.path.exists(db + "-wal")
    keep.close()
    report = operations.restore(tmp_path / "b.db", db, runs_after_backup="needs-human")
    assert report.kept_aside is not None and os.path.exists(report.kept_aside + "-wal")
    with SqliteCheckpointer(db) as store:
        assert sorted(report.marked) == ["goes-on", "stays"]
        cp, _ = operations.cancel_run(store, "stays", "restored from a backup", by="ops")
        assert cp.status == "cancelled"
        for run_id in ("done", "goes-on", "stays"):
            assert store.load(run_id)


@pytest.mark.postgres
def test_postgres_schema_dump_and_restore_verifies(tmp_path: Path) -> None:
    """The documented PostgreSQL backup: ``pg_dump --schema`` of the journal's schema, restored with
    ``pg_restore`` after the schema was lost (here: renamed away); every run of the restored journal
    verifies. The restore is recognised: its tables are not the ones the journal recorded, so an
    open for writing (a worker's) is refused, changing nothing, until ``mark-restored`` says what
    happens to the runs; a read-only open reads it as it is."""
    from _pg import PG_URL, drop_schemas, new_schema, schema_url, server_or_skip

    server_or_skip()
    if shutil.which("pg_dump") is None or shutil.which("pg_restore") is None:
        pytest.skip("pg_dump/pg_restore are not installed")
    schema, away = new_schema(), new_schema()
    try:
        store = open_journal(schema_url(schema))
        try:
            closed_run(store, "done")
            open_run(store, "open")
        finally:
            store.close()
        dump = tmp_path / "journal.dump"
        subprocess.run(["pg_dump", "--dbname", PG_URL, "--schema", schema, "--format", "custom", "--file", str(dump)],
                       check=True, capture_output=True, timeout=120)
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'ALTER SCHEMA "{schema}" RENAME TO "{away}"')  # the schema is lost
        subprocess.run(["pg_restore", "--dbname", PG_URL, str(dump)], check=True, capture_output=True, timeout=120)
        before = _pg_rows(schema)
        with pytest.raises(JournalRolledBack, match="mark-restored"):
            open_journal(schema_url(schema))  # what a worker would do first: refused
        refused = _cli("--db", schema_url(schema), "cancel", "open", cwd=tmp_path)
        assert refused.returncode != 0 and "mark-restored" in refused.stdout + refused.stderr
        assert _pg_rows(schema) == before  # nothing was written by either
        store = open_journal(schema_url(schema), readonly=True)
        try:
            assert {cp.run_id: cp.status for cp in store.list_runs()} == {"done": "completed", "open": "running"}
            for run_id in ("done", "open"):
                from cuaderno.checkpoint import verified

                verified(store, run_id)
        finally:
            store.close()
        # Before any worker: the operator says what happens to the runs that may have gone on after the dump.
        marked = _cli("--db", schema_url(schema), "mark-restored", "--runs-after-backup", "needs-human",
                      "--from", "journal.dump", cwd=tmp_path)
        assert marked.returncode == 0 and "1 open run(s) now wait for a person" in marked.stdout, marked.stderr
        store = open_journal(schema_url(schema))  # the restored tables are now the journal's own
        try:
            assert {cp.run_id: cp.status for cp in store.list_runs()} == {"done": "completed", "open": "needs_human"}
            record = operations.restored_record(store)
            assert [(r["from"], r["runs_after_backup"], r["marked"]) for r in record] == [
                ("journal.dump", "needs-human", ["open"])]
            assert store.load("open")  # the chain still checks
        finally:
            store.close()
    finally:
        drop_schemas([schema, away])


def _pg_rows(schema: str) -> list[Any]:
    """Every row of the journal's tables in ``schema`` (to show a refusal wrote nothing)."""
    import psycopg
    from _pg import PG_URL
    from psycopg import sql

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1",
                                             (schema,))]
        return [(t, sorted(map(repr, conn.execute(sql.SQL("SELECT * FROM {}.{}").format(
            sql.Identifier(schema), sql.Identifier(t))).fetchall()))) for t in tables]


@pytest.mark.postgres
def test_a_postgres_journal_records_its_tables_and_an_older_one_gets_the_record(tmp_path: Path) -> None:
    """A journal records its tables when created; one that recorded none (written by an older
    cuaderno) gets the record at its first open for writing, never at a read-only one."""
    import psycopg
    from _pg import PG_URL, drop_schemas, new_schema, schema_url, server_or_skip
    from psycopg import sql

    from cuaderno.journal._anchor import INCARNATION_META

    server_or_skip()
    schema = new_schema()
    try:
        open_journal(schema_url(schema)).close()

        def recorded() -> list[Any]:
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                return conn.execute(sql.SQL("SELECT value FROM {}.cuaderno_meta WHERE key = %s").format(
                    sql.Identifier(schema)), (INCARNATION_META,)).fetchall()

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            oid = conn.execute("SELECT to_regclass(%s)::oid::bigint", (f'"{schema}".cuaderno_events',)).fetchone()
        assert oid is not None and recorded() == [(str(oid[0]),)]
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("DELETE FROM {}.cuaderno_meta WHERE key = %s").format(sql.Identifier(schema)),
                         (INCARNATION_META,))
        open_journal(schema_url(schema), readonly=True).close()
        assert recorded() == []
        open_journal(schema_url(schema)).close()
        assert recorded() == [(str(oid[0]),)]
    finally:
        drop_schemas([schema])


def test_mark_restored_refuses_a_vague_choice_and_accept_marks_nothing(journal_url: str) -> None:
    store = open_journal(journal_url)
    try:
        closed_run(store, "done")
        open_run(store, "open")
        with pytest.raises(UsageError, match="needs-human"):
            operations.mark_restored(store, runs_after_backup="sure")  # type: ignore[arg-type]
        assert operations.restored_record(store) == []
        report = operations.mark_restored(store, runs_after_backup="accept", source="dump-1")
        assert report.marked == [] and store.checkpoint("open").status == "running"  # type: ignore[union-attr]
        report = operations.mark_restored(store, runs_after_backup="needs-human", source="dump-2")
        assert report.marked == ["open"]
        again = operations.mark_restored(store, runs_after_backup="needs-human", source="dump-2")
        assert again.marked == []  # already marked: not twice
        assert [r["from"] for r in operations.restored_record(store)] == ["dump-1", "dump-2", "dump-2"]
    finally:
        store.close()


class _Stop(BaseException):
    """The process "dies" at a model call (the intent is journaled, the call never answered)."""


def test_a_marked_run_settled_as_not_gone_on_resumes_from_the_backup_and_gone_on_is_refused(tmp_path: Path) -> None:
    done: list[int] = []

    @tool
    def transfer(n: int) -> str:
        """Move money."""
        done.append(n)
        return f"moved {n}"

    agent = Agent(instructions="x", tools=[transfer], name="a", max_turns=6)
    stop_at = [1]

    def script(request: Any) -> Any:
        turn = sum(1 for m in request.messages if m.get("role") == "assistant")
        if turn == stop_at[0]:
            raise _Stop
        return [ScriptedGateway.call("transfer", n=1), ScriptedGateway.call("transfer", n=2),
                ScriptedGateway.text("done")][turn]

    db = str(tmp_path / "runs.db")
    with SqliteCheckpointer(db) as store, pytest.raises(_Stop):
        asyncio.run(agent.run_to_end("t", session=Session("r1", ScriptedGateway(script), store)))
    operations.backup(db, tmp_path / "b.db")
    for suffix in ("", "-wal", "-shm"):  # the journal is lost
        if os.path.exists(db + suffix):
            os.unlink(db + suffix)
    assert operations.restore(tmp_path / "b.db", db, runs_after_backup="needs-human").marked == ["r1"]
    with SqliteCheckpointer(db):  # the last close folds the -wal in: the files at rest
        pass
    before = _files(tmp_path)
    gone_on = _cli("--db", db, "resolve", "r1", "restore", "--happened", cwd=tmp_path)
    assert gone_on.returncode == 2 and "went on past the backup" in gone_on.stderr, gone_on.stderr
    assert "cuaderno cancel" in gone_on.stderr and "Traceback" not in gone_on.stderr
    assert _files(tmp_path) == before  # nothing written
    settled = _cli("--db", db, "resolve", "r1", "restore", "--not-happened", "--by", "ops", cwd=tmp_path)
    assert settled.returncode == 0, settled.stderr
    stop_at[0] = 99
    gateway = ScriptedGateway(script)
    with SqliteCheckpointer(db) as store:
        result = asyncio.run(agent.run_to_end("t", session=Session("r1", gateway, store)))
        assert result.status == "completed" and result.text == "done"
        assert done == [1, 2]  # transfer 1 was in the backup: not run again
        assert gateway.calls == 2 and result.possibly_billed_twice == 1  # turn 1's call was in flight at the backup
        assert not store.checkpoint("r1").uncertain  # type: ignore[union-attr]
