"""Each conformance case can fail: a deliberately broken backend (a mutant) for every case.

A mutant is a :class:`MemoryCheckpointer` with one plausible bug. The case it is listed under must
reject it; a case that passes against its mutant checks nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

import pytest

from cuaderno.checkpoint import Checkpoint, rebuild
from cuaderno.errors import CuadernoError, UsageError
from cuaderno.events import StepEvent
from cuaderno.journal import MemoryCheckpointer
from cuaderno.journal.base import Checkpointer
from cuaderno.testing.conformance import CASES, Case, Factory, TwoHandles


def _rebuilt(ev: StepEvent, **changes: Any) -> StepEvent:
    fields: dict[str, Any] = {"run_id": ev.run_id, "step_id": ev.step_id, "phase": ev.phase, "kind": ev.kind,
                              "name": ev.name, "decision": ev.decision, "fingerprint": ev.fingerprint,
                              "codec": ev.codec, "payload": None, "raw": ev.encoded_payload(), "seq": ev.seq,
                              "created_at": ev.created_at, "row_hash": ev.row_hash}
    fields.update(changes)
    return StepEvent(**fields)


class AsciiPayloads(MemoryCheckpointer):
    """Re-encodes payloads with \\u escapes on read: equal values, different bytes."""

    def load(self, run_id: str) -> list[StepEvent]:
        return [_rebuilt(e, raw=json.dumps(e.payload, sort_keys=True, separators=(",", ":")).encode())
                for e in super().load(run_id)]


class ReturnsInput(MemoryCheckpointer):
    """Returns the caller's events instead of the stored ones."""

    def append(self, events: Sequence[StepEvent], *, epoch: int | None = None,
               expect_seq: int | None = None) -> list[StepEvent]:
        super().append(events, epoch=epoch, expect_seq=expect_seq)
        return list(events)


class OneAtATime(MemoryCheckpointer):
    """Not atomic: writes a batch event by event."""

    def append(self, events: Sequence[StepEvent], *, epoch: int | None = None,
               expect_seq: int | None = None) -> list[StepEvent]:
        out: list[StepEvent] = []
        for ev in events:
            out += super().append([ev], epoch=epoch, expect_seq=expect_seq)
        return out


class ForgetsCost(MemoryCheckpointer):
    """Stores a checkpoint that lost the cost."""

    def checkpoint(self, run_id: str) -> Checkpoint | None:
        cp = super().checkpoint(run_id)
        if cp is not None:
            cp.cost_usd = 0.0
        return cp


class NeverSuspends(MemoryCheckpointer):
    """Reports a suspended run as running."""

    def checkpoint(self, run_id: str) -> Checkpoint | None:
        cp = super().checkpoint(run_id)
        if cp is not None and cp.status == "suspended":
            cp.status = "running"
        return cp


class EmptyForUnknown(MemoryCheckpointer):
    """Loads an unknown run as an empty journal (a resume would start it again)."""

    def load(self, run_id: str) -> list[StepEvent]:
        return super().load(run_id) if self.checkpoint(run_id) else []


class IgnoresEpoch(MemoryCheckpointer):
    """Never checks the fencing epoch."""

    def append(self, events: Sequence[StepEvent], *, epoch: int | None = None,
               expect_seq: int | None = None) -> list[StepEvent]:
        return super().append(events, epoch=None, expect_seq=expect_seq)


class IgnoresExpectedSeq(MemoryCheckpointer):
    """Appends whatever the run's last event is (no compare-and-set)."""

    def append(self, events: Sequence[StepEvent], *, epoch: int | None = None,
               expect_seq: int | None = None) -> list[StepEvent]:
        return super().append(events, epoch=epoch)


class NoChecksAtCommit(MemoryCheckpointer):
    """Appends decisions without checking the run's state in the write (the caller checked before)."""

    def append(self, events: Sequence[StepEvent], *, epoch: int | None = None,
               expect_seq: int | None = None) -> list[StepEvent]:
        with mock.patch("cuaderno.journal._append._admit"):
            return super().append(events, epoch=epoch, expect_seq=expect_seq)


