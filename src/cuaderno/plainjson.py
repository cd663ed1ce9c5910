"""Plain JSON, as the journal holds it: the encoders of the per-step hot path (built once), the
decoder of the journal's own form, and the checks of what a journal can hold (:func:`not_plain`,
:func:`journalable`, :data:`MAX_DEPTH`), shared by every layer that writes or reads payloads.

``json.JSONEncoder.encode`` builds a new C encoder object on every call; on the loop's path (a
few payloads, fingerprints and one checkpoint per commit) that set-up costs more than encoding a
small dict. These encoders are built once and produce byte-identical output to the equivalent
``json.dumps`` call, which matters: stored payload bytes are compared on deduplication and
hashed into the journal's chain, so the encoding must never drift between versions.

Decoding stays with the standard library too (:func:`loads_object` calls its scanner directly).
orjson decodes three times faster, but it turns an integer outside 64 bits into a float without
an error. A guard that finds such integers first (a run of 19 digits) cost as much as the time
it saved, and a journal must give back a 25-digit account number exactly.

Circular-reference tracking is off (a reused marker table keeps stale entries after an error);
a circular value ends in ``RecursionError`` inside the C encoder, reported here as ``ValueError``
like every other value JSON cannot hold.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json import encoder as _encoder
from typing import Any, NoReturn, TypeAlias

from pydantic_core import to_jsonable_python

from cuaderno.errors import ToolResultInvalid

__all__ = ["MAX_DEPTH", "JSONObject", "JSONValue", "compact", "compact_ascii", "journalable", "loads_object", "not_plain", "shown",
           "sorted_compact", "sorted_compact_ascii", "sorted_compact_nan"]

JSONValue: TypeAlias = "None | bool | int | float | str | list[JSONValue] | dict[str, JSONValue]"
"""A value as JSON holds it: what a model writes (tool arguments) or a provider answers, before
the code that needs one of its fields narrows it (``isinstance``). mypy checks it recursively:
unlike ``Any``, reading a field of it without narrowing is an error."""
JSONObject: TypeAlias = "dict[str, JSONValue]"
"""A JSON object (``{...}``): a tool's arguments, a provider's request or response body."""


def _default(value: object) -> NoReturn:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _build(*, sort_keys: bool, ensure_ascii: bool, allow_nan: bool) -> Callable[[Any], str]:
    make = getattr(_encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator (another interpreter): the pure-Python encoder, same bytes
        return json.JSONEncoder(sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=ensure_ascii,
                                allow_nan=allow_nan, check_circular=False).encode
    strings = _encoder.encode_basestring_ascii if ensure_ascii else _encoder.encode_basestring
    encode = make(None, _default, strings, None, ":", ",", sort_keys, False, allow_nan)

    def run(value: Any) -> str:
        # (A string alone goes through the encoder too: the same text, and no test on every call.)
        try:
            return "".join(encode(value, 0))
        except RecursionError as exc:
            raise ValueError("value is circular or nested too deeply for JSON") from exc

    return run


sorted_compact = _build(sort_keys=True, ensure_ascii=False, allow_nan=False)
"""``json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)``"""
sorted_compact_ascii = _build(sort_keys=True, ensure_ascii=True, allow_nan=False)
"""The same with ASCII escapes (for text holding lone surrogates)."""
sorted_compact_nan = _build(sort_keys=True, ensure_ascii=False, allow_nan=True)
"""``json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` (NaN allowed)."""
compact = _build(sort_keys=False, ensure_ascii=False, allow_nan=True)
"""``json.dumps(v, separators=(",", ":"), ensure_ascii=False)``"""
compact_ascii = _build(sort_keys=False, ensure_ascii=True, allow_nan=True)
"""The same with ASCII escapes (for text holding lone surrogates)."""

MAX_DEPTH = 200
"""Deepest nesting of lists and objects a value from outside (a model's tool arguments, a tool's
result) may have: much deeper values overflow the recursive encoders and hashers (the C JSON
encoder and the fingerprint walk stop near Python's recursion limit, 1000 frames, and a loop
already runs some way down the stack)."""
_MAX_INT_BITS = 14_000
"""About 4,200 decimal digits: CPython refuses to print integers over 4,300 digits."""
_KEYS = frozenset((str,))
_LEAVES = frozenset((str, bool, type(None)))


def shown(value: Any, limit: int = 10_000) -> str:
    """``value`` as text for evidence, whatever it is (JSON when it can be, else its repr)."""
    try:
        return json.dumps(value)[:limit]
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        return repr(value)[:limit]
    except (RecursionError, ValueError):
        return f"<a {type(value).__name__} too deep to print>"


def not_plain(value: Any) -> str | None:
    """Why ``value`` is not plain JSON that every encoder here accepts, or ``None`` if it is.

    Plain: ``None``, booleans, strings, finite floats, integers printable in decimal, lists, and
    objects with string keys, nested at most :data:`MAX_DEPTH` deep. Iterative, so a hostile
    value cannot overflow the stack while it is being checked.
    """
    # The common cases first, with no loop: a string (a tool's usual result), an object of strings,
    # booleans and nulls (a tool's usual arguments), their exact types checked in C.
    t = type(value)
    if t in _LEAVES or (t is dict and _KEYS.issuperset(map(type, value))
                        and _LEAVES.issuperset(map(type, value.values()))):
        return None
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if item is None or isinstance(item, (str, bool)):
            continue
        if isinstance(item, int):
            if item.bit_length() > _MAX_INT_BITS:
                return "an integer too large to write in decimal"
        elif isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                return f"a number JSON cannot hold ({item})"
        elif isinstance(item, (list, tuple, dict)):
            if depth >= MAX_DEPTH:
                return f"nested more than {MAX_DEPTH} levels deep"
            if isinstance(item, dict):
                if not all(isinstance(k, str) for k in item):
                    return "an object key that is not a string"
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)
        else:
            return f"a value of type {type(item).__name__}"
    return None


def journalable(value: Any, *, run_id: str, step_id: str, tool: str) -> Any:
    """What a tool (or its lookup) returned, as the plain JSON the journal stores.

    Converted the way pydantic serialises (``to_jsonable_python``: a tuple or a set becomes a
    list, a model or a dataclass a dict, a datetime ISO text), then checked with
    :func:`not_plain`, so the value staged is one every encoder here accepts and the
    transaction that writes it cannot fail half-way on it.

    Raises:
        ToolResultInvalid: naming the run, the step and the tool, for a value with no JSON form
            (an unknown type, a circular reference, nesting past pydantic's limit) or one the
            journal refuses (NaN, infinity, an integer too long, nesting past :data:`MAX_DEPTH`).
    """
    try:
        plain = to_jsonable_python(value)
    except (ValueError, TypeError, RecursionError) as exc:  # PydanticSerializationError is a ValueError
        raise ToolResultInvalid(run_id, step_id, tool, f"no JSON form: {exc}") from None
    problem = not_plain(plain)
    if problem is not None:
        raise ToolResultInvalid(run_id, step_id, tool, problem)
    return plain


# The scanner behind json.loads (C when available), called without json.loads's per-call set-up.
# Typeshed does not declare the attribute (it has been on every JSONDecoder since Python 2.6).
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def loads_object(data: bytes) -> dict[str, Any] | None:
    """``json.loads(data)`` for the common case, ``None`` for anything else.

    The case is UTF-8 bytes holding exactly one JSON object, nothing before or after it (what
    the journal writes). For it the value is the one ``json.loads`` returns, at a fraction of
    the per-call cost, which dominates for the small payloads of a long run's replay. For any
    other input (whitespace around the value, another encoding, another type, an error) the
    caller decodes with ``json.loads``, which gives the standard value or error.
    """
    try:
        text = data.decode("utf-8", "surrogatepass")
        if text[:1] != "{":
            return None
        value, end = _scan(text, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    return value if end == len(text) and type(value) is dict else None
