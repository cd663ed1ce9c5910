"""Encryption at rest, wired into the SQL stores: which run's data key seals which bytes.

The codec is :mod:`._crypto` (data keys wrapped by a master key, rows sealed with AES-256-GCM);
this module is where a store meets it. A store opened with a
:class:`~cuaderno.journal.keys.KeyProvider` has a :class:`Sealer`; one opened without has none,
and every hook below is then the identity (an unencrypted journal's bytes are unchanged).

- **Where data keys live**: the ``cuaderno_keys`` table, one row per run ``(run_id, key_id,
  wrapped)``. A run's key is created by the first write that seals something of it, in that
  write's transaction (a rollback takes the key with the rows it sealed); a read finds it by the
  run id. Unwrapped keys are cached per store: a run's data key never changes (``rekey``
  re-wraps it, ``erase`` deletes it along with every row it sealed), but a run id pruned and
  started again by another process gets a new one, so a write uses a cached key only while the
  store's summary cache vouches for the run (the stores drop it otherwise), a ``load`` reads the
  key in its snapshot, and a seal a cached key does not open is retried with the key as stored.
- **Rows**: :func:`sealed` seals a row's stored payload (after compression) where rows become
  stored bytes (:func:`~._sql_write.stored_rows`); :func:`opened` opens it where rows are decoded
  (:func:`~._append.decode_row`). An erased row is never sealed (its payload is a digest). Rows
  written before encryption was turned on stay as they are and read as they are: one run may
  hold both.
- **Offloaded payloads**: a payload over the offload threshold goes to the blob tables as its
  run's own blob, addressed by its digest keyed with the run's data key and sealed chunk by
  chunk under it (:mod:`._offload`); its row's reference is sealed here like any payload. So a
  run's data key opens everything of it, ``erase`` destroys it with the run's rows and blobs,
  and ``rekey`` (which re-wraps it) touches no chunk.
- **Summaries**: the summary's content fields (the outcome, pending arguments, uncertain
  evidence, a cancellation's record, the task's fingerprint) are sealed into one ``"sealed"``
  field, with run id and ``"summary"`` as associated data; what stays readable is structure:
  status, counters, cost, chain head, versions, tenant, step ids, and two markers the
  ``open_runs`` queries match on (``"cancel_requested":{`` when a cancellation was asked for,
  ``"cleanup":[{`` when compensations were scheduled). A store opens the summary in Python
  before anything reads it.
- **Replay** needs nothing new: the chain is over the plaintext's keyed digest, so a sealed row
  verifies exactly as a plain one once opened.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import JournalCorrupt, KeyInvalid, KeyMissing, UsageError
from cuaderno.events import CODEC_ERASED, StepEvent
from cuaderno.journal._crypto import NONCE_BYTES, SEALED, WrappedKey, new_data_key, open_row, seal_row, unwrap, wrap
from cuaderno.journal.keys import KeyProvider
from cuaderno.plainjson import compact, compact_ascii

__all__ = ["ENCRYPTION_META", "KEYS_TABLE_PG", "KEYS_TABLE_SQLITE", "RunKeys", "Sealer", "check_journal", "open_summary",
           "opened", "sealed", "summary_text"]

ENCRYPTION_META = "encryption"
"""The ``cuaderno_meta`` key a journal that was opened encrypted records (value ``aesgcm``): from
then on a store without a key refuses it (:class:`~cuaderno.errors.KeyMissing`)."""

KEYS_TABLE_SQLITE = ("CREATE TABLE IF NOT EXISTS cuaderno_keys (run_id TEXT PRIMARY KEY, key_id TEXT NOT NULL, "
                     "wrapped BLOB NOT NULL) WITHOUT ROWID")
KEYS_TABLE_PG = "CREATE TABLE cuaderno_keys (run_id TEXT PRIMARY KEY, key_id TEXT NOT NULL, wrapped BYTEA NOT NULL)"

_T = TypeVar("_T")

_CONTENT = ("task_fingerprint", "pending", "uncertain", "outcome", "cancel_requested")
"""The summary's fields copied from payloads (what :func:`~._erase.erased_summary` drops too)."""
_SUMMARY_AD = b"\x00summary"

