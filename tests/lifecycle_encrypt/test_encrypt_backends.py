"""Encryption at rest on both backends (SQLite, PostgreSQL): the summary's content fields are
sealed while the queries a worker polls with still find the runs it must move on; a store
without the key is refused with nothing written; rekey re-wraps every data key."""

from __future__ import annotations

import time
from typing import Any

import pytest
from _encrypt_world import keys_of, new_key, raw_tables
from _erase_world import run_with_secret, secret

from cuaderno import Agent, Policy, ScriptedGateway, Session, tool
from cuaderno.errors import KeyInvalid, KeyMissing
from cuaderno.events import StepEvent
from cuaderno.journal import open_journal
from cuaderno.operations import erase, rekey


async def _waiting_for_approval(store: Any, run_id: str, token: str) -> None:
    @tool
    def transfer(to: str, amount: int) -> str:
        """Move money."""
        return "sent"

    agent = Agent(instructions="i", tools=[transfer], policy=Policy({"transfer": "require_approval"}))
    gw = ScriptedGateway([ScriptedGateway.call("transfer", to=token, amount=1), ScriptedGateway.text("done")])
    async for _ in agent.run(f"pay {token}", session=Session(run_id, gw, store)):
        pass


async def test_sealed_summaries_still_show_the_runs_a_worker_must_move_on(journal_url: str) -> None:
    token = secret()
    keys = keys_of(new_key())
    with open_journal(journal_url, keys=keys) as store:
        await _waiting_for_approval(store, "waits", token)
        await _waiting_for_approval(store, "cancelled", token)
        cp = store.checkpoint("waits")
        assert cp is not None and cp.status == "suspended"
        assert [p["arguments"]["to"] for p in cp.pending.values()] == [token]  # opened with the key
        assert [c.run_id for c in store.open_runs()] == []  # waiting for a person: nothing to do
        # A cancellation requested while the run waits (as a process holding it records it): a
        # worker must move it on, and finds it by the marker its sealed summary keeps.
        store.append([StepEvent(run_id="cancelled", step_id="cancel", phase="request", kind="cancel",
                                payload={"reason": f"asked by {token}"})])
        moved_on = store.open_runs()
        assert [c.run_id for c in moved_on] == ["cancelled"]
        assert moved_on[0].cancel_requested is not None and token in moved_on[0].cancel_requested["reason"]
    raw = repr(raw_tables(journal_url))
    assert token not in raw and "sealed" in raw


async def test_a_store_without_the_key_is_refused_and_nothing_is_written(journal_url: str) -> None:
    keys = keys_of(new_key())
    with open_journal(journal_url, keys=keys) as store:
        await run_with_secret(store, "r", secret())
    before = raw_tables(journal_url)
    assert before["cuaderno_meta"] and before["cuaderno_keys"]
    for opening in (lambda: open_journal(journal_url, keys=None), lambda: open_journal(journal_url, readonly=True),
                    lambda: open_journal(journal_url, keys=keys_of(new_key()))):
        with pytest.raises((KeyMissing, KeyInvalid), match="nothing was read or written"):
            opening()
        assert raw_tables(journal_url) == before


async def test_rekey_rewraps_every_data_key_and_the_old_key_can_go(journal_url: str) -> None:
    old, new = new_key(), new_key()
    tokens = {f"r{i}": secret() for i in range(4)}
    with open_journal(journal_url, keys=keys_of(old)) as store:
        for run_id, token in tokens.items():
            await run_with_secret(store, run_id, token)
    with open_journal(journal_url, keys=keys_of(new, old)) as store:
        done = rekey(store, batch=3)
        assert (done.key_id, done.runs, done.batches) == (new.key_id, 4, 2)
    assert {row[1] for row in raw_tables(journal_url)["cuaderno_keys"]} == {new.key_id}
    with open_journal(journal_url, keys=keys_of(new)) as store:
        for run_id, token in tokens.items():
            assert f"find {token}" in str(store.load(run_id)[0].payload)


async def test_erasing_an_encrypted_run_destroys_its_data_key(journal_url: str) -> None:
    keys = keys_of(new_key())
    with open_journal(journal_url, keys=keys) as store:
        await run_with_secret(store, "gone", secret())
        await run_with_secret(store, "kept", secret())
        before = store.load("gone")
        assert {row[0] for row in raw_tables(journal_url)["cuaderno_keys"]} == {"gone", "kept"}
        erase(store, "gone", reason="ticket 8")
    assert {row[0] for row in raw_tables(journal_url)["cuaderno_keys"]} == {"kept"}
    with open_journal(journal_url, keys=keys) as store:  # nothing cached: the chain still verifies
        after = store.load("gone")
        assert [e.row_hash for e in after] == [e.row_hash for e in before] and all(e.erased for e in after)
        assert not store.load("kept")[-1].erased


async def test_a_run_pruned_and_started_again_elsewhere_is_read_and_written_with_its_new_key(
        journal_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store caches each run's data key; another store prunes the run and a new run of the
    same id gets a new key: the first store reads the new run and appends to it with that key."""
    from cuaderno.journal import retention
    from cuaderno.operations import prune

    monkeypatch.setattr(retention, "SETTLE_S", 0.0)  # prune what was just written (no 10 s wait)

    keys = keys_of(new_key())
    first = open_journal(journal_url, keys=keys)
    try:
        first.append([StepEvent(run_id="r", step_id="run", phase="start", kind="run", payload={"task": "one"})])
        first.append([StepEvent(run_id="r", step_id="run", phase="end", kind="run",
                                payload={"status": "completed", "output": "1"})])
        # Another run after it: SQLite's prune keeps the run holding the journal's last row.
        first.append([StepEvent(run_id="later", step_id="run", phase="start", kind="run", payload={})])
        assert first.load("r")[0].payload == {"task": "one"}  # its key is cached now
        with open_journal(journal_url, keys=keys) as other:
            assert prune(other, "0s", now=time.time() + 60).runs == ["r"]
            other.append([StepEvent(run_id="r", step_id="run", phase="start", kind="run", payload={"task": "two"})])
        assert first.load("r")[0].payload == {"task": "two"}
        first.append([StepEvent(run_id="r", step_id="note", phase="result", kind="tool", payload={"n": 2})])
        with open_journal(journal_url, keys=keys) as third:  # nothing cached: what the first wrote opens
            assert [e.payload for e in third.load("r")] == [{"task": "two"}, {"n": 2}]
    finally:
        first.close()
