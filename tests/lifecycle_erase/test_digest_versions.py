"""Rows' keyed content digests of both kinds: keyed BLAKE2b under a 32-byte key (written since
journal schema 8) and HMAC-SHA256 under a 16-byte key (rows of schemas 4 to 7). The key's length
names the digest; both verify, whole and erased, side by side in one run."""

from __future__ import annotations

import hashlib
import hmac
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from cuaderno import SqliteCheckpointer, StepEvent
from cuaderno.errors import JournalCorrupt, UsageError
from cuaderno.events import HMAC_SALT_BYTES, SALT_BYTES, content_digest
from cuaderno.operations import erase

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "journals"


def test_the_key_length_names_the_digest() -> None:
    key32, key16, payload = bytes(range(SALT_BYTES)), bytes(range(HMAC_SALT_BYTES)), b'{"a":1}'
    assert content_digest(key32, "fp", payload) == hashlib.blake2b(b"2:fp" + payload, key=key32,
                                                                   digest_size=32).digest()
    assert content_digest(key16, "fp", payload) == hmac.digest(key16, b"2:fp" + payload, "sha256")
    big = b"x" * (70 * 1024)  # fed in two parts, not joined: the same digest
    assert content_digest(key32, None, big) == hashlib.blake2b(b"-" + big, key=key32, digest_size=32).digest()
    assert content_digest(key16, None, big) == hmac.digest(key16, b"-" + big, "sha256")


def test_a_schema_7_run_of_hmac_rows_goes_on_with_blake2b_rows_and_is_erased(tmp_path: Path) -> None:
    path = tmp_path / "v7.db"
    shutil.copyfile(GOLDEN / "schema_v7.sqlite", path)
    run = "golden-support"
    with SqliteCheckpointer(path) as store:
        old = store.load(run)
        assert old and {len(e.salt or b"") for e in old} == {HMAC_SALT_BYTES}
        store.append([StepEvent(run_id=run, step_id="note", phase="result", kind="tool", payload={"v": 1})])
        both = store.load(run)
        assert len(both[-1].salt or b"") == SALT_BYTES
        assert [e.row_hash for e in both[:len(old)]] == [e.row_hash for e in old]
        erase(store, run, reason="both digests")
        after = store.load(run)  # the whole chain recomputes from the digests left
        assert [e.row_hash for e in after] == [e.row_hash for e in both] and all(e.erased for e in after)
        assert all(len(e.encoded_payload()) == 32 and e.salt is None for e in after)
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT value FROM cuaderno_meta WHERE key='schema_version'").fetchone()[0] == "8"


def test_an_importer_may_carry_either_key_and_no_other(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "j.db") as store:
        for i, size in enumerate((SALT_BYTES, HMAC_SALT_BYTES)):
            ev = StepEvent(run_id="r", step_id=f"s{i}", phase="result", kind="tool", payload={"i": i})
            ev.salt = bytes([i + 1]) * size
            store.append([ev])
        assert [e.salt for e in store.load("r")] == [b"\x01" * SALT_BYTES, b"\x02" * HMAC_SALT_BYTES]
        bad = StepEvent(run_id="r", step_id="s9", phase="result", kind="tool", payload={})
        bad.salt = b"\x03" * 24
        with pytest.raises(UsageError, match="digest key"):
            store.append([bad])
    with closing(sqlite3.connect(tmp_path / "j.db")) as db, db:
        db.execute("UPDATE cuaderno_events SET salt=? WHERE step_id='s0'", (b"\x01" * 24,))
    with SqliteCheckpointer(tmp_path / "j.db") as store, pytest.raises(JournalCorrupt, match="digest key"):
        store.load("r")
