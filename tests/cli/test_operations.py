"""``cuaderno.operations`` called directly: the one implementation the command line and the page
share (their own tests drive it through ``cuaderno`` and the page)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import suspended_run, uncertain_run

from cuaderno import forks, harness, operations
from cuaderno.errors import RunNotFound, UsageError
from cuaderno.journal.sqlite import SqliteCheckpointer


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteCheckpointer]:
    with SqliteCheckpointer(tmp_path / "runs.db") as s:
        yield s


def test_cancel_run_says_whether_it_decided_anything(store: SqliteCheckpointer) -> None:
    run = suspended_run(store)  # waits for an approval: no loop can be running it, so it closes at once
    cp, already = operations.cancel_run(store, run, "changed my mind", by="ana")
    assert cp.status == "cancelled" and not already
    size = len(store.load(run))
    cp, already = operations.cancel_run(store, run, "again", by="ana")
    assert cp.status == "cancelled" and already
    assert len(store.load(run)) == size  # idempotent: nothing written the second time
    with pytest.raises(RunNotFound):
        operations.cancel_run(store, "no-such-run")


def test_list_runs_gives_each_run_its_state(store: SqliteCheckpointer) -> None:
    paid, stuck = suspended_run(store), uncertain_run(store)
    rows = operations.list_runs(store)
    assert {cp.run_id for cp, _ in rows} == {paid, stuck}
    for cp, state in rows:  # one holders query for the page, the same answer as one run's
        assert state == operations.run_state(store, cp)
        assert state["state"] == "waiting" and state["held_by"] is None
        assert state["waiting_for"].startswith("approval of" if cp.run_id == paid else "a person to settle")
    assert [cp.run_id for cp, _ in operations.list_runs(store, status="needs_human")] == [stuck]
    with pytest.raises(UsageError, match="not a run status"):
        operations.list_runs(store, status="runing")


@pytest.mark.parametrize(("text", "reason"), [
    ("{nope", "is not JSON"),
    ("[" * 50_000 + "]" * 50_000, "nested too deeply"),
    ("9" * 5000, "integer too long"),
])
def test_read_receipt_refuses_what_it_cannot_read_in_the_callers_words(text: str, reason: str) -> None:
    with pytest.raises(UsageError, match=reason) as caught:
        operations.read_receipt(text, what="--result")
    assert str(caught.value).startswith("--result ") and "nothing was written" in str(caught.value)


def test_read_receipt_reads_json() -> None:
    assert operations.read_receipt('{"receipt": "r-17", "n": [1, 2]}', what="x") == {"receipt": "r-17", "n": [1, 2]}


def test_the_old_names_are_the_same_functions() -> None:
    for name in harness.__all__:
        assert getattr(harness, name) is getattr(operations, name), name
    assert forks.fork is operations.fork and forks.export_lines is operations.export_lines
