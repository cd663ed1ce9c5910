"""Pydantic AI's external deferred tools under ``DurableAgent``: a tool that raises
``CallDeferred`` and a tool of an ``ExternalToolset`` each become a step waiting for an external
result (journaled intent, then an ``uncertain`` record saying so; the run stops ``needs_human``).
``cuaderno resolve --happened --result JSON`` gives the result, bound to the call's arguments'
fingerprint, and the next run hands it to the agent as the tool's return value. The provider's
billing and the payment service's receipts prove nothing was sent or paid twice meanwhile."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from _program import Deps, build_agent, effects
from _pyd_runs import cli
from _servers import Provider, Receipts
from pydantic_ai.exceptions import CallDeferred
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import ExternalToolset

from cuaderno import SqliteCheckpointer
from cuaderno.errors import UncertainEffect
from cuaderno.integrations.pydantic_ai import DurableAgent

PROMPT = "PAY: " + json.dumps([["credit_check", "ana", 10], ["kyc", "ana", 10], ["transfer", "ana", 10]])
KYC = ExternalToolset([ToolDefinition(name="kyc", description="Know-your-customer check, done by a person.",
                                      parameters_json_schema={"type": "object", "properties": {
                                          "to": {"type": "string"}, "amount": {"type": "integer"}},
                                          "required": ["to", "amount"]})])


def _run(db: Path, name: str, servers: tuple[Provider, Receipts]) -> Any:
    provider, receipts = servers
    url = receipts.base_url(name)

    async def go() -> Any:
        agent = build_agent(provider.base_url(name))

        @agent.tool_plain
        async def credit_check(to: str, amount: int) -> dict[str, Any]:
            """Ask the credit bureau (it answers later, outside this run)."""
            raise CallDeferred(metadata={"queue": "bureau"})

        async with httpx.AsyncClient() as http:
            with SqliteCheckpointer(db) as store:
                durable = DurableAgent(agent, journal=store, effects=effects("lookup", url, http))
                return await durable.run(PROMPT, run_id="pay", deps=Deps(url, http), toolsets=[KYC])

    return asyncio.run(go())


def _journal(db: Path) -> tuple[Any, list[Any]]:
    with SqliteCheckpointer(db, readonly=True) as store:
        return store.checkpoint("pay"), store.load("pay")


def test_external_results_are_waited_for_in_the_journal_and_given_by_resolve(
        tmp_path: Path, servers: tuple[Provider, Receipts]) -> None:
    provider, receipts = servers
    name, db = "external", tmp_path / "runs.db"
    with pytest.raises(UncertainEffect) as waiting:
        _run(db, name, servers)
    assert waiting.value.step_id == "t0000.tool00"
    cp, events = _journal(db)
    assert cp.status == "needs_human"
    evidence = cp.uncertain["t0000.tool00"]
    assert evidence["external"] is True and evidence["metadata"] == {"queue": "bureau"}
    assert "external result" in evidence["reason"]
    assert len(provider.billing(name)) == 1 and receipts.receipts(name) == []

    # Asked again before the result is in: it waits, sending and writing nothing.
    with pytest.raises(UncertainEffect):
        _run(db, name, servers)
    assert len(provider.billing(name)) == 1 and len(_journal(db)[1]) == len(events)
    shown = cli(db, "show", "pay")
    assert shown.returncode == 0 and "external result" in shown.stdout, shown.stdout + shown.stderr

    given = cli(db, "resolve", "pay", "t0000.tool00", "--happened", "--result", json.dumps({"score": 710}),
                "--by", "bureau")
    assert given.returncode == 0, given.stderr
    # The next run hands the result to the agent and goes on to the external toolset's call.
    with pytest.raises(UncertainEffect) as kyc:
        _run(db, name, servers)
    assert kyc.value.step_id == "t0001.tool00"
    assert _journal(db)[0].uncertain["t0001.tool00"]["external"] is True
    given = cli(db, "resolve", "pay", "t0001.tool00", "--happened", "--result", json.dumps("verified"))
    assert given.returncode == 0, given.stderr

    done = _run(db, name, servers)
    assert done.status == "completed" and done.output.paid == ["ana", "ana", "ana"]
    assert [r["to"] for r in receipts.receipts(name)] == ["ana"]  # the transfer, once
    billed = [b["key"] for b in provider.billing(name)]
    assert len(billed) == 4 and len(set(billed)) == 4  # each model request once, across the waits
    cp, events = _journal(db)
    results = {e.step_id: e for e in events if e.kind == "tool" and e.phase == "result"}
    assert results["t0000.tool00"].payload["value"] == {"score": 710}
    assert results["t0001.tool00"].payload["value"] == "verified"
    # Bound to the call: the result carries the fingerprint of the call's exact arguments.
    intent = next(e for e in events if e.step_id == "t0000.tool00" and e.phase == "intent")
    assert results["t0000.tool00"].fingerprint == intent.fingerprint is not None
