"""Pydantic AI's deferred tools (``requires_approval=True``) become cuaderno approvals: on disk,
bound to the fingerprint of the exact arguments, shown by ``cuaderno show``, decided with
``cuaderno approve``, continued by the next run of the run id; the approved transfer is made
exactly once across a SIGKILL (the payment service's receipts are the proof)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _pyd_runs import Ran, Runner, cli
from _servers import Provider, Receipts
from starlette.testclient import TestClient

from cuaderno import SqliteCheckpointer
from cuaderno.ui.app import create_app

PROMPT = 'PAY: [["transfer", "ana", 10], ["big_transfer", "bob", 5000]]'


def _runs(tmp: Path, servers: tuple[Provider, Receipts], runner: Runner, name: str):  # type: ignore[no-untyped-def]
    provider, receipts = servers

    def run(run_id: str, crash_at: str | None = None) -> Ran:
        return runner.run(tmp / "runs.db", provider.base_url(name), receipts.base_url(name), run_id, PROMPT,
                          crash_at=crash_at)

    return run, (lambda: provider.billing(name)), (lambda: receipts.receipts(name))


@pytest.mark.parametrize("kill", [None, "tool.K4:1", "approval.K7"])
def test_an_approved_call_runs_exactly_once_across_a_kill(tmp_path: Path, servers: tuple[Provider, Receipts],
                                                          runner: Runner, kill: str | None) -> None:
    run, billing, receipts = _runs(tmp_path, servers, runner, f"approve-{kill}")
    db = tmp_path / "runs.db"
    first = run("big", crash_at=kill if kill == "approval.K7" else None)
    if kill == "approval.K7":  # killed after the request was journaled: the next run finds it
        assert first.killed
        first = run("big")
    assert first.out is not None and first.out["status"] == "suspended"
    [pending] = first.out["pending"]
    assert pending["step"] == "t0001.tool00.approval"
    assert [r["to"] for r in receipts()] == ["ana"]  # nothing big paid yet

    shown = cli(db, "show", "big")
    assert shown.returncode == 0, shown.stderr
    assert "big_transfer" in shown.stdout and pending["fingerprint"] in shown.stdout
    with SqliteCheckpointer(db, readonly=True) as store:
        cp = store.checkpoint("big")
    assert cp is not None and cp.status == "suspended" and "t0001.tool00.approval" in cp.pending
    with TestClient(create_app(db, allowed_hosts=["testserver"])) as page:  # the page shows it too
        run_page = page.get("/run", params={"id": "big"}).text
    assert "big_transfer" in run_page and pending["fingerprint"] in run_page and "5000" in run_page

    # The run waits: another run of it changes nothing and pays nothing.
    again = run("big")
    assert again.out is not None and again.out["status"] == "suspended"

    wrong = "0" * len(pending["fingerprint"])
    refused = cli(db, "approve", "big", "t0001.tool00", "--fingerprint", wrong)
    assert refused.returncode != 0 and "nothing was written" in (refused.stdout + refused.stderr)
    ok = cli(db, "approve", "big", "t0001.tool00", "--fingerprint", pending["fingerprint"], "--by", "ana")
    assert ok.returncode == 0, ok.stderr

    if kill == "tool.K4:1":  # ana's transfer replays: the approved one is the first body run
        assert run("big", crash_at=kill).killed
    done = run("big")
    assert done.out is not None and done.out["status"] == "completed", done
    assert done.out["output"] == {"paid": ["ana", "bob"], "total": 5010}
    paid = receipts()
    assert [(r["to"], r["amount"]) for r in paid] == [("ana", 10), ("bob", 5000)]  # each exactly once
    # Every model request was billed once, except one in flight at a kill (none here: the kills
    # are in tools), and each request carried the key its journaled intent holds.
    billed = billing()
    assert len({b["key"] for b in billed}) == len(billed)


def test_a_denied_call_never_runs_and_the_model_is_told(tmp_path: Path, servers: tuple[Provider, Receipts],
                                                        runner: Runner) -> None:
    run, _, receipts = _runs(tmp_path, servers, runner, "deny")
    db = tmp_path / "runs.db"
    first = run("deny")
    assert first.out is not None
    [pending] = first.out["pending"]
    denied = cli(db, "deny", "deny", "t0001.tool00", "--fingerprint", pending["fingerprint"], "--reason", "too big")
    assert denied.returncode == 0, denied.stderr
    done = run("deny")
    assert done.out is not None and done.out["status"] == "completed"
    assert [r["to"] for r in receipts()] == ["ana"]
    with SqliteCheckpointer(db, readonly=True) as store:
        events = store.load("deny")
    told = [e for e in events if e.kind == "model" and e.phase == "result"][-1]
    assert told is not None
    assert ("t0001.tool00", "intent") not in {(e.step_id, e.phase) for e in events}
