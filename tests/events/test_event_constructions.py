"""The three ways an event is built set the same fourteen slots.

``new_event`` sets the slots itself instead of going through ``_filled`` (keyword parsing of a
class call costs about a third more), so nothing but this test stops a slot added to ``StepEvent``
from being left unset (``AttributeError`` on read) or set differently on the per-step path."""

from __future__ import annotations

import pytest

from cuaderno.events import CODEC_JSON, StepEvent, new_event

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
