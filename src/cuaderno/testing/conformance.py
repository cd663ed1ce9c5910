"""The journal conformance suite: what every :class:`~cuaderno.journal.base.Checkpointer` must do.

Modelled on LangGraph's ``checkpoint-conformance``: the cases live here, once, and each backend
runs them by registering a factory. A backend's test module is a few lines::

    import itertools
    import pytest
    from cuaderno.journal import SqliteCheckpointer
    from cuaderno.testing.conformance import CASES, Case

    @pytest.fixture
    def factory(tmp_path):
        paths = (tmp_path / f"journal{i}.db" for i in itertools.count())
        return lambda: SqliteCheckpointer(next(paths))

    @pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
    def test_conformance(case: Case, factory) -> None:
        case.check(factory)

Each case is a plain ``check_<name>(factory)`` function too, and :func:`conformance_cases` yields
``(name, check)`` pairs.

Outside pytest, :func:`run_conformance` runs every case and returns the failures.

Some cases check an optional capability (:class:`Capability`): they run only against a backend
that declares it, as :func:`capabilities` detects it (a store that implements
:class:`~cuaderno.journal.base.SupportsRebuild`, say). A case's ``needs`` names what it requires;
:func:`run_conformance` leaves out the cases a backend cannot run, and a pytest module skips them
(``case.needs <= capabilities(factory)``).

Two workers sharing one journal are two *handles* on it (two connections, two processes). The
two-worker cases are written here once for every backend: a factory that can open a second handle
on a store's journal (:class:`SharedFactory`; build one with :class:`TwoHandles`) declares
:attr:`Capability.SECOND_HANDLE`. For SQLite the second handle is a new store on the same file,
for PostgreSQL a new connection pool on the same database; a memory journal, which lives in one
object, may hand out that object again::

    factory = TwoHandles(lambda: SqliteCheckpointer(next(paths)), lambda s: SqliteCheckpointer(s.path))

The factory must return a new, *empty* store on every call; a case opens exactly one store (and
the two-worker cases a second handle on its journal) and closes it when it ends. Cases observe a backend only through the protocol (``append``, ``load``,
``checkpoint``, ``list_runs``, ``acquire``), so "nothing was written" means: every run's stored
checkpoint and every row that ``load`` returns are exactly what they were before, and no run
appeared. Backend-specific checks (row counts of tables, file bytes, pragmas) belong in the
backend's own tests.

A case fails by raising :class:`ConformanceFailure` (an :class:`AssertionError`) with a message
that names what was expected; any other exception escaping a case is a failure too. This module
imports no test framework.
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, NamedTuple, Protocol, runtime_checkable

from cuaderno.checkpoint import Checkpoint, rebuild
from cuaderno.errors import (
    ApprovalMismatch,
    FencedOut,
    JournalConflict,
    NotUncertain,
    NotWaitingForApproval,
    RunChanged,
    RunClosed,
    RunNotFound,
    UsageError,
)
from cuaderno.events import CODEC_JSON, StepEvent, approval_step_id, model_step_id, row_hash, tool_step_id
from cuaderno.journal.base import Checkpointer, SupportsClaims, SupportsRebuild

__all__ = ["CASES", "Capability", "Case", "ConformanceFailure", "Factory", "SharedFactory", "TwoHandles", "capabilities",
           "conformance_cases", "run_conformance"]

Factory = Callable[[], Checkpointer]
"""Returns a new, empty store on every call."""

PAYLOAD_ERRORS: tuple[type[BaseException], ...] = (UsageError, ValueError, TypeError)
"""What an append of a payload that is not plain JSON may raise (see ``unserializable_payload_refused``)."""

_ALL = 1_000_000  # list_runs limit meaning "every run"; the cases create far fewer


class ConformanceFailure(AssertionError):
    """A backend broke the contract; the message says which expectation failed."""


class Capability(enum.StrEnum):
    """An optional capability a backend may declare; the cases that check it need it."""

    REBUILD = "rebuild"
    """The store implements :class:`~cuaderno.journal.base.SupportsRebuild`."""
    SECOND_HANDLE = "second_handle"
    """The factory opens a second handle on a store's journal (:class:`SharedFactory`)."""
    CLAIMS = "claims"
    """The store implements :class:`~cuaderno.journal.base.SupportsClaims` (what a worker polls)."""


@runtime_checkable
class SharedFactory(Protocol):
    """A factory that also opens a second handle on the journal of a store it made."""

    def __call__(self) -> Checkpointer:
        """A new store on a new, empty journal."""
        ...

    def open_second(self, store: Checkpointer) -> Checkpointer:
        """Another handle on ``store``'s journal, as a second worker would open it: what either
        writes, the other reads. The case closes it."""
        ...


class TwoHandles:
    """A :class:`SharedFactory` from two callables: ``new()`` and ``second(store)``."""

    def __init__(self, new: Factory, second: Callable[[Checkpointer], Checkpointer]) -> None:
        self._new, self._second = new, second

    def __call__(self) -> Checkpointer:
        return self._new()

    def open_second(self, store: Checkpointer) -> Checkpointer:
        return self._second(store)


def capabilities(factory: Factory) -> frozenset[Capability]:
    """The optional capabilities the factory and its stores declare (one store is opened, then closed)."""
    found = set()
    with _open(factory) as store:
        if isinstance(store, SupportsRebuild):
            found.add(Capability.REBUILD)
        if isinstance(store, SupportsClaims):
            found.add(Capability.CLAIMS)
    if isinstance(factory, SharedFactory):
        found.add(Capability.SECOND_HANDLE)
    return frozenset(found)


Check = Callable[[Factory], None]

_NEEDS: dict[Check, frozenset[Capability]] = {}
"""The capabilities each check needs (see :func:`_needs`); a check not listed needs none."""


def _needs(*needed: Capability) -> Callable[[Check], Check]:
    """Declare the optional capabilities a check needs: it runs only where they are declared."""
    def mark(check: Check) -> Check:
        _NEEDS[check] = frozenset(needed)
        return check
    return mark


class Case(NamedTuple):
    """One conformance case: a name (stable, used as the test id) and the check to run."""

    name: str
    check: Check

    @property
    def needs(self) -> frozenset[Capability]:
        """The optional capabilities the case checks: it runs only against backends declaring them."""
        return _NEEDS.get(self.check, frozenset())

    @property
    def doc(self) -> str:
        """The first line of the check's docstring: what the case requires."""
        lines = (self.check.__doc__ or "").strip().splitlines()
        return lines[0] if lines else ""


# -- helpers --------------------------------------------------------------------------------------


@contextmanager
def _open(factory: Factory) -> Iterator[Checkpointer]:
    store = factory()
    try:
        yield store
    finally:
        store.close()


@contextmanager
def _two(factory: Factory) -> Iterator[tuple[Checkpointer, Checkpointer]]:
    """Two handles, A and B, on one new journal."""
    if not isinstance(factory, SharedFactory):
        raise ConformanceFailure(f"{factory!r} cannot open a second handle (no open_second); this case needs it")
    with _open(factory) as a:
        b = factory.open_second(a)
        try:
            yield a, b
        finally:
            if b is not a:
                b.close()


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}…({len(text)} chars)"


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise ConformanceFailure(message)


def _eq(actual: object, expected: object, what: str) -> None:
    if actual != expected:
        raise ConformanceFailure(f"{what}: expected {_short(expected, 400)}, got {_short(actual, 400)}")