class OldestFirst(MemoryCheckpointer):
    """Lists runs in creation order."""

    def list_runs(self, *, status: str | None = None, limit: int = 100) -> list[Checkpoint]:
        return super().list_runs(status=status, limit=1_000_000)[::-1][:limit]


class ClaimsNewestFirst(MemoryCheckpointer):
    """A worker would serve the runs that waited least first."""

    def open_runs(self, *, limit: int = 1000) -> list[Checkpoint]:
        return super().open_runs(limit=1_000_000)[::-1][:limit]


class ClaimsEveryCancelled(MemoryCheckpointer):
    """Lists every run that did not complete: cancelled with nothing to undo, waiting for a person."""

    def open_runs(self, *, limit: int = 1000) -> list[Checkpoint]:
        runs = [c for c in self.list_runs(limit=1_000_000)[::-1] if c.status != "completed"]
        return runs[:limit]


class StripsStepIds(MemoryCheckpointer):
    """'Normalizes' step ids by stripping whitespace."""

    def append(self, events: Sequence[StepEvent], *, epoch: int | None = None,
               expect_seq: int | None = None) -> list[StepEvent]:
        return super().append([_rebuilt(e, step_id=e.step_id.strip() or e.step_id) for e in events], epoch=epoch,
                              expect_seq=expect_seq)


class CaseInsensitive(MemoryCheckpointer):
    """Folds run ids to lower case."""

    def append(self, events: Sequence[StepEvent], *, epoch: int | None = None,
               expect_seq: int | None = None) -> list[StepEvent]:
        return super().append([_rebuilt(e, run_id=e.run_id.lower()) for e in events], epoch=epoch,
                              expect_seq=expect_seq)

    def load(self, run_id: str) -> list[StepEvent]:
        return super().load(run_id.lower())


class SwallowsRefusals(MemoryCheckpointer):
    """Turns every refused append into a silent no-op."""

    def append(self, events: Sequence[StepEvent], *, epoch: int | None = None,
               expect_seq: int | None = None) -> list[StepEvent]:
        try:
            return super().append(events, epoch=epoch, expect_seq=expect_seq)
        except (UsageError, ValueError, TypeError):
            return []


class DriverErrors(MemoryCheckpointer):
    """Lets a driver's encoding error escape from reads (what sqlite3 does with a lone surrogate)."""

    def load(self, run_id: str) -> list[StepEvent]:
        run_id.encode("utf-8")
        return super().load(run_id)

    def checkpoint(self, run_id: str) -> Checkpoint | None:
        run_id.encode("utf-8")
        return super().checkpoint(run_id)


class _SlowReads(dict[str, str]):
    def get(self, key: str, default: Any = None) -> Any:
        value = super().get(key, default)
        time.sleep(0.002)  # widen the read-then-write window
        return value


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class Unlocked(MemoryCheckpointer):
    """Reads the checkpoint and writes rows without holding a lock."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = _NoLock()  # type: ignore[assignment]
        self._checkpoints = _SlowReads()



class RebuildForgetsEpoch(MemoryCheckpointer):
    """Rebuilds a summary from the events alone: the takeover's epoch is lost (and always rewritten)."""

    def rebuild_checkpoint(self, run_id: str, *, trust_journal: bool = False) -> tuple[Checkpoint, list[str]]:
        cp = rebuild(run_id, self.load(run_id))
        self._checkpoints[run_id] = cp.dumps()
        return cp, []


# -- second handles: what a backend whose handles do not share one journal gets wrong ---------------------


def _separate(store: Checkpointer) -> Checkpointer:
    """A 'second handle' that is another journal altogether (a second file, a wrong database)."""
    return MemoryCheckpointer()


