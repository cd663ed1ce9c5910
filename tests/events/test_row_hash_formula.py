"""``row_hash`` is the formula its docstring states, on every one of its roads.

The link is part of the journal format. ``row_hash`` computes the digest of a version-2 row
written today (a 32-byte key, a payload under 64 KiB) inline rather than through
``content_digest``; this test recomputes every version from the documented formula with
``hashlib`` and ``hmac`` alone, so a change of any byte on any road fails here."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuaderno.events import CODEC_ERASED, CODEC_JSON, HMAC_SALT_BYTES, SALT_BYTES, StepEvent, row_hash


def _formula(prev: str, ev: StepEvent, seq: int, data: bytes) -> str:
    def text(*fields: str) -> bytes:
        return "\x00".join(fields).encode("utf-8", "surrogatepass")

    head = (prev, ev.run_id, ev.step_id, ev.phase, ev.kind, ev.name or "", ev.decision or "")
    if ev.codec != CODEC_ERASED and ev.salt is None:
        return hashlib.sha256(text(*head, ev.fingerprint or "", ev.codec, str(seq), "") + b"\x01" + data
                              ).hexdigest()[:32]
    if ev.codec == CODEC_ERASED or ev.salt is None:
        digest = data
    else:
        fp = ev.fingerprint
        keyed = (b"-" if fp is None else str(len(fp)).encode() + b":" + fp.encode("utf-8", "surrogatepass")) + data
        digest = (hmac.digest(ev.salt, keyed, "sha256") if len(ev.salt) == HMAC_SALT_BYTES
                  else hashlib.blake2b(keyed, key=ev.salt, digest_size=32).digest())
    return hashlib.sha256(text(*head, CODEC_JSON, str(seq), "2") + b"\x02" + digest).hexdigest()[:32]


_text = st.text(min_size=1, max_size=6) | st.sampled_from(["\ud800x", "é", "\U0001f600"])
_salts = st.none() | st.sampled_from([b"k" * SALT_BYTES, b"h" * HMAC_SALT_BYTES, bytes(range(SALT_BYTES))])
_payloads = st.binary(max_size=40) | st.sampled_from([b"x" * (64 * 1024 - 1), b"y" * (64 * 1024), b"z" * 70_000])


@settings(max_examples=300, deadline=None)
@given(run_id=_text, step_id=_text, name=st.none() | _text, decision=st.none() | _text,
       fingerprint=st.none() | _text, codec=st.sampled_from([CODEC_JSON, CODEC_ERASED, "json+zstd"]), salt=_salts,
       seq=st.integers(1, 10**12), prev=st.sampled_from(["", "0" * 32, "é"]), data=_payloads)
def test_row_hash_is_its_formula(run_id: str, step_id: str, name: str | None, decision: str | None,
                                 fingerprint: str | None, codec: str, salt: bytes | None, seq: int, prev: str,
                                 data: bytes) -> None:
    ev = StepEvent._stored(run_id, step_id, "result", "tool", name, decision, fingerprint, codec, None, data, seq,
                           0.0, "", salt)
    assert row_hash(prev, ev, seq, data) == _formula(prev, ev, seq, data)


@pytest.mark.parametrize("salt", [b"k" * SALT_BYTES, b"h" * HMAC_SALT_BYTES, None])
@pytest.mark.parametrize("fingerprint", [None, "ab", "\ud800"])
def test_each_road_once(salt: bytes | None, fingerprint: str | None) -> None:
    ev = StepEvent._stored("r", "t0001.tool", "result", "tool", "pay", None, fingerprint, CODEC_JSON, None,
                           b'{"a":1}', 3, 0.0, "", salt)
    assert row_hash("p", ev, 3, b'{"a":1}') == _formula("p", ev, 3, b'{"a":1}')