def _raises(expected: type[BaseException] | tuple[type[BaseException], ...], fn: Callable[[], object],
            what: str) -> BaseException:
    names = expected.__name__ if isinstance(expected, type) else " or ".join(e.__name__ for e in expected)
    try:
        fn()
    except expected as exc:
        return exc
    except Exception as exc:
        raise ConformanceFailure(f"{what}: expected {names}, got {type(exc).__name__}: {_short(str(exc), 200)}") \
            from exc
    raise ConformanceFailure(f"{what}: expected {names}, nothing was raised")


def _e(run_id: str, step_id: str, phase: str, kind: str, **fields: Any) -> StepEvent:
    return StepEvent(run_id=run_id, step_id=step_id, phase=phase, kind=kind, **fields)


def _start(run_id: str, **fields: Any) -> StepEvent:
    return _e(run_id, "run", "start", "run", **fields)


def _copy(ev: StepEvent, **changes: Any) -> StepEvent:
    fields: dict[str, Any] = {"run_id": ev.run_id, "step_id": ev.step_id, "phase": ev.phase, "kind": ev.kind,
                              "name": ev.name, "decision": ev.decision, "fingerprint": ev.fingerprint,
                              "payload": ev.payload, "codec": ev.codec, "seq": ev.seq,
                              "created_at": ev.created_at, "row_hash": ev.row_hash}
    fields.update(changes)
    return StepEvent(**fields)


def _row(ev: StepEvent) -> tuple[Any, ...]:
    return (ev.run_id, ev.step_id, ev.phase, ev.seq, ev.kind, ev.name, ev.decision, ev.fingerprint, ev.codec,
            ev.encoded_payload(), ev.created_at, ev.row_hash)


Snapshot = dict[str, tuple[dict[str, Any] | None, tuple[tuple[Any, ...], ...] | str]]


def _snapshot(store: Checkpointer) -> Snapshot:
    """Everything the protocol can see: each run's stored checkpoint and its rows."""
    out: Snapshot = {}
    for rid in sorted(cp.run_id for cp in store.list_runs(limit=_ALL)):
        cp = store.checkpoint(rid)
        try:
            rows: tuple[tuple[Any, ...], ...] | str = tuple(_row(e) for e in store.load(rid))
        except RunNotFound:
            rows = "RunNotFound"
        out[rid] = (None if cp is None else cp.to_json(), rows)
    return out


def _unchanged(store: Checkpointer, before: Snapshot, what: str) -> None:
    after = _snapshot(store)
    if after == before:
        return
    added = sorted(set(after) - set(before))
    changed = sorted(r for r in set(after) & set(before) if after[r] != before[r])
    removed = sorted(set(before) - set(after))
    raise ConformanceFailure(f"{what}: the store changed (runs added {_short(added)}, changed {_short(changed)}, "
                             f"removed {_short(removed)}); nothing may be written")


def _run_ids(store: Checkpointer, **kwargs: Any) -> list[str]:
    return [cp.run_id for cp in store.list_runs(**kwargs)]


def _assert_projection(store: Checkpointer, run_id: str, what: str) -> Checkpoint:
    """The stored checkpoint equals the one rebuilt from the loaded events; returns it."""
    stored = store.checkpoint(run_id)
    if stored is None:
        raise ConformanceFailure(f"{what}: no checkpoint stored for run {run_id!r}")
    events = store.load(run_id)
    rebuilt = rebuild(run_id, events, epoch=stored.epoch)
    for field in ("status", "counters", "pending", "uncertain", "cost_usd", "last_seq", "last_hash", "next_step",
                  "versions", "task_fingerprint", "outcome"):
        _eq(getattr(stored, field), getattr(rebuilt, field), f"{what}: stored checkpoint.{field} vs rebuild()")
    _eq(stored.to_json(), rebuilt.to_json(), f"{what}: stored checkpoint vs rebuild()")
    _eq(stored.last_seq, len(events), f"{what}: checkpoint.last_seq vs number of loaded events")
    return stored


# -- round trip -------------------------------------------------------------------------------------

_RICH_PAYLOAD: dict[str, Any] = {
    "text": "¿Qué tal? ñandú — 東京 🦙👩‍👩‍👧 \u200f\u202eRTL\u202c",
    "escapes": 'quote " backslash \\ newline \n tab \t nul \u0000 ctrl \u001f del \u007f',
    "nested": {"list": [1, 2.5, -0.0, None, True, False, {"deep": [[[]], {}]}], "empty": {}, "zero": 0},
    "big": 2**70,
    "negative_big": -(2**64) - 1,
    "float": 0.1,
    "huge_float": 1e300,
    "tiny_float": 5e-324,
    "key with spaces and ünicode 🦙": "v",
    "": "the empty key",
}


def check_append_load_round_trip(factory: Factory) -> None:
    """Append then load: seq 1..n in order, fields and payload bytes exact, created_at and row_hash set."""
    run = "round-trip"
    batch = [
        _start(run, name="agent", fingerprint="task-fp", payload={"versions": {"schema": 1}, "task": "ñ 🦙"}),
        _e(run, model_step_id(0), "intent", "model", fingerprint="chain-0", payload={"attempt": 1}),
        _e(run, model_step_id(0), "result", "model", fingerprint="chain-0", payload=_RICH_PAYLOAD),
        _e(run, tool_step_id(0, 0), "intent", "tool", name="read_file", decision="allow", fingerprint="args-0",
           payload={"effect_key": "k" * 64}),
        _e(run, tool_step_id(0, 0), "result", "tool", name="read_file", decision="allow", fingerprint="args-0",
           payload={"outcome": "ok", "result": {"bytes": 2**53 + 1, "lines": ["a", "b"]}}),
    ]
    with _open(factory) as store:
        t0 = time.time()
        returned = store.append(batch)
        t1 = time.time()
        _eq(len(returned), len(batch), "append() returns one stored event per event appended")
        loaded = store.load(run)
        _eq(len(loaded), len(batch), "load() after one append")
        prev = ""
        for i, (sent, got, ret) in enumerate(zip(batch, loaded, returned, strict=True), start=1):
            where = f"event {i} ({sent.step_id}:{sent.phase})"
            _eq(got.seq, i, f"{where}: seq")
            for field in ("run_id", "step_id", "phase", "kind", "name", "decision", "fingerprint", "codec"):
                _eq(getattr(got, field), getattr(sent, field), f"{where}: {field}")
            _eq(got.codec, CODEC_JSON, f"{where}: codec tag")
            _eq(got.encoded_payload(), sent.encoded_payload(), f"{where}: payload bytes")
            _eq(got.payload, sent.payload, f"{where}: decoded payload")
            _expect(isinstance(got.created_at, float) and t0 - 3600 <= got.created_at <= t1 + 3600,
                    f"{where}: created_at must be set to the write time, got {got.created_at!r}")
            _expect(isinstance(got.row_hash, str) and len(got.row_hash) == 32,
                    f"{where}: row_hash must be set (32 hex chars), got {got.row_hash!r}")
            _eq(got.row_hash, row_hash(prev, got, got.seq, got.encoded_payload()),
                f"{where}: row_hash must chain to the previous row (events.row_hash)")
            _eq(_row(ret), _row(got), f"{where}: the event append() returned vs the one load() returns")
            prev = got.row_hash
        deep = loaded[2].payload
        _expect(type(deep["big"]) is int and deep["big"] == 2**70, "big ints must round-trip exactly")
        _expect(math.copysign(1.0, deep["nested"]["list"][2]) == -1.0, "-0.0 must round-trip")
        # A second append continues the sequence and the chain.
        more = store.append([_e(run, "final", "result", "final", payload={"answer": "fin ✓"})])
        _eq(more[0].seq, len(batch) + 1, "seq of the first event of a second append")
        _eq(more[0].row_hash, row_hash(prev, more[0], more[0].seq, more[0].encoded_payload()),
            "the second append chains to the last row of the first")
        cp = store.checkpoint(run)
        _expect(cp is not None, "a run with events has a checkpoint")
        assert cp is not None
        _eq(cp.last_seq, len(batch) + 1, "checkpoint.last_seq")
        _eq(cp.last_hash, more[0].row_hash, "checkpoint.last_hash is the head of the chain")
        _eq([_row(e) for e in store.load(run)][:len(batch)], [_row(e) for e in loaded],
            "rows already written never change (I5: append-only)")


