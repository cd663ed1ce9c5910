"""Fingerprints: the fast canonical path is RFC 8785 exactly, and keys are stable."""

from __future__ import annotations

from typing import Any

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from cuaderno.fingerprint import canonical, chain, fingerprint, idempotency_key

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


def _valid_unicode(value: Any) -> bool:
    try:
        rfc8785.dumps(value)
    except rfc8785.CanonicalizationError:
        return False
    return True


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_canonical_is_rfc8785(value: Any) -> None:
    if _valid_unicode(value):
        assert canonical(value) == rfc8785.dumps(value)


def test_astral_keys_sort_by_utf16_like_rfc8785() -> None:
    value = {"\U0001f600": 1, "\ufb01": 2, "a": 3}
    assert canonical(value) == rfc8785.dumps(value)


def test_lone_surrogates_still_get_a_stable_identity() -> None:
    assert fingerprint({"x": "\ud800"}) == fingerprint({"x": "\ud800"}) != fingerprint({"x": "\ud801"})


def test_keys_depend_on_run_step_and_body() -> None:
    k = idempotency_key("r", "t0000.model", "f" * 64)
    assert k == idempotency_key("r", "t0000.model", "f" * 64)
    assert len({k, idempotency_key("r2", "t0000.model", "f" * 64), idempotency_key("r", "t0001.model", "f" * 64),
                idempotency_key("r", "t0000.model", "e" * 64)}) == 4
    assert chain("a", "b") != chain("b", "a")
