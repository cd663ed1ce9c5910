"""A journal encrypted at rest offloads under its run's data key: a 2 MB tool result holding a
secret (over the offload threshold, 1 MB) rests in the blob tables, each chunk sealed, at an
address keyed by the run's key (not the content's digest), its row holding only a sealed
reference; a run killed right after recording it resumes and reads it (both backends).

A real run in a child process records the result and is SIGKILLed at ``tool.K7`` (right after
the commit that holds it); another child resumes the run to its end. The tool's own ledger file,
not the journal, proves it ran once."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _encrypt_world import key_text, new_key, raw_tables, sqlite_files
from _erase_world import grep_files, secret

from cuaderno import open_journal
from cuaderno.errors import UsageError
from cuaderno.events import StepEvent
from cuaderno.journal import SqliteCheckpointer, offloaded_payloads
from cuaderno.journal._offload import CHUNK
from cuaderno.journal.keys import StaticKeys

HERE = Path(__file__).resolve().parent


def _child(mode: str, url: str, token: str, ledger: Path, key: str, crash: str | None = None) -> tuple[int, str]:
    env = {**os.environ, "CUADERNO_KEY": key,
           "PYTHONPATH": os.pathsep.join([str(HERE.parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    for name in ("CUADERNO_CRASH_AT", "CUADERNO_KEY_FILE", "CUADERNO_OLD_KEYS"):
        env.pop(name, None)
    if crash is not None:
        env["CUADERNO_CRASH_AT"] = crash
    proc = subprocess.run([sys.executable, str(HERE / "_encrypt_large_child.py"), mode, url, token, str(ledger)],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    return proc.returncode, proc.stdout.decode()


def _stored_bytes(url: str) -> bytes:
    """Every value of the journal's events, runs and blob tables as stored, read without cuaderno."""
    if url.startswith("postgresql://"):
        import psycopg
        from psycopg import sql

        schema = url.split("schema=")[1]
        with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
            rows = [r for n in ("cuaderno_events", "cuaderno_runs", "cuaderno_blobs") for r in conn.execute(
                sql.SQL("SELECT * FROM {}.{}").format(sql.Identifier(schema), sql.Identifier(n))).fetchall()]
    else:
        import sqlite3
        from contextlib import closing

        with closing(sqlite3.connect(url)) as db:
            rows = [r for n in ("cuaderno_events", "cuaderno_runs", "cuaderno_blobs")
                    for r in db.execute(f"SELECT * FROM {n}").fetchall()]  # noqa: S608 (fixed names)
    return b"\n".join(bytes(v) if isinstance(v, (bytes, memoryview)) else str(v).encode() for r in rows for v in r)


def _count(url: str, query: str, table: str) -> int:
    """``query`` on ``table`` (named where ``{}`` stands), read without cuaderno."""
    if url.startswith("postgresql://"):
        import psycopg
        from psycopg import sql

        schema = url.split("schema=")[1]
        with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
            row = conn.execute(sql.SQL(query).format(sql.Identifier(schema, table))).fetchone()
    else:
        import sqlite3
        from contextlib import closing

        with closing(sqlite3.connect(url)) as db:
            row = db.execute(query.format(table)).fetchone()
    assert row is not None
    return int(row[0])


def test_a_2_mb_tool_result_rests_sealed_in_its_row_and_the_run_resumes_and_reads_it(journal_url: str,
                                                                                     tmp_path: Path) -> None:
    token, ledger, master = secret(), tmp_path / "ledger.txt", new_key()
    status, out = _child("record", journal_url, token, ledger, key_text(master), crash="tool.K7:1")
    assert status == -9, (status, out[-2000:])  # SIGKILLed at the point, the result committed
    assert ledger.read_text().count("called") == 1
    if not journal_url.startswith("postgresql://"):  # the files as they rest, -wal and -shm included
        files = [f for f in sqlite_files(Path(journal_url)) if f.name.endswith(("db", "-wal", "-shm"))]
        assert any(f.name.endswith("-wal") and f.exists() for f in files)  # the commit is in the -wal
        assert grep_files(files, token) == {f.name: 0 for f in files}
    stored = _stored_bytes(journal_url)  # (SQLite: this reader's close folds the -wal in)
    assert token.encode() not in stored and len(stored) > 1_000_000  # the 2 MB is there, sealed
    # Offloaded: the row holds a sealed reference, the blob's chunks are each sealed.
    assert _count(journal_url, "SELECT count(*) FROM {} WHERE codec = 'json+blob+aesgcm' AND phase = 'result' "
                  "AND length(payload) < 1000", "cuaderno_events") == 1
    chunks = _count(journal_url, "SELECT count(*) FROM {}", "cuaderno_blobs")
    assert chunks >= 2
    assert _count(journal_url, "SELECT count(*) FROM {} WHERE codec LIKE '%+aesgcm'", "cuaderno_blobs") == chunks
    assert _count(journal_url, "SELECT count(*) FROM {} WHERE run_id = 'big-1'", "cuaderno_blob_refs") == 1
    assert raw_tables(journal_url)["cuaderno_keys"]  # the run's data key, wrapped

    status, out = _child("resume", journal_url, token, ledger, key_text(master))
    assert status == 0 and "STATUS completed" in out and "SEEN" in out, out[-2000:]
    assert ledger.read_text().count("called") == 1  # the result came from the journal: no second call
    assert token.encode() not in _stored_bytes(journal_url)
    store = open_journal(journal_url, keys=StaticKeys(master))
    try:
        result = next(e for e in store.load("big-1") if e.kind == "tool" and e.phase == "result")
        assert token in str(result.payload) and len(str(result.payload)) > 2_000_000
        (off,) = offloaded_payloads(store, "big-1")
        assert (off.step_id, off.phase, off.size) == (result.step_id, "result", len(result.encoded_payload()))
        assert chunks == -(-off.size // CHUNK)
        # Its address is keyed by the run's data key: not the plaintext's digest, which would let
        # anyone holding the file confirm a guessed content.
        assert off.sha256 != hashlib.sha256(result.encoded_payload()).hexdigest()
        assert _count(journal_url, "SELECT count(DISTINCT digest) FROM {}", "cuaderno_blobs") == 1
    finally:
        store.close()


def test_an_encrypted_store_refuses_a_bad_threshold_as_a_plain_one_does(tmp_path: Path) -> None:
    store = SqliteCheckpointer(tmp_path / "runs.db", keys=StaticKeys(new_key()))
    try:
        store.offload_above = 0  # type: ignore[attr-defined]
        with pytest.raises(UsageError, match="offload_above"):
            store.append([StepEvent(run_id="r1", step_id="run", phase="start", kind="run", fingerprint="f",
                                    payload={"task": "t"})])
        assert store.checkpoint("r1") is None  # nothing written
    finally:
        store.close()
