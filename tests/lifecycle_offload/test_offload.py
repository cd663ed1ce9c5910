"""Issue 35, part 4: payloads over the offload threshold are stored once, content-addressed, in the
journal's own tables, read back in chunks, covered by the chain; prune, erase and backup keep,
remove and carry the blobs (both backends)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from prune_journals import _connect, _param, age, end, start

from cuaderno import JournalCorrupt, open_journal, operations
from cuaderno.events import HMAC_SALT_BYTES, StepEvent
from cuaderno.journal._offload import CHUNK, CODEC_JSON_BLOB, DEFAULT_OFFLOAD_ABOVE, offload_above
from cuaderno.journal.base import DEFAULT_MAX_PAYLOAD, SCHEMA_VERSION


def _tool(run_id: str, data: str, step: str = "t0000.tool00") -> StepEvent:
    return StepEvent(run_id=run_id, step_id=step, phase="result", kind="tool", name="fetch", fingerprint="a1",
                     payload={"outcome": "ok", "result": {"data": data}})


def _big(seed: str, size: int) -> str:
    """``size`` characters that compress (repeated lines) yet differ per seed."""
    line = hashlib.sha256(seed.encode()).hexdigest() + " some text of a page\n"
    return (line * (size // len(line) + 1))[:size]


def _q(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    db = _connect(url)
    try:
        return [tuple(r) for r in db.execute(_param(url, sql), params).fetchall()]
    finally:
        db.close()


def _store(url: str, above: int = 10_000) -> Any:
    store = open_journal(url)
    store.offload_above = above
    return store


def _run(store: Any, run_id: str, data: str, *, closed: bool = True) -> None:
    store.append([start(run_id)])
    store.append([_tool(run_id, data)])
    if closed:
        store.append([end(run_id)])


def test_the_default_threshold_is_under_the_limit_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    from cuaderno.errors import UsageError

    assert CHUNK <= DEFAULT_OFFLOAD_ABOVE < DEFAULT_MAX_PAYLOAD
    assert offload_above(object()) == DEFAULT_OFFLOAD_ABOVE
    store = open_journal(str(tmp_path / "runs.db"))
    try:
        store.offload_above = 0  # type: ignore[attr-defined]
        with pytest.raises(UsageError, match="offload_above"):
            store.append([start("r1")])
        assert store.checkpoint("r1") is None  # nothing written
    finally:
        store.close()


def test_a_large_payload_is_stored_once_in_chunks_and_reads_back_verified(journal_url: str) -> None:
    data = _big("a", 3 * CHUNK + 12_345)  # four chunks, the last short
    store = _store(journal_url)
    try:
        _run(store, "r1", data)
        _run(store, "r2", data)  # the same content: the same blob
        _run(store, "r3", _big("b", 20_000))  # another content, one chunk
        for run_id in ("r1", "r2"):
            events = store.load(run_id)  # the chain checked over the content
            assert events[1].payload["result"]["data"] == data
            assert events[1].codec == "json"
    finally:
        store.close()
    rows = _q(journal_url, "SELECT run_id, codec, payload FROM cuaderno_events WHERE step_id='t0000.tool00' "
                           "ORDER BY run_id")
    assert [r[1] for r in rows] == [CODEC_JSON_BLOB] * 3
    refs = [bytes(r[2]) for r in rows]
    assert refs[0] == refs[1] != refs[2] and all(len(r) < 120 for r in refs)
    digest = refs[0].split(b":")[1].decode()
    json_bytes = StepEvent(run_id="x", step_id="x", phase="x", kind="x",
                           payload={"outcome": "ok", "result": {"data": data}}).encoded_payload()
    assert digest == hashlib.sha256(json_bytes).hexdigest()  # content-addressed
    parts = _q(journal_url, "SELECT part FROM cuaderno_blobs WHERE digest=? ORDER BY part", (digest,))
    assert [p[0] for p in parts] == [0, 1, 2, 3]
    assert _q(journal_url, "SELECT count(DISTINCT digest) FROM cuaderno_blobs") == [(2,)]
    assert sorted(_q(journal_url, "SELECT run_id FROM cuaderno_blob_refs WHERE digest=?", (digest,))) == [
        ("r1",), ("r2",)]
    # Under the threshold: the row holds its payload.
    store = _store(journal_url)
    try:
        _run(store, "small", "x" * 5_000)
    finally:
        store.close()
    assert _q(journal_url, "SELECT codec FROM cuaderno_events WHERE run_id='small' AND step_id='t0000.tool00'") != [
        (CODEC_JSON_BLOB,)]


def test_a_blob_altered_or_missing_is_reported_as_damage(journal_url: str) -> None:
    data = _big("c", 2 * CHUNK)
    store = _store(journal_url)
    try:
        _run(store, "r1", data)
    finally:
        store.close()
    (digest,), = _q(journal_url, "SELECT DISTINCT digest FROM cuaderno_blobs")
    db = _connect(journal_url)
    try:  # another chunk's bytes in chunk 1: each decompresses, the content differs
        other = db.execute(_param(journal_url, "SELECT codec, data FROM cuaderno_blobs WHERE digest=? AND part=0"),
                           (digest,)).fetchone()
        db.execute(_param(journal_url, "UPDATE cuaderno_blobs SET data=? WHERE digest=? AND part=1"),
                   (bytes(other[1]), digest))
    finally:
        db.close()
    store = open_journal(journal_url)
    try:
        with pytest.raises(JournalCorrupt, match="does not match its digest"):
            store.load("r1")
    finally:
        store.close()
    db = _connect(journal_url)
    try:
        db.execute(_param(journal_url, "DELETE FROM cuaderno_blobs WHERE digest=? AND part=1"), (digest,))
    finally:
        db.close()
    store = open_journal(journal_url)
    try:
        with pytest.raises(JournalCorrupt, match="chunk 1 of its payload"):
            store.load("r1")
    finally:
        store.close()


def test_prune_keeps_a_blob_a_kept_run_uses_and_removes_it_with_the_last(journal_url: str) -> None:
    shared, own = _big("shared", CHUNK + 10), _big("own", 50_000)
    store = _store(journal_url)
    try:
        _run(store, "old", shared)
        _run(store, "old2", own)
        _run(store, "new", shared)
        age(journal_url, 10 * 86_400, ["old", "old2"])
        report = operations.prune(store, "1d", vacuum=False)
        assert sorted(report.runs) == ["old", "old2"]
        assert store.load("new")[1].payload["result"]["data"] == shared  # its blob kept
        assert _q(journal_url, "SELECT DISTINCT run_id FROM cuaderno_blob_refs") == [("new",)]
        assert _q(journal_url, "SELECT count(DISTINCT digest) FROM cuaderno_blobs") == [(1,)]  # "own" went
        store.append([start("later")])  # SQLite keeps the run of the journal's last row (its anchor)
        age(journal_url, 10 * 86_400, ["new"])
        assert operations.prune(store, "1d", vacuum=False).runs == ["new"]
        assert _q(journal_url, "SELECT count(*) FROM cuaderno_blobs") == [(0,)]
        assert _q(journal_url, "SELECT count(*) FROM cuaderno_blob_refs") == [(0,)]
    finally:
        store.close()


def test_erase_removes_a_blob_only_the_run_used_and_drops_its_reference_to_a_shared_one(journal_url: str) -> None:
    shared, own = _big("shared", CHUNK + 10), _big("own", 50_000)
    store = _store(journal_url)
    try:
        _run(store, "a", shared)
        _run(store, "b", shared)
        _run(store, "c", own)
        operations.erase(store, "c")
        assert _q(journal_url, "SELECT count(DISTINCT digest) FROM cuaderno_blobs") == [(1,)]  # own's went
        operations.erase(store, "a")
        # "b" still uses the shared blob: it stays, and nothing of "a" refers to it any more.
        assert _q(journal_url, "SELECT run_id FROM cuaderno_blob_refs") == [("b",)]
        assert _q(journal_url, "SELECT count(*) FROM cuaderno_events WHERE run_id='a' AND codec=?",
                  (CODEC_JSON_BLOB,)) == [(0,)]
        assert store.load("b")[1].payload["result"]["data"] == shared
        store.load("a")  # its chain still verifies
        operations.erase(store, "b")
        assert _q(journal_url, "SELECT count(*) FROM cuaderno_blobs") == [(0,)]
    finally:
        store.close()


def test_a_backup_carries_the_blobs_and_a_restore_reads_them(tmp_path: Path) -> None:
    db, dest = str(tmp_path / "runs.db"), tmp_path / "b.db"
    data = _big("backup", 2 * CHUNK + 1)
    store = _store(db)
    try:
        _run(store, "r1", data)
    finally:
        store.close()
    operations.backup(db, dest)  # verified inside: every chain (so every blob) read back
    Path(db).unlink()
    for suffix in ("-wal", "-shm"):
        Path(db + suffix).unlink(missing_ok=True)
    operations.restore(dest, db, runs_after_backup="accept")
    store = open_journal(db)
    try:
        assert store.load("r1")[1].payload["result"]["data"] == data
    finally:
        store.close()


def test_an_older_file_gets_the_tables_at_open_and_its_schema_raised_with_its_first_offloaded_row(
        tmp_path: Path) -> None:
    import sqlite3

    from cuaderno.journal._sqlite_file import _KEYED_SINCE, _OFFLOADED_SINCE

    path = str(tmp_path / "runs.db")
    store = _store(path)
    try:
        store.append([start("r1")])
    finally:
        store.close()
    con = sqlite3.connect(path)
    # As schema 4 left it (before the keys' and the blobs' tables).
    con.execute("UPDATE cuaderno_meta SET value=? WHERE key='schema_version'", (str(_KEYED_SINCE),))
    con.execute("DROP TABLE cuaderno_blob_refs")
    con.execute("DROP TABLE cuaderno_blobs")
    con.execute("DROP TABLE cuaderno_keys")
    con.commit()
    con.close()
    schema = "SELECT value FROM cuaderno_meta WHERE key='schema_version'"
    store = _store(path)
    try:
        # Rows keyed as a cuaderno of schema 4 to 7 keyed them (HMAC-SHA256, a 16-byte key, carried
        # as an importer carries it): they need no schema 8, so the step to 6 is what is seen.
        store.append([_hmac_keyed(_tool("r1", "small", step="t0009.tool00"))])
        assert _q(path, schema) == [(str(_KEYED_SINCE),)]  # tables made, a plain journal's schema kept
        store.append([_hmac_keyed(_tool("r1", _big("x", 20_000)))])
        assert _q(path, schema) == [(str(_OFFLOADED_SINCE),)]
        assert store.load("r1")[2].payload["result"]["data"] == _big("x", 20_000)
        store.append([_tool("r1", "small", step="t0010.tool00")])  # keyed BLAKE2b: schema 8
        assert _q(path, schema) == [(str(SCHEMA_VERSION),)]
    finally:
        store.close()


def _hmac_keyed(ev: StepEvent) -> StepEvent:
    ev.salt = os.urandom(HMAC_SALT_BYTES)
    return ev


def test_show_counts_offloaded_payloads_and_renders_a_reference(journal_url: str) -> None:
    import json

    from typer.testing import CliRunner

    from cuaderno.cli import app

    data = _big("show", 3 * CHUNK)
    store = _store(journal_url)
    try:
        _run(store, "r1", data)
    finally:
        store.close()
    (ref,), = _q(journal_url, "SELECT payload FROM cuaderno_events WHERE run_id='r1' AND codec=?", (CODEC_JSON_BLOB,))
    _, digest, size, _ = bytes(ref).decode().split(":")
    runner = CliRunner()
    shown = runner.invoke(app, ["--db", journal_url, "show", "r1"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert f"1 payload, {int(size):,} bytes" in shown.output
    assert f"[offloaded: {int(size):,} bytes, sha256 {digest[:16]}" in shown.output
    assert len(shown.output) < 20_000  # a reference, not megabytes of text
    as_json = runner.invoke(app, ["--db", journal_url, "show", "r1", "--json"])
    assert as_json.exit_code == 0, as_json.output
    detail = json.loads(as_json.output)
    assert detail["offloaded"] == {"payloads": 1, "bytes": int(size), "each": [
        {"step_id": "t0000.tool00", "phase": "result", "size": int(size), "sha256": digest}]}