# -- deduplication and conflicts ----------------------------------------------------------------------


def check_duplicate_append_is_noop(factory: Factory) -> None:
    """The same event appended again returns the stored one and writes nothing, even with other write-time fields."""
    run = "dedup"
    a = _start(run, name="agent", payload={"v": 1})
    b = _e(run, model_step_id(0), "intent", "model", fingerprint="fp", payload={"n": 1})
    c = _e(run, model_step_id(0), "result", "model", fingerprint="fp", payload={"response": None})
    with _open(factory) as store:
        stored = store.append([a, b, c])
        before = _snapshot(store)
        again = _copy(a, created_at=12345.0, seq=99, row_hash="f" * 32)
        out = store.append([again])
        _eq([_row(e) for e in out], [_row(stored[0])], "re-appending an event (other created_at) returns the stored one")
        _unchanged(store, before, "re-appending a stored event")
        out = store.append([a, b, c])
        _eq([_row(e) for e in out], [_row(e) for e in stored], "re-appending a whole batch returns the stored events")
        _unchanged(store, before, "re-appending a whole batch")
        d = _e(run, tool_step_id(0, 0), "intent", "tool", name="t", payload={})
        out = store.append([b, d])
        _eq(_row(out[0]), _row(stored[1]), "a duplicate in a mixed batch returns the stored event")
        _eq(out[1].seq, 4, "the new event in a mixed batch gets the next seq")
        _eq(len(store.load(run)), 4, "rows after a mixed batch")
        x = _e(run, tool_step_id(0, 0), "result", "tool", name="t", payload={"outcome": "ok"})
        out = store.append([x, _copy(x)])
        _eq(len(out), 2, "a batch holding one event twice returns two events")
        _eq(_row(out[0]), _row(out[1]), "the same event twice in one batch is stored once")
        _eq(len(store.load(run)), 5, "rows after a batch holding one event twice")
        _assert_projection(store, run, "after duplicates")


def check_conflict_writes_nothing(factory: Factory) -> None:
    """A different event under a stored key raises JournalConflict and nothing of its batch is written."""
    run = "conflict"
    start = _start(run)
    intent = _e(run, model_step_id(0), "intent", "model", name=None, fingerprint="fp", payload={"n": 1})
    with _open(factory) as store:
        store.append([start, intent])
        before = _snapshot(store)
        ok = _e(run, model_step_id(0), "result", "model", fingerprint="fp", payload={"response": None})
        variants = {"payload": _copy(intent, payload={"n": 2}), "kind": _copy(intent, kind="tool"),
                    "name": _copy(intent, name="other"), "decision": _copy(intent, decision="allow"),
                    "fingerprint": _copy(intent, fingerprint="fp2")}
        for field, other in variants.items():
            for label, batch in ((f"another {field}", [other]), (f"[new, another {field}]", [ok, other]),
                                 (f"[another {field}, new]", [other, ok])):
                exc = _raises(JournalConflict, partial(store.append, batch), f"append {label} under a stored key")
                assert isinstance(exc, JournalConflict)
                _eq((exc.run_id, exc.step_id, exc.phase), intent.key, "JournalConflict names the key")
                _unchanged(store, before, f"a conflicting append ({label})")
        y = _e(run, tool_step_id(0, 0), "intent", "tool", name="t", payload={"a": 1})
        _raises(JournalConflict, lambda: store.append([y, _copy(y, payload={"a": 2})]),
                "two different events under one key in one batch")
        _unchanged(store, before, "a batch that conflicts with itself")
        out = store.append([ok])
        _eq(out[0].seq, 3, "after refused appends, the next event continues the sequence without a gap")
        _assert_projection(store, run, "after conflicts")


# -- batches ------------------------------------------------------------------------------------------


def check_batch_atomic_and_ordered(factory: Factory) -> None:
    """A batch lands in list order (seq, not key order) or not at all."""
    run = "batch"
    with _open(factory) as store:
        # Step ids in descending key order, more than 9 events: seq must follow the list, numerically.
        batch = [_start(run)] + [_e(run, f"t{i:04d}.model", "result", "model", payload={"i": i})
                                 for i in range(24, -1, -1)]
        out = store.append(batch)
        _eq([e.key for e in out], [e.key for e in batch], "append() returns events in batch order")
        loaded = store.load(run)
        _eq([e.key for e in loaded], [e.key for e in batch], "load() returns events in append order")
        _eq([e.seq for e in loaded], list(range(1, len(batch) + 1)), "seq of a 26-event batch")
        before = _snapshot(store)
        good = [_e(run, f"u{i}", "intent", "tool", name="t", payload={}) for i in range(3)]
        bad_last = [*good, _e(run, "", "intent", "tool")]
        _raises(UsageError, lambda: store.append(bad_last), "a batch whose last event has an empty step_id")
        _unchanged(store, before, "a batch whose last event is invalid")
        bad_middle = [good[0], _e(run, "u9", "intent", "tool", payload={"x": float("nan")}), good[1]]
        _raises(PAYLOAD_ERRORS, lambda: store.append(bad_middle), "a batch whose middle event has a NaN payload")
        _unchanged(store, before, "a batch whose middle event cannot be encoded")
        _eq(store.append([]), [], "an empty append returns []")
        _unchanged(store, before, "an empty append")
        _assert_projection(store, run, "after batches")


def check_batch_of_two_runs_refused(factory: Factory) -> None:
    """One append holds the events of one run: two runs in a batch raise UsageError and write nothing."""
    with _open(factory) as store:
        _raises(UsageError, lambda: store.append([_start("a"), _start("b")]), "a batch of two new runs")
        _eq(_run_ids(store), [], "runs after a refused two-run batch")
        _raises(RunNotFound, lambda: store.load("a"), "load of a run whose batch was refused")
        _eq(store.checkpoint("b"), None, "checkpoint of a run whose batch was refused")
        store.append([_start("a")])
        before = _snapshot(store)
        later = _e("a", "t0000.model", "intent", "model")
        for label, batch in (("[run a, run b]", [later, _start("b")]), ("[run b, run a]", [_start("b"), later])):
            _raises(UsageError, partial(store.append, batch), f"a batch {label}")
            _unchanged(store, before, f"a refused batch {label}")


# -- the checkpoint projection ---------------------------------------------------------------------------


