"""``DurableAgent.run_stream`` and ``DurableAgent.iter``: the framework's own streaming shapes under
the same promises as ``run``. A real process is SIGKILLed mid-stream, mid-tool, between nodes and
while the caller reads the output; the run resumed through the same shape bills again only the
model request in flight at the kill and pays each transfer once. The fake provider's billing and
the payment service's receipts are the proof (not the journal)."""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from _program import Deps, build_agent, compensations, effects
from _pyd_runs import Runner, cli
from _servers import Provider, Receipts
from _soak import soak

from cuaderno import SqliteCheckpointer
from cuaderno.errors import BudgetExceeded, RunClosed
from cuaderno.integrations.pydantic_ai import DurableAgent, RunBudget

TRANSFERS = [["transfer", "ana", 10], ["transfer", "bob", 20], ["transfer", "cy", 30]]
PROMPT = "PAY: " + json.dumps(TRANSFERS)
OUTPUT = {"paid": ["ana", "bob", "cy"], "total": 60}
SHAPES = ("run_stream", "iter")


def _sends(db: Path, run_id: str) -> dict[str, int]:
    with SqliteCheckpointer(db, readonly=True) as store:
        events = store.load(run_id)
    return {e.payload["key"]: e.payload["sends"] for e in events if e.kind == "model" and e.phase == "result"}


def _status(db: Path, run_id: str) -> str:
    with SqliteCheckpointer(db, readonly=True) as store:
        cp = store.checkpoint(run_id)
    assert cp is not None
    return cp.status


def _check(provider: Provider, receipts: Receipts, name: str, db: Path) -> Counter[str]:
    """Each transfer paid once; each model request billed at most as often as the journal counts
    it sent, always with its key."""
    paid = receipts.receipts(name)
    assert sorted(r["to"] for r in paid) == ["ana", "bob", "cy"] and len({r["key"] for r in paid}) == 3, paid
    billed = Counter(b["key"] for b in provider.billing(name))
    sends = _sends(db, "pay")
    assert set(billed) == set(sends) and all(billed[k] <= sends[k] for k in billed), (billed, sends)
    assert all(b["key"] == b["x_key"] for b in provider.billing(name))
    return billed


@pytest.mark.parametrize("shape", SHAPES)
def test_a_run_through_the_shape_is_journaled_and_an_ended_one_sends_nothing(
        tmp_path: Path, servers: tuple[Provider, Receipts], runner: Runner, shape: str) -> None:
    provider, receipts = servers
    name, db = f"shape-{shape}", tmp_path / "runs.db"
    done = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind=shape)
    assert done.status == "completed" and done.out is not None and done.out["output"] == OUTPUT, done
    assert done.out["seen"] > 0
    assert _status(db, "pay") == "completed"
    assert sorted(_check(provider, receipts, name, db).values()) == [1, 1, 1, 1]
    # Ended: run and run_stream answer from the journal, and nothing is billed again.
    for kind in ("run_stream", "lookup"):
        again = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind=kind)
        assert again.out is not None and again.out["output"] == OUTPUT, again
    assert len(provider.billing(name)) == 4 and len(receipts.receipts(name)) == 3


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("point", "in_flight"), [
    ("model.K4:2", True),    # mid-stream: the answer's headers in, its chunks unread
    ("tool.K4:2", False),    # bob paid, the reply unread: the lookup finds it
    ("model.K7:3", False),   # three steps journaled: replayed without a request
    ("model.K4:4", True),    # the final answer mid-stream, before the caller saw any of it
    ("caller.K1:2", False),  # the caller reading the run (partial outputs, nodes): its steps journaled
    ("final.K0", False),     # read whole, the end not journaled yet
])
def test_a_kill_resumed_through_the_shape_rebills_only_the_request_in_flight(
        tmp_path: Path, servers: tuple[Provider, Receipts], runner: Runner, shape: str, point: str,
        in_flight: bool) -> None:
    provider, receipts = servers
    name = f"shape-{shape}-" + point.replace(":", "-").replace(".", "-")
    db = tmp_path / "runs.db"
    killed = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind=shape,
                        crash_at=point)
    assert killed.killed, killed
    assert _status(db, "pay") != "completed"
    resumed = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind=shape)
    assert resumed.status == "completed" and resumed.out is not None and resumed.out["output"] == OUTPUT, resumed
    billed = _check(provider, receipts, name, db)
    assert len(billed) == 4
    assert sum(n - 1 for n in billed.values()) == (1 if in_flight else 0), billed
    assert _status(db, "pay") == "completed"


@pytest.mark.parametrize("shape", SHAPES)
def test_a_caller_that_leaves_early_leaves_the_run_open_and_the_next_call_goes_on(
        tmp_path: Path, servers: tuple[Provider, Receipts], runner: Runner, shape: str) -> None:
    provider, receipts = servers
    name, db = f"shape-peek-{shape}", tmp_path / "runs.db"
    left = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind=f"{shape}_peek")
    assert left.status == "left" and left.out is not None and left.out["seen"] == 1, left
    assert _status(db, "pay") != "completed"  # nothing read whole: no end journaled
    done = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind=shape)
    assert done.status == "completed" and done.out is not None and done.out["output"] == OUTPUT, done
    billed = _check(provider, receipts, name, db)
    assert sorted(billed.values()) == [1, 1, 1, 1]  # what the first call journaled was not asked for again