class _CachedSummaries(dict[str, str]):
    """The shared summaries, through a cache of the ones this handle last read or wrote that
    nobody invalidates (what SQLite's data_version check exists to prevent)."""

    def __init__(self, shared: dict[str, str]) -> None:
        super().__init__()
        self.shared, self.cache = shared, dict[str, str]()

    def get(self, key: str, default: Any = None) -> Any:
        if key not in self.cache:
            if key not in self.shared:
                return default
            self.cache[key] = self.shared[key]
        return self.cache[key]

    def __setitem__(self, key: str, value: str) -> None:
        self.cache[key] = self.shared[key] = value

    def pop(self, key: str, default: Any = None) -> Any:
        return self.shared.pop(key, default)

    def values(self) -> Any:
        return self.shared.values()


def _stale_summaries(store: Checkpointer) -> Checkpointer:
    """A handle that shares the journal but decides from the summaries it cached: it misses the
    other handle's takeovers and appends made since it last looked."""
    assert isinstance(store, MemoryCheckpointer)
    other = MemoryCheckpointer()
    other._rows, other._lock = store._rows, store._lock
    other._checkpoints = _CachedSummaries(store._checkpoints)
    return other


def _own_rows(store: Checkpointer) -> Checkpointer:
    """A handle that shares the summaries but looks up existing rows only among its own writes
    (deduplication by a check in the handle instead of the journal's key)."""
    assert isinstance(store, MemoryCheckpointer)
    other = MemoryCheckpointer()
    other._checkpoints, other._lock = store._checkpoints, store._lock
    return other


class _Handles(TwoHandles):
    """Memory stores whose second handle is made by ``second``; named like the mutant classes (test ids)."""

    def __init__(self, name: str, second: Callable[[Checkpointer], Checkpointer]) -> None:
        super().__init__(MemoryCheckpointer, second)
        self.__name__ = name


SeparateHandles = _Handles("SeparateHandles", _separate)
StaleSummaries = _Handles("StaleSummaries", _stale_summaries)
OwnRows = _Handles("OwnRows", _own_rows)


MUTANTS: dict[str, list[Factory]] = {
    "append_load_round_trip": [AsciiPayloads, ReturnsInput],
    "duplicate_append_is_noop": [ReturnsInput],
    "conflict_writes_nothing": [OneAtATime],
    "batch_atomic_and_ordered": [OneAtATime],
    "batch_of_two_runs_refused": [OneAtATime, SwallowsRefusals],
    "checkpoint_equals_rebuild": [ForgetsCost],
    "status_transitions": [NeverSuspends],
    "unknown_run": [EmptyForUnknown],
    "fencing": [IgnoresEpoch],
    "list_runs": [OldestFirst],
    "hostile_ids_round_trip": [StripsStepIds],
    "runs_are_isolated": [CaseInsensitive],
    "invalid_ids_refused": [SwallowsRefusals],
    "invalid_names_refused": [SwallowsRefusals],
    "reads_with_invalid_ids": [DriverErrors],
    "unserializable_payload_refused": [SwallowsRefusals],
    "unreadable_rows_refused": [SwallowsRefusals],
    "concurrent_appends": [Unlocked],
    "compare_and_set": [IgnoresExpectedSeq],
    "decisions_checked_at_commit": [NoChecksAtCommit],
    "rebuild_checkpoint": [RebuildForgetsEpoch],
    "two_handles_same_key": [SeparateHandles, OwnRows],
    "two_handles_fencing": [SeparateHandles, StaleSummaries],
    "two_handles_see_each_other": [SeparateHandles, StaleSummaries],
    "open_runs_and_holders": [ClaimsNewestFirst, ClaimsEveryCancelled],
}


def test_every_case_has_a_mutant() -> None:
    assert sorted(MUTANTS) == sorted(c.name for c in CASES)


@pytest.mark.parametrize(("case", "mutant"), [(c, m) for c in CASES for m in MUTANTS[c.name]],
                         ids=lambda v: v.name if isinstance(v, Case) else v.__name__)
def test_case_rejects_mutant(case: Case, mutant: Factory) -> None:
    # The case must fail by its own verdict (ConformanceFailure) or by a journal error the bug causes,
    # not by a crash of the mutant itself.
    with pytest.raises((AssertionError, CuadernoError)):
        case.check(mutant)