def _mixed_batches(run: str) -> list[list[StepEvent]]:
    """A run that exercises every projection rule; split into batches of varying size."""
    m0, m1, m2 = model_step_id(0), model_step_id(1), model_step_id(2)
    t00, t01, t02, t10, t20 = (tool_step_id(0, 0), tool_step_id(0, 1), tool_step_id(0, 2), tool_step_id(1, 0),
                               tool_step_id(2, 0))
    a10 = approval_step_id(t10)
    usage = {"input_tokens": 100, "output_tokens": 20, "cached_tokens": 5, "reasoning_tokens": 7}
    return [
        [_start(run, name="agent", fingerprint="task", payload={"versions": {"schema": 1, "policy": "p1"}})],
        [_e(run, m0, "intent", "model", fingerprint="c0"),
         _e(run, m0, "result", "model", fingerprint="c0", payload={"response": {"usage": usage, "cost": None}}),
         _e(run, t00, "intent", "tool", name="read", decision="allow", fingerprint="a0")],
        [_e(run, t00, "result", "tool", name="read", decision="allow", fingerprint="a0",
            payload={"outcome": "ok", "result": "contents"}),
         _e(run, t01, "result", "tool", name="send", decision="deny", fingerprint="a1",
            payload={"outcome": "denied", "reason": "policy"}),
         _e(run, t02, "result", "tool", name="nope", fingerprint="a2",
            payload={"outcome": "error", "error": {"error_class": "invalid_input"}, "counters": {"repairs": 1}}),
         _e(run, m1, "intent", "model", fingerprint="c1"),
         _e(run, m1, "intent.2", "model", fingerprint="c1", payload={"after": "crash", "counters": {"retries": 1}}),
         _e(run, m1, "result", "model", fingerprint="c1", payload={"response": {"usage": usage, "cost": 0.0125}}),
         _e(run, t10, "decision", "tool", name="pay", decision="require_approval", fingerprint="a3",
            payload={"policy_version": "p1"}),
         _e(run, a10, "request", "approval", name="pay", decision="require_approval", fingerprint="a3",
            payload={"tool_step": t10, "arguments": {"amount": 10}})],
        [_e(run, a10, "decision", "approval", name="pay", decision="approved", fingerprint="a3",
            payload={"approver": "ana"})],
        [_e(run, t10, "intent", "tool", name="pay", decision="approved", fingerprint="a3"),
         _e(run, t10, "result", "tool", name="pay", decision="approved", fingerprint="a3",
            payload={"outcome": "ok", "result": {"receipt": 1}})],
        [_e(run, m2, "intent", "model", fingerprint="c2"),
         _e(run, m2, "result", "model", fingerprint="c2",
            payload={"response": {"usage": usage, "cost": 0.003,
                                  "escalations": [{"usage": usage, "cost": None}]}}),
         _e(run, t20, "intent", "tool", name="pay", decision="allow", fingerprint="a4"),
         _e(run, t20, "uncertain", "tool", name="pay", fingerprint="a4", payload={"effect_key": "ek"})],
        [_e(run, t20, "result", "tool", name="pay", decision="allow", fingerprint="a4",
            payload={"outcome": "ok", "reconciled": True})],
        [_e(run, "final", "result", "final", payload={"answer": "done"})],
    ]


def check_checkpoint_equals_rebuild(factory: Factory) -> None:
    """After every append of a mixed run, the stored checkpoint equals rebuild(load()) and the expected totals."""
    run = "mixed"
    with _open(factory) as store:
        epoch = 0
        for i, batch in enumerate(_mixed_batches(run)):
            store.append(batch)
            if i == 3:
                epoch = store.acquire(run, "worker-2")  # the epoch must survive later appends
            _assert_projection(store, run, f"after batch {i + 1}")
        cp = _assert_projection(store, run, "at the end")
        expected = {"model_calls": 3, "model_sends": 5, "possibly_billed_twice": 1, "calls_paid": 2,
                    "unpriced_calls": 2, "escalations": 1, "tool_calls": 3, "tool_denied": 1, "tool_errors": 1,
                    "approvals_requested": 1, "repairs": 1, "retries": 1, "uncertain": 1,
                    "input_tokens": 400, "output_tokens": 80, "cached_tokens": 20, "reasoning_tokens": 28}
        _eq({k: cp.count(k) for k in expected}, expected, "counters of the mixed run")
        _expect(abs(cp.cost_usd - 0.0155) < 1e-9, f"cost_usd: expected 0.0155, got {cp.cost_usd!r}")
        _eq((cp.status, cp.pending, cp.uncertain, cp.outcome), ("completed", {}, {}, {"answer": "done"}),
            "status, pending, uncertain and outcome of the mixed run")
        _expect(epoch >= 1, f"acquire() must return an epoch >= 1, got {epoch}")
        _eq(cp.epoch, epoch, "the fencing epoch taken mid-run survives later appends")
        _eq(cp.versions, {"schema": 1, "policy": "p1"}, "versions of the mixed run")
        listed = [c for c in store.list_runs(limit=_ALL) if c.run_id == run]
        _eq([c.to_json() for c in listed], [cp.to_json()], "list_runs() returns the same checkpoint")


def check_status_transitions(factory: Factory) -> None:
    """start: running; approval request: suspended with pending; decision: running; final: completed."""
    run = "status"
    step = tool_step_id(0, 0)
    appr = approval_step_id(step)
    with _open(factory) as store:
        store.append([_start(run)])
        cp = store.checkpoint(run)
        _eq(cp and (cp.status, cp.is_open), ("running", True), "status after run start")
        store.append([_e(run, step, "decision", "tool", name="pay", decision="require_approval", fingerprint="fp"),
                      _e(run, appr, "request", "approval", name="pay", decision="require_approval",
                         fingerprint="fp", payload={"tool_step": step, "arguments": {"amount": 5}})])
        cp = store.checkpoint(run)
        assert cp is not None
        _eq(cp.status, "suspended", "status after an approval request")
        _eq(cp.pending, {appr: {"tool": "pay", "fingerprint": "fp", "tool_step": step, "arguments": {"amount": 5}}},
            "pending approvals after a request")
        _eq(_run_ids(store, status="suspended"), [run], "list_runs(status='suspended')")
        store.append([_e(run, appr, "decision", "approval", name="pay", decision="approved", fingerprint="fp")])
        cp = store.checkpoint(run)
        _eq(cp and (cp.status, cp.pending), ("running", {}), "status and pending after the decision")
        store.append([_e(run, "final", "result", "final", payload={"answer": 42})])
        cp = store.checkpoint(run)
        _eq(cp and (cp.status, cp.is_open, cp.outcome), ("completed", False, {"answer": 42}),
            "status after the final answer")
        store.append([_start("failing"), _e("failing", "run", "end", "run", payload={"status": "failed"})])
        cp = store.checkpoint("failing")
        _eq(cp and cp.status, "failed", "status after a run end")
        _eq(_run_ids(store, status="running"), [], "list_runs(status='running') once no run is running")


# -- unknown runs, fencing, listing ------------------------------------------------------------------------


def check_unknown_run(factory: Factory) -> None:
    """load and acquire of an unknown run raise RunNotFound; checkpoint returns None; nothing is created."""
    with _open(factory) as store:
        for stage in ("empty store", "store with another run"):
            for rid in ("nope", "run-1 ", "RUN-1", "run-"):
                exc = _raises(RunNotFound, partial(store.load, rid), f"load({rid!r}) in an {stage}")
                _eq(getattr(exc, "run_id", None), rid, "RunNotFound.run_id")
                _eq(store.checkpoint(rid), None, f"checkpoint({rid!r}) in an {stage}")
                _raises(RunNotFound, partial(store.acquire, rid, "owner"), f"acquire({rid!r}) in an {stage}")
                _eq(store.checkpoint(rid), None, f"acquire({rid!r}) must not create the run")
            if stage == "empty store":
                _eq(store.list_runs(), [], "list_runs() of an empty store")
                store.append([_start("run-1")])
        _eq(_run_ids(store), ["run-1"], "runs after lookups of unknown runs")


