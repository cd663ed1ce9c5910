"""Encryption of what crosses Temporal's activity boundary: a :class:`PayloadCodec` (AES-256-GCM
under the journal's master keys, :class:`~cuaderno.journal.keys.KeyProvider`).

Under Temporal, the workflow's history keeps every activity's input and result: a run's task
(``RunInput``), the journal events a model turn or a tool call returns, tool arguments and
results. The journal encrypts at rest on its own side (``keys=`` on the store); this codec does
the same for the history, so the server, its database and anyone who reads a history with
``temporal workflow show`` see sealed bytes. The client that starts workflows and every worker
use the same converter (:func:`encrypted_converter`)::

    keys = env_keys()  # or file_keys(PATH)
    client = await Client.connect("localhost:7233", data_converter=encrypted_converter(keys))

Each payload is serialised whole (its metadata too, which names its encoding), sealed with a
fresh nonce under the provider's current master key, and stored as a payload of encoding
``binary/cuaderno-aesgcm`` whose metadata names the key id (never the key), so a history written
before a rotation still decodes while the older key stays in the provider. A payload that is not
sealed passes through (histories written before the codec was turned on still replay).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import temporalio.converter
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import DataConverter, PayloadCodec

from cuaderno.errors import KeyInvalid, UsageError
from cuaderno.journal.keys import KeyProvider

__all__ = ["ENCODING", "JournalPayloadCodec", "encrypted_converter"]

ENCODING = b"binary/cuaderno-aesgcm"
_KEY_ID = "cuaderno-key-id"
_AD = b"cuaderno temporal payload"
_NONCE = 12


class JournalPayloadCodec(PayloadCodec):
    """Seals every payload with AES-256-GCM under the provider's current master key (see the module)."""

    def __init__(self, keys: KeyProvider) -> None:
        if not isinstance(keys, KeyProvider):
            raise UsageError(f"keys must be a KeyProvider, got {type(keys).__name__}")
        keys.current()  # KeyMissing now, not at the first payload
        self._keys = keys

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        current = self._keys.current()
        aead = AESGCM(current.secret)
        out = []
        for p in payloads:
            nonce = os.urandom(_NONCE)
            sealed = aead.encrypt(nonce, p.SerializeToString(), _AD)
            out.append(Payload(metadata={"encoding": ENCODING, _KEY_ID: current.key_id.encode()},
                               data=nonce + sealed))
        return out

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            if p.metadata.get("encoding") != ENCODING:
                out.append(p)  # written before the codec: as it is
                continue
            key_id = p.metadata.get(_KEY_ID, b"").decode("ascii", "replace")
            master = self._keys.find(key_id)
            if master is None:
                raise KeyInvalid(f"a Temporal payload is sealed by master key {key_id!r}, which the key provider does "
                                 "not hold")
            try:
                plain = AESGCM(master.secret).decrypt(p.data[:_NONCE], p.data[_NONCE:], _AD)
            except InvalidTag:
                raise KeyInvalid(f"a Temporal payload sealed by master key {key_id!r} does not open: it was "
                                 "altered") from None
            out.append(Payload.FromString(plain))
        return out


def encrypted_converter(keys: KeyProvider, base: DataConverter | None = None) -> DataConverter:
    """``base`` (Temporal's default converter when ``None``) with :class:`JournalPayloadCodec`:
    what the client and every worker connect with."""
    return dataclasses.replace(base or temporalio.converter.default(), payload_codec=JournalPayloadCodec(keys))
