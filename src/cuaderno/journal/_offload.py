"""Large payloads kept once, content-addressed, in the journal's own tables, and read back in chunks.

A payload over the store's threshold (``store.offload_above``, :data:`DEFAULT_OFFLOAD_ABOVE`
unless set) is not stored in its row. Its bytes go to ``cuaderno_blobs``, keyed by the SHA-256
of the JSON bytes and cut in :data:`CHUNK` pieces, each a Zstandard frame of its own (or the
piece as it is when compression saves nothing); its row holds a *reference* (storage codec
:data:`CODEC_JSON_BLOB`): the digest, the size and the chunk size. ``cuaderno_blob_refs`` says
which runs use a blob, so that prune and erase remove a blob no run uses any more, and keep one
another run still uses. Under encryption at rest the address is keyed and the chunks sealed, per
run (below).

What replay needs is unchanged, as with compression (:mod:`._compress`): the event's codec stays
``json`` and its payload bytes are the canonical JSON, restored when the row is read, before the
hash chain is checked. The chain covers the content (a version-2 link hashes the keyed digest of
the JSON bytes, never the reference), so an offloaded row verifies like any other, and a blob
altered in place fails both its own SHA-256 and the chain.

Why tables and not files beside the database: the journal stays one thing to back up and copy
(SQLite's online backup carries the blobs, a ``pg_dump`` of the schema carries them), a blob is
written in the same transaction as the row that refers to it (a kill leaves neither or both),
and the same code serves both backends. Why chunks: a read decompresses one chunk at a time into
the payload's buffer, so a 50 MB result is never held twice compressed, and no single database
value is larger than a chunk (PostgreSQL's and the driver's buffers stay small).

**Under encryption at rest** (a store with a :class:`~._sealing.Sealer`) a blob belongs to one
run and is sealed with that run's data key, so that erasing the run (its key destroyed, its
blobs deleted) leaves nothing another run's rows or key could open, and a prune's or erasure's
:func:`release` of the run removes its blobs. What changes:

- The blob's *address* (the ``digest`` column) is ``HMAC-SHA256(run data key, "cuaderno blob" ||
  SHA-256(JSON bytes))``, not the content's digest: a bare digest would let anyone holding the
  file confirm a guess of the content (a known document, a short secret) without any key. Keyed
  by the run's own key, two runs never share an address (no cross-run sharing, nothing that
  outlives a destroyed key), while one run storing the same content twice still stores it once.
- Each chunk is compressed as above, then sealed with AES-256-GCM under the run's data key
  (a fresh 12-byte nonce per chunk), with ``run id, address, part number, inner codec`` as
  associated data: a chunk moved to another part, another blob or another run, or its codec
  column changed, does not open. Its codec column gets the suffix ``+aesgcm``.
- The row's reference (``hmac:<address>:<size>:<chunk>``) is sealed like any row payload, so the
  row's storage codec is :data:`CODEC_SEALED_BLOB` (``json+blob+aesgcm``). A journal holding one
  is refused by a cuaderno before the schema that reads it (see ``_sqlite_file._SEALED_BLOB_SINCE``).
- Reading opens the row's reference, then reads, opens and decompresses one chunk at a time
  (the same bound as a plain blob: one chunk sealed and one open beside the payload's buffer),
  and checks the keyed address of what it read.
- ``cuaderno rekey`` re-wraps the run's data key and touches no chunk: the data key itself does
  not change, so every chunk still opens.

Crash point (``cuaderno.faults``): ``offload.O1`` after each chunk's insert, inside the append's
transaction (before its rows): a kill there leaves neither the chunks nor the row.

Why 1 MB by default: under it a row is read with the run in one statement and costs nothing
more; over it the row would make every read of the run's journal (``tail``, a listing's summary
reads do not touch rows) carry it, while a resume reads it once. A model answer is far below
(4 MB would be a million tokens); a tool returning a file or a page is what crosses it.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import zstandard
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from cuaderno import faults
from cuaderno.errors import JournalCorrupt
from cuaderno.journal._crypto import NONCE_BYTES, SEALED
from cuaderno.journal._sealing import RunKeys, opened
from cuaderno.journal.base import byte_setting

__all__ = ["BLOB_TABLES_PG", "BLOB_TABLES_SQLITE", "CHUNK", "CODEC_JSON_BLOB", "CODEC_SEALED_BLOB", "DEFAULT_OFFLOAD_ABOVE",
           "Held", "Offloaded", "fetched", "inlined", "offload_above", "offloaded_payloads", "reading", "reference_size", "release", "stats"]

CODEC_JSON_BLOB = "json+blob"
"""The storage codec of a row whose JSON payload is in ``cuaderno_blobs`` (never an event's codec)."""

CODEC_SEALED_BLOB = CODEC_JSON_BLOB + SEALED
"""The storage codec of an encrypted run's offloaded row: its reference sealed, its blob keyed
and sealed with the run's data key (see the module)."""

DEFAULT_OFFLOAD_ABOVE = 1024 * 1024
"""Payloads of more JSON bytes than this are offloaded (see the module for why 1 MB)."""

CHUNK = 1024 * 1024
"""Bytes of JSON per stored chunk (the last one may be shorter)."""

BLOB_TABLES_SQLITE: tuple[str, ...] = (
    "CREATE TABLE IF NOT EXISTS cuaderno_blobs (digest TEXT NOT NULL, part INTEGER NOT NULL, codec TEXT NOT NULL, "
    "data BLOB NOT NULL, PRIMARY KEY (digest, part))",
    "CREATE TABLE IF NOT EXISTS cuaderno_blob_refs (digest TEXT NOT NULL, run_id TEXT NOT NULL, "
    "PRIMARY KEY (digest, run_id)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS cuaderno_blob_refs_run ON cuaderno_blob_refs (run_id)",
)
"""SQLite's blob tables (schema 6). The chunks' table keeps its rowid: SQLite stores large values
best in rowid tables (a WITHOUT ROWID row should be small). So its inserts move
``last_insert_rowid()``, which the anchor reads after an append's rows: an append writes its
blobs before its rows (:meth:`Held.write` is called first)."""

BLOB_TABLES_PG: tuple[str, ...] = (
    "CREATE TABLE cuaderno_blobs (digest TEXT NOT NULL, part INTEGER NOT NULL, codec TEXT NOT NULL, "
    "data BYTEA NOT NULL, PRIMARY KEY (digest, part))",
    # Chunks are Zstandard frames already: TOAST's own compression would only spend CPU on them.
    "ALTER TABLE cuaderno_blobs ALTER COLUMN data SET STORAGE EXTERNAL",
    "CREATE TABLE cuaderno_blob_refs (digest TEXT NOT NULL, run_id TEXT NOT NULL, PRIMARY KEY (digest, run_id))",
    "CREATE INDEX cuaderno_blob_refs_run ON cuaderno_blob_refs (run_id)",
)
"""PostgreSQL's blob tables (version 5)."""

_ZSTD, _RAW = "zstd", "raw"
_ADDRESS_CONTEXT = b"cuaderno blob\x00"
_CHUNK_CONTEXT = b"cuaderno blob chunk\x00"

_reader: contextvars.ContextVar[Any] = contextvars.ContextVar("cuaderno_blob_reader", default=None)


def offload_above(store: object) -> int:
    """The offload threshold of ``store`` (its ``offload_above`` attribute, else
    :data:`DEFAULT_OFFLOAD_ABOVE`; a wrapper's is its store's).

    Raises:
        UsageError: an ``offload_above`` that is not a positive integer.
    """
    return byte_setting(store, "offload_above", DEFAULT_OFFLOAD_ABOVE)


def _style(db: Any) -> str:
    return "?" if isinstance(db, sqlite3.Connection) else "%s"


def _sql(db: Any, statement: str) -> str:
    return statement if _style(db) == "?" else statement.replace("?", "%s")


def _address(key: bytes, digest: bytes) -> str:
    """An encrypted run's blob address: its content digest keyed by the run's data key (hex)."""
    return hmac.new(key, _ADDRESS_CONTEXT + digest, hashlib.sha256).hexdigest()


def _chunk_ad(run_id: str, address: str, part: int, codec: str) -> bytes:
    # NUL never occurs in a run id (validate_event refuses it), nor in an address or a codec.
    return b"%s%s\x00%s\x00%d\x00%s" % (_CHUNK_CONTEXT, run_id.encode("utf-8", "surrogatepass"), address.encode(),
                                     part, codec.encode())


class Held:
    """The blobs one append offloads, from :meth:`take` (in ``stored_rows``) to :meth:`write` (in
    the append's transaction)."""

    def __init__(self, above: int) -> None:
        self.above = above
        self._blobs: list[tuple[str, str, bytes, bytes | None]] = []  # (run_id, address, JSON bytes, data key)

    def take(self, run_id: str, payload: bytes, keys: RunKeys | None = None) -> tuple[str, bytes] | None:
        """The codec and reference to store for ``payload`` if it is offloaded, else ``None``.
        ``keys``: the run keys of a store that encrypts, bound to the append's transaction: the
        blob is then the run's own, keyed and sealed (see the module), and its reference is
        sealed after, as every row's payload is."""
        if len(payload) <= self.above:
            return None
        if keys is None:
            digest = hashlib.sha256(payload).hexdigest()
            self._blobs.append((run_id, digest, payload, None))
            return CODEC_JSON_BLOB, b"sha256:%s:%d:%d" % (digest.encode(), len(payload), CHUNK)
        key = keys.for_write(run_id)  # created in this transaction if the run has none yet
        address = _address(key, hashlib.sha256(payload).digest())
        self._blobs.append((run_id, address, payload, key))
        return CODEC_JSON_BLOB, b"hmac:%s:%d:%d" % (address.encode(), len(payload), CHUNK)

    def write(self, db: Any) -> None:
        """Store the held blobs and their runs' references in ``db``'s transaction: a blob already
        stored whole is not written again (same address, same bytes)."""
        for run_id, address, payload, key in self._blobs:
            db.execute(_sql(db, "INSERT INTO cuaderno_blob_refs (digest, run_id) VALUES (?, ?) ON CONFLICT DO NOTHING"),
                       (address, run_id))
            parts = max(1, -(-len(payload) // CHUNK))
            have = db.execute(_sql(db, "SELECT count(*) FROM cuaderno_blobs WHERE digest=?"), (address,)).fetchone()[0]
            if have == parts:
                continue
            view = memoryview(payload)
            compressor = zstandard.ZstdCompressor(level=1, write_content_size=True)
            sealer = None if key is None else AESGCM(key)
            insert = _sql(db, "INSERT INTO cuaderno_blobs (digest, part, codec, data) VALUES (?, ?, ?, ?) "
                              "ON CONFLICT DO NOTHING")
            for part in range(parts):
                piece = view[part * CHUNK:(part + 1) * CHUNK]
                packed = compressor.compress(piece)
                codec, data = (_ZSTD, packed) if len(packed) < len(piece) else (_RAW, bytes(piece))
                if sealer is not None:
                    nonce = os.urandom(NONCE_BYTES)
                    data = nonce + sealer.encrypt(nonce, data, _chunk_ad(run_id, address, part, codec))
                    codec += SEALED
                db.execute(insert, (address, part, codec, data))
                del packed, data
                faults.point("offload.O1")  # a chunk in, the row not yet: a kill leaves neither
        self._blobs.clear()


@contextmanager
def reading(db: Any) -> Iterator[None]:
    """Within the block, an offloaded row decoded (:func:`fetched`) reads its blob through ``db``
    (the connection or cursor of the transaction that read the row)."""
    token = _reader.set(db)
    try:
        yield
    finally:
        _reader.reset(token)


def _parse(reference: bytes, where: str) -> tuple[str, str, int, int]:
    """``(tag, address, size, chunk)`` of a reference; the tag is ``sha256`` (a plain blob,
    addressed by its content's digest) or ``hmac`` (an encrypted run's, keyed)."""
    try:
        tag, digest, size, chunk = reference.decode("ascii").split(":")
        if tag not in ("sha256", "hmac") or len(digest) != 64 or int(size) < 0 or int(chunk) < 1:
            raise ValueError(reference[:80])
        int(digest, 16)
        return tag, digest, int(size), int(chunk)
    except (ValueError, UnicodeDecodeError):
        raise JournalCorrupt(f"{where}: its blob reference {reference[:80]!r} is not one cuaderno writes; the row was "
                             "altered or damaged") from None


def reference_size(reference: bytes | str) -> int:
    """The JSON size an offloaded row's reference names (for ``show``'s counts)."""
    raw = reference if isinstance(reference, bytes) else reference.encode()
    return _parse(raw, "a stored row")[2]


def _pieces(db: Any, address: str, size: int, chunk: int, key: bytes | None, run_id: str,
            where: str) -> Iterator[bytes]:
    """The blob's JSON bytes, one chunk at a time (each opened when ``key``, then decompressed).

    Raises:
        JournalCorrupt: a chunk missing, not opening, not decompressing, or of the wrong size.
    """
    parts = max(1, -(-size // chunk))
    decompressor = zstandard.ZstdDecompressor()
    opener = None if key is None else AESGCM(key)
    select = _sql(db, "SELECT codec, data FROM cuaderno_blobs WHERE digest=? AND part=?")
    at = 0
    for part in range(parts):
        row = db.execute(select, (address, part)).fetchone()
        if row is None:
            raise JournalCorrupt(f"{where}: chunk {part} of its payload (blob {address[:16]}) is missing")
        codec, data = str(row[0]), bytes(row[1]) if not isinstance(row[1], bytes) else row[1]
        del row
        if opener is not None:
            # An encrypted run's chunk is sealed; a plain one where a sealed one belongs is damage.
            codec = codec.removesuffix(SEALED) if codec.endswith(SEALED) else ""
            try:
                data = opener.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], _chunk_ad(run_id, address, part, codec))
            except InvalidTag:
                raise JournalCorrupt(f"{where}: chunk {part} of its sealed payload does not open: it was altered, or "
                                     "moved from another part, blob or run") from None
        want = min(chunk, size - at)
        try:
            piece = data if codec == _RAW else decompressor.decompress(data, max_output_size=want)
        except zstandard.ZstdError as exc:
            raise JournalCorrupt(f"{where}: chunk {part} of its payload does not decompress ({exc})") from None
        if len(piece) != want:
            raise JournalCorrupt(f"{where}: chunk {part} of its payload holds {len(piece)} bytes, not {want}")
        del data
        at += want
        yield piece


def fetched(reference: bytes, where: str, keys: RunKeys | None = None, run_id: str = "") -> bytes:
    """The JSON bytes an offloaded row refers to, read one chunk at a time into one buffer.
    ``keys`` and ``run_id``: the run's keys, for an encrypted run's blob (``hmac`` reference).

    Raises:
        JournalCorrupt: a chunk missing, not opening, not decompressing, or the bytes not the
            address's (the message names ``where``).
        KeyMissing: an encrypted run's blob and no keys.
        JournalError: no store transaction is reading (a bug: :func:`reading` binds one).
    """
    from cuaderno.errors import JournalError, KeyMissing

    tag, address, size, chunk = _parse(reference, where)
    db = _reader.get()
    if db is None:
        raise JournalError(f"{where}: an offloaded payload was read outside the store's transaction")
    key = None
    if tag == "hmac":
        if keys is None:
            raise KeyMissing(f"{where}: its offloaded payload is encrypted and this store was opened without a key "
                             "(set CUADERNO_KEY or pass --key-file / keys=); nothing was read")
        key = keys.for_read(run_id)
    buf = bytearray(size)
    check = hashlib.sha256()
    at = 0
    for piece in _pieces(db, address, size, chunk, key, run_id, where):
        buf[at:at + len(piece)] = piece
        check.update(piece)
        at += len(piece)
        del piece
    found = check.hexdigest() if key is None else _address(key, check.digest())
    if not hmac.compare_digest(found, address):
        raise JournalCorrupt(f"{where}: its payload's blob does not match its digest; it was altered or damaged")
    # One copy into immutable bytes (events hold bytes); the buffer goes at once.
    out = bytes(buf)
    del buf
    return out


_OFFLOADED = (CODEC_JSON_BLOB, CODEC_SEALED_BLOB)


def inlined(rows: list[Any], keys: RunKeys | None = None) -> list[Any]:
    """``rows`` (events rows as read, in the store's transaction) with each offloaded row's
    reference replaced by its JSON bytes (codec ``json``; an encrypted run's reference opened
    with ``keys`` first): for a read that decodes its rows after its snapshot ends (``load``,
    ``load_tail``), so the blob is read in the same snapshot as the row. Rows without a blob
    are returned as they are (one comparison each)."""
    if not any(r[8] in _OFFLOADED for r in rows):
        return rows
    out = []
    for r in rows:
        if r[8] in _OFFLOADED:
            where = f"run {r[0]!r}: journal row {r[3]} ({r[1]}:{r[2]})"
            raw = r[9] if isinstance(r[9], bytes) else bytes(r[9])
            _, ref = opened(keys, r[0], r[1], r[2], r[8], raw)
            r = (*r[:8], "json", fetched(ref, where, keys, r[0]), *r[10:])
        out.append(r)
    return out


def release(db: Any, run_ids: Sequence[str]) -> int:
    """In ``db``'s transaction, after the runs' rows are deleted or erased: drop their references
    and every blob no run refers to any more; the number of blobs removed."""
    if not run_ids:
        return 0
    removed = 0
    for run_id in run_ids:
        digests = [r[0] for r in db.execute(_sql(db, "SELECT digest FROM cuaderno_blob_refs WHERE run_id=?"),
                                            (run_id,)).fetchall()]
        if not digests:
            continue
        db.execute(_sql(db, "DELETE FROM cuaderno_blob_refs WHERE run_id=?"), (run_id,))
        for digest in digests:
            used = db.execute(_sql(db, "SELECT 1 FROM cuaderno_blob_refs WHERE digest=? LIMIT 1"), (digest,)).fetchone()
            if used is None:
                db.execute(_sql(db, "DELETE FROM cuaderno_blobs WHERE digest=?"), (digest,))
                removed += 1
    return removed


@dataclass(frozen=True)
class Offloaded:
    """One offloaded payload of a run, as ``show`` reports it (the row's reference, not the content).

    Attributes:
        step_id, phase: the event.
        size: its JSON bytes.
        sha256: the blob's address (hex): the content's SHA-256, shared by every row of that
            content; for an encrypted run, that digest keyed by the run's data key (see the module).
    """

    step_id: str
    phase: str
    size: int
    sha256: str


def offloaded_payloads(store: object, run_id: str) -> list[Offloaded]:
    """The run's offloaded payloads, read from their rows' references (no blob is read; an
    encrypted run's references are opened with the store's keys); none for a store without blob
    tables (the in-memory one).

    Raises:
        KeyMissing: an encrypted run's payloads and a store without a key.
    """
    reader = getattr(store, "_reader", None)
    if reader is None or not hasattr(store, "_dialect"):
        return []
    out = []
    with reader(run_id) as db:
        rows = db.execute(_sql(db, "SELECT step_id, phase, codec, payload FROM cuaderno_events WHERE run_id=? AND "
                                   "codec IN (?, ?)"), (run_id, *_OFFLOADED)).fetchall()
        keys = store._keys(db) if any(r[2] == CODEC_SEALED_BLOB for r in rows) else None  # type: ignore[attr-defined]
        for step_id, phase, codec, ref in rows:
            raw = ref if isinstance(ref, bytes) else bytes(ref)
            _, raw = opened(keys, run_id, str(step_id), str(phase), str(codec), raw)
            _, address, size, _ = _parse(raw, f"run {run_id!r}: journal row {step_id}:{phase}")
            out.append(Offloaded(str(step_id), str(phase), size, address))
    return out


def stats(db: Any) -> tuple[int, int]:
    """``(blobs, stored bytes)`` in the journal (the chunks as stored, compressed)."""
    row = db.execute("SELECT count(DISTINCT digest), coalesce(sum(length(data)), 0) FROM cuaderno_blobs").fetchone()
    return int(row[0]), int(row[1])