def check_fencing(factory: Factory) -> None:
    """acquire returns increasing epochs; a stale or future epoch raises FencedOut and writes nothing."""
    run = "fenced"
    with _open(factory) as store:
        store.append([_start(run)], epoch=0)
        cp = store.checkpoint(run)
        _eq(cp and cp.epoch, 0, "epoch of a run never acquired")
        events_before = [_row(e) for e in store.load(run)]
        e1 = store.acquire(run, "w1")
        e2 = store.acquire(run, "w2")
        _expect(1 <= e1 < e2, f"acquire must return increasing epochs >= 1, got {e1} then {e2}")
        _eq([_row(e) for e in store.load(run)], events_before, "acquire does not change the journal")
        cp = store.checkpoint(run)
        _eq(cp and (cp.epoch, cp.last_seq), (e2, 1), "checkpoint epoch and last_seq after acquire")
        before = _snapshot(store)
        intent = _e(run, tool_step_id(0, 0), "intent", "tool", name="pay")
        for label, epoch in (("stale", e1), ("never issued", e2 + 1), ("zero", 0)):
            exc = _raises(FencedOut, partial(store.append, [intent], epoch=epoch), f"append with a {label} epoch")
            assert isinstance(exc, FencedOut)
            _eq((exc.run_id, exc.epoch, exc.current), (run, epoch, e2), "FencedOut names the run and both epochs")
            _unchanged(store, before, f"an append with a {label} epoch")
        _raises(FencedOut, lambda: store.append([_start(run)], epoch=e1), "a duplicate appended with a stale epoch")
        out = store.append([intent], epoch=e2)
        _eq(out[0].seq, 2, "an append with the current epoch")
        out = store.append([_e(run, "cancel", "request", "cancel", payload={"by": "ops"})], epoch=None)
        _eq(out[0].seq, 3, "a harness append (epoch=None) while another process owns the run")
        cp = store.checkpoint(run)
        _eq(cp and cp.epoch, e2, "appends do not change the epoch")
        e3 = store.acquire(run, "w3")
        _expect(e3 > e2, f"a third acquire must return a higher epoch, got {e3} after {e2}")
        _raises(FencedOut, lambda: store.append([_e(run, "t", "result", "tool")], epoch=e2),
                "the previous owner after a takeover")
        _assert_projection(store, run, "after fencing")


def check_list_runs(factory: Factory) -> None:
    """list_runs: most recently updated first, filtered by status, at most `limit`."""
    with _open(factory) as store:
        for rid in ("a", "b", "c"):
            store.append([_start(rid)])
        _eq(_run_ids(store), ["c", "b", "a"], "list_runs() after creating a, b, c")
        store.append([_e("a", model_step_id(0), "intent", "model")])
        _eq(_run_ids(store), ["a", "c", "b"], "list_runs() after appending to a (most recently updated first)")
        store.append([_e("b", "final", "result", "final", payload={})])
        _eq(_run_ids(store), ["b", "a", "c"], "list_runs() after completing b")
        _eq(_run_ids(store, status="completed"), ["b"], "list_runs(status='completed')")
        _eq(_run_ids(store, status="running"), ["a", "c"], "list_runs(status='running')")
        _eq(_run_ids(store, status="no-such-status"), [], "list_runs(status=<unknown>)")
        _eq(_run_ids(store, limit=2), ["b", "a"], "list_runs(limit=2)")
        _eq(_run_ids(store, limit=1), ["b"], "list_runs(limit=1)")
        _eq(_run_ids(store, status="running", limit=1), ["a"], "list_runs(status='running', limit=1)")
        _eq(_run_ids(store, limit=0), [], "list_runs(limit=0)")
        for cp in store.list_runs():
            stored = store.checkpoint(cp.run_id)
            _eq(cp.to_json(), stored and stored.to_json(), f"list_runs() entry for {cp.run_id!r} vs checkpoint()")


# -- R12: identifiers ---------------------------------------------------------------------------------------

HOSTILE_IDS: tuple[str, ...] = (
    "'; DROP TABLE cuaderno_events; --",
    "Robert'); DROP TABLE cuaderno_runs;--",
    "' OR '1'='1",
    '" OR 1=1 --',
    "it's \"quoted\" `twice`",
    "C:\\path\\to\\ \\' \\\" \\x00 \\n",
    "\u200f\u202eabc\u202c \u0645\u0631\u062d\u0628\u0627",
    "🦙🔥👩‍👩‍👧",
    "%", "_", "%_%", "?", ":name", "$1", "@p", "*",
    '","last_seq":99,"',
    "cuaderno_meta",
    " leading and trailing ",
    "\t\n\r\x01\x1f\x7f",
    "x" * 999 + "é",
    "🦙" * 1024,
)
"""Identifiers that must be stored and read back exactly (the last two: 1000 and 1024 characters)."""

INVALID_IDS: tuple[object, ...] = ("", "\x00", "a\x00b", "\ud800", "a\udfffb", "x" * 1025, "y" * (1 << 20), 123)
"""Identifiers an append must refuse with UsageError: empty, NUL, lone surrogates, too long, not a string."""


def check_hostile_ids_round_trip(factory: Factory) -> None:
    """R12: SQL-looking, quoted, RTL, emoji and 1000-character ids are stored and read back exactly."""
    with _open(factory) as store:
        for i, value in enumerate(HOSTILE_IDS):
            run_events = [_start(value, name=value), _e(value, value, value, "tool", name=value, payload={"v": value})]
            store.append(run_events)
            loaded = store.load(value)
            _eq([(e.run_id, e.step_id, e.phase, e.name) for e in loaded],
                [(value, "run", "start", value), (value, value, value, value)], f"run id #{i} {_short(value)}")
            _eq(loaded[1].payload, {"v": value}, f"payload of run #{i}")
            cp = store.checkpoint(value)
            _eq(cp and cp.run_id, value, f"checkpoint of run #{i}")
            epoch = store.acquire(value, owner=value)
            cp = store.checkpoint(value)
            _eq(cp and cp.epoch, epoch, f"epoch of run #{i} after acquire (a hostile owner)")
        host = "host-run"
        store.append([_start(host)])
        step_events = [_e(host, v, "intent", "tool", name=v) for v in HOSTILE_IDS]
        store.append(step_events)
        loaded = store.load(host)
        _eq([(e.step_id, e.name) for e in loaded[1:]], [(v, v) for v in HOSTILE_IDS], "hostile step ids and names")
        _eq(sorted(_run_ids(store, limit=_ALL)), sorted([*HOSTILE_IDS, host]), "every run, and nothing else")
        for value in HOSTILE_IDS:
            _eq(len(store.load(value)), 2, f"rows of run {_short(value)} at the end")
            _assert_projection(store, value, f"run {_short(value)}")


def check_runs_are_isolated(factory: Factory) -> None:
    """Ids that differ by case, whitespace, normalization or a prefix are different runs and steps."""
    ids = ("a", "A", "a ", " a", "é", "e\u0301", "run", "run1", "run-1", "ru%", "r_n")
    with _open(factory) as store:
        for rid in ids:
            store.append([_start(rid, payload={"who": rid}), _e(rid, "Step", "p", "tool", payload={"who": rid}),
                          _e(rid, "step", "p", "tool", payload={"who": rid})])
        for rid in ids:
            loaded = store.load(rid)
            _eq([(e.run_id, e.step_id, e.payload["who"]) for e in loaded],
                [(rid, "run", rid), (rid, "Step", rid), (rid, "step", rid)], f"events of run {rid!r}")
        _eq(sorted(_run_ids(store, limit=_ALL)), sorted(ids), "runs")


