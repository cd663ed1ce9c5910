"""cuaderno.durable.approval: a framework's approval is the loop's approval, byte for byte, so
``cuaderno approve`` and the run's summary read it alike, and the call runs only when a person
approved exactly its arguments."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from cuaderno import Agent, Policy, ScriptedGateway, Session, SqliteCheckpointer, approve, deny, faults, tool
from cuaderno.durable import Approval, open_run
from cuaderno.errors import ApprovalMismatch, UsageError
from cuaderno.fingerprint import fingerprint

ARGS = {"to": "ana", "amount": 42}
FP = fingerprint({"name": "transfer", "arguments": ARGS})
REASON = "policy p1: require_approval"  # what the loop journals for this policy


def _loop_request(store: SqliteCheckpointer) -> Any:
    """The approval request cuaderno's own loop journals for a transfer of ARGS."""
    @tool
    def transfer(to: str, amount: int) -> dict[str, Any]:
        """Move money."""
        return {"ok": True}

    agent = Agent(instructions="i", tools=[transfer], policy=Policy({"transfer": "require_approval"}, version="p1"))
    gw = ScriptedGateway([ScriptedGateway.call("transfer", **ARGS)])

    async def go() -> None:
        async for _ in agent.run("pay", session=Session("loop", gw, store)):
            pass

    asyncio.run(go())
    [ev] = [e for e in store.load("loop") if e.kind == "approval"]
    return ev


def _opened(store: SqliteCheckpointer, run_id: str = "fw") -> Any:
    return open_run(store, run_id, task="pay", task_fingerprint="fp", versions={}, tenant="default", owner="me")


def test_a_request_is_journaled_in_the_loops_shape_and_decided_by_cuaderno_approve(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        theirs = _loop_request(store)
        opened = _opened(store)
        appr = Approval(opened.log, "t0000.tool00", "transfer", ARGS, FP)
        assert appr.decided() is None and not appr.requested()
        assert appr.request(REASON, extra={"policy_version": "p1"})
        opened.log.commit()
        assert not appr.request(REASON)  # once: a later pass finds it journaled, stages nothing
        opened.log.commit()
        [ours] = [e for e in store.load("fw") if e.kind == "approval"]
        shape = ("step_id", "phase", "kind", "name", "decision", "fingerprint", "payload")
        assert {f: getattr(ours, f) for f in shape} == {f: getattr(theirs, f) for f in shape}
        cp = store.checkpoint("fw")
        assert cp is not None and cp.status == "suspended" and list(cp.pending) == ["t0000.tool00.approval"]
        with pytest.raises(ApprovalMismatch):  # the person saw these arguments, not others
            approve(store, "fw", "t0000.tool00", fingerprint=fingerprint({"name": "transfer", "arguments": {}}))
        with pytest.raises(ApprovalMismatch):
            appr.require_approved()  # still waiting: nothing runs
        approve(store, "fw", "t0000.tool00", fingerprint=FP, approver="eve", reason="ok")
        opened.log.index.update({(e.step_id, e.phase): e for e in store.load("fw")})  # the next pass's view
        decided = appr.decided()
        assert decided is not None and decided.approved and decided.approver == "eve" and decided.reason == "ok"
        appr.require_approved()
        # The same position with other arguments is not the call that was approved.
        other = Approval(opened.log, "t0000.tool00", "transfer", {"to": "eve", "amount": 42},
                         fingerprint({"name": "transfer", "arguments": {"to": "eve", "amount": 42}}))
        with pytest.raises(ApprovalMismatch):
            other.require_approved()
        opened.release()


def test_a_rejection_is_read_and_never_runs(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        opened = _opened(store)
        appr = Approval(opened.log, "t0000.tool00", "transfer", ARGS, FP)
        appr.request(REASON)
        opened.log.commit()
        deny(store, "fw", "t0000.tool00.approval", fingerprint=FP, reason="too much")
        opened.log.index.update({(e.step_id, e.phase): e for e in store.load("fw")})
        decided = appr.decided()
        assert decided is not None and not decided.approved and decided.reason == "too much"
        with pytest.raises(ApprovalMismatch, match="rejected"):
            appr.require_approved()
        opened.release()


def test_a_request_that_is_not_plain_json_stages_nothing(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        opened = _opened(store)
        with pytest.raises(UsageError):
            Approval(opened.log, "t0000.tool00", "transfer", {"amount": float("nan")}, FP).request(REASON)
        with pytest.raises(UsageError, match="replace"):
            Approval(opened.log, "t0000.tool00", "transfer", ARGS, FP).request(REASON, extra={"arguments": {}})
        opened.log.commit()
        assert [e.kind for e in store.load("fw")] == ["run"]
        opened.release()


def test_the_request_passes_approval_k1_inside_its_transaction(tmp_path: Path) -> None:
    """approval.K1 fires inside the journal's transaction (a kill there leaves no request): a
    failure injected at the point rolls the request back."""
    class Boom(Exception):
        pass

    def boom() -> None:
        raise Boom

    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        opened = _opened(store)
        Approval(opened.log, "t0000.tool00", "transfer", ARGS, FP).request(REASON)
        faults.on("approval.K1", boom)
        try:
            with pytest.raises(Boom):
                opened.log.commit()
        finally:
            faults.on("approval.K1", None)
        assert [e.kind for e in store.load("fw")] == ["run"]
        opened.release()
