"""The exception/status mapping in isolation (the provider tests drive it through the real SDKs)."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx2
import pytest

from cuaderno.errors import ErrorClass, GatewayError
from cuaderno.gateway._errors import ResponseTooLarge, from_exception, from_status, retry_after_seconds


class APIConnectionError(Exception):
    """Stands in for an SDK connection error: same name, cause chained like the SDKs do."""


def chained(outer: Exception, cause: BaseException) -> Exception:
    try:
        raise outer from cause
    except Exception as exc:
        return exc


def test_retry_after_forms() -> None:
    assert retry_after_seconds({"retry-after": "3"}) == 3.0
    assert retry_after_seconds({"retry-after": "0.5"}) == 0.5
    assert retry_after_seconds({"retry-after-ms": "20", "retry-after": "3"}) == 0.02
    assert retry_after_seconds({"retry-after-ms": "nonsense", "retry-after": "3"}) == 3.0
    assert retry_after_seconds({"retry-after": "-4"}) == 0.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({"retry-after": "inf"}) is None
    assert retry_after_seconds({}) is None
    now = datetime(2030, 1, 1, tzinfo=UTC)
    date = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert retry_after_seconds({"retry-after": date}, now=now.timestamp()) == pytest.approx(30.0)


@pytest.mark.parametrize(("cause", "error_class", "sent"), [
    (httpx2.ConnectError("refused"), ErrorClass.TRANSIENT, False),
    (httpx2.PoolTimeout("pool"), ErrorClass.TRANSIENT, False),
    (httpx2.UnsupportedProtocol("ftp"), ErrorClass.PERMANENT, False),
    (httpx2.WriteTimeout("w"), ErrorClass.TRANSIENT, True),
    (httpx2.ReadTimeout("r"), ErrorClass.AMBIGUOUS, True),
    (httpx2.ReadError("reset"), ErrorClass.AMBIGUOUS, True),
    (httpx2.DecodingError("bad gzip"), ErrorClass.AMBIGUOUS, True),
    (ResponseTooLarge(10, read=11), ErrorClass.PERMANENT, True),
])
def test_causes_are_found_through_the_chain(cause: BaseException, error_class: ErrorClass, sent: bool) -> None:
    err = from_exception(chained(APIConnectionError("Connection error."), cause), provider="p")
    assert (err.error_class, err.sent) == (error_class, sent)


def test_sdk_connection_error_without_cause_is_ambiguous() -> None:
    err = from_exception(APIConnectionError("Connection error."), provider="p")
    assert (err.error_class, err.sent) == (ErrorClass.AMBIGUOUS, True)


def test_unknown_exception_is_a_bug_and_gateway_errors_pass_through() -> None:
    err = from_exception(KeyError("x"), provider="p")
    assert (err.error_class, err.sent) == (ErrorClass.BUG, True)
    original = GatewayError("x", error_class=ErrorClass.CONFLICT, sent=False)
    assert from_exception(original, provider="p") is original


def test_status_mapping_reads_nested_and_flat_error_bodies() -> None:
    nested = from_status(429, {}, {"error": {"code": "insufficient_quota", "message": "quota"}}, provider="p")
    flat = from_status(429, {}, {"code": "insufficient_quota", "message": "quota"}, provider="p")
    text = from_status(429, {"retry-after": "1"}, '{"error": {"message": "slow"}}', provider="p")
    assert nested.error_class is flat.error_class is ErrorClass.PERMANENT
    assert text.error_class is ErrorClass.TRANSIENT and "slow" in str(text) and text.retry_after == 1.0


def test_long_provider_messages_are_bounded() -> None:
    err = from_status(400, {}, {"error": {"message": "x" * 5000}}, provider="p")
    assert len(str(err)) < 400


def test_mapped_errors_survive_pickling() -> None:
    err = from_status(503, {"retry-after": "7"}, None, provider="p")
    back = pickle.loads(pickle.dumps(err))
    assert back.to_json() == err.to_json()
