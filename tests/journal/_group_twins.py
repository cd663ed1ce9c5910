"""What the group-append tests of both SQL backends share (``test_group_append_sqlite.py``,
``test_group_append_postgres.py``): their events, the shape of a group's outcomes, the same
appends made one by one, and the scenarios both run against two journals of their backend (one
written by groups, the other by the same appends alone), compared column for column."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from cuaderno.errors import FencedOut, RunChanged
from cuaderno.events import StepEvent
from cuaderno.journal import _append
from cuaderno.journal._group import GroupBatch

NOW = 1_700_000_000.25
"""The time every append stamps under the ``frozen`` fixture."""


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every append stamps the same time, so that two journals can be compared column for column."""
    monkeypatch.setattr(_append, "time", SimpleNamespace(time=lambda: NOW))


@contextmanager
def all_closed(stores: list[Any]) -> Iterator[list[Any]]:
    """The two stores of a test, closed after it."""
    try:
        yield stores
    finally:
        for s in stores:
            s.close()


def headless(summary: str) -> dict[str, Any]:
    """A stored summary without its chain head's hash (random: each row's digest key is)."""
    data = json.loads(summary)
    data.pop("last_hash")
    return dict(data)


def start(run: str) -> StepEvent:
    return StepEvent(run_id=run, step_id="run", phase="start", kind="run", payload={"task": "t"})


def ev(run: str, step: str, phase: str = "intent", **payload: Any) -> StepEvent:
    return StepEvent(run_id=run, step_id=step, phase=phase, kind="tool", name="lookup",
                     payload={"text": "x" * 300, **payload})  # compressed (256 bytes and more)


def shape(outs: list[Any]) -> list[Any]:
    return [type(o).__name__ if isinstance(o, Exception) else [(e.run_id, e.step_id, e.phase, e.seq)
                                                              for e in o] for o in outs]


def alone(store: Any, batches: list[GroupBatch]) -> list[Any]:
    outs: list[Any] = []
    for b in batches:
        try:
            outs.append(store.append(b.events, epoch=b.epoch, expect_seq=b.expect_seq))
        except Exception as exc:
            outs.append(exc)
    return outs


def rounds(stores: list[Any]) -> list[list[GroupBatch]]:
    """Runs ``a``, ``b`` and ``e`` started in both stores and ``b`` taken over (the same epoch in
    both); then two groups over them and ``c``, ``d``, which have no row yet: two batches of one
    run, a holder's epoch, a compare-and-set, a key twice in a batch; then a group of every run."""
    epochs = []
    for s in stores:
        for r in ("a", "b", "e"):
            s.append([start(r)])
        epochs.append(s.acquire("b", "me"))
    assert epochs[0] == epochs[1]
    epoch = epochs[0]
    return [
        [GroupBatch([ev("b", "s0")], epoch=epoch), GroupBatch([ev("a", "s0"), ev("a", "s0", "result")]),
         GroupBatch([start("d")]), GroupBatch([ev("a", "s1")], expect_seq=3),
         GroupBatch([start("c"), ev("c", "s0")]), GroupBatch([ev("d", "s0")], points=("tool.K1",)),
         GroupBatch([ev("e", "s0")]), GroupBatch([ev("a", "s2"), ev("a", "s2")])],  # a key twice in a batch
        [GroupBatch([ev(r, "s9")]) for r in ("e", "d", "c", "b", "a")],
    ]


def a_refused_batch_is_refused_alone(grouped: Any, by_one: Any, tables: Callable[[Any], Any]) -> None:
    """A stale holder's batch and a compare-and-set that its own group outdated are refused, each
    alone, and the group's other batches written, as the same appends one by one; the rolled-back
    group's summaries (it had folded events into them) are not used after."""
    for s in (grouped, by_one):
        for r in ("a", "b"):
            s.append([start(r)])
    epoch = grouped.acquire("b", "me")
    assert by_one.acquire("b", "me") == epoch
    batches = [GroupBatch([ev("a", "s0")]), GroupBatch([ev("b", "s0")], epoch=epoch - 1),  # a stale holder
               GroupBatch([start("c")]), GroupBatch([ev("b", "s1")], epoch=epoch),
               GroupBatch([ev("a", "s1")], expect_seq=1)]  # "a" has moved on (s0, in this group)
    outs = grouped.append_group(batches)
    assert isinstance(outs[1], FencedOut) and isinstance(outs[4], RunChanged)
    assert shape(outs) == shape(alone(by_one, batches))
    assert tables(grouped) == tables(by_one)
    assert [e.step_id for e in grouped.load("b")] == ["run", "s1"]
    batches = [GroupBatch([ev(r, "s2")]) for r in "abc"]
    assert shape(grouped.append_group(batches)) == shape(alone(by_one, batches))
    assert tables(grouped) == tables(by_one)


def a_group_seals_and_offloads(grouped: Any, reopen: Callable[[], Any]) -> None:
    """A group of an encrypting store whose payloads over its threshold go to blobs (one content
    in two runs, each run's blob its own): written in one transaction (the store's batch-by-batch
    fallback fails the test), and read back as written by another store of the same journal."""
    def never(batches: Any) -> Any:
        raise AssertionError(f"the group was appended batch by batch: {shape(alone(grouped, list(batches)))}")

    grouped.offload_above = 2048
    for r in ("a", "b"):
        grouped.append([start(r)])
    big = " ".join(f"word{i}" for i in range(800))  # about 6 KB of JSON: over the threshold
    batches = [GroupBatch([ev("b", "s0", big=big)]), GroupBatch([ev("a", "s0")]),
               GroupBatch([start("c"), ev("c", "s0", big=big)]), GroupBatch([ev("a", "s1", big=big[:3000])])]
    grouped._one_by_one = never
    try:
        outs = grouped.append_group(batches)
    finally:
        del grouped._one_by_one
    assert shape(outs) == [[("b", "s0", "intent", 2)], [("a", "s0", "intent", 2)],
                           [("c", "run", "start", 1), ("c", "s0", "intent", 2)], [("a", "s1", "intent", 3)]]
    with reopen() as other:
        got = {r: [(e.step_id, e.payload.get("big")) for e in other.load(r)] for r in "abc"}
    assert got == {"a": [("run", None), ("s0", None), ("s1", big[:3000])], "b": [("run", None), ("s0", big)],
                   "c": [("run", None), ("s0", big)]}