# Whole statements per parameter style (no SQL built from strings, R12).
_STATEMENTS = {
    "?": ("SELECT key_id, wrapped FROM cuaderno_keys WHERE run_id=?",
          "INSERT INTO cuaderno_keys (run_id, key_id, wrapped) VALUES (?,?,?) ON CONFLICT (run_id) DO NOTHING",
          "DELETE FROM cuaderno_keys WHERE run_id=?"),
    "%s": ("SELECT key_id, wrapped FROM cuaderno_keys WHERE run_id=%s",
           "INSERT INTO cuaderno_keys (run_id, key_id, wrapped) VALUES (%s,%s,%s) ON CONFLICT (run_id) DO NOTHING",
           "DELETE FROM cuaderno_keys WHERE run_id=%s"),
}


def check_journal(db: Any, sealer: Sealer | None, where: str, *, has_tables: bool) -> bool:
    """Before a store reads or writes anything: refuse a journal recorded as encrypted when the
    store has no key, and one holding data keys wrapped by a master key the provider lacks (a
    wrong key: every such id is named). ``has_tables``: the meta and keys tables exist. Returns
    whether the journal is recorded as encrypted.

    Raises:
        KeyMissing: encrypted, and no key.
        KeyInvalid: a data key wrapped by a master key the provider does not hold.
    """
    if not has_tables:
        return False
    row = db.execute("SELECT value FROM cuaderno_meta WHERE key='encryption'").fetchone()
    encrypted = row is not None
    if encrypted and sealer is None:
        raise KeyMissing(f"{where} is encrypted at rest and was opened without a key: set CUADERNO_KEY (or "
                         "CUADERNO_KEY_FILE), pass --key-file, or open it with keys=; nothing was read or written")
    if sealer is not None:
        ids = [r[0] for r in db.execute("SELECT DISTINCT key_id FROM cuaderno_keys").fetchall()]
        missing = sorted(str(i) for i in ids if sealer.keys.find(str(i)) is None)
        if missing:
            raise KeyInvalid(f"{where}: its data keys are wrapped by master key(s) {', '.join(missing)}, which the key "
                             "provider does not hold (a wrong key, or an old one removed before `cuaderno rekey` "
                             "finished); nothing was read or written")
    return encrypted


class Sealer:
    """A store's keys: its provider and the data keys it has unwrapped (see the module)."""

    has_table = True
    """Whether the journal has its keys table (a file before the schema that added it, read by a
    store that cannot migrate it, has none, and so no sealed content)."""

    def __init__(self, keys: KeyProvider, paramstyle: str) -> None:
        if not isinstance(keys, KeyProvider):
            raise UsageError(f"keys must be a KeyProvider (env_keys(), file_keys(PATH), StaticKeys), got "
                             f"{type(keys).__name__}")
        keys.current()  # KeyMissing now, not at the first write
        self.keys = keys
        self.paramstyle = paramstyle
        self._select, self._insert, self._delete = _STATEMENTS[paramstyle]
        self._known: dict[str, tuple[WrappedKey, bytes]] = {}
        """Per run, its wrapped key as last read and the data key it unwraps to."""
        self._lock = threading.Lock()

    def bind(self, db: Any) -> RunKeys:
        """The data keys of runs, looked up (and, for a write, created) on ``db``, in its
        transaction when it is in one."""
        return RunKeys(self, db)

    def preload(self, db: Any, run_id: str) -> RunKeys:
        """The run's data key read now, on ``db`` (a snapshot about to end), for reads made after
        it: the returned keys look nothing up later. Always read (one primary-key lookup): the
        run's key as this snapshot has it, not as this store last saw it (a run id pruned and
        started again by another process has another key)."""
        wrapped = self.stored(db, run_id)
        if wrapped is None:
            self.forget([run_id])
        else:
            self.key_of(run_id, wrapped)
        return RunKeys(self, None)

    def forget(self, run_ids: Any) -> None:
        """Drop cached keys of runs whose write failed (a key created in a rolled-back
        transaction is gone), whose key was destroyed, or whose summary row is not the version
        this store last wrote (another writer may have pruned it and started it again)."""
        with self._lock:
            for run_id in run_ids:
                self._known.pop(run_id, None)

    def forget_all(self) -> None:
        """Drop every cached key (another connection committed since this store last wrote)."""
        with self._lock:
            self._known.clear()

    def cached(self, run_id: str) -> bytes | None:
        with self._lock:
            found = self._known.get(run_id)
        return None if found is None else found[1]

    def key_of(self, run_id: str, wrapped: WrappedKey) -> bytes:
        """The data key ``wrapped`` unwraps to (unwrapped once per wrapped form)."""
        with self._lock:
            found = self._known.get(run_id)
        if found is not None and found[0] == wrapped:
            return found[1]
        key = unwrap(self.keys, run_id, wrapped)
        with self._lock:
            self._known[run_id] = (wrapped, key)
        return key

    def stored(self, db: Any, run_id: str) -> WrappedKey | None:
        """The run's wrapped key as stored on ``db``, or ``None``."""
        if not self.has_table:
            return None
        row = db.execute(self._select, (run_id,)).fetchone()
        if row is None:
            return None
        key_id, blob = row
        if not isinstance(key_id, str) or not isinstance(blob, (bytes, bytearray, memoryview)):
            raise JournalCorrupt(f"run {run_id!r}: its wrapped data key is damaged (cuaderno_keys); nothing was read")
        return key_id, bytes(blob)

    def insert(self, db: Any, run_id: str, wrapped: WrappedKey) -> None:
        db.execute(self._insert, (run_id, wrapped[0], wrapped[1]))

    def destroy(self, db: Any, run_id: str) -> None:
        """Delete the run's wrapped data key on ``db`` (an erasure's or a prune's transaction)."""
        db.execute(self._delete, (run_id,))


