"""Payloads compressed at rest by the SQLite store: invisible to every reader, damage still found.

Every claim is checked on the file itself (raw ``sqlite3``), not only through the store.
"""

from __future__ import annotations

import base64
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import zstandard
from _files import journal_files, load_refused

from cuaderno.errors import JournalConflict, JournalCorrupt, JournalError, SchemaTooNew, UsageError
from cuaderno.events import CODEC_JSON, StepEvent, encode_payload
from cuaderno.journal import SqliteCheckpointer, _compress, _sql_write
from cuaderno.journal._compress import CODEC_JSON_ZSTD, COMPRESS_FROM
from cuaderno.journal.base import SCHEMA_VERSION

_RNG = random.Random(1)
PROSE = " ".join(_RNG.choice(["the", "transfer", "of", "account", "was", "approved", "refund", "to", "ana", "from",
                              "balance", "on", "order", "invoice", "paid", "pending", "and", "a", "with", "for"])
                 for _ in range(400))
"""About 2 KB of English-like words (compressed to about 0.4 of that; English prose to about 0.5)."""


MAIN_AND_WAL = ("-wal",)
"""What these tests compare: some keep a store open, whose -shm changes with every read."""


def _ev(step: str, payload: dict[str, Any], phase: str = "result") -> StepEvent:
    return StepEvent(run_id="r", step_id=step, phase=phase, kind="tool", name="work", fingerprint="fp",
                     payload=payload)


def _rows(path: Path) -> list[tuple[str, str, bytes]]:
    with closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT step_id, codec, payload FROM cuaderno_events ORDER BY seq").fetchall()


def _journal(path: Path, **kwargs: Any) -> list[StepEvent]:
    with SqliteCheckpointer(path, **kwargs) as store:
        return store.append([StepEvent(run_id="r", step_id="run", phase="start", kind="run"),
                             _ev("big", {"value": PROSE}), _ev("small", {"value": "short"})])


def test_large_payloads_rest_compressed_and_read_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    written = _journal(path)
    rows = {step: (codec, blob) for step, codec, blob in _rows(path)}
    logical = encode_payload({"value": PROSE})
    assert rows["big"][0] == CODEC_JSON_ZSTD and len(rows["big"][1]) < len(logical) // 2
    assert zstandard.ZstdDecompressor().decompress(rows["big"][1]) == logical  # a standard frame
    assert rows["small"] == (CODEC_JSON, encode_payload({"value": "short"}))
    for kwargs in ({}, {"readonly": True}, {"compress": False}):
        with SqliteCheckpointer(path, **kwargs) as store:
            loaded = store.load("r")
        assert loaded == written  # same codec, bytes, hashes: the chain checks out
        assert loaded[1].codec == CODEC_JSON and loaded[1].payload == {"value": PROSE}


def test_compress_false_keeps_plain_json_and_one_journal_holds_both(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path, compress=False) as store:
        store.append([StepEvent(run_id="r", step_id="run", phase="start", kind="run"), _ev("a", {"value": PROSE})])
    with SqliteCheckpointer(path, compress=True) as store:
        store.append([_ev("b", {"value": PROSE})])
    assert [codec for _, codec, _ in _rows(path)] == [CODEC_JSON, CODEC_JSON, CODEC_JSON_ZSTD]
    with closing(sqlite3.connect(path)) as db:  # plain rows stay queryable with SQLite's JSON functions
        assert db.execute("SELECT json_extract(payload, '$.value') FROM cuaderno_events WHERE step_id='a'"
                          ).fetchone()[0] == PROSE
    with SqliteCheckpointer(path) as store:
        assert [e.payload.get("value") for e in store.load("r")] == [None, PROSE, PROSE]


