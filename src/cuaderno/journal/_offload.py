"""Large payloads kept once, content-addressed, in the journal's own tables, and read back in chunks.

A payload over the store's threshold (``store.offload_above``, :data:`DEFAULT_OFFLOAD_ABOVE`
unless set) is not stored in its row. Its bytes go to ``cuaderno_blobs``, keyed by the SHA-256
of the JSON bytes and cut in :data:`CHUNK` pieces, each a Zstandard frame of its own (or the
piece as it is when compression saves nothing); its row holds a *reference* (storage codec
:data:`CODEC_JSON_BLOB`): the digest, the size and the chunk size. ``cuaderno_blob_refs`` says
which runs use a blob, so that prune and erase remove a blob no run uses any more, and keep one
another run still uses.

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

Why 1 MB by default: under it a row is read with the run in one statement and costs nothing
more; over it the row would make every read of the run's journal (``tail``, a listing's summary
reads do not touch rows) carry it, while a resume reads it once. A model answer is far below
(4 MB would be a million tokens); a tool returning a file or a page is what crosses it.
"""

from __future__ import annotations

import contextvars
import hashlib
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import zstandard

from cuaderno.errors import JournalCorrupt
from cuaderno.journal.base import byte_setting

__all__ = ["BLOB_TABLES_PG", "BLOB_TABLES_SQLITE", "CHUNK", "CODEC_JSON_BLOB", "DEFAULT_OFFLOAD_ABOVE", "Held", "Offloaded",
           "fetched", "inlined", "offload_above", "offloaded_payloads", "reading", "reference_size", "release", "stats"]

CODEC_JSON_BLOB = "json+blob"
"""The storage codec of a row whose JSON payload is in ``cuaderno_blobs`` (never an event's codec)."""

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


