"""open_run: what every loop does before it goes on with a run, as a caller that is not the
runner sees it. Every refusal writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuaderno import SqliteCheckpointer
from cuaderno.durable import open_run
from cuaderno.errors import DrainOnOldWorker, ReplayDivergence, VersionMismatch

RUN = "r1"


def _open(store: SqliteCheckpointer, **over: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = {"task": "pay", "task_fingerprint": "fp-pay", "versions": {"agent": "v1"},
                               "tenant": "acme", "owner": "me"}
    args.update(over)
    return open_run(store, RUN, **args)  # type: ignore[arg-type]


def test_a_new_run_is_started_held_and_finished(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        opened = _open(store, start={"framework": "x"})
        assert not opened.closed and opened.epoch is not None
        start = store.load(RUN)[0]
        assert start.payload == {"task": "pay", "versions": {"agent": "v1"}, "tenant": "acme", "framework": "x"}
        opened.finish("done", structured={"ok": True})
        opened.release()
        again = _open(store)
        assert again.closed and again.epoch is None
        assert again.checkpoint.status == "completed" and again.checkpoint.outcome is not None
        assert again.checkpoint.outcome["structured"] == {"ok": True}


@pytest.mark.parametrize(("over", "error"), [
    ({"versions": {"agent": "v2"}}, VersionMismatch),
    ({"versions": {"agent": "v2"}, "on_version_mismatch": "drain"}, DrainOnOldWorker),
    ({"task_fingerprint": "fp-other"}, ReplayDivergence),
    ({"tenant": "globex"}, ReplayDivergence),
])
def test_a_reopening_that_does_not_match_is_refused_before_anything_is_written(
        tmp_path: Path, over: dict[str, object], error: type[Exception]) -> None:
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        _open(store).release()
        before = [e.row_hash for e in store.load(RUN)]
        with pytest.raises(error):
            _open(store, **over)
        assert [e.row_hash for e in store.load(RUN)] == before


def test_a_failed_run_is_closed_and_answers_from_its_journal(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        held = _open(store)
        held.fail("budget", budget="turns")
        held.release()
        n = len(store.load(RUN))
        again = _open(store)
        assert again.closed and again.checkpoint.status == "failed"
        assert again.checkpoint.outcome is not None and again.checkpoint.outcome["budget"] == "turns"
        assert len(store.load(RUN)) == n
