"""Large payloads offloaded under encryption at rest (both backends): each blob is its run's own,
addressed by its content digest keyed with the run's data key, each chunk sealed with AES-GCM
under that key and bound to its blob and part; erase and prune remove it, rekey leaves it as it
is (the data key does not change), and a process killed between two of its chunks leaves neither
chunk nor row (the append redone stores it whole)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from _encrypt_world import key_text, keys_of, new_key, sqlite_files
from _erase_world import grep_files, secret
from prune_journals import _connect, _param, age, end, start

from cuaderno import open_journal, operations
from cuaderno.errors import JournalCorrupt, KeyMissing
from cuaderno.events import HMAC_SALT_BYTES, StepEvent
from cuaderno.journal import offloaded_payloads
from cuaderno.journal._offload import CHUNK, CODEC_SEALED_BLOB
from cuaderno.journal.base import SCHEMA_VERSION
from cuaderno.journal.keys import MasterKey, StaticKeys

SRC = str(Path(__file__).resolve().parents[2] / "src")
ABOVE = 10_000
"""The offload threshold these tests set (a payload over it goes to the blob tables)."""


def _query(url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """``sql`` on the journal, read without cuaderno (``?`` placeholders, either backend)."""
    db = _connect(url)
    try:
        return [tuple(r) for r in db.execute(_param(url, sql), params).fetchall()]
    finally:
        db.close()


def _write(url: str, sql: str, *params: Any) -> None:
    db = _connect(url)
    try:
        db.execute(_param(url, sql), params)
        db.commit()
    finally:
        db.close()


def _data(token: str) -> str:
    """About 2.5 MB of text (random hex: it compresses to half, not to nothing) holding ``token``:
    three chunks."""
    half = os.urandom(600_000).hex()
    return f"{half}{token}{half}"


def _tool(run_id: str, data: str, step: str = "t0000.tool00") -> StepEvent:
    return StepEvent(run_id=run_id, step_id=step, phase="result", kind="tool", name="f", payload={"data": data})


def _open(url: str, master: MasterKey, *older: MasterKey) -> Any:
    store = open_journal(url, keys=keys_of(master, *older))
    store.offload_above = ABOVE
    return store


def _blobs(url: str, run_id: str) -> list[tuple[str, int, str, bytes]]:
    """The chunks of the blobs ``run_id`` refers to: (address, part, codec, data)."""
    return sorted((str(a), int(p), str(c), bytes(d)) for a, p, c, d in _query(
        url, "SELECT b.digest, b.part, b.codec, b.data FROM cuaderno_blobs b JOIN cuaderno_blob_refs r "
             "ON r.digest = b.digest WHERE r.run_id = ?", run_id))


def test_each_run_s_blob_is_its_own_keyed_and_sealed_and_reads_back(journal_url: str) -> None:
    token, master = secret(), new_key()
    data = _data(token)
    store = _open(journal_url, master)
    try:
        for run_id in ("a", "b"):  # the same content in two runs
            store.append([start(run_id), _tool(run_id, data)])
        store.append([_tool("a", data, step="t0001.tool00")])  # and twice in one run
        plain = hashlib.sha256(store.load("a")[1].encoded_payload()).hexdigest()
        for run_id, steps in (("a", 3), ("b", 2)):
            events = store.load(run_id)
            assert len(events) == steps and all(e.payload == {"data": data} for e in events[1:])
        shown = {run_id: offloaded_payloads(store, run_id) for run_id in ("a", "b")}
    finally:
        store.close()
    assert [o.step_id for o in shown["a"]] == ["t0000.tool00", "t0001.tool00"]
    a, b = _blobs(journal_url, "a"), _blobs(journal_url, "b")
    parts = -(-shown["b"][0].size // CHUNK)
    assert parts == 3 and len(a) == len(b) == parts  # one blob per run: stored once within it, never shared
    (addr_a,), (addr_b,) = {c[0] for c in a}, {c[0] for c in b}
    assert addr_a != addr_b and plain not in (addr_a, addr_b)  # keyed: not the content's digest
    assert {o.sha256 for o in shown["a"]} == {addr_a} and shown["b"][0].sha256 == addr_b
    assert all(c[2].endswith("+aesgcm") for c in a + b)  # every chunk sealed
    rows = _query(journal_url, "SELECT codec, payload FROM cuaderno_events WHERE phase = 'result'")
    assert len(rows) == 3 and all(c == CODEC_SEALED_BLOB and len(bytes(p)) < 200 for c, p in rows)
    assert all(addr_a.encode() not in bytes(p) for _, p in rows)  # the reference itself is sealed
    stored = b"".join(c[3] for c in a + b) + b"".join(bytes(p) for _, p in rows)
    assert token.encode() not in stored
    with pytest.raises(KeyMissing):
        open_journal(journal_url)  # no key: refused, as every encrypted journal is


def test_a_chunk_swapped_moved_or_altered_does_not_open(journal_url: str) -> None:
    master = new_key()
    store = _open(journal_url, master)
    try:
        for run_id in ("a", "b"):
            store.append([start(run_id), _tool(run_id, _data(secret()))])
    finally:
        store.close()
    a, b = _blobs(journal_url, "a"), _blobs(journal_url, "b")

    def refused(match: str) -> None:
        store = _open(journal_url, master)
        try:
            with pytest.raises(JournalCorrupt, match=match):
                store.load("a")
            assert len(store.load("b")) == 2  # the other run reads
        finally:
            store.close()

    update = "UPDATE cuaderno_blobs SET data = ? WHERE digest = ? AND part = ?"
    # Two parts swapped (reordered): each is bound to its part number.
    _write(journal_url, update, a[1][3], a[0][0], 0)
    _write(journal_url, update, a[0][3], a[0][0], 1)
    refused("chunk 0 of its sealed payload does not open")
    _write(journal_url, update, a[0][3], a[0][0], 0)
    _write(journal_url, update, a[1][3], a[0][0], 1)
    # Another run's chunk, same part: bound to its blob (and sealed under another key).
    _write(journal_url, update, b[0][3], a[0][0], 0)
    refused("chunk 0 of its sealed payload does not open")
    _write(journal_url, update, a[0][3], a[0][0], 0)
    # One byte altered; then the codec column changed (bound too).
    _write(journal_url, update, a[2][3][:-1] + bytes([a[2][3][-1] ^ 1]), a[0][0], 2)
    refused("chunk 2 of its sealed payload does not open")
    _write(journal_url, update, a[2][3], a[0][0], 2)
    other = "raw+aesgcm" if a[0][2] == "zstd+aesgcm" else "zstd+aesgcm"
    _write(journal_url, "UPDATE cuaderno_blobs SET codec = ? WHERE digest = ? AND part = 0", other, a[0][0])
    refused("chunk 0 of its sealed payload does not open")
    _write(journal_url, "UPDATE cuaderno_blobs SET codec = ? WHERE digest = ? AND part = 0", a[0][2], a[0][0])
    # A part removed: missing, named.
    _write(journal_url, "DELETE FROM cuaderno_blobs WHERE digest = ? AND part = 2", a[0][0])
    refused("chunk 2 of its payload .* is missing")


def test_rekey_rewraps_the_data_key_and_leaves_every_chunk_as_it_is(journal_url: str) -> None:
    old, new = new_key(), new_key()
    data = _data(secret())
    store = _open(journal_url, old)
    try:
        store.append([start("a"), _tool("a", data)])
    finally:
        store.close()
    chunks = _query(journal_url, "SELECT digest, part, codec, data FROM cuaderno_blobs ORDER BY digest, part")
    store = _open(journal_url, new, old)
    try:
        assert operations.rekey(store).runs == 1
    finally:
        store.close()
    assert _query(journal_url, "SELECT key_id FROM cuaderno_keys") == [(new.key_id,)]
    assert _query(journal_url, "SELECT digest, part, codec, data FROM cuaderno_blobs ORDER BY digest, part") == chunks
    store = _open(journal_url, new)  # the old master key gone: the chunks open with the re-wrapped data key
    try:
        assert store.load("a")[1].payload == {"data": data}
    finally:
        store.close()


@pytest.mark.parametrize("erase", [False, True], ids=["prune", "erase"])
def test_erase_and_prune_remove_the_run_s_sealed_blob(journal_url: str, erase: bool) -> None:
    master = new_key()
    store = _open(journal_url, master)
    kept = _data(secret())
    try:
        store.append([start("gone"), _tool("gone", _data(secret())), end("gone")])
        store.append([start("kept"), _tool("kept", kept), end("kept")])
        store.append([start("later")])
    finally:
        store.close()
    gone = _blobs(journal_url, "gone")
    assert len(gone) == 3
    age(journal_url, 10 * 86_400, ["gone"])
    store = _open(journal_url, master)
    try:
        if erase:
            assert operations.erase(store, "gone").scrubbed
        else:
            assert operations.prune(store, "1d").runs == ["gone"]
        assert store.load("kept")[1].payload == {"data": kept}
    finally:
        store.close()
    assert _query(journal_url, "SELECT count(*) FROM cuaderno_blobs WHERE digest = ?", gone[0][0]) == [(0,)]
    assert _query(journal_url, "SELECT count(*) FROM cuaderno_blob_refs WHERE run_id = 'gone'") == [(0,)]
    assert len(_blobs(journal_url, "kept")) == 3
    assert _query(journal_url, "SELECT count(*) FROM cuaderno_keys WHERE run_id = 'gone'") == [(0,)]


def test_an_erased_run_s_sealed_chunks_leave_every_file(tmp_path: Path) -> None:
    """SQLite: not a byte run of the erased run's chunks (sealed: its secret never was in a file)
    is left in the database, its -wal or -shm."""
    path, token, master = tmp_path / "j.db", secret(), new_key()
    store = _open(str(path), master)
    try:
        store.append([start("gone"), _tool("gone", _data(token)), end("gone")])
        store.append([start("kept"), _tool("kept", _data(secret())), end("kept")])
        chunks = _blobs(str(path), "gone")
        probes = [c[3][100:164] for c in chunks]  # 64 bytes of each sealed chunk
        files = [f for f in sqlite_files(path) if f.name.endswith(("db", "-wal", "-shm"))]
        assert all(sum(f.read_bytes().count(p) for f in files if f.exists()) > 0 for p in probes)  # can fail
        assert grep_files(files, token) == {f.name: 0 for f in files}
        assert operations.erase(store, "gone").scrubbed
        files = [f for f in sqlite_files(path) if f.name.endswith(("db", "-wal", "-shm"))]
        left = {f.name: sum(f.read_bytes().count(p) for p in probes) for f in files if f.exists()}
        assert left == dict.fromkeys(left, 0), left
        assert grep_files(files, token) == {f.name: 0 for f in files}
    finally:
        store.close()


def _killed_child(url: str, master: MasterKey, point: str, code: str) -> None:
    env = {**os.environ, "CUADERNO_CRASH_AT": point, "CUADERNO_KEY": key_text(master), "PYTHONPATH": SRC}
    env.pop("CUADERNO_OLD_KEYS", None)
    env.pop("CUADERNO_KEY_FILE", None)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=180, check=False)
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr


@pytest.mark.parametrize("after", [1, 2])
def test_killed_between_sealed_chunks_leaves_neither_chunk_nor_row_and_the_redone_append_reads(
        journal_url: str, after: int) -> None:
    master, token = new_key(), secret()
    data = "q" * 1_500_000 + token + "r" * 1_000_000
    _killed_child(journal_url, master, f"offload.O1:{after}", f"""
        from cuaderno import open_journal
        from cuaderno.events import StepEvent
        store = open_journal({journal_url!r})
        store.offload_above = {ABOVE}
        store.append([StepEvent(run_id="k", step_id="run", phase="start", kind="run", payload={{"task": "t"}})])
        store.append([StepEvent(run_id="k", step_id="t0000.tool00", phase="result", kind="tool", name="f",
                                payload={{"data": "q" * 1_500_000 + {token!r} + "r" * 1_000_000}})])
        print("not killed")
    """)
    # Rolled back whole: no chunk, no reference, no row; the run's data key (written by the first
    # append) stays.
    assert _query(journal_url, "SELECT count(*) FROM cuaderno_blobs") == [(0,)]
    assert _query(journal_url, "SELECT count(*) FROM cuaderno_blob_refs") == [(0,)]
    assert _query(journal_url, "SELECT count(*) FROM cuaderno_events") == [(1,)]
    store = _open(journal_url, master)
    try:
        assert len(store.load("k")) == 1
        store.append([_tool("k", data)])  # what a resume does: the append again
        assert store.load("k")[1].payload == {"data": data}
    finally:
        store.close()
    assert len(_blobs(journal_url, "k")) == 3


def test_an_encrypted_run_killed_inside_its_sealed_offload_never_reruns_its_tool_blindly(journal_url: str,
                                                                                        tmp_path: Path) -> None:
    """A real run: its tool's 2 MB result is being offloaded (one chunk sealed and written) when
    the process is killed. No chunk is left; the resumed run, whose tool (not idempotent) ran
    once and whose result was never committed, asks a person (``needs_human``) rather than run
    it again: the tool's own ledger says it ran once. The same as a kill inside any result
    transaction; the offload adds nothing a resume could mistake for the result."""
    from test_encrypt_large_payload import _child

    token, ledger, master = secret(), tmp_path / "ledger.txt", new_key()
    status, out = _child("record", journal_url, token, ledger, key_text(master), crash="offload.O1:1")
    assert status == -9, (status, out[-2000:])
    assert ledger.read_text().count("called") == 1
    assert _query(journal_url, "SELECT count(*) FROM cuaderno_blobs") == [(0,)]
    status, out = _child("resume", journal_url, token, ledger, key_text(master))
    assert status == 0 and "STATUS needs_human" in out, out[-2000:]
    assert ledger.read_text().count("called") == 1  # not run again
    assert _query(journal_url, "SELECT count(*) FROM cuaderno_blobs") == [(0,)]
    store = open_journal(journal_url, keys=StaticKeys(master))
    try:
        assert not any(e.kind == "tool" and e.phase == "result" for e in store.load("big-1"))
        assert offloaded_payloads(store, "big-1") == []
    finally:
        store.close()


def test_a_schema_6_file_is_raised_to_7_by_its_first_sealed_blob_only(tmp_path: Path) -> None:
    """A cuaderno of schema 6 would take a keyed reference or a sealed chunk for damage: the first
    transaction that writes one raises the file to schema 7 (which it refuses); until then an
    encrypted file keeps its schema."""
    import sqlite3
    from contextlib import closing

    from cuaderno.journal._sqlite_file import _OFFLOADED_SINCE, _SEALED_BLOB_SINCE

    path, master = str(tmp_path / "runs.db"), new_key()
    store = _open(path, master)
    try:
        store.append([start("r1")])
    finally:
        store.close()
    schema = "SELECT value FROM cuaderno_meta WHERE key='schema_version'"
    with closing(sqlite3.connect(path)) as con:  # as a cuaderno of schema 6 left it
        con.execute("UPDATE cuaderno_meta SET value=? WHERE key='schema_version'", (str(_OFFLOADED_SINCE),))
        con.commit()
    store = _open(path, master)
    try:
        # Rows keyed as a cuaderno of schema 7 keyed them (HMAC-SHA256, a 16-byte key, carried as an
        # importer carries it): they need no schema 8, so the step to 7 is what is seen.
        store.append([_hmac_keyed(_tool("r1", "small", step="t0009.tool00"))])
        assert _query(path, schema) == [(str(_OFFLOADED_SINCE),)]  # nothing sealed offloaded: kept
        store.append([_hmac_keyed(_tool("r1", _data(secret())))])
        assert _query(path, schema) == [(str(_SEALED_BLOB_SINCE),)]
        assert len(store.load("r1")) == 3
        store.append([_tool("r1", "small", step="t0010.tool00")])  # keyed BLAKE2b: schema 8
        assert _query(path, schema) == [(str(SCHEMA_VERSION),)]
    finally:
        store.close()


def _hmac_keyed(ev: StepEvent) -> StepEvent:
    ev.salt = os.urandom(HMAC_SALT_BYTES)
    return ev


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from cuaderno.testing.ledger import LedgerProcess

    with LedgerProcess(tmp_path_factory.mktemp("ledger-sealblob") / "dedup.db", mode="dedup") as served:
        yield served


TURNS = 2


@pytest.mark.parametrize("point", ["offload.O1:2", "offload.O1:5"], ids=["first-result", "second-result"])
def test_a_run_killed_inside_a_sealed_offload_resumes_to_its_end_each_transfer_once(
        journal_url: str, point: str, ledger: Any) -> None:
    """A real run of two transfers, each result about 2.5 MB (three sealed chunks): SIGKILLed
    after a chunk of the first or the second result, inside its transaction. A second process
    resumes it to its end; the ledger's receipts (not the journal) say each transfer happened
    once; each result read back is the receipt the ledger keeps; every chunk stored belongs to a
    result row (no orphan), each sealed."""
    from cuaderno.testing.ledger import read_receipts

    master, run_id = new_key(), f"pay-{point[-1]}-{os.urandom(3).hex()}"
    env = {**os.environ, "CUADERNO_KEY": key_text(master), "PYTHONPATH": SRC}
    for name in ("CUADERNO_CRASH_AT", "CUADERNO_OLD_KEYS", "CUADERNO_KEY_FILE"):
        env.pop(name, None)
    argv = [sys.executable, str(Path(__file__).with_name("_sealed_offload_child.py")), journal_url, run_id,
            ledger.url, str(TURNS)]
    killed = subprocess.run(argv, env={**env, "CUADERNO_CRASH_AT": point}, capture_output=True, text=True,
                            timeout=300, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr[-2000:]
    chunks_after_kill = len(_blobs(journal_url, run_id))
    assert chunks_after_kill == (0 if point.endswith(":2") else 3)  # the killed result's chunks rolled back
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and "STATUS completed" in done.stdout, done.stdout + done.stderr[-2000:]
    receipts = read_receipts(ledger.db_path, business_id=run_id)
    assert len(receipts) == TURNS and len({r["key"] for r in receipts}) == TURNS
    store = open_journal(journal_url, keys=StaticKeys(master))
    try:
        results = [e for e in store.load(run_id) if e.kind == "tool" and e.phase == "result"]
        shown = offloaded_payloads(store, run_id)
    finally:
        store.close()
    assert len(results) == TURNS and len(shown) == TURNS
    kept = {r["key"] for r in receipts}
    found = [{k for k in kept if k in str(e.payload)} for e in results]  # each result holds its receipt
    assert all(len(f) == 1 for f in found) and set().union(*found) == kept
    chunks = _blobs(journal_url, run_id)
    assert len(chunks) == sum(-(-o.size // CHUNK) for o in shown) == 3 * TURNS
    assert {c[0] for c in chunks} == {o.sha256 for o in shown}  # every chunk is a result row's
    assert all(c[2].endswith("+aesgcm") for c in chunks)


def test_show_export_fork_and_a_backup_read_an_encrypted_offloaded_payload(tmp_path: Path) -> None:
    """The operations that read a run whole: ``shown`` (what ``show`` and the page render) and
    ``export_lines`` read the payload; a fork copies it into a run of its own (another data key:
    another blob, at another address); a backup (SQLite) carries the sealed chunks and its copy
    reads them with the key."""
    from cuaderno.journal.backups import backup

    path, master = str(tmp_path / "j.db"), new_key()
    data = _data(secret())
    model = StepEvent(run_id="a", step_id="t0001.model", phase="request", kind="model", payload={"turn": 1})
    store = _open(path, master)
    try:
        store.append([start("a"), _tool("a", data), model])
        _, events = operations.shown(store, "a")
        assert events[1].payload == {"data": data}
        assert data in list(operations.export_lines(store, "a"))[1]
        operations.fork(store, "a", at="t0001.model", new_run_id="b")
        assert store.load("b")[1].payload == {"data": data}
        forked, original = offloaded_payloads(store, "b"), offloaded_payloads(store, "a")
    finally:
        store.close()
    assert len(forked) == len(original) == 1 and forked[0].sha256 != original[0].sha256
    assert {c[0] for c in _blobs(path, "b")} == {forked[0].sha256}
    report = backup(path, tmp_path / "copy.db", keys=StaticKeys(master))
    assert report.runs == 2
    copy = _open(str(tmp_path / "copy.db"), master)
    try:
        assert copy.load("a")[1].payload == copy.load("b")[1].payload == {"data": data}
    finally:
        copy.close()


@pytest.mark.parametrize("point", ["erase.E2:1", "prune.P1:1"], ids=["erase", "prune"])
def test_killed_before_an_erase_or_prune_commits_no_sealed_blob_is_lost_then_it_finishes(journal_url: str,
                                                                                        point: str) -> None:
    master = new_key()
    store = _open(journal_url, master)
    gone, kept = _data(secret()), _data(secret())
    try:
        store.append([start("gone"), _tool("gone", gone), end("gone")])
        store.append([start("kept"), _tool("kept", kept), end("kept")])
        store.append([start("later")])  # SQLite keeps the run of the journal's last row
    finally:
        store.close()
    age(journal_url, 10 * 86_400, ["gone"])
    before = _query(journal_url, "SELECT digest, part, codec, data FROM cuaderno_blobs ORDER BY digest, part")
    act = 'operations.erase(store, "gone")' if point.startswith("erase") else 'operations.prune(store, "1d")'
    _killed_child(journal_url, master, point, f"""
        from cuaderno import open_journal, operations
        store = open_journal({journal_url!r})
        {act}
        print("not killed")
    """)
    # Rolled back whole: every chunk as it was, every run reads.
    assert _query(journal_url, "SELECT digest, part, codec, data FROM cuaderno_blobs ORDER BY digest, part") == before
    store = _open(journal_url, master)
    try:
        assert store.load("gone")[1].payload == {"data": gone}
        if point.startswith("erase"):
            assert operations.erase(store, "gone").scrubbed
        else:
            assert operations.prune(store, "1d").runs == ["gone"]
        assert store.load("kept")[1].payload == {"data": kept}
    finally:
        store.close()
    assert _blobs(journal_url, "gone") == [] and len(_blobs(journal_url, "kept")) == 3
    assert _query(journal_url, "SELECT count(*) FROM cuaderno_blobs") == [(3,)]  # only the kept run's