class Held:
    """The blobs one append offloads, from :meth:`take` (in ``stored_rows``) to :meth:`write` (in
    the append's transaction)."""

    def __init__(self, above: int) -> None:
        self.above = above
        self._blobs: list[tuple[str, str, bytes]] = []  # (run_id, digest, JSON bytes)

    def take(self, run_id: str, payload: bytes) -> tuple[str, bytes] | None:
        """The codec and reference to store for ``payload`` if it is offloaded, else ``None``."""
        if len(payload) <= self.above:
            return None
        digest = hashlib.sha256(payload).hexdigest()
        self._blobs.append((run_id, digest, payload))
        return CODEC_JSON_BLOB, b"sha256:%s:%d:%d" % (digest.encode(), len(payload), CHUNK)

    def write(self, db: Any) -> None:
        """Store the held blobs and their runs' references in ``db``'s transaction: a blob already
        stored whole is not written again (same digest, same bytes)."""
        for run_id, digest, payload in self._blobs:
            db.execute(_sql(db, "INSERT INTO cuaderno_blob_refs (digest, run_id) VALUES (?, ?) ON CONFLICT DO NOTHING"),
                       (digest, run_id))
            parts = max(1, -(-len(payload) // CHUNK))
            have = db.execute(_sql(db, "SELECT count(*) FROM cuaderno_blobs WHERE digest=?"), (digest,)).fetchone()[0]
            if have == parts:
                continue
            view = memoryview(payload)
            compressor = zstandard.ZstdCompressor(level=1, write_content_size=True)
            insert = _sql(db, "INSERT INTO cuaderno_blobs (digest, part, codec, data) VALUES (?, ?, ?, ?) "
                              "ON CONFLICT DO NOTHING")
            for part in range(parts):
                piece = view[part * CHUNK:(part + 1) * CHUNK]
                packed = compressor.compress(piece)
                codec, data = (_ZSTD, packed) if len(packed) < len(piece) else (_RAW, bytes(piece))
                db.execute(insert, (digest, part, codec, data))
                del packed, data
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


def _parse(reference: bytes, where: str) -> tuple[str, int, int]:
    try:
        tag, digest, size, chunk = reference.decode("ascii").split(":")
        if tag != "sha256" or len(digest) != 64 or int(size) < 0 or int(chunk) < 1:
            raise ValueError(reference[:80])
        int(digest, 16)
        return digest, int(size), int(chunk)
    except (ValueError, UnicodeDecodeError):
        raise JournalCorrupt(f"{where}: its blob reference {reference[:80]!r} is not one cuaderno writes; the row was "
                             "altered or damaged") from None


def reference_size(reference: bytes | str) -> int:
    """The JSON size an offloaded row's reference names (for ``show``'s counts)."""
    raw = reference if isinstance(reference, bytes) else reference.encode()
    return _parse(raw, "a stored row")[1]


def fetched(reference: bytes, where: str) -> bytes:
    """The JSON bytes an offloaded row refers to, read one chunk at a time into one buffer.

    Raises:
        JournalCorrupt: a chunk missing, not decompressing, or the bytes not the digest's (the
            message names ``where``).
        JournalError: no store transaction is reading (a bug: :func:`reading` binds one).
    """
    from cuaderno.errors import JournalError

    digest, size, chunk = _parse(reference, where)
    db = _reader.get()
    if db is None:
        raise JournalError(f"{where}: an offloaded payload was read outside the store's transaction")
    parts = max(1, -(-size // chunk))
    buf = bytearray(size)
    check = hashlib.sha256()
    decompressor = zstandard.ZstdDecompressor()
    select = _sql(db, "SELECT codec, data FROM cuaderno_blobs WHERE digest=? AND part=?")
    at = 0
    for part in range(parts):
        row = db.execute(select, (digest, part)).fetchone()
        if row is None:
            raise JournalCorrupt(f"{where}: chunk {part} of its payload (blob {digest[:16]}) is missing")
        codec, data = row[0], bytes(row[1]) if not isinstance(row[1], bytes) else row[1]
        want = min(chunk, size - at)
        try:
            piece = data if codec == _RAW else decompressor.decompress(data, max_output_size=want)
        except zstandard.ZstdError as exc:
            raise JournalCorrupt(f"{where}: chunk {part} of its payload does not decompress ({exc})") from None
        if len(piece) != want:
            raise JournalCorrupt(f"{where}: chunk {part} of its payload holds {len(piece)} bytes, not {want}")
        buf[at:at + want] = piece
        check.update(piece)
        at += want
        del row, data, piece
    if check.hexdigest() != digest:
        raise JournalCorrupt(f"{where}: its payload's blob does not match its digest; it was altered or damaged")
    # One copy into immutable bytes (events hold bytes); the buffer goes at once.
    out = bytes(buf)
    del buf
    return out


def inlined(rows: list[Any]) -> list[Any]:
    """``rows`` (events rows as read, in the store's transaction) with each offloaded row's
    reference replaced by its JSON bytes (codec ``json``): for a read that decodes its rows after
    its snapshot ends (``load``, ``load_tail``), so the blob is read in the same snapshot as the
    row. Rows without a blob are returned as they are (one comparison each)."""
    if not any(r[8] == CODEC_JSON_BLOB for r in rows):
        return rows
    out = []
    for r in rows:
        if r[8] == CODEC_JSON_BLOB:
            where = f"run {r[0]!r}: journal row {r[3]} ({r[1]}:{r[2]})"
            raw = r[9] if isinstance(r[9], bytes) else bytes(r[9])
            r = (*r[:8], "json", fetched(raw, where), *r[10:])
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
        sha256: the content's digest (hex): the blob's address, shared by every row of that content.
    """

    step_id: str
    phase: str
    size: int
    sha256: str


def offloaded_payloads(store: object, run_id: str) -> list[Offloaded]:
    """The run's offloaded payloads, read from their rows' references (no blob is read); none for a
    store without blob tables (the in-memory one)."""
    reader = getattr(store, "_reader", None)
    if reader is None or not hasattr(store, "_dialect"):
        return []
    out = []
    with reader(run_id) as db:
        rows = db.execute(_sql(db, "SELECT step_id, phase, payload FROM cuaderno_events WHERE run_id=? AND codec=?"),
                          (run_id, CODEC_JSON_BLOB)).fetchall()
    for step_id, phase, ref in rows:
        raw = ref if isinstance(ref, bytes) else bytes(ref)
        digest, size, _ = _parse(raw, f"run {run_id!r}: journal row {step_id}:{phase}")
        out.append(Offloaded(str(step_id), str(phase), size, digest))
    return out


def stats(db: Any) -> tuple[int, int]:
    """``(blobs, stored bytes)`` in the journal (the chunks as stored, compressed)."""
    row = db.execute("SELECT count(DISTINCT digest), coalesce(sum(length(data)), 0) FROM cuaderno_blobs").fetchone()
    return int(row[0]), int(row[1])