def test_iter_refuses_an_ended_run_and_names_what_answers_it(
        tmp_path: Path, servers: tuple[Provider, Receipts], runner: Runner) -> None:
    provider, receipts = servers
    name, db = "shape-iter-ended", tmp_path / "runs.db"
    assert runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT).status == "completed"
    before = db.read_bytes()

    async def iterate() -> None:
        async with httpx.AsyncClient() as http:
            with SqliteCheckpointer(db) as store:
                durable = DurableAgent(build_agent(provider.base_url(name)), journal=store,
                                       effects=effects("lookup", receipts.base_url(name), http),
                                       compensations=compensations(receipts.base_url(name)))
                async with durable.iter(PROMPT, run_id="pay", deps=Deps(receipts.base_url(name), http)):
                    raise AssertionError("an ended run must not be handed out as a live agent run")

    with pytest.raises(RunClosed) as caught:
        asyncio.run(iterate())
    assert caught.value.status == "completed"
    assert any("DurableAgent.run" in note for note in caught.value.__notes__)
    assert len(provider.billing(name)) == 4
    assert db.read_bytes() == before  # the refusal wrote nothing


@pytest.mark.parametrize("shape", SHAPES)
def test_a_shape_that_ends_in_approvals_journals_them_and_run_goes_on_once_decided(
        tmp_path: Path, servers: tuple[Provider, Receipts], runner: Runner, shape: str) -> None:
    provider, receipts = servers
    name, db = f"shape-approve-{shape}", tmp_path / "runs.db"
    prompt = 'PAY: [["transfer", "ana", 10], ["big_transfer", "bob", 5000]]'
    first = runner.run(db, provider.base_url(name), receipts.base_url(name), "big", prompt, kind=shape)
    assert first.out is not None and first.out["status"] == "deferred" and first.out["approvals"] == ["big_transfer"]
    assert _status(db, "big") == "suspended" and [r["to"] for r in receipts.receipts(name)] == ["ana"]
    with SqliteCheckpointer(db, readonly=True) as store:
        cp = store.checkpoint("big")
    assert cp is not None and list(cp.pending) == ["t0001.tool00.approval"]
    request = next(e for e in store_events(db, "big") if e.step_id == "t0001.tool00.approval" and e.phase == "request")
    decided = cli(db, "approve", "big", "t0001.tool00", "--fingerprint", request.fingerprint or "", "--by", "ana")
    assert decided.returncode == 0, decided.stderr
    # Decided: run (the same run id) replays up to the approval and pays bob, once.
    done = runner.run(db, provider.base_url(name), receipts.base_url(name), "big", prompt)
    assert done.status == "completed", done
    assert [(r["to"], r["amount"]) for r in receipts.receipts(name)] == [("ana", 10), ("bob", 5000)]
    billed = Counter(b["key"] for b in provider.billing(name))
    assert max(billed.values()) == 1, billed


def store_events(db: Path, run_id: str) -> list[Any]:
    with SqliteCheckpointer(db, readonly=True) as store:
        return list(store.load(run_id))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("shape", SHAPES)
def test_random_kills_through_the_shape_pay_each_transfer_once(tmp_path: Path, runner: Runner, shape: str) -> None:
    """SIGKILLs from outside at random moments of each run (up to four a run), resumed through the
    same shape until it completes: no transfer twice, no request billed more often than the journal
    counts it sent, every request keyed (``CUADERNO_SOAK=1``: ``CUADERNO_SOAK_RUNS`` runs, else 6)."""
    runs = int(os.environ.get("CUADERNO_SOAK_RUNS", "20")) if os.environ.get("CUADERNO_SOAK") == "1" else 6
    with Provider(tmp_path) as provider, Receipts(tmp_path) as receipts:
        totals = soak(runner, provider, receipts, tmp_path, program="cuaderno", label=f"shape-soak-{shape}",
                      runs=runs, transfers=4, seed=11, max_kills=4, kind=shape)
    print(f"\nSHAPE SOAK {json.dumps(totals)}")
    assert totals["kills"] > 0 and totals["unfinished"] == 0 and totals["needs_human"] == 0
    assert totals["duplicated"] == 0 and totals["unknowingly"] == 0 and totals["keyed"] == totals["billed"]


def test_a_budget_met_in_run_stream_ends_the_run_and_a_later_stream_is_refused(
        tmp_path: Path, servers: tuple[Provider, Receipts]) -> None:
    provider, receipts = servers
    name, db = "shape-budget", tmp_path / "runs.db"

    async def stream_once() -> None:
        async with httpx.AsyncClient() as http:
            with SqliteCheckpointer(db) as store:
                durable = DurableAgent(build_agent(provider.base_url(name)), journal=store,
                                       effects=effects("lookup", receipts.base_url(name), http),
                                       compensations=compensations(receipts.base_url(name)),
                                       budget=RunBudget(tool_calls=1))
                async with durable.run_stream(PROMPT, run_id="pay", deps=Deps(receipts.base_url(name), http)) as s:
                    await s.get_output()

    with pytest.raises(BudgetExceeded) as over:
        asyncio.run(stream_once())
    assert over.value.budget == "tool_calls"
    assert [r["to"] for r in receipts.receipts(name)] == ["ana"] and len(provider.billing(name)) == 2
    assert _status(db, "pay") == "failed"  # journaled: the run ended with the budget record
    with pytest.raises(RunClosed) as closed:  # ended failed: no stream to give, nothing sent
        asyncio.run(stream_once())
    assert closed.value.status == "failed"
    assert len(provider.billing(name)) == 2 and len(receipts.receipts(name)) == 1
