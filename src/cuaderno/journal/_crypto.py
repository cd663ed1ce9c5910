"""Encryption at rest, the storage codec: per-run data keys wrapped by a master key, and each
row's payload sealed with its run's data key (AES-256-GCM, from ``cryptography``).

The design, in the style of :mod:`._compress` (a storage form, invisible above the backend):

- Each run gets a random 32-byte *data key*; the journal stores it only *wrapped*: AES-256-GCM
  under a master key from a :class:`~cuaderno.journal.keys.KeyProvider`, with the run id as
  associated data (a wrapped key moved to another run does not unwrap), and the master key's id
  beside it. Erasing an encrypted run is then destroying its wrapped key (and its ciphertext);
  rotating the master key (``rekey``) re-wraps the data keys, never the rows.
- A row's payload is compressed first (:func:`~._compress.pack`), then sealed: a fresh 12-byte
  nonce, then the AES-256-GCM ciphertext and tag, with the row's identity ``(run_id, step_id,
  phase)`` as associated data, so a sealed payload copied to another row does not open. Its
  storage codec gets the suffix :data:`SEALED` (``json+aesgcm``, ``json+zstd+aesgcm``).
- The hash chain is computed over the plaintext's keyed digest (:func:`cuaderno.events.row_hash`)
  exactly as for a plain row: encryption changes how a row rests, not what it says.

The stores call it through :mod:`._sealing` (which run's key seals what, the summary's content
fields, the keys table).
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from cuaderno.errors import JournalCorrupt, KeyInvalid
from cuaderno.journal.keys import KeyProvider, MasterKey

__all__ = ["DATA_KEY_BYTES", "NONCE_BYTES", "SEALED", "WrappedKey", "new_data_key", "open_row", "rewrap", "seal_row",
           "unwrap", "wrap"]

DATA_KEY_BYTES = 32
NONCE_BYTES = 12
"""AES-GCM's standard nonce: random per seal (2**-32 collision odds only after 2**32 seals under
one data key: far more rows than a run has)."""

SEALED = "+aesgcm"
"""The suffix of a sealed row's storage codec."""

_WRAP_CONTEXT = b"cuaderno data key\x00"


WrappedKey = tuple[str, bytes]
"""``(master key id, nonce + ciphertext of the data key)``: what the journal stores for a run."""


def new_data_key() -> bytes:
    """A fresh random data key for a new run."""
    return os.urandom(DATA_KEY_BYTES)


def wrap(master: MasterKey, run_id: str, data_key: bytes) -> WrappedKey:
    """The data key of ``run_id`` wrapped under ``master`` (the run id is associated data)."""
    nonce = os.urandom(NONCE_BYTES)
    sealed = AESGCM(master.secret).encrypt(nonce, data_key, _WRAP_CONTEXT + _text(run_id))
    return master.key_id, nonce + sealed


def unwrap(keys: KeyProvider, run_id: str, wrapped: WrappedKey) -> bytes:
    """The data key of ``run_id`` from its wrapped form.

    Raises:
        KeyInvalid: the provider lacks the master key it names, or that key does not open it (a
            wrong key under the same id cannot happen: ids derive from keys; so the wrapped
            key was altered, or moved from another run).
    """
    key_id, blob = wrapped
    master = keys.find(key_id)
    if master is None:
        raise KeyInvalid(f"run {run_id!r}: its data key is wrapped by master key {key_id!r}, which the key provider "
                         "does not hold; nothing was read")
    try:
        return AESGCM(master.secret).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], _WRAP_CONTEXT + _text(run_id))
    except InvalidTag:
        raise KeyInvalid(f"run {run_id!r}: master key {key_id!r} does not open its data key (altered, or another "
                         "run's); nothing was read") from None


def rewrap(keys: KeyProvider, run_id: str, wrapped: WrappedKey) -> WrappedKey:
    """The run's data key wrapped under the provider's current key (what ``rekey`` stores); the
    same value when it already is."""
    current = keys.current()
    if wrapped[0] == current.key_id:
        return wrapped
    return wrap(current, run_id, unwrap(keys, run_id, wrapped))


def _text(value: str) -> bytes:
    return value.encode("utf-8", "surrogatepass")


def _row_identity(run_id: str, step_id: str, phase: str) -> bytes:
    # NUL never occurs in a stored id (validate_event refuses it), so the join is unambiguous.
    return _text(f"{run_id}\x00{step_id}\x00{phase}")


def seal_row(data_key: bytes, run_id: str, step_id: str, phase: str, codec: str, stored: bytes) -> tuple[str, bytes]:
    """A row's stored payload (``codec``: how it is stored, compressed or not) sealed."""
    nonce = os.urandom(NONCE_BYTES)
    return codec + SEALED, nonce + AESGCM(data_key).encrypt(nonce, stored, _row_identity(run_id, step_id, phase))


def open_row(data_key: bytes, run_id: str, step_id: str, phase: str, codec: str, stored: bytes) -> tuple[str, bytes]:
    """A sealed row's storage codec and payload as stored before sealing; others pass through.

    Raises:
        JournalCorrupt: the seal does not open: the row was altered, or its payload moved from
            another row (the data key itself was checked when it was unwrapped).
    """
    if not codec.endswith(SEALED):
        return codec, stored
    try:
        plain = AESGCM(data_key).decrypt(stored[:NONCE_BYTES], stored[NONCE_BYTES:],
                                         _row_identity(run_id, step_id, phase))
    except InvalidTag:
        raise JournalCorrupt(f"run {run_id!r}: the sealed payload of {step_id}:{phase} does not open: the row was "
                             "altered or its payload copied from another row") from None
    return codec[:-len(SEALED)], plain
