"""The four ways an event is built set the same fourteen slots.

``new_event`` and ``stamped`` set the slots themselves instead of going through ``_filled``
(calls and keyword parsing cost more on paths every step takes), so nothing but this test stops a
slot added to ``StepEvent`` from being left unset (``AttributeError`` on read) or set differently
there."""

from __future__ import annotations

import pytest

from cuaderno.events import CODEC_JSON, SALT_BYTES, StepEvent, new_event, row_hash

CASES = [
    {"run_id": "r", "step_id": "s1", "phase": "intent", "kind": "model"},
    {"run_id": "r", "step_id": "s2", "phase": "result", "kind": "tool", "name": "pay", "decision": "allow",
     "fingerprint": "fp", "payload": {"amount": 3}},
    {"run_id": "r", "step_id": "s3", "phase": "result", "kind": "model", "raw": b'{"a":1}'},
    {"run_id": "r", "step_id": "s4", "phase": "intent", "kind": "tool", "payload": {}, "raw": None},
]


def _slots(ev: StepEvent) -> dict[str, object]:
    return {name: getattr(ev, name) for name in StepEvent.__slots__}


@pytest.mark.parametrize("fields", CASES)
def test_new_event_sets_every_slot_as_the_constructor_does(fields: dict[str, object]) -> None:
    assert _slots(new_event(**fields)) == _slots(StepEvent(**fields))  # type: ignore[arg-type]


@pytest.mark.parametrize("fields", CASES)
def test_stored_sets_every_slot_as_the_constructor_does(fields: dict[str, object]) -> None:
    built = StepEvent(**fields)  # type: ignore[arg-type]
    stored = StepEvent._stored(built.run_id, built.step_id, built.phase, built.kind, built.name, built.decision,
                               built.fingerprint, CODEC_JSON, built._payload, built._raw, 0, 0.0, "")
    assert _slots(stored) == _slots(built)


def test_every_slot_is_compared() -> None:
    # A slot missing from __slots__' tuple would escape the comparisons above.
    ev = new_event(run_id="r", step_id="s", phase="intent", kind="model")
    assert set(StepEvent.__slots__) == {n for n in dir(type(ev)) if isinstance(getattr(type(ev), n, None),
                                                                            type(StepEvent.seq))}


@pytest.mark.parametrize("fields", CASES)
@pytest.mark.parametrize("salt", [None, b"k" * SALT_BYTES])
def test_stamped_sets_every_slot_as_stored_does(fields: dict[str, object], salt: bytes | None) -> None:
    # stamped sets the slots itself too (the append path stamps every event of every step).
    ev = StepEvent(**fields)  # type: ignore[arg-type]
    data, prev = b'{"a":1}', "0" * 64
    stamped = ev.stamped(seq=7, created_at=12.5, prev_hash=prev, payload_bytes=data, salt=salt)
    stored = StepEvent._stored(ev.run_id, ev.step_id, ev.phase, ev.kind, ev.name, ev.decision, ev.fingerprint,
                               ev.codec, ev._payload, data, 7, 12.5, "", salt)
    stored.row_hash = row_hash(prev, stored, 7, data)
    assert _slots(stamped) == _slots(stored)
