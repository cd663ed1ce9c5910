"""R21: a journal rolled back is refused at open, never resumed from an earlier step.

Restoring an older copy of the journal, or deleting or truncating its hot ``-wal``, leaves a file
whose hash chains all check out: it is simply an earlier state. Resumed, it repeated every effect
done after that state (issue 19, item 5). Ground truth is the ledger's receipts (a non-deduplicating
ledger: a transfer sent again is applied again). Runs are killed with a real SIGKILL at a named
crash point, so the ``-wal`` is hot.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import workload
from _sweep import forked

from cuaderno import SqliteCheckpointer
from cuaderno.journal import JournalRolledBack
from cuaderno.testing.ledger import LedgerProcess, read_receipts

pytestmark = pytest.mark.xdist_group("crash")

RUN = "r21"
TURNS = 3
SIDE = ("", "-wal", "-shm")


@pytest.fixture
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerProcess]:
    """One ledger per test: the effect keys of one run id are the same in every test."""
    with LedgerProcess(tmp_path_factory.mktemp("ledger-r21") / "nodedup.db", mode="nodedup") as lp:
        yield lp


def _argv(work: Path, url: str) -> list[str]:
    return ["--db", str(work / "runs.db"), "--run", RUN, "--kind", "tool_nodedup", "--turns", str(TURNS),
            "--work", str(work), "--ledger", url]


def _run(work: Path, url: str, crash_at: str | None) -> int:
    """The workload in a forked child; its exit code (-9: killed at ``crash_at``)."""
    result = work / "result.json"
    result.unlink(missing_ok=True)
    rc, _ = forked(workload.run_forked, (_argv(work, url), crash_at, str(result)), f"r21 {crash_at}")
    return rc


def _receipts(ledger: LedgerProcess) -> Counter[str]:
    return Counter(r["key"] for r in read_receipts(ledger.db_path, business_id=RUN))


def _files(db: Path) -> dict[str, str]:
    return {s: hashlib.sha256(Path(f"{db}{s}").read_bytes()).hexdigest()
            for s in SIDE if Path(f"{db}{s}").exists()}


def _resume_refused(work: Path, ledger: LedgerProcess) -> None:
    """A resume (in this process, so the refusal is seen as raised) is refused before anything is
    sent, and the files are left as they were."""
    before, receipts = _files(work / "runs.db"), _receipts(ledger)
    args = workload.parser().parse_args(_argv(work, ledger.url))
    with pytest.raises(JournalRolledBack, match="older than the last one this machine saw.*accept_rollback=True"):
        asyncio.run(workload.run(args))
    assert _files(work / "runs.db") == before
    assert _receipts(ledger) == receipts


def _killed_after_transfers(work: Path, ledger: LedgerProcess, n: int) -> None:
    """Run until the ``n``-th transfer's result is committed, then SIGKILL: a hot -wal."""
    assert _run(work, ledger.url, f"tool.K7:{n}") == -9
    assert sum(_receipts(ledger).values()) == n
    assert Path(f"{work / 'runs.db'}-wal").stat().st_size > 0


def test_an_older_copy_restored_is_refused_and_no_effect_repeats(tmp_path: Path, ledger: LedgerProcess) -> None:
    db = tmp_path / "runs.db"
    _killed_after_transfers(tmp_path, ledger, 1)
    aside = {s: Path(f"{db}{s}").read_bytes() for s in SIDE if Path(f"{db}{s}").exists()}  # a copy of the files
    assert _run(tmp_path, ledger.url, None) == 0  # the run goes on and completes: transfers 2 and 3
    done = _receipts(ledger)
    assert sorted(done.values()) == [1] * TURNS
    for s in SIDE:  # restore the older copy over the live journal
        Path(f"{db}{s}").unlink(missing_ok=True)
        if s in aside:
            Path(f"{db}{s}").write_bytes(aside[s])
    _resume_refused(tmp_path, ledger)
    assert _run(tmp_path, ledger.url, None) != 0  # a whole child process too: refused, not resumed
    assert _receipts(ledger) == done  # no transfer sent twice
    # Accepted deliberately, the run goes on from the copy's step (and repeats what came after it).
    with SqliteCheckpointer(db, accept_rollback=True) as store:
        cp = store.checkpoint(RUN)
        assert cp is not None and cp.count("tool_calls") == 1


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_a_hot_wal_deleted_or_truncated_is_refused(tmp_path: Path, ledger: LedgerProcess, damage: str) -> None:
    db = tmp_path / "runs.db"
    _killed_after_transfers(tmp_path, ledger, 2)
    wal = Path(f"{db}-wal")
    if damage == "deleted":
        wal.unlink()
        Path(f"{db}-shm").unlink()
    else:  # one frame less: the last transaction (the second transfer's result) loses its commit frame
        size = wal.stat().st_size
        with wal.open("r+b") as f:
            f.truncate(size - 4096 - 24)
    _resume_refused(tmp_path, ledger)
    assert sorted(_receipts(ledger).values()) == [1, 1]


def test_a_journal_created_anew_at_the_same_path_is_not_a_rollback(tmp_path: Path) -> None:
    """Deleting the journal (all of it) and starting again is a choice, not a rollback."""
    from cuaderno.events import StepEvent

    db = tmp_path / "runs.db"
    ev = StepEvent(run_id="r", step_id="run", phase="start", kind="run", fingerprint="f", payload={})
    with SqliteCheckpointer(db) as store:
        store.append([ev])
        store.append([StepEvent(run_id="q", step_id="run", phase="start", kind="run", fingerprint="f", payload={})])
    for s in SIDE:
        Path(f"{db}{s}").unlink(missing_ok=True)
    with SqliteCheckpointer(db) as store:
        store.append([ev])
    with SqliteCheckpointer(db) as store:
        assert len(store.load("r")) == 1


def test_a_journal_copied_from_another_path_is_not_this_one(tmp_path: Path) -> None:
    """Another journal put at this path (its row where ours was has another hash) is refused too."""
    from cuaderno.events import StepEvent

    mine, other = tmp_path / "runs.db", tmp_path / "other.db"
    for path, task in ((mine, "mine"), (other, "other")):
        with SqliteCheckpointer(path) as store:
            store.append([StepEvent(run_id="r", step_id="run", phase="start", kind="run", fingerprint="f",
                                    payload={"task": task})])
    shutil.copy(other, mine)
    with pytest.raises(JournalRolledBack, match="not the one this machine last wrote at this path"):
        SqliteCheckpointer(mine)
    with pytest.raises(JournalRolledBack):
        SqliteCheckpointer(mine, readonly=True)
    with SqliteCheckpointer(mine, readonly=True, accept_rollback=True) as store:
        assert store.load("r")[0].payload["task"] == "other"
    with SqliteCheckpointer(mine, accept_rollback=True):
        pass  # a writable store records the journal as it is as the new mark
    with SqliteCheckpointer(mine) as store:
        assert store.load("r")[0].payload["task"] == "other"