class RunKeys:
    """Data keys of runs on one connection (see :meth:`Sealer.bind`)."""

    def __init__(self, sealer: Sealer, db: Any | None) -> None:
        self._sealer = sealer
        self._db = db

    def for_read(self, run_id: str) -> bytes:
        """The run's data key, to open what it sealed (as cached, else looked up).

        Raises:
            KeyInvalid: the run has no stored data key (destroyed, or the table altered), or the
                provider cannot unwrap it.
        """
        key = self._sealer.cached(run_id)
        if key is not None:
            return key
        key = self.fresh(run_id)
        if key is None:
            raise KeyInvalid(f"run {run_id!r}: it holds sealed content but no data key (cuaderno_keys): the key was "
                             "destroyed or removed, and nothing can open it")
        return key

    def fresh(self, run_id: str) -> bytes | None:
        """The run's data key as stored now (``None``: none stored, or no connection to look on)."""
        wrapped = None if self._db is None else self._sealer.stored(self._db, run_id)
        if wrapped is None:
            return None
        return self._sealer.key_of(run_id, wrapped)

    def for_write(self, run_id: str) -> bytes:
        """The run's data key, created and stored (wrapped) in this transaction if it has none.
        A cached key is used only while the store's summary cache vouches that the run is the one
        it wrote (the stores drop it otherwise: :meth:`Sealer.forget`)."""
        key = self._sealer.cached(run_id)
        if key is not None:
            return key
        assert self._db is not None, "a write binds its transaction's connection"
        wrapped = self._sealer.stored(self._db, run_id)
        if wrapped is None:
            self._sealer.insert(self._db, run_id, wrap(self._sealer.keys.current(), run_id, new_data_key()))
            wrapped = self._sealer.stored(self._db, run_id)  # another creator's, if it won the race
            assert wrapped is not None
        return self._sealer.key_of(run_id, wrapped)


def _with_key(keys: RunKeys, run_id: str, use: Callable[[bytes], _T]) -> _T:
    """``use`` with the run's data key; once more with the key as stored now when the cached one
    does not open it (the run was pruned and started again by another process since)."""
    key = keys.for_read(run_id)
    try:
        return use(key)
    except JournalCorrupt:
        fresh = keys.fresh(run_id)
        if fresh is None or fresh == key:
            raise
        return use(fresh)


def sealed(keys: RunKeys | None, e: StepEvent, codec: str, stored: bytes) -> tuple[str, bytes]:
    """A new row's storage codec and payload as they rest: sealed under its run's data key when
    the store encrypts (``keys``), as they are otherwise (and for an erased row)."""
    if keys is None or codec == CODEC_ERASED:
        return codec, stored
    return seal_row(keys.for_write(e.run_id), e.run_id, e.step_id, e.phase, codec, stored)


