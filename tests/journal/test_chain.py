"""How stored rows become events: check_chain, the payload fast path, and the positional
constructor behind both loads and stamping. The rows prove that a payload which is not exactly
one JSON object is reported on its own row, never decoded with (or into) a neighbour."""

from __future__ import annotations

from typing import Any

import pytest

from cuaderno.errors import JournalCorrupt
from cuaderno.events import StepEvent, row_hash
from cuaderno.journal._append import RawRow, check_chain


def _rows(payloads: list[bytes], codec: str = "json") -> list[RawRow]:
    """Rows whose hash chain is valid for these payload bytes (as if written by a buggy or
    hostile writer that also recomputed the hashes)."""
    rows: list[RawRow] = []
    prev = ""
    for seq, raw in enumerate(payloads, start=1):
        ev = StepEvent(run_id="r", step_id=f"s{seq}", phase="result", kind="tool", name="t", codec=codec, raw=raw)
        link = row_hash(prev, ev, seq, raw)
        rows.append(("r", f"s{seq}", "result", seq, "tool", "t", None, None, codec, raw, 1.0, link, None))
        prev = link
    return rows


def test_plain_payloads_come_back_decoded() -> None:
    events = check_chain("r", _rows([b'{"a":1}', b'{"b":[2,3]}', b'{"c":"\\ud800"}']), None)
    assert [e.payload for e in events] == [{"a": 1}, {"b": [2, 3]}, {"c": "\ud800"}]
    assert [e.encoded_payload() for e in events] == [b'{"a":1}', b'{"b":[2,3]}', b'{"c":"\\ud800"}']


@pytest.mark.parametrize(
    ("payloads", "bad"),
    [
        # One payload holds two objects and two others merge through a string: the count still
        # matches, so only the one-object-per-payload rule keeps bytes with their rows.
        ([b'{"x":"', b'"}', b"{},{}", b'{"ok":1}'], [0, 1, 2]),
        ([b"[1]", b'{"ok":1}'], [0]),
        ([b"not json", b'{"ok":1}'], [0]),
        ([b'{"ok":1}', b'{"a":1}]'], [1]),
    ],
)
def test_a_payload_that_is_not_one_object_is_reported_on_its_own_row(payloads: list[bytes], bad: list[int]) -> None:
    events = check_chain("r", _rows(payloads), None)
    assert [e.encoded_payload() for e in events] == payloads
    for i, event in enumerate(events):
        if i in bad:
            with pytest.raises((JournalCorrupt, ValueError)):
                event.payload  # noqa: B018
        else:
            assert event.payload == {"ok": 1}


def test_an_unknown_codec_is_never_decoded_as_json() -> None:
    # Refused at load, not at the payload's first decoding: the chain does not cover the codec
    # column, and a row whose payload is never decoded (a model response a resume skips) would
    # otherwise read back with a damaged codec silently (the bit-flip sweep found one).
    with pytest.raises(JournalCorrupt, match="its codec 'msgpack' is not one a journal stores"):
        check_chain("r", _rows([b'{"a":1}'], codec="msgpack"), None)


def test_an_altered_payload_is_refused_before_anything_is_decoded() -> None:
    rows = _rows([b'{"a":1}', b'{"b":2}'])
    rows[1] = (*rows[1][:9], b'{"b":3}', *rows[1][10:])
    with pytest.raises(JournalCorrupt, match="row 2 .* was altered"):
        check_chain("r", rows, None)


def test_stored_constructor_sets_every_slot_as_init_does() -> None:
    """``StepEvent._stored`` (the positional fast path of loads and stamping) must set every slot
    the keyword constructor sets, to the same values: a slot added to one and not the other
    would only show as an AttributeError deep in a resume."""
    fields: dict[str, Any] = {"run_id": "r", "step_id": "t0001.tool00", "phase": "result", "kind": "tool", "name": "t",
              "decision": "allow", "fingerprint": "f" * 64, "codec": "json", "seq": 7, "created_at": 2.5,
              "row_hash": "h" * 32}
    by_init = StepEvent(**fields, raw=b'{"a":1}')
    stored = StepEvent._stored("r", "t0001.tool00", "result", "tool", "t", "allow", "f" * 64, "json", None,
                               b'{"a":1}', 7, 2.5, "h" * 32)
    assert {s: getattr(stored, s) for s in StepEvent.__slots__} == {s: getattr(by_init, s) for s in StepEvent.__slots__}
    stamped = StepEvent(run_id="r", step_id="s", phase="intent", kind="tool", payload={"a": 1}).stamped(
        seq=1, created_at=1.0, prev_hash="", payload_bytes=b'{"a":1}')
    assert stamped.payload == {"a": 1} and stamped.encoded_payload() == b'{"a":1}' and stamped.seq == 1
    assert stamped.row_hash == row_hash("", stamped, 1, b'{"a":1}')