def check_invalid_ids_refused(factory: Factory) -> None:
    """R12: empty, NUL, lone-surrogate, over-long or non-string run_id/step_id/phase/kind raise UsageError."""
    with _open(factory) as store:
        store.append([_start("ok")])
        before = _snapshot(store)
        for field in ("run_id", "step_id", "phase", "kind"):
            for value in INVALID_IDS:
                fields: dict[str, Any] = {"run_id": "ok", "step_id": "s", "phase": "intent", "kind": "tool"}
                fields[field] = value
                bad = StepEvent(**fields)
                what = f"{field}={_short(value)}"
                _raises(UsageError, partial(store.append, [bad]), f"append with {what}")
                _unchanged(store, before, f"a refused append with {what}")
                if field != "run_id":
                    batch = [_e("ok", "fine", "intent", "tool"), bad]
                    _raises(UsageError, partial(store.append, batch), f"a batch [valid, {what}]")
                    _unchanged(store, before, f"a refused batch [valid, {what}]")


def check_invalid_names_refused(factory: Factory) -> None:
    """R12: name like an id (non-empty, no NUL, no lone surrogate, <= 1024); decision/fingerprint
    storable and non-empty. The SQL stores bind a missing name, decision or fingerprint as ``''``
    and store it as NULL (``NULLIF``, cheaper to bind than ``None``): an empty one must never reach
    them, or it would come back as ``None``."""
    cases: list[tuple[str, object]] = [("name", v) for v in ("", "a\x00b", "\ud800", "x" * 1025, "y" * (1 << 20))]
    cases += [(f, v) for f in ("decision", "fingerprint") for v in ("", "a\x00b", "\udc00")]
    with _open(factory) as store:
        store.append([_start("ok")])
        before = _snapshot(store)
        for field, value in cases:
            bad = _e("ok", "s", "intent", "tool", **{field: value})
            what = f"{field}={_short(value)}"
            _raises(UsageError, partial(store.append, [bad]), f"append with {what}")
            _unchanged(store, before, f"a refused append with {what}")


def check_reads_with_invalid_ids(factory: Factory) -> None:
    """Reads with an id no append accepts: RunNotFound/None (or UsageError), never an encoder or driver error."""
    with _open(factory) as store:
        store.append([_start("ok")])
        for value in ("\ud800", "a\x00b", "", "x" * 2000):
            what = _short(value)
            _raises((RunNotFound, UsageError), partial(store.load, value), f"load({what})")
            try:
                cp = store.checkpoint(value)
            except UsageError:
                cp = None
            except Exception as exc:
                raise ConformanceFailure(f"checkpoint({what}): expected None or UsageError, got "
                                         f"{type(exc).__name__}: {exc}") from exc
            _eq(cp, None, f"checkpoint({what})")
            _raises((RunNotFound, UsageError), partial(store.acquire, value, "o"), f"acquire({what})")


# -- payloads ---------------------------------------------------------------------------------------------------


def _unserializable() -> list[tuple[str, dict[Any, Any]]]:
    return [("NaN", {"x": float("nan")}), ("Infinity", {"x": float("inf")}), ("-Infinity", {"x": float("-inf")}),
            ("nested NaN", {"deep": [{"y": [1, float("nan")]}]}), ("a set", {"x": {1, 2}}),
            ("an object", {"x": object()}), ("bytes", {"x": b"raw"}), ("a tuple key", {("a", "b"): 1})]


def check_unserializable_payload_refused(factory: Factory) -> None:
    """A payload that is not plain JSON (NaN, Infinity, a set, bytes...) raises and writes nothing."""
    run = "payloads"
    with _open(factory) as store:
        store.append([_start(run), _e(run, "s0", "intent", "tool", payload={"ok": 1})])
        before = _snapshot(store)
        for label, payload in _unserializable():
            bad = _e(run, "s1", "intent", "tool", payload=payload)
            _raises(PAYLOAD_ERRORS, partial(store.append, [bad]), f"a payload holding {label}")
            _unchanged(store, before, f"a refused payload holding {label}")
            batch = [_e(run, "s2", "intent", "tool", payload={"fine": True}), bad]
            _raises(PAYLOAD_ERRORS, partial(store.append, batch), f"a batch [valid, payload holding {label}]")
            _unchanged(store, before, f"a refused batch [valid, payload holding {label}]")
            dup = _e(run, "s0", "intent", "tool", payload=payload)
            _raises((*PAYLOAD_ERRORS, JournalConflict), partial(store.append, [dup]),
                    f"a payload holding {label} under a stored key")
            _unchanged(store, before, f"a refused payload holding {label} under a stored key")


def check_unreadable_rows_refused(factory: Factory) -> None:
    """An append never stores a row this version cannot read back: non-object payloads, unknown codecs."""
    run = "unreadable"
    bad: list[tuple[str, StepEvent]] = [
        ("a list payload", _e(run, "cancel", "request", "cancel", payload=[1, 2])),
        ("a string payload", _e(run, "note", "n", "note", payload="text")),
        ("an unknown codec", _e(run, "note", "n", "note", payload={"a": 1}, codec="msgpack")),
    ]
    with _open(factory) as store:
        store.append([_start(run)])
        before = _snapshot(store)
        for label, ev in bad:
            _raises(PAYLOAD_ERRORS, partial(store.append, [ev]), f"an event with {label}")
            _unchanged(store, before, f"a refused event with {label}")


# -- concurrency --------------------------------------------------------------------------------------------------


def check_concurrent_appends(factory: Factory) -> None:
    """Threads appending to one run through one store: every event lands once, seq has no gap, the chain holds."""
    run = "threads"
    n_threads, per_thread = 6, 8
    errors: list[BaseException] = []
    with _open(factory) as store:
        store.append([_start(run)])
        barrier = threading.Barrier(n_threads)

        def work(t: int) -> None:
            try:
                barrier.wait(timeout=30)
                for i in range(per_thread):
                    store.append([_e(run, f"w{t}.{i}", "intent", "tool", payload={"t": t, "i": i})])
                    # Every thread also appends the same shared event: it must land exactly once.
                    store.append([_e(run, f"shared.{i}", "intent", "tool", payload={"i": i})])
            except BaseException as exc:  # reported below; a thread must not die silently
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=120)
        _eq([f"{type(e).__name__}: {e}" for e in errors], [], "errors raised in appending threads")
        loaded = store.load(run)
        _eq(len(loaded), 1 + n_threads * per_thread + per_thread, "rows after concurrent appends")
        _eq([e.seq for e in loaded], list(range(1, len(loaded) + 1)), "seq after concurrent appends")
        _eq(len({e.key for e in loaded}), len(loaded), "keys after concurrent appends are unique")
        _assert_projection(store, run, "after concurrent appends")


def check_compare_and_set(factory: Factory) -> None:
    """append(expect_seq=n) writes only while the run's last event is n; otherwise RunChanged, nothing written."""
    run = "cas"
    with _open(factory) as store:
        store.append([_start(run)])
        first = _e(run, model_step_id(0), "intent", "model", fingerprint="c0")
        out = store.append([first], expect_seq=1)
        _eq(out[0].seq, 2, "an append whose expected last event is the run's last event")
        before = _snapshot(store)
        for expected in (1, 3, 0):
            exc = _raises(RunChanged, partial(store.append, [_e(run, "cancel", "request", "cancel")],
                                              expect_seq=expected), f"an append expecting last event {expected}")
            assert isinstance(exc, RunChanged)
            _eq((exc.run_id, exc.expected, exc.found), (run, expected, 2), "RunChanged names the run and both seqs")
            _unchanged(store, before, f"an append expecting last event {expected}")
        _raises(RunChanged, lambda: store.append([_start("new")], expect_seq=1), "expecting events of a new run")
        _unchanged(store, before, "an append expecting events of a run that does not exist")
        _eq(store.append([_start("fresh")], expect_seq=0)[0].seq, 1, "expect_seq=0 for a run not yet started")