def opened(keys: RunKeys | None, run_id: str, step_id: str, phase: str, codec: str,
           stored: bytes) -> tuple[str, bytes]:
    """A stored row's codec and payload as written before sealing (a sealed one opened).

    Raises:
        KeyMissing: the row is sealed and the store has no key.
        KeyInvalid: the provider cannot unwrap the run's data key.
        JournalCorrupt: the seal does not open (the row altered or moved).
    """
    if not codec.endswith(SEALED):
        return codec, stored
    if keys is None:
        raise KeyMissing(f"run {run_id!r}: its journal rows are encrypted and this store was opened without a key "
                         "(set CUADERNO_KEY or pass --key-file / keys=); nothing was read")
    return _with_key(keys, run_id, lambda key: open_row(key, run_id, step_id, phase, codec, stored))


def summary_text(keys: RunKeys | None, cp: Checkpoint) -> str:
    """The stored form of a summary: :meth:`Checkpoint.dumps`, its content fields sealed when the
    store encrypts (see the module)."""
    if keys is None or not any(getattr(cp, name) for name in _CONTENT):
        return cp.dumps()
    out = cp.to_json()
    content = {name: out[name] for name in _CONTENT}
    # What stays readable: structure, and the markers the open_runs queries match on.
    out["task_fingerprint"] = None
    out["pending"] = {step: {"sealed": True} for step in cp.pending}
    out["uncertain"] = {step: {"sealed": True} for step in cp.uncertain}
    out["cancel_requested"] = None if cp.cancel_requested is None else {"sealed": True}
    out["outcome"] = None if cp.outcome is None else _outcome_marker(cp.outcome)
    text = compact(content)
    try:
        plain = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (a model's answer can hold one): escaped, as dumps does
        plain = compact_ascii(content).encode("ascii")
    nonce = _nonce()
    blob = AESGCM(keys.for_write(cp.run_id)).encrypt(nonce, plain, _summary_ad(cp.run_id))
    out["sealed"] = base64.b64encode(nonce + blob).decode("ascii")
    return compact(out)


def _outcome_marker(outcome: Mapping[str, Any]) -> dict[str, Any]:
    # The open_runs queries find a cancelled run with compensations left by '"cleanup":[{'.
    cleanup = outcome.get("cleanup")
    marker: dict[str, Any] = {"sealed": True}
    if isinstance(cleanup, list) and cleanup:
        marker["cleanup"] = [{"sealed": True} for _ in cleanup]
    return marker


def open_summary(keys_of: Callable[[], RunKeys | None], run_id: str, text: Any,
                 loads: Callable[[str, Any], Checkpoint]) -> Checkpoint:
    """A stored summary read back (``loads``: the store's reading of plain text), its sealed
    content opened with the run's data key (``keys_of``: the store's keys, ``None`` without).

    Raises:
        KeyMissing: a sealed summary and no key.
        KeyInvalid / JournalCorrupt: as :func:`opened`.
    """
    cp = loads(run_id, text)
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "surrogatepass")
    if not isinstance(text, str) or '"sealed":"' not in text:
        return cp
    data = json.loads(text)
    blob = data.get("sealed")
    if not isinstance(blob, str):
        return cp
    keys = keys_of()
    if keys is None:
        raise KeyMissing(f"run {run_id!r}: its summary is encrypted and this store was opened without a key "
                         "(set CUADERNO_KEY or pass --key-file / keys=); nothing was read")
    def unseal(key: bytes) -> Any:
        try:
            raw = base64.b64decode(blob, validate=True)
            return json.loads(AESGCM(key).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _summary_ad(run_id)))
        except (InvalidTag, ValueError):
            raise JournalCorrupt(f"run {run_id!r}: its sealed summary does not open: it was altered or copied from "
                                 "another run") from None

    content = _with_key(keys, run_id, unseal)
    if not isinstance(content, dict):
        raise JournalCorrupt(f"run {run_id!r}: its sealed summary is not an object")
    del data["sealed"]
    data.update({name: content.get(name) for name in _CONTENT})
    out = Checkpoint.from_json(data)
    out.epoch = cp.epoch
    return out


def _summary_ad(run_id: str) -> bytes:
    return run_id.encode("utf-8", "surrogatepass") + _SUMMARY_AD


def _nonce() -> bytes:
    return os.urandom(NONCE_BYTES)
