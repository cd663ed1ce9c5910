"""Payload compression at rest: a storage form, invisible above the backend.

A model response or a tool result is mostly text (prose, JSON, code), which Zstandard stores in
fewer bytes the longer it is: English prose (the GPL-3 text, in JSON) keeps 0.65 of its bytes at
400 bytes, 0.48 at 2 KB and 0.41 at 8 KB. SQLite, unlike Postgres (whose TOAST compresses large values by
itself), stores a blob as given, so :class:`~cuaderno.journal.sqlite.SqliteCheckpointer`
compresses large payloads itself and tags the row's codec ``json+zstd``.

What replay needs is unchanged: an event's codec stays ``json`` and its payload bytes stay the
canonical JSON, so the row hash, deduplication (``same_as`` compares the JSON bytes) and every
reader see the same event whether or not its row was compressed. :func:`unpack` restores the JSON
bytes when a row is read, before the hash chain is checked, so a damaged compressed blob is
reported like any other altered row.

Why Zstandard at level 1, measured on the benchmark's run (400-byte English-like tool results,
CPython 3.11, on the loop's path rather than in a tight loop, where caches are warm): 13 us per
step against 22 us for zlib at level 1 with a 4 KB window (58 us with the default 32 KB one, whose
set-up dominates small inputs), for the same journal size; LZ4 costs 2 us but saves too little
on small payloads to change the file at all. A frame is standard (RFC 8878): the ``zstd`` tool
and Python 3.14's ``compression.zstd`` read it. A row holds exactly one frame: bytes after it
are refused, since another reader would decode them as more payload.

Each frame records its content size, and a row is read only if that size is one a frame of its
length could really hold: a damaged header can make a reader ask for at most 32,768 times the
row's own size (32 MB for a 1 KB row), never for whatever its size field names.
"""

from __future__ import annotations

import threading
from typing import Any

import zstandard

from cuaderno.errors import JournalCorrupt, JournalError
from cuaderno.events import CODEC_JSON, decode_payload

__all__ = ["CODEC_JSON_ZSTD", "COMPRESS_FROM", "MAX_PAYLOAD", "pack", "stored_payload", "unpack"]

CODEC_JSON_ZSTD = "json+zstd"
"""The storage codec of a compressed JSON payload (never an event's own codec)."""

COMPRESS_FROM = 256
"""Payloads shorter than this are stored as they are: intents, decisions and short answers save
a few dozen bytes at most, not worth a compression each."""

MAX_PAYLOAD = 999_000_000
"""The largest JSON payload the journal stores, compressed or not: SQLite's limit on a row
(1,000,000,000 bytes by default) less room for the row's other columns, so that no payload is
stored compressed that could not have been stored plain (it could then be read back only by a
reader that allows more)."""

_MAX_RATIO = 32_768
"""No Zstandard frame expands more than this: a block holds at most 128 KB and takes at least
4 bytes (an RLE block: a 3-byte header and the byte to repeat); compressed blocks cost more.
A frame claiming more than this many times its own length was not written by a compressor."""

# Compression contexts are reused (their set-up is most of the cost on small payloads) and are
# not safe to share between threads, so each thread keeps its own.
_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    found: zstandard.ZstdCompressor | None = getattr(_local, "compressor", None)
    if found is None:
        found = _local.compressor = zstandard.ZstdCompressor(level=1, write_content_size=True)
    return found


def _decompressor() -> zstandard.ZstdDecompressor:
    found: zstandard.ZstdDecompressor | None = getattr(_local, "decompressor", None)
    if found is None:
        found = _local.decompressor = zstandard.ZstdDecompressor()
    return found


def pack(data: bytes) -> tuple[str, bytes]:
    """The codec and bytes to store for the JSON payload ``data``.

    Compressed when that saves at least a sixteenth of the bytes (a row read back costs a
    decompression, which a few bytes saved do not pay for); otherwise ``data`` as it is.
    """
    if len(data) < COMPRESS_FROM:
        return CODEC_JSON, data
    packed = _compressor().compress(data)
    if len(packed) + len(data) // 16 > len(data):
        return CODEC_JSON, data
    return CODEC_JSON_ZSTD, packed


def unpack(codec: str, data: bytes, where: str) -> tuple[str, bytes]:
    """The event codec and JSON bytes of a stored payload; other codecs pass through untouched
    (the event decodes them, and refuses one it does not know).

    Raises:
        JournalCorrupt: a ``json+zstd`` blob that does not decompress (damaged or truncated),
            claims a size no frame of its length can hold, or has bytes after its frame; the
            message names ``where``.
        JournalError: a believable size this process has not the memory for.
    """
    if codec != CODEC_JSON_ZSTD:
        return codec, data
    size = -1
    try:
        size = zstandard.frame_content_size(data)
        if size < 0:
            raise zstandard.ZstdError("the frame does not say its content size")
        if size > min(MAX_PAYLOAD, _MAX_RATIO * len(data)):
            raise zstandard.ZstdError(f"a frame of {len(data)} bytes claims {size} bytes")
        return CODEC_JSON, _decompressor().decompress(data, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise JournalCorrupt(f"{where}: the compressed payload does not decompress ({exc}); the row was "
                             "altered or damaged") from exc
    except MemoryError:
        # A size a real frame can have, so not proof of damage: this process lacks the memory.
        raise JournalError(f"{where}: not enough memory to decompress a payload of {size} bytes") from None


def stored_payload(codec: str, data: bytes | str) -> dict[str, Any]:
    """The payload of a row read with plain SQL (``SELECT codec, payload ...``), decoded as the
    store decodes it (no hash check: that needs the whole chain, which ``load`` does).

    Raises:
        RunErased: the row's content was erased.
    """
    raw = data if isinstance(data, bytes) else data.encode()
    codec, raw = unpack(codec, raw, "a stored row")
    return decode_payload(codec, raw)
