"""A child process of the sealed-offload kill test:
``python _sealed_offload_child.py JOURNAL RUN LEDGER_URL TURNS``.

The journal is opened with the key in ``CUADERNO_KEY`` (set by the parent). The run's tool,
``transfer`` (idempotent: keyed by the step's effect key), posts one transfer to the ledger
service (dedup mode: a second post under a key answers the first receipt) and returns the receipt
with about 2.5 MB of statement text: over the offload threshold, so the result is offloaded in
three sealed chunks. Armed by the parent with ``CUADERNO_CRASH_AT=offload.O1:<n>``, the process is
SIGKILLed after the ``n``-th chunk written, inside a result's transaction; run again without it,
it resumes the run to its end and prints ``STATUS <status>``. The ledger's receipts, not the
journal, are the record of how often each transfer happened.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from cuaderno import Agent, ScriptedGateway, Session, open_journal, tool
from cuaderno.testing.ledger import LedgerClient
from cuaderno.tools import ToolContext


def main() -> None:
    url, run_id, ledger, turns = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    client = LedgerClient(ledger)

    @tool(idempotent=True)
    def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Move money through the ledger, keyed by the effect key; return the receipt and a statement."""
        receipt = client.post_effect(ctx.effect_key, "transfer", {"to": to, "amount": amount, "from": "bank"},
                                     business_id=run_id)
        return {"receipt": receipt, "statement": os.urandom(1_250_000).hex()}

    store = open_journal(url)
    try:
        calls = [ScriptedGateway.call("transfer", to=f"acct{i}", amount=10 + i) for i in range(turns)]
        gateway = ScriptedGateway([*calls, ScriptedGateway.text("done")])
        agent = Agent(instructions="transfer", tools=[transfer], name="payer")
        result = asyncio.run(agent.run_to_end("pay", session=Session(run_id, gateway, store)))
        print("STATUS", result.status, flush=True)
    finally:
        store.close()


if __name__ == "__main__":
    main()
