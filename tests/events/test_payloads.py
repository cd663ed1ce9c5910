"""The payload types: one per ``(kind, phase)`` a run writes, and :func:`check` holding a payload to
its type (what a journal from elsewhere is held to), with typed errors that name the key."""

from __future__ import annotations

from typing import Any

import pytest

from cuaderno.errors import JournalCorrupt
from cuaderno.events import StepEvent, new_event
from cuaderno.events.names import KINDS, NUMBERED, PHASES
from cuaderno.events.payloads import (
    PAYLOADS,
    ModelResult,
    PayloadMalformed,
    RunMigrate,
    ToolIntent,
    check,
    type_of,
    view,
)


def _ev(kind: str, phase: str, payload: dict[str, Any]) -> StepEvent:
    return StepEvent(run_id="r", step_id="t0000.tool00", phase=phase, kind=kind, payload=payload)


def test_every_pair_is_named_and_every_kind_has_a_type() -> None:
    assert all(kind in KINDS and phase in PHASES for kind, phase in PAYLOADS)
    assert {kind for kind, _ in PAYLOADS} == set(KINDS)
    assert type_of("tool", "intent.3") is ToolIntent and type_of("run", "migrate.2") is RunMigrate
    assert type_of("tool", "message") is None
    assert {phase for _, phase in PAYLOADS} >= NUMBERED


def test_a_well_formed_payload_passes_and_is_the_same_object() -> None:
    payload = {"response": {"text": "hi", "tool_calls": [], "usage": {"input_tokens": 1}, "cost": None},
               "key": "k", "sends": 1, "counters": {"retries": 1}, "rung": "from a newer cuaderno"}
    ev = _ev("model", "result", payload)
    check(ev)
    assert view(ev, ModelResult) is payload  # a view: nothing copied, nothing converted
    check(_ev("tool", "intent.2", {"effect_key": None, "idempotent": True, "attempt": 2, "after": "absent"}))
    check(_ev("run", "migrate.1", {"from": {}, "to": {"loop": "2"}, "name": "m", "record": [1]}))
    check(_ev("run", "end", {"status": "failed", "cost": 1.0, "limit": 3}))
    check(_ev("widget", "thing", {"anything": 1}))  # a pair no run writes: a store's to keep, not ours


@pytest.mark.parametrize(("kind", "phase", "payload", "says"), [
    ("model", "result", {"key": "k"}, "has no 'response'"),
    ("model", "result", {"response": "text"}, "'response' = 'text'"),
    ("model", "result", {"response": None, "counters": {"retries": "1"}}, "'counters'"),
    ("model", "intent.2", {"key": 7}, "'key' = 7"),
    ("tool", "result", {"outcome": "ok", "counters": []}, "'counters' = []"),
    ("tool", "intent", {"idempotent": "yes"}, "'idempotent'"),
    ("run", "start", {"versions": ["v1"]}, "'versions'"),
    ("run", "end", {"uncertain": {"step_id": "x"}}, "'uncertain'"),
    ("run", "migrate.1", {"from": {}}, "has no 'to'"),
    ("snapshot", "base.12", {"format": 1, "turn": "3", "chain": None, "first": None, "base": {}}, "'turn'"),
    ("conversation", "message", {"text": "hi"}, "has no 'run_id'"),
])
def test_a_malformed_payload_is_a_typed_error_naming_the_key(kind: str, phase: str, payload: dict[str, Any],
                                                             says: str) -> None:
    with pytest.raises(PayloadMalformed, match="run 'r' step 't0000.tool00'") as caught:
        check(_ev(kind, phase, payload))
    assert says in str(caught.value)
    assert isinstance(caught.value, JournalCorrupt)


@pytest.mark.parametrize("fields", [
    {},
    {"name": "pay", "decision": "allow", "fingerprint": "f" * 64, "payload": {"a": 1}},
    {"payload": {"b": [1, 2]}, "raw": b'{"b":[1,2]}'},
    {"raw": b'{"c":3}'},
])
def test_new_event_builds_what_the_class_builds(fields: dict[str, Any]) -> None:
    """The per-step paths' factory and the class give the same event, field for field."""
    head = {"run_id": "r", "step_id": "t0001.tool00", "phase": "intent", "kind": "tool"}
    made, built = new_event(**head, **fields), StepEvent(**head, **fields)
    assert made == built and made.payload == built.payload and made.salt is built.salt is None
    assert [getattr(made, s) for s in StepEvent.__slots__] == [getattr(built, s) for s in StepEvent.__slots__]
