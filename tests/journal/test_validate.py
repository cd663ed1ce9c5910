"""``validate_event`` checks the common case (short ASCII ids) first, with a few calls into C, and
only then field by field.

The two are separate encodings of the same limits, so they could drift: a limit changed in one
and not the other would let the one-expression check accept an id the journal must refuse. This
test holds them together: on a valid event with one or two fields replaced by a value near a
limit or otherwise odd, ``validate_event`` refuses exactly what the field-by-field check refuses.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuaderno.errors import UsageError
from cuaderno.events import StepEvent
from cuaderno.journal.base import (
    _MAX_DECISION_CHARS,
    _MAX_FINGERPRINT_CHARS,
    MAX_ID_CHARS,
    _check_fields,
    validate_event,
)


def _around(limit: int) -> st.SearchStrategy[str]:
    """ASCII strings at and just past ``limit`` characters: the lengths where the two checks could disagree."""
    return st.sampled_from([limit - 1, limit, limit + 1]).map(lambda n: "a" * n)


_odd = st.sampled_from(["", "a\x00b", "\ud800", "é", "x\udfff", "ok"])  # empty, NUL, lone surrogates, non-ASCII


class _Str(str):
    """A str subclass: the journal stores exact strings only (the fast check tests types by identity)."""


_not_str = st.sampled_from([1, b"bytes", 2.5, _Str("ok")])


_LIMITS = {"run_id": MAX_ID_CHARS, "step_id": MAX_ID_CHARS, "phase": MAX_ID_CHARS, "kind": MAX_ID_CHARS,
           "name": MAX_ID_CHARS, "decision": _MAX_DECISION_CHARS, "fingerprint": _MAX_FINGERPRINT_CHARS}
_VALID = {"run_id": "r", "step_id": "t0001.tool00", "phase": "intent", "kind": "tool", "name": "t",
          "decision": "allow", "fingerprint": "f" * 64}


@st.composite
def _events(draw: st.DrawFn) -> StepEvent:
    """A valid event with one or two fields replaced by a value near a limit or otherwise odd."""
    fields: dict[str, Any] = dict(_VALID)
    for name in draw(st.lists(st.sampled_from(sorted(_LIMITS)), min_size=1, max_size=2, unique=True)):
        value = st.text(max_size=8) | _around(_LIMITS[name]) | _odd | _not_str
        optional = name in ("name", "decision", "fingerprint")
        fields[name] = draw(st.none() | value if optional else value)
    return StepEvent(**fields, payload={"a": 1})


@settings(max_examples=500, deadline=None)
@given(_events())
def test_the_fast_check_refuses_exactly_what_the_field_checks_refuse(ev: StepEvent) -> None:
    try:
        _check_fields(ev)
        field_by_field_ok = True
    except UsageError:
        field_by_field_ok = False
    if field_by_field_ok:
        validate_event(ev)
    else:
        with pytest.raises(UsageError):
            validate_event(ev)
