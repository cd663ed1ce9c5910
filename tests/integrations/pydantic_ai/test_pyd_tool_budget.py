"""``RunBudget(tool_calls=..., tool_calls_per_tool=...)`` under ``DurableAgent``: a tool call past
a bound is not started, the run ends ``failed`` with the budget record (journaled), and a resumed
run counts the calls its journal holds, so a crash gives no call back. The payment service's
receipts and the provider's billing are the proof of what ran and what was sent."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from _pyd_runs import Runner
from _servers import Provider, Receipts

from cuaderno import SqliteCheckpointer
from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import UsageError
from cuaderno.integrations import RunBudget

PROMPT = "PAY: " + json.dumps([["transfer", "ana", 10], ["transfer", "bob", 20], ["transfer", "cy", 30]])


def _ended(db: Path) -> Checkpoint:
    with SqliteCheckpointer(db, readonly=True) as store:
        cp = store.checkpoint("pay")
    assert cp is not None
    return cp


@pytest.mark.parametrize(("kind", "budget", "paid"), [
    ("budget:tool_calls=2", "tool_calls", ["ana", "bob"]),
    ("budget:tool_calls_per_tool=transfer/1", "tool_calls[transfer]", ["ana"]),
    ("budget:tool_calls=0", "tool_calls", []),
])
def test_a_tool_call_past_its_bound_is_not_started_and_the_run_ends_failed(
        tmp_path: Path, servers: tuple[Provider, Receipts], runner: Runner, kind: str, budget: str,
        paid: list[str]) -> None:
    provider, receipts = servers
    name, db = "toolbudget-" + kind.split("=", 1)[1].replace("/", "-"), tmp_path / "runs.db"
    first = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind=kind)
    assert first.out == {"status": "failed", "budget": budget, "replayed": False}, first
    assert [r["to"] for r in receipts.receipts(name)] == paid
    # The model asked for the refused call (its answer billed once), and nothing was sent after it.
    assert len(provider.billing(name)) == len(paid) + 1
    cp = _ended(db)
    assert cp.status == "failed" and cp.outcome is not None
    assert (cp.outcome["reason"], cp.outcome["budget"], cp.outcome["spent"]) == ("budget", budget, len(paid))
    # Ended: the next call answers from the journal; nothing runs, nothing is sent.
    again = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind=kind)
    assert again.out is not None and again.out["status"] == "failed" and again.out["replayed"], again
    assert len(receipts.receipts(name)) == len(paid) and len(provider.billing(name)) == len(paid) + 1


@pytest.mark.parametrize(("point", "rebilled"), [
    ("tool.K7:1", 0),   # ana's transfer journaled: one call spent
    ("tool.K4:2", 0),   # bob paid, its reply unread: started, settled on resume by the lookup
    ("model.K4:3", 1),  # both transfers journaled, the next answer in flight (sent again with its key)
])
def test_a_resumed_run_counts_the_tool_calls_its_journal_holds(
        tmp_path: Path, servers: tuple[Provider, Receipts], runner: Runner, point: str, rebilled: int) -> None:
    provider, receipts = servers
    name, db = "toolbudget-resume-" + point.replace(":", "-").replace(".", "-"), tmp_path / "runs.db"
    kind = "budget:tool_calls=2"
    killed = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind=kind, crash_at=point)
    assert killed.killed, killed
    resumed = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind=kind)
    # Counted from zero, the resume would have paid cy too; counted from the journal, the third
    # call is the one refused, and each transfer is made once.
    assert resumed.out == {"status": "failed", "budget": "tool_calls", "replayed": False}, resumed
    paid = receipts.receipts(name)
    assert [r["to"] for r in paid] == ["ana", "bob"] and len({r["key"] for r in paid}) == 2
    billed = Counter(b["key"] for b in provider.billing(name))
    assert len(billed) == 3 and sum(n - 1 for n in billed.values()) == rebilled, billed
    cp = _ended(db)
    assert cp.outcome is not None and (cp.outcome["budget"], cp.outcome["limit"], cp.outcome["spent"]) == \
        ("tool_calls", 2, 2)


@pytest.mark.parametrize("bad", [{"tool_calls": -1}, {"tool_calls": 2.0}, {"tool_calls_per_tool": {"transfer": -1}},
                                 {"tool_calls_per_tool": {"": 1}}, {"tool_calls_per_tool": [("transfer", 1)]},
                                 {"tool_calls_per_tool": {"transfer": True}}])
def test_a_malformed_tool_bound_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(UsageError, match="RunBudget"):
        RunBudget(**bad)  # type: ignore[arg-type]


def test_the_per_tool_bounds_are_a_copy_the_caller_cannot_change() -> None:
    given = {"transfer": 1}
    budget = RunBudget(tool_calls_per_tool=given)
    given["transfer"] = 99
    assert budget.tool_calls_per_tool == {"transfer": 1}
    with pytest.raises(TypeError):
        budget.tool_calls_per_tool["transfer"] = 5  # type: ignore[index]
