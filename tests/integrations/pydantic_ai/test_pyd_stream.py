"""Streaming under ``DurableAgent``: a run with an ``event_stream_handler`` makes streamed model
requests (the fake provider answers them as server-sent chunks). Each step is read whole and
journaled before its events reach the handler; a journaled step is replayed without a request;
a stream cut short is sent again with the same key, counted; a SIGKILL mid-stream (the answer's
headers in, its body unread) re-sends only that step. The provider's billing and the payment
service's receipts are the proof."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from _pyd_runs import Runner
from _servers import Provider, Receipts

from cuaderno import SqliteCheckpointer

TRANSFERS = [["transfer", "ana", 10], ["transfer", "bob", 20], ["transfer", "cy", 30]]
PROMPT = "PAY: " + json.dumps(TRANSFERS)
OUTPUT = {"paid": ["ana", "bob", "cy"], "total": 60}


def _sends(db: Path, run_id: str) -> dict[str, int]:
    with SqliteCheckpointer(db, readonly=True) as store:
        events = store.load(run_id)
    return {e.payload["key"]: e.payload["sends"] for e in events if e.kind == "model" and e.phase == "result"}


def _check(provider: Provider, receipts: Receipts, name: str, db: Path) -> Counter[str]:
    """Each transfer once; each model request billed at most as often as the journal counts it
    sent (a send killed before it left is counted and not billed)."""
    paid = receipts.receipts(name)
    assert [r["to"] for r in paid] == ["ana", "bob", "cy"] and len({r["key"] for r in paid}) == 3
    billed = Counter(b["key"] for b in provider.billing(name))
    sends = _sends(db, "pay")
    assert set(billed) == set(sends) and all(billed[k] <= sends[k] for k in billed), (billed, sends)
    assert all(b["key"] == b["x_key"] for b in provider.billing(name))
    return billed


def test_a_streamed_run_is_journaled_step_by_step_and_replayed_without_requests(
        tmp_path: Path, servers: tuple[Provider, Receipts], runner: Runner) -> None:
    provider, receipts = servers
    name, db = "stream-plain", tmp_path / "runs.db"
    done = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind="stream")
    assert done.status == "completed" and done.out is not None and done.out["output"] == OUTPUT, done
    assert done.out["events"] > 0  # the handler saw the streamed answers
    billed = _check(provider, receipts, name, db)
    assert sorted(billed.values()) == [1, 1, 1, 1]
    # Ended: the next call, streamed or not, answers from the journal and sends nothing.
    for kind in ("stream", "lookup"):
        again = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind=kind)
        assert again.out is not None and again.out["replayed"] and again.out["output"] == OUTPUT
    assert len(provider.billing(name)) == 4


@pytest.mark.parametrize(("point", "resume_kind", "in_flight"), [
    ("model.K3:2", "stream", False),  # the request handed to the transport: maybe sent
    ("model.K4:2", "stream", True),   # mid-stream: the answer's headers in, its chunks unread
    ("model.K5:2", "lookup", True),   # the stream read whole, its result not journaled; resumed unstreamed
    ("model.K7:3", "stream", False),  # three steps journaled: replayed without a request
    ("tool.K4:2", "stream", False),   # bob paid, the reply unread: the lookup finds it
])
def test_a_kill_mid_stream_resends_only_that_step(tmp_path: Path, servers: tuple[Provider, Receipts], runner: Runner,
                                                  point: str, resume_kind: str, in_flight: bool) -> None:
    provider, receipts = servers
    name, db = "stream-" + point.replace(":", "-").replace(".", "-"), tmp_path / "runs.db"
    killed = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind="stream",
                        crash_at=point)
    assert killed.killed
    before = Counter(b["key"] for b in provider.billing(name))
    resumed = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind=resume_kind)
    assert resumed.status == "completed" and resumed.out is not None and resumed.out["output"] == OUTPUT, resumed
    billed = _check(provider, receipts, name, db)
    # Re-billed: only the step in flight at the kill, sent again with its key and counted.
    assert sum(n - 1 for n in billed.values()) == (1 if in_flight else 0)
    if point == "model.K7:3":  # the three journaled answers were not asked for again
        assert all(billed[k] == 1 for k in before) and len(before) == 3


def test_a_stream_cut_short_is_sent_again_with_its_key_and_counted(
        tmp_path: Path, servers: tuple[Provider, Receipts], runner: Runner) -> None:
    provider, receipts = servers
    name, db = "cut-stream", tmp_path / "runs.db"  # every position's first stream is cut after two chunks
    done = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind="stream")
    assert done.status == "completed" and done.out is not None and done.out["output"] == OUTPUT, done
    billed = _check(provider, receipts, name, db)
    assert sorted(billed.values()) == [2, 2, 2, 2]  # each step: the cut send and its re-send, one key
    with SqliteCheckpointer(db, readonly=True) as store:
        cp = store.checkpoint("pay")
    assert cp is not None and cp.counters["possibly_billed_twice"] == 4
