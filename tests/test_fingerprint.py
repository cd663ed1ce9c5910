"""Fingerprints: the fast canonical path is RFC 8785 exactly, and keys are stable."""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from cuaderno.fingerprint import _fast_ok, canonical, chain, fingerprint, idempotency_key

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


class _Str(str):
    pass


class _Int(int):
    pass


class _Dict(dict):  # type: ignore[type-arg]
    pass


def _walked(value: Any) -> bool:
    """The fast path's test as a plain walk, member by member, written apart from ``_fast_ok``:
    a faster rewrite of it must take exactly these values."""
    t = type(value)
    if t is str or value is None or t is bool:
        return True
    if t is int:
        return bool(-(2**53 - 1) <= value <= 2**53 - 1)
    if t is dict:
        return all(type(k) is str and (k.isascii() or max(k) < "\ud800") and _walked(v) for k, v in value.items())
    if t is list or t is tuple:
        return all(_walked(v) for v in value)
    return False


_keys = st.text(max_size=3) | st.sampled_from(["\U0001f600", "\ufb01", "\ud7ff", "\ud800", "é", ""]) | st.builds(_Str, st.text(max_size=2))
_odd_keys = st.integers(-2, 2) | st.none() | st.booleans()
_leaves = (st.none() | st.booleans() | st.text(max_size=3) | st.floats(allow_nan=False, allow_infinity=False)
           | st.sampled_from([2**53 - 1, -(2**53 - 1), 2**53, -(2**53), 0]) | st.integers()
           | st.builds(_Str, st.text(max_size=2)) | st.builds(_Int, st.integers(-5, 5)) | st.just(object()))
_values = st.recursive(
    _leaves,
    lambda children: (st.lists(children, max_size=4) | st.lists(children, max_size=3).map(tuple)
                      | st.dictionaries(_keys, children, max_size=4)
                      | st.dictionaries(_keys | _odd_keys, children, max_size=3)
                      | st.dictionaries(_keys, children, max_size=2).map(_Dict)),
    max_leaves=16,
)


@settings(max_examples=400, deadline=None)
@given(_values)
def test_fast_path_takes_exactly_the_values_a_walk_takes(value: Any) -> None:
    assert _fast_ok(value) is _walked(value)


@pytest.mark.parametrize("key", ["a", "é", "\ud7ff", "\ud800", "\ufb01", "\U0001f600", "a\ud800", _Str("a")])
def test_fast_path_keys_at_the_utf16_boundary(key: str) -> None:
    for value in ({key: 1}, [{"b": None, key: "x"}], {"x": [{key: True}]}):
        assert _fast_ok(value) is _walked(value)
