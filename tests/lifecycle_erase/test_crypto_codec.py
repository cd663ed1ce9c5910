"""The encryption-at-rest building blocks (not yet used by the stores): master keys from the
environment or a file, per-run data keys wrapped and re-wrapped, rows sealed with their identity
as associated data."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from cuaderno import KeyInvalid, KeyMissing
from cuaderno.errors import JournalCorrupt
from cuaderno.journal import _crypto
from cuaderno.journal._compress import pack
from cuaderno.journal.keys import StaticKeys, env_keys, file_keys, master_key, parse_key


def _text() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def test_keys_come_from_the_environment_and_their_ids_are_derived_from_them() -> None:
    old, new = _text(), _text()
    keys = env_keys(environ={"CUADERNO_KEY": new, "CUADERNO_OLD_KEYS": f" {old} ,"})
    assert keys.current() == parse_key(new, "x")
    assert keys.find(parse_key(old, "x").key_id) == parse_key(old, "x")
    assert keys.current().key_id != parse_key(old, "x").key_id
    assert new not in repr(keys.current()) and "secret" not in repr(keys.current())
    with pytest.raises(KeyMissing, match="CUADERNO_KEY"):
        env_keys(environ={})
    with pytest.raises(KeyInvalid, match="CUADERNO_KEY is 16 bytes"):
        env_keys(environ={"CUADERNO_KEY": base64.b64encode(os.urandom(16)).decode()})
    with pytest.raises(KeyInvalid, match="not base64") as caught:
        env_keys(environ={"CUADERNO_KEY": "not a key!"})
    assert "not a key" not in str(caught.value)  # a key's text is never echoed


def test_a_key_file_must_be_private_and_holds_current_then_older_keys(tmp_path: Path) -> None:
    old, new = _text(), _text()
    path = tmp_path / "keys"
    path.write_text(f"# rotated 2026-12\n{new}\n\n{old}\n")
    path.chmod(0o644)
    with pytest.raises(KeyInvalid, match="readable by others"):
        file_keys(path)
    path.chmod(0o600)
    keys = file_keys(path)
    assert keys.current() == parse_key(new, "x") and keys.find(parse_key(old, "x").key_id) is not None
    with pytest.raises(KeyMissing):
        file_keys(tmp_path / "absent")


def test_a_data_key_opens_only_for_its_run_under_its_master_key_and_survives_rotation() -> None:
    old, new = master_key(os.urandom(32)), master_key(os.urandom(32))
    dek = _crypto.new_data_key()
    wrapped = _crypto.wrap(old, "r1", dek)
    assert dek not in wrapped[1] and wrapped[0] == old.key_id
    assert _crypto.unwrap(StaticKeys(old), "r1", wrapped) == dek
    with pytest.raises(KeyInvalid, match="does not open"):
        _crypto.unwrap(StaticKeys(old), "r2", wrapped)  # moved to another run
    with pytest.raises(KeyInvalid, match="does not hold"):
        _crypto.unwrap(StaticKeys(new), "r1", wrapped)  # the old key is gone from the provider
    rotated = StaticKeys(new, [old])
    again = _crypto.rewrap(rotated, "r1", wrapped)
    assert again[0] == new.key_id and _crypto.unwrap(StaticKeys(new), "r1", again) == dek
    assert _crypto.rewrap(rotated, "r1", again) is again  # already under the current key: unchanged


def test_a_row_is_compressed_then_sealed_and_opens_only_as_itself() -> None:
    dek = _crypto.new_data_key()
    payload = b'{"record":"' + b"SECRET the customer asked about the invoice. " * 40 + b'"}'
    codec, stored = pack(payload)
    sealed_codec, sealed = _crypto.seal_row(dek, "r", "t0000.tool00", "result", codec, stored)
    assert sealed_codec == "json+zstd+aesgcm" and b"SECRET" not in sealed
    assert _crypto.open_row(dek, "r", "t0000.tool00", "result", sealed_codec, sealed) == (codec, stored)
    with pytest.raises(JournalCorrupt, match="does not open"):
        _crypto.open_row(dek, "r", "t0001.tool00", "result", sealed_codec, sealed)  # swapped to another row
    flipped = bytes([sealed[0]]) + bytes([sealed[1] ^ 1]) + sealed[2:]
    with pytest.raises(JournalCorrupt, match="does not open"):
        _crypto.open_row(dek, "r", "t0000.tool00", "result", sealed_codec, flipped)
    assert _crypto.open_row(dek, "r", "s", "p", "json", b"{}") == ("json", b"{}")  # plain rows pass through
