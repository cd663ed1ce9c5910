"""Canonical JSON (RFC 8785) and the fingerprints built on it.

A fingerprint identifies *what was asked*: two requests with the same canonical body have the
same fingerprint on every machine and every Python version, and any change in any field changes
it. They are journaled, and provider idempotency keys are derived from them, so the way they are
computed is part of the journal format: changing it is a schema change.

Request bodies grow with the conversation. Hashing the whole body at every turn would make a run
of N turns cost O(N²); instead a request fingerprint is a hash chain over the canonical pieces
(configuration, then each message once), which identifies the same body with O(1) work per turn.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785

__all__ = ["canonical", "chain", "fingerprint", "idempotency_key"]


def canonical(value: Any) -> bytes:
    """The RFC 8785 canonical JSON bytes of ``value``."""
    return rfc8785.dumps(value)


def fingerprint(value: Any) -> str:
    """sha256 (hex) of the canonical JSON of ``value``."""
    return hashlib.sha256(rfc8785.dumps(value)).hexdigest()


def chain(previous: str, piece_fingerprint: str) -> str:
    """Extend a hash chain: the fingerprint of ``previous`` followed by one more piece."""
    return hashlib.sha256(f"{previous}\n{piece_fingerprint}".encode()).hexdigest()


def idempotency_key(run_id: str, step_id: str, body_fingerprint: str) -> str:
    """``hash(run_id, step_id, body_fingerprint)``: the key a provider sees for one step.

    The same step with the same body always gets the same key, so a re-send after a crash is
    recognisable; the same step with another body (the instructions changed) gets another key,
    so it never collides with the stored answer for the old body.
    """
    h = hashlib.sha256(rfc8785.dumps([run_id, step_id, body_fingerprint])).hexdigest()
    return f"cdn-{h[:48]}"