def check_decisions_checked_at_commit(factory: Factory) -> None:
    """Approvals, run ends, cancellations and settlements the run's state no longer admits are refused in the write."""
    run = "decisions"
    step, appr = tool_step_id(0, 0), approval_step_id(tool_step_id(0, 0))
    request = [_e(run, step, "decision", "tool", name="pay", decision="require_approval", fingerprint="fp"),
               _e(run, appr, "request", "approval", name="pay", decision="require_approval", fingerprint="fp",
                  payload={"tool_step": step, "arguments": {"amount": 5}})]

    def decision(fp: str = "fp", step_id: str = appr) -> StepEvent:
        return _e(run, step_id, "decision", "approval", name="pay", decision="approved", fingerprint=fp)

    with _open(factory) as store:
        store.append([_start(run)])
        before = _snapshot(store)
        _raises(NotWaitingForApproval, lambda: store.append([decision()]), "a decision nothing is waiting for")
        _unchanged(store, before, "a decision nothing is waiting for")
        store.append(request)
        before = _snapshot(store)
        _raises(ApprovalMismatch, lambda: store.append([decision("other")]), "a decision for other arguments")
        _raises(NotWaitingForApproval, lambda: store.append([decision(step_id="x.approval")]),
                "a decision for another step")
        _unchanged(store, before, "refused decisions")
        store.append([decision()])
        _raises((NotWaitingForApproval, JournalConflict),
                lambda: store.append([_copy(decision(), decision="rejected")]), "a second, different decision")
        store.append([_e(run, step, "intent", "tool", name="pay", decision="approved", fingerprint="fp"),
                      _e(run, step, "uncertain", "tool", name="pay", fingerprint="fp", payload={"why": "timeout"})])
        cp = store.checkpoint(run)
        _eq(cp and cp.status, "needs_human", "status after an uncertain effect")
        store.append([_e(run, step, "resolution", "tool", name="pay", decision="not_happened", fingerprint="fp")])
        before = _snapshot(store)
        _raises(NotUncertain, lambda: store.append([_e(run, step, "result", "tool", name="pay", decision="resolved",
                                                       fingerprint="fp", payload={"outcome": "ok"})]),
                "settling an effect that is no longer uncertain")
        _unchanged(store, before, "a settlement of an effect that is no longer uncertain")
        store.append([_e(run, "final", "result", "final", payload={"output": "done"})])
        before = _snapshot(store)
        for label, ev in (("a cancellation", _e(run, "cancel", "request", "cancel")),
                          ("a run end", _e(run, "run", "end", "run", payload={"status": "cancelled"}))):
            exc = _raises(RunClosed, partial(store.append, [ev]), f"{label} of a completed run")
            assert isinstance(exc, RunClosed)
            _eq(exc.status, "completed", f"RunClosed for {label} names the status")
            _unchanged(store, before, f"{label} of a completed run")
        _assert_projection(store, run, "after refused decisions")


@_needs(Capability.REBUILD)
def check_rebuild_checkpoint(factory: Factory) -> None:
    """rebuild_checkpoint (the optional SupportsRebuild) of an untouched summary: no field differs, nothing is written,
    the epoch is kept, and an unknown run is RunNotFound."""
    run = "rebuilt"
    with _open(factory) as store:
        if not isinstance(store, SupportsRebuild):
            raise ConformanceFailure(f"{type(store).__name__} does not declare SupportsRebuild; this case needs it")
        rebuild_checkpoint = store.rebuild_checkpoint
        for batch in _mixed_batches(run):
            store.append(batch)
        epoch = store.acquire(run, "worker-2")
        stored = _assert_projection(store, run, "before rebuild_checkpoint()")
        before = _snapshot(store)
        cp, differed = rebuild_checkpoint(run)
        _eq(list(differed), [], "fields rebuild_checkpoint() found different in an untouched summary")
        _eq(cp.to_json(), stored.to_json(), "rebuild_checkpoint() of an untouched summary")
        _eq(cp.epoch, epoch, "the epoch after rebuild_checkpoint()")
        _unchanged(store, before, "rebuild_checkpoint() of a summary that matches its journal")
        _raises(RunNotFound, lambda: rebuild_checkpoint("no-such-run"), "rebuild_checkpoint() of an unknown run")


# -- two workers: two handles on one journal ----------------------------------------------------------------------


@_needs(Capability.SECOND_HANDLE)
def check_two_handles_same_key(factory: Factory) -> None:
    """Two handles appending the same (run, step, phase): one row; the other append returns it, a different event conflicts."""
    run = "two-same-key"
    rounds = 6
    with _two(factory) as (a, b):
        started = a.append([_start(run)])
        _eq([_row(e) for e in b.append([_start(run)])], [_row(e) for e in started],
            "B appending the event A stored returns A's stored event")
        intent = _e(run, model_step_id(0), "intent", "model", fingerprint="f0", payload={"attempt": 1})
        stored = b.append([intent])
        _eq([_row(e) for e in a.append([intent])], [_row(e) for e in stored],
            "A appending the event B stored returns B's stored event")
        before = _snapshot(a)
        exc = _raises(JournalConflict, lambda: b.append([_copy(intent, payload={"attempt": 2})]),
                      "B appending another event under a key A's journal holds")
        _unchanged(a, before, "a conflicting append through B, seen through A")
        assert isinstance(exc, JournalConflict)
        _eq((exc.run_id, exc.step_id, exc.phase), intent.key, "JournalConflict names the key")
        # Racing: both handles append the same events at once (the first insert wins, the other
        # finds the key taken and returns the stored row, in the same transaction).
        errors: list[BaseException] = []
        barrier = threading.Barrier(2)

        def work(store: Checkpointer, who: str) -> None:
            try:
                for i in range(rounds):
                    barrier.wait(timeout=30)
                    store.append([_e(run, f"shared.{i}", "intent", "tool", payload={"i": i})])
                    store.append([_e(run, f"{who}.{i}", "intent", "tool", payload={"i": i})])
            except BaseException as exc:  # reported below; a thread must not die silently
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(store, who)) for store, who in ((a, "a"), (b, "b"))]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=120)
        _eq([f"{type(e).__name__}: {e}" for e in errors], [], "errors raised by the racing handles")
        for name, store in (("A", a), ("B", b)):
            loaded = store.load(run)
            _eq(len(loaded), 2 + 3 * rounds, f"rows through {name} after two handles raced on the same keys")
            _eq(len({e.key for e in loaded}), len(loaded), f"keys through {name} are unique")
            _assert_projection(store, run, f"through {name} after two handles raced")
        _eq([_row(e) for e in a.load(run)], [_row(e) for e in b.load(run)], "A and B load the same rows")


@_needs(Capability.SECOND_HANDLE)
def check_two_handles_fencing(factory: Factory) -> None:
    """A takeover through A fences B: B's write with its older epoch is FencedOut, nothing written; B sees A's epoch."""
    run = "two-fenced"
    with _two(factory) as (a, b):
        a.append([_start(run)])
        e_b = b.acquire(run, "worker-b")
        b.append([_e(run, tool_step_id(0, 0), "intent", "tool", name="pay", fingerprint="p0")], epoch=e_b)
        b.release(run, e_b)  # B's loop stopped (say it paused); A's worker takes the run
        e_a = a.acquire(run, "worker-a")
        _expect(e_a > e_b, f"a takeover through A must return an epoch above B's {e_b}, got {e_a}")
        result = _e(run, tool_step_id(0, 0), "result", "tool", name="pay", fingerprint="p0", payload={"ok": True})
        before = _snapshot(a)
        exc = _raises(FencedOut, lambda: b.append([result], epoch=e_b), "B writing with the epoch A took over")
        assert isinstance(exc, FencedOut)
        _eq((exc.run_id, exc.epoch, exc.current), (run, e_b, e_a), "FencedOut names the run, B's epoch and A's")
        _unchanged(a, before, "B's fenced write, seen through A")
        _unchanged(b, before, "B's fenced write, seen through B")
        cp = b.checkpoint(run)
        _eq(cp and cp.epoch, e_a, "the epoch B reads after A's takeover")
        out = a.append([result], epoch=e_a)
        _eq(out[0].seq, 3, "A writing with the epoch it took")
        _raises(FencedOut, lambda: b.append([_e(run, "t", "intent", "tool")], epoch=e_b),
                "B again, after A wrote")
        a.release(run, e_a)
        _assert_projection(b, run, "through B after fencing")


