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
import json
from typing import Any

import rfc8785

from cuaderno.plainjson import sorted_compact

__all__ = ["canonical", "chain", "fingerprint", "idempotency_key"]


_MAX_SAFE_INT = 2**53 - 1


def canonical(value: Any) -> bytes:
    """The RFC 8785 canonical JSON bytes of ``value``.

    Values made only of strings with keys below U+D800, safe integers, booleans, nulls, lists and
    dicts take a fast path through the C JSON encoder, whose compact sorted output is identical
    to RFC 8785 for exactly that subset (a property test checks it against ``rfc8785``).
    Anything else (floats, big integers, astral-plane keys) goes through ``rfc8785`` itself.
    """
    try:
        if _fast_ok(value):
            return sorted_compact(value).encode()
        return rfc8785.dumps(value)
    except (UnicodeEncodeError, rfc8785.CanonicalizationError):
        # RFC 8785 has no form for a lone surrogate, and a model can emit one ("\\ud800"). Such a
        # value still needs a stable identity: the same compact sorted form, surrogates passed
        # through. Valid Unicode never reaches this branch, so every other fingerprint is RFC 8785.
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8", "surrogatepass")


def _fast_ok(value: Any) -> bool:
    t = type(value)
    if t is str or value is None or t is bool:
        return True
    if t is int:
        return bool(-_MAX_SAFE_INT <= value <= _MAX_SAFE_INT)
    if t is dict:
        for k, v in value.items():
            # RFC 8785 sorts keys by UTF-16 code units, Python by code points: they agree below U+D800.
            if type(k) is not str or (not k.isascii() and max(k) >= "\ud800"):
                return False
            # Leaves are checked here rather than by a call each: most values of a payload are
            # strings, and this runs for every fingerprint of every step.
            tv = type(v)
            if not (tv is str or v is None or tv is bool) and not _fast_ok(v):
                return False
        return True
    if t is list or t is tuple:
        for v in value:
            tv = type(v)
            if not (tv is str or v is None or tv is bool) and not _fast_ok(v):
                return False
        return True
    return False


def fingerprint(value: Any) -> str:
    """sha256 (hex) of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical(value)).hexdigest()


def chain(previous: str, piece_fingerprint: str) -> str:
    """Extend a hash chain: the fingerprint of ``previous`` followed by one more piece."""
    return hashlib.sha256(f"{previous}\n{piece_fingerprint}".encode()).hexdigest()


def idempotency_key(run_id: str, step_id: str, body_fingerprint: str) -> str:
    """``hash(run_id, step_id, body_fingerprint)``: the key a provider sees for one step.

    The same step with the same body always gets the same key, so a re-send after a crash is
    recognisable; the same step with another body (the instructions changed) gets another key,
    so it never collides with the stored answer for the old body.
    """
    h = hashlib.sha256(canonical([run_id, step_id, body_fingerprint])).hexdigest()
    return f"cdn-{h[:48]}"