def test_the_threshold_and_payloads_that_do_not_shrink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _compress.pack(b"{" + b" " * (COMPRESS_FROM - 3) + b"}")[0] == CODEC_JSON  # one byte short
    assert _compress.pack(b"{" + b" " * (COMPRESS_FROM - 2) + b"}")[0] == CODEC_JSON_ZSTD
    noise = encode_payload({"v": base64.b64encode(random.Random(2).randbytes(30_000)).decode()})
    codec, blob = _compress.pack(noise)  # the large-window path
    assert codec == CODEC_JSON_ZSTD and zstandard.ZstdDecompressor().decompress(blob) == noise
    # A compression that would save less than a sixteenth is not kept (nothing to gain on reading).
    monkeypatch.setattr(_compress, "_compressor", lambda: _Fixed(len(noise) - len(noise) // 20))
    assert _compress.pack(noise) == (CODEC_JSON, noise)


class _Fixed:
    def __init__(self, size: int) -> None:
        self.size = size

    def compress(self, data: bytes) -> bytes:
        return b"x" * self.size


def test_the_same_event_again_is_a_no_op_and_another_one_a_conflict(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    written = _journal(path)
    before = journal_files(path, MAIN_AND_WAL)
    with SqliteCheckpointer(path) as store:
        assert store.append([_ev("big", {"value": PROSE})]) == [written[1]]  # compared on the JSON bytes
        with pytest.raises(JournalConflict):
            store.append([_ev("big", {"value": PROSE + "!"})])
    assert journal_files(path, MAIN_AND_WAL) == before  # nothing was written
    rows = _rows(path)
    with SqliteCheckpointer(path, compress=False) as store:  # also against a store that would not compress
        assert store.append([_ev("big", {"value": PROSE})]) == [written[1]]
    assert _rows(path) == rows


@pytest.mark.parametrize(("damage", "message"), [
    ("UPDATE cuaderno_events SET payload=substr(payload, 1, length(payload) - 5) WHERE step_id='big'",
     "row 2 .*does not decompress"),
    ("UPDATE cuaderno_events SET payload=CAST('garbage' AS BLOB) WHERE step_id='big'", "row 2 .*does not decompress"),
    ("UPDATE cuaderno_events SET codec='json+zstd' WHERE step_id='small'", "row 3 .*does not decompress"),
    ("UPDATE cuaderno_events SET codec='json' WHERE step_id='big'", "row 2 .* was altered"),
    ("UPDATE cuaderno_events SET payload=? WHERE step_id='big'", "row 2 .* was altered"),
], ids=["truncated", "garbage", "plain-row-tagged-compressed", "compressed-row-tagged-plain", "other-text"])
def test_a_damaged_compressed_row_is_journal_corrupt_and_the_file_untouched(tmp_path: Path, damage: str,
                                                                           message: str) -> None:
    path = tmp_path / "j.db"
    _journal(path)
    with closing(sqlite3.connect(path)) as db, db:
        params = (zstandard.ZstdCompressor().compress(encode_payload({"value": PROSE.upper()})),) if "?" in damage else ()
        assert db.execute(damage, params).rowcount == 1
    load_refused(path, JournalCorrupt, message)


def test_a_flipped_bit_in_a_compressed_payload_is_never_silent(tmp_path: Path) -> None:
    """R7 for compressed rows: each flipped bit is caught (the frame's own checks or the row hash),
    or it changed nothing anybody reads (a bit the decoder ignores), so the same payload comes back."""
    path = tmp_path / "j.db"
    written = _journal(path)
    blob = {s: b for s, _, b in _rows(path)}["big"]
    caught = 0
    bits = range(0, len(blob) * 8, 5)  # a fifth of them, every bit position in a byte among them
    for bit in bits:
        flipped = bytearray(blob)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with closing(sqlite3.connect(path)) as db, db:
            db.execute("UPDATE cuaderno_events SET payload=? WHERE step_id='big'", (bytes(flipped),))
        with SqliteCheckpointer(path, readonly=True) as store:
            try:
                loaded = store.load("r")
            except JournalCorrupt:
                caught += 1
                continue
        assert loaded == written, f"bit {bit} changed what the journal says without an error"
    assert caught >= 0.95 * len(bits), (caught, len(bits))  # measured: 99.5% on such text


@pytest.mark.parametrize("value", [1, "yes", 0])
def test_compress_must_be_a_bool_or_none(tmp_path: Path, value: Any) -> None:
    with pytest.raises(UsageError, match="compress must be True, False or None"):
        SqliteCheckpointer(tmp_path / "j.db", compress=value)
    assert not (tmp_path / "j.db").exists()


def test_compression_is_the_journals_setting_and_every_writer_keeps_to_it(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path, compress=False) as store:  # the owner's choice, recorded in the file
        store.append([StepEvent(run_id="r", step_id="run", phase="start", kind="run"), _ev("a", {"v": PROSE})])
    with SqliteCheckpointer(path) as store:  # another writer that says nothing (the CLI, say) follows it
        store.append([_ev("b", {"v": PROSE})])
    with SqliteCheckpointer(path, readonly=True, compress=True) as store:  # a reader changes nothing
        assert len(store.load("r")) == 3
    with SqliteCheckpointer(path) as store:
        store.append([_ev("c", {"v": PROSE})])
    with SqliteCheckpointer(path, compress=True) as store:  # said again, the other way: from now on
        store.append([_ev("d", {"v": PROSE})])
    with SqliteCheckpointer(path) as store:
        store.append([_ev("e", {"v": PROSE})])
    assert [codec for _, codec, _ in _rows(path)] == [CODEC_JSON] * 4 + [CODEC_JSON_ZSTD] * 2
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT value FROM cuaderno_meta WHERE key='compress'").fetchone() == ("on",)


def test_a_new_journal_compresses_unless_told_not_to(tmp_path: Path) -> None:
    _journal(tmp_path / "a.db")
    assert {s: c for s, c, _ in _rows(tmp_path / "a.db")}["big"] == CODEC_JSON_ZSTD
    with closing(sqlite3.connect(tmp_path / "a.db")) as db:  # nothing recorded until somebody says
        assert db.execute("SELECT value FROM cuaderno_meta WHERE key='compress'").fetchone() is None


def test_a_payload_over_the_row_limit_is_refused_even_though_it_would_compress(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compressed, a payload over SQLite's value limit would commit, and no reader could open it.
    (The limit is lowered here: the real one is a gigabyte.)"""
    path = tmp_path / "j.db"
    _journal(path)
    before = journal_files(path, MAIN_AND_WAL)
    monkeypatch.setattr(_sql_write, "MAX_PAYLOAD", 1000)  # the one writer of both backends
    with SqliteCheckpointer(path) as store:
        with pytest.raises(JournalError, match=r"big2:result is 2,\d{3} bytes of JSON, more than the 1,000"):
            store.append([_ev("big2", {"value": PROSE})])
        assert store.checkpoint("r").last_seq == 3  # type: ignore[union-attr]
    assert journal_files(path, MAIN_AND_WAL) == before


def test_bytes_after_the_frame_are_refused(tmp_path: Path) -> None:
    """Another reader (``zstd -d``) would decode them as more payload than cuaderno shows."""
    path = tmp_path / "j.db"
    _journal(path)
    extra = zstandard.ZstdCompressor().compress(b',"receipt2":"paid 9999 to mallory"}')
    blob = {s: b for s, _, b in _rows(path)}["big"]
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE cuaderno_events SET payload=? WHERE step_id='big'", (blob + extra,))
    load_refused(path, JournalCorrupt, "row 2 .*unused data")


def test_a_believable_size_without_the_memory_for_it_is_a_typed_error(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "j.db"
    _journal(path)

    class _NoMemory:
        def decompress(self, data: bytes, **kwargs: Any) -> bytes:
            raise MemoryError

    monkeypatch.setattr(_compress, "_decompressor", _NoMemory)
    with SqliteCheckpointer(path) as store:
        with pytest.raises(JournalError, match="row 2 .*not enough memory to decompress a payload of"):
            store.load("r")


@pytest.mark.parametrize("claim", [2**40, 999_999_999, 40_000_000])
def test_a_frame_claiming_more_than_it_can_hold_is_refused_before_any_memory_is_asked_for(
        tmp_path: Path, claim: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame expands at most 32,768 times its length, so a claim beyond that is damage, even one
    under the gigabyte limit (a 1 KB row cannot hold 40 MB)."""
    path = tmp_path / "j.db"
    _journal(path)
    blob = {s: b for s, _, b in _rows(path)}["big"]
    header = zstandard.get_frame_parameters(blob)
    assert header.content_size == len(encode_payload({"value": PROSE})) and blob[4] >> 6 == 1  # a 2-byte size
    assert claim > 32_768 * len(blob) + 8
    # The same frame with an 8-byte content size (single segment: that is also its window).
    huge = blob[:4] + bytes([0xE0 | (blob[4] & 0x3F)]) + claim.to_bytes(8, "little") + blob[7:]
    assert zstandard.frame_content_size(huge) == claim
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE cuaderno_events SET payload=? WHERE step_id='big'", (huge,))
    monkeypatch.setattr(_compress, "_decompressor", None)  # proof that no decompression is attempted
    load_refused(path, JournalCorrupt, rf"row 2 .*claims {claim} bytes")


def test_an_open_store_follows_the_setting_another_store_records(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    _journal(path)
    with SqliteCheckpointer(path) as follower, SqliteCheckpointer(path, compress=True) as keeper:
        with SqliteCheckpointer(path, compress=False):  # the owner turns compression off while both are open
            pass
        follower.append([_ev("after-off", {"value": PROSE})])  # said nothing: follows the file
        keeper.append([_ev("keeper", {"value": PROSE})])  # said so itself: keeps to it
        with SqliteCheckpointer(path, compress=True):
            pass
        follower.append([_ev("after-on", {"value": PROSE})])
    codecs = {s: c for s, c, _ in _rows(path)}
    assert (codecs["after-off"], codecs["keeper"], codecs["after-on"]) == (CODEC_JSON, CODEC_JSON_ZSTD,
                                                                          CODEC_JSON_ZSTD)


@pytest.mark.parametrize("setting", ["OFF", "false", "0", "", "off ", "garbage"])
def test_an_unknown_compress_setting_is_journal_corrupt_unless_a_store_sets_it(tmp_path: Path, setting: str) -> None:
    path = tmp_path / "j.db"
    _journal(path)
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("INSERT OR REPLACE INTO cuaderno_meta (key, value) VALUES ('compress', ?)", (setting,))
    before = journal_files(path, MAIN_AND_WAL)
    with pytest.raises(JournalCorrupt, match="compress setting is"):
        SqliteCheckpointer(path)
    assert journal_files(path, MAIN_AND_WAL) == before
    with SqliteCheckpointer(path, compress=False) as store:  # an explicit setting replaces it
        store.append([_ev("plain", {"value": PROSE})])
    assert {s: c for s, c, _ in _rows(path)}["plain"] == CODEC_JSON


def test_a_store_open_while_a_newer_cuaderno_migrates_the_file_refuses_to_read_or_write(tmp_path: Path) -> None:
    """Checked when the store opens, and again on every read and whenever another connection has
    committed: a process left running across an upgrade stops instead of misreading new rows."""
    path = tmp_path / "j.db"
    _journal(path)
    with SqliteCheckpointer(path) as old, SqliteCheckpointer(path, readonly=True) as reader:
        old.load("r")
        reader.load("r")
        with closing(sqlite3.connect(path)) as db, db:  # what a newer cuaderno's migration does
            db.execute("UPDATE cuaderno_meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
        before = journal_files(path, MAIN_AND_WAL)
        with pytest.raises(SchemaTooNew):
            old.load("r")
        with pytest.raises(SchemaTooNew):
            reader.load("r")
        with pytest.raises(SchemaTooNew):
            old.append([_ev("late", {"value": "x"})])
        assert journal_files(path, MAIN_AND_WAL) == before


# -- schema 1 files: raised to 3 by an open for writing (schema 2 was only the compressed codec) -----

GOLDEN_V1 = Path(__file__).resolve().parents[1] / "golden" / "journals" / "schema_v1.sqlite"


def _schema(path: Path) -> int:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return int(db.execute("SELECT value FROM cuaderno_meta WHERE key='schema_version'").fetchone()[0])


def _v1(tmp_path: Path) -> Path:
    path = tmp_path / "v1.db"
    shutil.copyfile(GOLDEN_V1, path)
    assert _schema(path) == 1
    return path


def test_a_schema_1_file_opened_for_writing_is_migrated_to_4_and_its_old_rows_still_verify(tmp_path: Path) -> None:
    """Schema 4 (the rows' digest keys; schema 3 added the queue's tables) is taken by the open for
    writing: every new row needs its column. The old rows keep their first-version hashes and
    still verify; the new rows chain after them over keyed digests, compressed or not. A
    read-only store reads schema 1 as it is (it cannot migrate)."""
    path = _v1(tmp_path)
    run = "golden-payments"
    with SqliteCheckpointer(path, readonly=True) as reader:
        old = reader.load(run)
    assert _schema(path) == 1
    assert all(ev.salt is None for ev in old)
    with SqliteCheckpointer(path, compress=False) as store:
        assert _schema(path) == 4
        store.append([StepEvent(run_id=run, step_id="note", phase="result", kind="tool", payload={"v": PROSE})])
    with SqliteCheckpointer(path, compress=True) as store:
        store.append([StepEvent(run_id=run, step_id="note2", phase="result", kind="tool", payload={"v": PROSE})])
        events = store.load(run)
    assert [ev.row_hash for ev in events[:len(old)]] == [ev.row_hash for ev in old]
    assert [ev.salt is not None for ev in events[len(old):]] == [True, True]
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        assert db.execute("SELECT codec FROM cuaderno_events WHERE step_id='note2'").fetchone()[0] == CODEC_JSON_ZSTD


# Committed, the first row (compressed, its digest keyed BLAKE2b) has raised the file to schema 8;
# killed before the commit, the file stays at the schema the open for writing took (4).
@pytest.mark.parametrize(("point", "schema", "compressed"), [("append.W1", 4, 0), ("append.W2", 8, 1)])
def test_killed_around_the_first_compressed_row_the_file_is_at_the_schema_its_rows_need(
        tmp_path: Path, point: str, schema: int, compressed: int) -> None:
    path = _v1(tmp_path)
    code = textwrap.dedent(f"""
        from cuaderno.events import StepEvent
        from cuaderno.journal import SqliteCheckpointer
        store = SqliteCheckpointer({str(path)!r})
        store.append([StepEvent(run_id="golden-payments", step_id="note", phase="result", kind="tool",
                                payload={{"v": {PROSE!r}}})])
        print("not killed")
    """)
    env = {**os.environ, "CUADERNO_CRASH_AT": f"{point}:1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert _schema(path) == schema
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        assert db.execute("SELECT count(*) FROM cuaderno_events WHERE codec=?", (CODEC_JSON_ZSTD,)
                          ).fetchone()[0] == compressed
    with SqliteCheckpointer(path) as store:  # and it reads, either way
        assert len(store.load("golden-payments")) > 2


def _killed_opening(path: Path, point: str, **kwargs: Any) -> None:
    """Open ``path`` for writing in another process that SIGKILLs itself at ``point``."""
    code = f"from cuaderno.journal import SqliteCheckpointer\nSqliteCheckpointer({str(path)!r}, **{kwargs!r})\n"
    env = {**os.environ, "CUADERNO_CRASH_AT": f"{point}:1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr


def _meta(path: Path) -> dict[str, str]:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return dict(db.execute("SELECT key, value FROM cuaderno_meta").fetchall())


@pytest.mark.parametrize(("point", "recorded", "codec"), [("open.M1", None, CODEC_JSON_ZSTD),
                                                         ("open.M2", "off", CODEC_JSON)])
def test_killed_while_recording_the_setting_the_journal_keeps_the_old_one_or_the_new_one(
        tmp_path: Path, point: str, recorded: str | None, codec: str) -> None:
    """The setting is written in the opening transaction: a death before its commit leaves the old
    setting (here none: compressed), after it the new one, and the next writer that does not
    choose keeps to whichever the file holds."""
    path = tmp_path / "j.db"
    _journal(path)
    before = _rows(path)
    _killed_opening(path, point, compress=False)
    assert _meta(path).get("compress") == recorded
    assert _rows(path) == before
    with SqliteCheckpointer(path) as store:
        store.append([_ev("after", {"value": PROSE})])
        assert len(store.load("r")) == 4
    assert _rows(path)[-1][:2] == ("after", codec)


@pytest.mark.parametrize("point", ["open.M1", "open.M2"])
def test_killed_while_creating_a_journal_the_file_is_empty_or_whole(tmp_path: Path, point: str) -> None:
    path = tmp_path / "new.db"
    _killed_opening(path, point, compress=False)
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if point == "open.M1":  # nothing of the creation committed: still no journal, and one can start
        assert tables == set()
        with pytest.raises(JournalError, match="not a cuaderno journal"):
            SqliteCheckpointer(path, create=False)
    else:
        SqliteCheckpointer(tmp_path / "whole.db").close()  # a journal whose creation ran to its end
        with closing(sqlite3.connect(tmp_path / "whole.db")) as whole:
            expected = {r[0] for r in whole.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "cuaderno_events" in expected and "cuaderno_blobs" in expected and tables == expected
        assert _meta(path) == {"schema_version": str(SCHEMA_VERSION), "compress": "off"}
    _journal(path)  # a store that does not choose: compressed unless "off" committed
    big = CODEC_JSON_ZSTD if point == "open.M1" else CODEC_JSON
    assert [codec for _, codec, _ in _rows(path)] == [CODEC_JSON, big, CODEC_JSON]


def test_every_read_and_lease_write_refuses_a_file_migrated_past_this_cuaderno(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    _journal(path)
    with SqliteCheckpointer(path) as store:
        store.checkpoint("r")
        with closing(sqlite3.connect(path)) as db, db:
            db.execute("UPDATE cuaderno_meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
        before = journal_files(path, MAIN_AND_WAL)
        for call in (lambda: store.checkpoint("r"), lambda: store.list_runs(), lambda: store.load("r"),
                     lambda: store.acquire("r", "me"), lambda: store.release("r", 1)):
            with pytest.raises(SchemaTooNew):
                call()
        assert journal_files(path, MAIN_AND_WAL) == before