@_needs(Capability.SECOND_HANDLE)
def check_two_handles_see_each_other(factory: Factory) -> None:
    """What one handle commits the other reads at once (checkpoint, load, list_runs), and appends continue its chain."""
    run = "two-seen"
    with _two(factory) as (a, b):
        _eq(b.checkpoint(run), None, "B's checkpoint of a run nobody started")
        for batch in _mixed_batches(run)[:2]:
            a.append(batch)
        through_a = a.checkpoint(run)
        through_b = b.checkpoint(run)
        _expect(through_a is not None and through_b is not None, "a run A started has a checkpoint through B")
        assert through_a is not None and through_b is not None
        _eq(through_b.to_json(), through_a.to_json(), "the checkpoint B reads vs the one A wrote")
        _eq([_row(e) for e in b.load(run)], [_row(e) for e in a.load(run)], "the rows B loads vs A's")
        _eq(_run_ids(b, limit=_ALL), [run], "the runs B lists")
        # Each handle appends after the other: each must see the other's last row (a handle that
        # kept the summary it last wrote would number its row after a stale head).
        for i, (writer, reader) in enumerate(((b, a), (a, b), (b, a))):
            out = writer.append([_e(run, f"turn.{i}", "intent", "tool", payload={"i": i})])
            _eq(out[0].seq, through_a.last_seq + 1 + i, f"seq of append {i + 1} after the other handle wrote")
            _eq([_row(e) for e in reader.load(run)], [_row(e) for e in writer.load(run)],
                f"the rows read through the other handle after append {i + 1}")
        _assert_projection(a, run, "through A after both handles wrote")
        _assert_projection(b, run, "through B after both handles wrote")


@_needs(Capability.CLAIMS)
def check_open_runs_and_holders(factory: Factory) -> None:
    """open_runs (SupportsClaims) lists running runs, waiting ones asked to cancel and cancelled ones with cleanup, oldest
    update first, with their epochs; holders names nobody for a run never taken or released; reads write nothing."""
    with _open(factory) as store:
        if not isinstance(store, SupportsClaims):
            raise ConformanceFailure(f"{type(store).__name__} does not declare SupportsClaims; this case needs it")
        appr = approval_step_id(tool_step_id(0, 0))
        store.append([_start("waits")])
        store.append([_e("waits", appr, "request", "approval", name="pay", fingerprint="fp", payload={})])
        store.append([_start("done")])
        store.append([_e("done", "final", "result", "final", payload={"output": "ok"})])
        store.append([_start("bare-cancel")])
        store.append([_e("bare-cancel", "run", "end", "run", payload={"status": "cancelled", "cleanup": []})])
        store.append([_start("cleanup")])
        store.append([_e("cleanup", "run", "end", "run", payload={
            "status": "cancelled", "cleanup": [{"for_step": "t0000.tool00", "tool": "refund", "arguments": {},
                                                "status": "scheduled"}]})])
        store.append([_start("runs")])
        epoch = store.acquire("runs", "worker-1")
        store.append([_start("asked")])
        store.append([_e("asked", appr, "request", "approval", name="pay", fingerprint="fp", payload={})])
        store.append([_e("asked", "cancel", "request", "cancel", payload={"reason": "r", "by": None})])
        before = _snapshot(store)
        listed = store.open_runs(limit=_ALL)
        _eq([cp.run_id for cp in listed], ["cleanup", "runs", "asked"],
            "open_runs(): running runs, cancelled ones with cleanup, waiting ones asked to cancel; least recently "
            "updated first; none that only a person moves on")
        _eq({cp.run_id: cp.status for cp in listed}, {"cleanup": "cancelled", "runs": "running", "asked": "suspended"},
            "the statuses open_runs() returns")
        _eq(next(cp.epoch for cp in listed if cp.run_id == "runs"), epoch, "the epoch open_runs() returns")
        _eq([cp.run_id for cp in store.open_runs(limit=1)], ["cleanup"], "open_runs(limit=1)")
        _eq(store.open_runs(limit=0), [], "open_runs(limit=0)")
        _eq(store.holders(["waits", "done", "no-such-run"]), {}, "holders() of runs nobody took")
        store.release("runs", epoch)
        _eq(store.holders(["runs"]), {}, "holders() of a released run")
        _unchanged(store, before, "open_runs() and holders()")


# -- registry ------------------------------------------------------------------------------------------------------

CASES: tuple[Case, ...] = (
    Case("append_load_round_trip", check_append_load_round_trip),
    Case("duplicate_append_is_noop", check_duplicate_append_is_noop),
    Case("conflict_writes_nothing", check_conflict_writes_nothing),
    Case("batch_atomic_and_ordered", check_batch_atomic_and_ordered),
    Case("batch_of_two_runs_refused", check_batch_of_two_runs_refused),
    Case("checkpoint_equals_rebuild", check_checkpoint_equals_rebuild),
    Case("status_transitions", check_status_transitions),
    Case("unknown_run", check_unknown_run),
    Case("fencing", check_fencing),
    Case("list_runs", check_list_runs),
    Case("hostile_ids_round_trip", check_hostile_ids_round_trip),
    Case("runs_are_isolated", check_runs_are_isolated),
    Case("invalid_ids_refused", check_invalid_ids_refused),
    Case("invalid_names_refused", check_invalid_names_refused),
    Case("reads_with_invalid_ids", check_reads_with_invalid_ids),
    Case("unserializable_payload_refused", check_unserializable_payload_refused),
    Case("unreadable_rows_refused", check_unreadable_rows_refused),
    Case("concurrent_appends", check_concurrent_appends),
    Case("compare_and_set", check_compare_and_set),
    Case("decisions_checked_at_commit", check_decisions_checked_at_commit),
    Case("rebuild_checkpoint", check_rebuild_checkpoint),
    Case("two_handles_same_key", check_two_handles_same_key),
    Case("two_handles_fencing", check_two_handles_fencing),
    Case("two_handles_see_each_other", check_two_handles_see_each_other),
    Case("open_runs_and_holders", check_open_runs_and_holders),
)
"""Every case, in a stable order. Names are test ids: renaming one is a visible change."""


def conformance_cases() -> Iterator[Case]:
    """Yield every case as ``(name, check)``; ``check(factory)`` raises on a contract violation."""
    yield from CASES


def run_conformance(factory: Factory, *, skip: Sequence[str] = ()) -> list[str]:
    """Run every case (except ``skip``, and those needing a capability the factory's stores do not
    declare) against ``factory``; return ``"name: error"`` per failed case."""
    unknown = set(skip) - {c.name for c in CASES}
    if unknown:
        raise UsageError(f"unknown conformance cases to skip: {sorted(unknown)}")
    failures: list[str] = []
    declared = capabilities(factory)
    for case in CASES:
        if case.name in skip or not case.needs <= declared:
            continue
        try:
            case.check(factory)
        except Exception as exc:
            failures.append(f"{case.name}: {type(exc).__name__}: {exc}")
    return failures
