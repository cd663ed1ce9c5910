"""A process SIGKILLed inside or right after the append that offloads a payload leaves the row and
its blob both, or neither; one killed before a prune or an erase commits loses no blob, and a
second one removes exactly the blobs no kept run uses (both backends)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prune_journals import _connect, _param

from cuaderno import open_journal

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _count(url: str, sql: str) -> int:
    db = _connect(url)
    try:
        return int(db.execute(_param(url, sql)).fetchone()[0])
    finally:
        db.close()


def _blob_counts(url: str) -> list[int]:
    """Chunks stored, and references held."""
    return [_count(url, "SELECT count(*) FROM cuaderno_blobs"), _count(url, "SELECT count(*) FROM cuaderno_blob_refs")]


@pytest.mark.parametrize(("point", "landed"), [("append.W1:2", False), ("append.W2:2", True)])
def test_killed_around_an_offloaded_append_row_and_blob_land_together(journal_url: str, point: str,
                                                                       landed: bool) -> None:
    code = textwrap.dedent(f"""
        from cuaderno import open_journal
        from cuaderno.events import StepEvent
        store = open_journal({journal_url!r})
        store.offload_above = 10_000
        store.append([StepEvent(run_id="k", step_id="run", phase="start", kind="run", payload={{"task": "t"}})])
        store.append([StepEvent(run_id="k", step_id="t0000.tool00", phase="result", kind="tool", name="f",
                                payload={{"data": "q" * 3_000_000}})])
        print("not killed")
    """)
    env = {**os.environ, "CUADERNO_CRASH_AT": point, "PYTHONPATH": SRC}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    rows = _count(journal_url, "SELECT count(*) FROM cuaderno_events WHERE codec='json+blob'")
    chunks = _count(journal_url, "SELECT count(*) FROM cuaderno_blobs")
    refs = _count(journal_url, "SELECT count(*) FROM cuaderno_blob_refs")
    assert (rows, chunks, refs) == ((1, 3, 1) if landed else (0, 0, 0))
    store = open_journal(journal_url)
    try:  # the journal verifies (and on SQLite, its anchor agrees) either way
        events = store.load("k")
        assert len(events) == (2 if landed else 1)
        if landed:
            assert events[1].payload == {"data": "q" * 3_000_000}
    finally:
        store.close()


@pytest.mark.parametrize("erase", [False, True])
def test_killed_before_a_prune_or_erase_commits_no_blob_is_lost_then_it_finishes(journal_url: str,
                                                                                 erase: bool) -> None:
    from prune_journals import age, end, start

    from cuaderno import operations
    from cuaderno.events import StepEvent

    def tool(run_id: str, data: str) -> StepEvent:
        return StepEvent(run_id=run_id, step_id="t0000.tool00", phase="result", kind="tool", name="f",
                         payload={"data": data})

    shared, own = "s" * 2_000_000, "o" * 50_000
    store = open_journal(journal_url)
    store.offload_above = 10_000  # type: ignore[attr-defined]
    try:
        for run_id, data in (("old", shared), ("old2", own), ("new", shared)):
            store.append([start(run_id), tool(run_id, data), end(run_id)])
        store.append([start("later")])  # SQLite keeps the run of the journal's last row
    finally:
        store.close()
    age(journal_url, 10 * 86_400, ["old", "old2"])
    before = _blob_counts(journal_url)
    assert before == [3, 3]  # shared: 2 chunks, own: 1; three runs refer
    act = ('operations.erase(store, "old"); operations.erase(store, "old2")' if erase
           else 'operations.prune(store, "1d", vacuum=False)')
    code = textwrap.dedent(f"""
        from cuaderno import open_journal, operations
        store = open_journal({journal_url!r})
        {act}
        print("not killed")
    """)
    env = {**os.environ, "CUADERNO_CRASH_AT": "erase.E2:1" if erase else "prune.P1:1", "PYTHONPATH": SRC}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    assert _blob_counts(journal_url) == before  # rolled back whole: every blob and reference still there
    store = open_journal(journal_url)
    try:
        for run_id, data in (("old", shared), ("old2", own), ("new", shared)):
            assert store.load(run_id)[1].payload == {"data": data}
        if erase:
            operations.erase(store, "old")
            operations.erase(store, "old2")
        else:
            assert sorted(operations.prune(store, "1d", vacuum=False).runs) == ["old", "old2"]
        assert store.load("new")[1].payload == {"data": shared}
    finally:
        store.close()
    # Only the shared blob is left (2 chunks), and only "new" refers to it.
    assert _blob_counts(journal_url) == [2, 1]
