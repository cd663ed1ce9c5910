"""Every conformance case against every embedded backend.

A new backend joins by adding a factory to ``BACKENDS`` here, or with its own small module that
parametrizes over ``CASES`` the same way (the Postgres backend will). Cases that fail on a backend
because of a known, reported bug are marked ``xfail(strict=True)``: the day the bug is fixed the
mark turns into a failure, so it cannot outlive the bug.
"""

from __future__ import annotations

import itertools
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from cuaderno.errors import UsageError
from cuaderno.events import StepEvent
from cuaderno.harness import rebuild_summary
from cuaderno.journal import MemoryCheckpointer, SqliteCheckpointer
from cuaderno.journal.base import Checkpointer
from cuaderno.testing.conformance import (
    CASES,
    Capability,
    Case,
    ConformanceFailure,
    Factory,
    TwoHandles,
    capabilities,
    conformance_cases,
    run_conformance,
)

BACKENDS = ("memory", "sqlite")

KNOWN_BUGS: dict[tuple[str, str], str] = {}


def _factory(backend: str, tmp_path: Path) -> Factory:
    if backend == "memory":
        # One object is the whole journal: the second handle is that object again.
        return TwoHandles(MemoryCheckpointer, lambda store: store)
    # A fresh directory per factory: the factory must hand out new, empty stores.
    base = Path(tempfile.mkdtemp(dir=tmp_path))
    names = (base / f"journal{i}.db" for i in itertools.count())
    # A second worker opens its own connection on the same file.
    return TwoHandles(lambda: SqliteCheckpointer(next(names)),
                      lambda store: SqliteCheckpointer(cast(SqliteCheckpointer, store).path))


def _params() -> Iterator[object]:
    for backend in BACKENDS:
        for case in CASES:
            reason = KNOWN_BUGS.get((backend, case.name))
            marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)] if reason else []
            yield pytest.param(backend, case, id=f"{backend}-{case.name}", marks=marks)


@pytest.mark.parametrize(("backend", "case"), list(_params()))
def test_conformance(backend: str, case: Case, tmp_path: Path) -> None:
    factory = _factory(backend, tmp_path)
    missing = case.needs - capabilities(factory)
    if missing:
        pytest.skip(f"{backend} does not declare {sorted(missing)}")
    case.check(factory)


@pytest.mark.parametrize("backend", BACKENDS)
def test_embedded_backends_declare_every_capability(backend: str, tmp_path: Path) -> None:
    assert capabilities(_factory(backend, tmp_path)) == set(Capability)


class _NoRebuild(MemoryCheckpointer):
    """A store that does not offer rebuilding a summary (a custom backend may not)."""

    rebuild_checkpoint = None  # type: ignore[assignment]


def test_a_plain_factory_does_not_declare_a_second_handle() -> None:
    assert Capability.SECOND_HANDLE not in capabilities(MemoryCheckpointer)
    two_worker = [c.name for c in CASES if Capability.SECOND_HANDLE in c.needs]
    assert two_worker == ["two_handles_same_key", "two_handles_fencing", "two_handles_see_each_other"]
    failed = [f.split(":", 1)[0] for f in run_conformance(MemoryCheckpointer)]
    assert not set(failed) & set(two_worker)  # left out, not failed
    with pytest.raises(ConformanceFailure, match="cannot open a second handle"):
        next(c for c in CASES if c.name == two_worker[0]).check(MemoryCheckpointer)


def test_a_capability_a_store_does_not_declare_is_not_checked() -> None:
    assert Capability.REBUILD not in capabilities(_NoRebuild)
    needing = [c for c in CASES if Capability.REBUILD in c.needs]
    assert [c.name for c in needing] == ["rebuild_checkpoint"]
    assert run_conformance(_NoRebuild) == []  # the case is left out, not failed
    with pytest.raises(ConformanceFailure, match="does not declare SupportsRebuild"):
        needing[0].check(_NoRebuild)  # run anyway, it says why it cannot pass
    # And what needs the capability refuses the store by the declaration, not by trying.
    with pytest.raises(UsageError, match="_NoRebuild cannot rebuild a run's summary.*SupportsRebuild"):
        rebuild_summary(_NoRebuild(), "r")


def test_known_bugs_name_real_cases() -> None:
    names = {c.name for c in CASES}
    assert {name for _, name in KNOWN_BUGS} <= names
    assert {backend for backend, _ in KNOWN_BUGS} <= set(BACKENDS)


def test_cases_are_unique_documented_and_yielded() -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)) == 25
    assert list(conformance_cases()) == list(CASES)
    for name, check in conformance_cases():  # the (name, fn) form
        assert callable(check)
        assert check.__doc__, f"case {name} has no docstring"
        assert check.__name__ == f"check_{name}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_run_conformance_reports_exactly_the_known_failures(backend: str, tmp_path: Path) -> None:
    failures = run_conformance(_factory(backend, tmp_path))
    failed = sorted(f.split(":", 1)[0] for f in failures)
    assert failed == sorted(name for b, name in KNOWN_BUGS if b == backend)
    assert run_conformance(_factory(backend, tmp_path), skip=failed) == []


def test_run_conformance_rejects_unknown_skip() -> None:
    from cuaderno.errors import UsageError

    with pytest.raises(UsageError):
        run_conformance(MemoryCheckpointer, skip=["no_such_case"])


# A payload that is not plain JSON is a UsageError naming the step; a lone surrogate (a model can
# emit one) is stored with ASCII escapes and read back exactly.
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("payload", "message"), [
    ({"x": math.nan}, "Out of range float values are not JSON compliant"),
    ({"x": math.inf}, "Out of range float values are not JSON compliant"),
    ({"x": {1, 2}}, "Object of type set is not JSON serializable"),
    ({"x": b"raw"}, "Object of type bytes is not JSON serializable"),
    ({("a", "b"): 1}, "keys must be str, int, float, bool or None"),
], ids=["nan", "inf", "set", "bytes", "tuple-key"])
def test_payload_errors_are_usage_errors(backend: str, payload: dict[Any, Any], message: str,
                                         tmp_path: Path) -> None:
    store: Checkpointer = _factory(backend, tmp_path)()
    try:
        with pytest.raises(UsageError, match=message):
            store.append([StepEvent(run_id="r", step_id="s", phase="p", kind="tool", payload=payload)])
        assert store.list_runs() == []
    finally:
        store.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_lone_surrogates_in_payloads_round_trip(backend: str, tmp_path: Path) -> None:
    store: Checkpointer = _factory(backend, tmp_path)()
    try:
        store.append([StepEvent(run_id="r", step_id="s", phase="p", kind="tool", payload={"x": "a\ud800b"})])
        assert store.load("r")[0].payload == {"x": "a\ud800b"}
    finally:
        store.close()


def test_int_keys_are_silently_converted(tmp_path: Path) -> None:
    """Not an error today: {1: 'a'} is stored as {"1": "a"}, so what load() returns differs from what was sent."""
    store = SqliteCheckpointer(tmp_path / "j.db")
    try:
        payload: dict[Any, Any] = {1: "a"}
        store.append([StepEvent(run_id="r", step_id="s", phase="p", kind="tool", payload=payload)])
        assert store.load("r")[0].payload == {"1": "a"}
    finally:
        store.close()

