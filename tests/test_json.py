"""The hot-path JSON helpers must be exact stand-ins for the standard library.

Stored payload bytes are compared on deduplication and hashed into the journal's chain, so an
encoder that differed from ``json.dumps`` in one byte (a float's format, an escape) would make
old journals conflict with new code. Decoding must return the values ``json.loads`` returns.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cuaderno import plainjson as _json
from cuaderno.events import CODEC_JSON, decode_payload

_text = st.text(alphabet=st.characters(codec=None), max_size=12)  # includes lone surrogates
_scalars = st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | _text | st.floats(
    allow_nan=False, allow_infinity=False
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=20,
)


def _dumps(value: Any, **kw: Any) -> str:
    return json.dumps(value, separators=(",", ":"), **kw)


@settings(max_examples=400, deadline=None)
@given(_values)
def test_encoders_are_byte_identical_to_json_dumps(value: Any) -> None:
    assert _json.sorted_compact(value) == _dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)
    assert _json.sorted_compact_ascii(value) == _dumps(value, sort_keys=True, ensure_ascii=True, allow_nan=False)
    assert _json.sorted_compact_nan(value) == _dumps(value, sort_keys=True, ensure_ascii=False)
    assert _json.compact(value) == _dumps(value, ensure_ascii=False)
    assert _json.compact_ascii(value) == _dumps(value, ensure_ascii=True)


@settings(max_examples=400, deadline=None)
@given(_values)
def test_stored_payloads_decode_to_what_json_loads_returns(value: Any) -> None:
    for text in (_dumps({"v": value}, ensure_ascii=False), _dumps({"v": value}, ensure_ascii=True)):
        data = text.encode("utf-8", "surrogatepass")  # the bytes SQLite hands back
        assert decode_payload(CODEC_JSON, data) == json.loads(data)


@pytest.mark.parametrize("value", [1e-05, 1e16, 5e-324, 1.7976931348623157e308, -0.0, 0.1, 123456789.125])
def test_float_formats_match(value: float) -> None:
    assert _json.sorted_compact({"x": value}) == _dumps({"x": value}, sort_keys=True)


@pytest.mark.parametrize(
    "text",
    ['{"a":NaN}', '{"a":Infinity}', '{"a":1e400}', '{"a":' + str(2**80) + "}", '{"a":"\\ud800"}', '{"a":1,"a":2}',
     ' {"a":1} '],
)
def test_payload_edge_cases_follow_json(text: str) -> None:
    got, want = decode_payload(CODEC_JSON, text.encode()), json.loads(text)
    if isinstance(want, dict) and isinstance(want.get("a"), float) and math.isnan(want["a"]):
        assert math.isnan(got["a"])
    else:
        assert got == want and type(got) is type(want)


def test_nan_is_refused_where_json_refuses_it() -> None:
    with pytest.raises(ValueError):
        _json.sorted_compact({"x": float("nan")})
    assert _json.sorted_compact_nan({"x": float("nan")}) == '{"x":NaN}'


def test_unserialisable_and_circular_values_raise_like_json() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        _json.sorted_compact({"x": object()})
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError):
        _json.compact(loop)
    # The encoder is reused: an error must not leave state behind for the next call.
    assert _json.compact([1, 2]) == "[1,2]"


@pytest.mark.parametrize("n", [2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30, -(10**30)])
def test_integers_beyond_64_bits_stay_exact(n: int) -> None:
    # orjson turns these into floats without an error (why it is not used); the journal gives back the int.
    for text in (f'{{"v":{n}}}', f'{{"v":{n}}}'.encode()):
        value = decode_payload(CODEC_JSON, text)["v"]
        assert value == n and type(value) is int


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_text, _values, max_size=5))
def test_loads_object_agrees_with_json_loads_on_stored_payloads(value: dict[str, Any]) -> None:
    from cuaderno.events import encode_payload

    raw = encode_payload(value)
    assert _json.loads_object(raw) == json.loads(raw)


@pytest.mark.parametrize("raw", [b" {}", b"{} ", b"[]", b"1", b'{"a":1}{}', b"{", b"", b'{"a":"\xff"}', b"\xef\xbb\xbf{}",
                                 b'{\x00"\x00}\x00'])
def test_loads_object_leaves_everything_unusual_to_json_loads(raw: bytes) -> None:
    assert _json.loads_object(raw) is None


class _Str(str):
    pass


def _walked(value: Any) -> str | None:
    """``not_plain``'s verdict as a plain walk of every member (what it did before it took its
    common cases without one), reduced to plain or not."""
    if value is None or isinstance(value, (str, bool)):
        return None
    if isinstance(value, int):
        return None if value.bit_length() <= 14_000 else "int"
    if isinstance(value, float):
        return None if math.isfinite(value) else "float"
    if isinstance(value, (list, tuple)):
        return next((p for p in map(_walked, value) if p), None)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return "key"
        return next((p for p in map(_walked, value.values()) if p), None)
    return "type"


_odd = (st.none() | st.booleans() | _text | st.builds(_Str, _text) | st.floats() | st.integers()
        | st.just(1 << 14_001) | st.just(object()) | st.just(b"x"))
_odd_values = st.recursive(
    _odd,
    lambda inner: (st.lists(inner, max_size=3) | st.dictionaries(_text | st.builds(_Str, _text), inner, max_size=3)
                   | st.dictionaries(st.integers(0, 3) | st.none(), inner, max_size=2)),
    max_leaves=10,
)


@settings(max_examples=400, deadline=None)
@given(_odd_values)
@example(math.nan)
@example({"a": math.inf, "b": "x"})
@example({"a": 1 << 14_001})
@example({1: "x"})
@example({_Str("k"): _Str("v")})
@example({"a": {"b": "c"}, "d": None})
def test_not_plain_takes_exactly_what_a_walk_takes(value: Any) -> None:
    assert (_json.not_plain(value) is None) is (_walked(value) is None)
