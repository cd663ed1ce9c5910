"""A claim's takeover asks for its runs' locks and writes their rows in batches (PostgreSQL: one
statement for every advisory lock, one UPDATE per holder record; SQLite: the hold file's path
resolved once, the rows written in one loop). What each run gets is unchanged: its own next
epoch, the claimer's holder record, its lock; a run held elsewhere is lost, a closed one stale;
a takeover that fails gives back every lock it took and writes nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cuaderno import Agent, open_journal
from cuaderno.flow import submit
from cuaderno.journal import _takeover
from cuaderno.journal._takeover import take_over

agent = Agent(instructions="claim me", tools=[], name="claim-batch")


def _stored(store: Any, run_id: str) -> tuple[int, dict[str, Any]]:
    if type(store).__name__ == "PostgresCheckpointer":
        with store._conn() as conn:
            epoch, owner = conn.execute("SELECT epoch, owner FROM cuaderno_runs WHERE run_id = %s", (run_id,)).fetchone()
    else:
        with store._lock:
            epoch, owner = store._db.execute("SELECT epoch, owner FROM cuaderno_runs WHERE run_id = ?",
                                             (run_id,)).fetchone()
    return int(epoch), json.loads(owner) if owner else {}


def test_each_run_of_a_batch_gets_its_own_next_epoch_and_the_claimers_record(store: Any) -> None:
    runs = [submit(store, agent, f"task {i}").run_id for i in range(4)]
    for _ in range(2):  # runs[1] was taken twice before: its epoch is ahead of the others'
        store.release(runs[1], store.acquire(runs[1], "before"))
    before = {r: _stored(store, r)[0] for r in runs}
    took = take_over(store, runs, "claimer")
    assert [r for r, _ in took.taken] == runs and not took.lost and not took.stale
    for run_id, epoch in took.taken:
        stored_epoch, owner = _stored(store, run_id)
        assert stored_epoch == epoch and epoch > before[run_id]
        assert owner["owner"] == "claimer" and owner["held"] is True
    assert len({epoch for _, epoch in took.taken}) >= 2  # not one epoch written for all
    for run_id, epoch in took.taken:
        store.release(run_id, epoch)


def test_a_run_this_store_holds_already_is_taken_again_in_the_batch(store: Any) -> None:
    runs = [submit(store, agent, f"task {i}").run_id for i in range(3)]
    first = store.acquire(runs[0], "mine")
    took = take_over(store, runs, "claimer")
    assert [r for r, _ in took.taken] == runs
    assert dict(took.taken)[runs[0]] > first
    for run_id, epoch in took.taken:
        store.release(run_id, epoch)


@pytest.mark.postgres
def test_a_run_another_session_holds_is_lost_and_the_others_are_taken(fq_journal: str) -> None:
    if not fq_journal.startswith("postgresql"):
        pytest.skip("two stores of one process hold apart only on PostgreSQL (record locks are the process's)")
    store, other = open_journal(fq_journal), open_journal(fq_journal)
    try:
        runs = [submit(store, agent, f"task {i}").run_id for i in range(3)]
        held = other.acquire(runs[1], "elsewhere")
        took = take_over(store, runs, "claimer")
        assert [r for r, _ in took.taken] == [runs[0], runs[2]] and took.lost == [runs[1]]
        assert store._locked == {runs[0], runs[2]}
        assert _stored(store, runs[1])[1]["owner"] == "elsewhere"
        other.release(runs[1], held)
        for run_id, epoch in took.taken:
            store.release(run_id, epoch)
    finally:
        other.close()
        store.close()


@pytest.mark.parametrize("where", ["before COMMIT", "at the second run"])
def test_a_takeover_that_fails_gives_back_every_lock_and_writes_nothing(store: Any, where: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    runs = [submit(store, agent, f"task {i}").run_id for i in range(3)]
    before = {r: _stored(store, r) for r in runs}

    def refuse(name: str) -> None:
        if name == "queue.C0":
            raise RuntimeError("refused before COMMIT")

    next_epoch = _takeover.next_epoch

    def refuse_second(run_id: str, stored: Any) -> int:
        if run_id == runs[1]:  # PostgreSQL: every run's lock was taken before the loop reached it
            raise RuntimeError("refused at the second run")
        return next_epoch(run_id, stored)

    if where == "before COMMIT":
        monkeypatch.setattr(_takeover.faults, "point", refuse)
    else:
        monkeypatch.setattr(_takeover, "next_epoch", refuse_second)
    with pytest.raises(RuntimeError):
        take_over(store, runs, "claimer")
    monkeypatch.undo()
    assert {r: _stored(store, r) for r in runs} == before
    assert store.holders(runs) == {}
    if type(store).__name__ == "PostgresCheckpointer":
        assert not store._locked
    took = take_over(store, runs, "claimer")  # nothing left held: all of them taken now
    assert [r for r, _ in took.taken] == runs
    for run_id, epoch in took.taken:
        store.release(run_id, epoch)
