"""``DurableAgent(..., budget=RunBudget(...))``: a run past a bound sends nothing more and ends
``failed`` as cuaderno's runner ends it; the spending is the journal's, so a resume after a
SIGKILL counts nothing again. The provider's billing log is the proof of what was sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _pyd_runs import Runner
from _servers import Provider, Receipts

from cuaderno import SqliteCheckpointer
from cuaderno.errors import UsageError
from cuaderno.integrations import RunBudget

PROMPT = "PAY: " + json.dumps([["transfer", "ana", 10], ["transfer", "bob", 20], ["transfer", "cy", 30]])


@pytest.mark.parametrize(("kind", "billed", "paid", "spent"), [
    ("budget:model_calls=2", 2, ["ana", "bob"], 2),
    ("budget:tokens=30", 2, ["ana", "bob"], 30),  # the fake provider answers 15 tokens a call
    # The fake model is unpriced: after its first call the run's cost is unknown, never $0.
    ("budget:cost_usd=1.0", 1, ["ana"], None),
])
def test_a_run_past_its_budget_sends_nothing_more(tmp_path: Path, servers: tuple[Provider, Receipts], runner: Runner,
                                                  kind: str, billed: int, paid: list[str], spent: int | None) -> None:
    provider, receipts = servers
    name, db = "budget-" + kind.split(":")[1].split("=")[0], tmp_path / "runs.db"
    first = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind=kind)
    budget = kind.split(":")[1].split("=")[0]
    assert first.out == {"status": "failed", "budget": budget, "replayed": False}
    assert len(provider.billing(name)) == billed
    assert [r["to"] for r in receipts.receipts(name)] == paid
    with SqliteCheckpointer(db, readonly=True) as store:
        cp = store.checkpoint("pay")
    assert cp is not None and cp.status == "failed"
    assert cp.outcome is not None and cp.outcome["reason"] == "budget" and cp.outcome["budget"] == budget
    assert cp.outcome["spent"] == spent
    # The run has ended: the next call answers from the journal and sends nothing.
    again = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind=kind)
    assert again.out is not None and again.out["status"] == "failed" and again.out["replayed"]
    assert again.out["reason"] == "budget"
    assert len(provider.billing(name)) == billed and len(receipts.receipts(name)) == len(paid)


def test_a_resume_counts_nothing_again(tmp_path: Path, servers: tuple[Provider, Receipts], runner: Runner) -> None:
    provider, receipts = servers
    name, db = "budget-resume", tmp_path / "runs.db"
    kind = "budget:model_calls=3"
    # Killed once the second answer is journaled: two calls spent.
    killed = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind=kind,
                        crash_at="model.K7:2")
    assert killed.killed and len(provider.billing(name)) == 2
    resumed = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, kind=kind)
    # The two journaled answers replay uncounted: one more call is sent (the third), not zero.
    assert resumed.out == {"status": "failed", "budget": "model_calls", "replayed": False}
    billed = provider.billing(name)
    assert len(billed) == 3 and len({b["key"] for b in billed}) == 3
    assert [r["to"] for r in receipts.receipts(name)] == ["ana", "bob", "cy"]


@pytest.mark.parametrize("bad", [{"tokens": -1}, {"model_calls": 1.5}, {"cost_usd": float("inf")}, {"model_sends": True}])
def test_a_malformed_budget_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(UsageError, match="RunBudget"):
        RunBudget(**bad)  # type: ignore[arg-type]
