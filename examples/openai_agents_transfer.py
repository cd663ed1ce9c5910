"""An OpenAI Agents SDK agent, run durably by cuaderno: killed in the middle of a transfer, resumed
in a new process, and no transfer made twice, no model answer paid twice.

Run it: ``python examples/openai_agents_transfer.py`` (needs ``pip install 'cuaderno[openai-agents]'``).
The agent is at the top of this file: plain SDK code, plus ``effect_key()`` sent to the receipts
server and a lookup declared for ``transfer``. The demonstration starts, on loopback, a fake OpenAI-compatible provider that bills every request it answers and
a receipts server that never deduplicates (both from ``tests/integrations/openai_agents``), then:

1. runs the agent in a child process that SIGKILLs itself right after the receipts server
   recorded the third transfer, before the agent heard back (``CUADERNO_CRASH_AT=tool.K4:3``);
2. runs the same run id again in a new process: the journal answers the model calls already
   paid, the lookup declared for ``transfer`` finds the third transfer's receipt by its effect
   key, and the run goes on to its structured answer;
3. checks against the two outside records: 5 transfers, each once; each model call billed once,
   except at most the one in flight at the kill (counted by the journal as possibly billed twice).

Exits 1 when a check fails. ``CUADERNO_KEEP=1`` keeps the temporary directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "tests" / "integrations" / "openai_agents"
sys.path[:0] = [str(ROOT / "src"), str(HERE)]

from _oai_harness import ProviderProcess, outcome, run_agent, truth  # noqa: E402
from agents import Agent, OpenAIChatCompletionsModel, RunContextWrapper, function_tool, set_tracing_disabled  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from cuaderno import SqliteCheckpointer  # noqa: E402
from cuaderno.errors import ErrorClass, ToolError, UncertainEffect  # noqa: E402
from cuaderno.integrations.openai_agents import DurableRunner, EffectCall, effect_key, lookup  # noqa: E402
from cuaderno.testing.ledger import LedgerClient, LedgerProcess, LedgerReplyLost, read_receipts  # noqa: E402

# -- the agent: plain OpenAI Agents SDK code --------------------------------------------------------


@dataclass
class Bank:
    account: str
    receipts_url: str


class Summary(BaseModel):
    transfers: int
    total: int


async def post(ctx: RunContextWrapper[Bank], effect: str, args: dict[str, Any]) -> dict[str, Any]:
    client = LedgerClient(ctx.context.receipts_url)
    try:  # effect_key(): the same for every send, lookup and resume of this call
        return await asyncio.to_thread(client.post_effect, effect_key(), effect, args, effect_key())
    except LedgerReplyLost as exc:  # sent, reply lost: say so, the declared lookup settles it
        raise ToolError(str(exc), error_class=ErrorClass.AMBIGUOUS, sent=True) from exc


@function_tool
async def transfer(ctx: RunContextWrapper[Bank], to: str, amount: int) -> dict[str, Any]:
    """Send money from the bank's account."""
    receipt = await post(ctx, "transfer", {"from": ctx.context.account, "to": to, "amount": amount})
    return {"receipt": receipt["receipt_id"], "to": to, "amount": amount}


@function_tool
async def balance(ctx: RunContextWrapper[Bank], account: str) -> int:
    """Read an account's balance."""
    return 1000


@function_tool
async def notify(ctx: RunContextWrapper[Bank], message: str) -> str:
    """Tell the operations channel."""
    await post(ctx, "notify", {"message": message})
    return "notified"


def child(journal: str, provider_url: str, receipts_url: str, run_id: str) -> None:
    """One process's go at the run (started, or resumed: the same call)."""
    set_tracing_disabled(True)
    agent = Agent(name="treasurer", instructions="Make the transfers you are asked for, then summarise.",
                  model=OpenAIChatCompletionsModel(model="fake-model",
                                                   openai_client=AsyncOpenAI(base_url=provider_url, api_key="k")),
                  tools=[transfer, balance, notify], output_type=Summary)

    async def find_transfer(call: EffectCall) -> dict[str, Any] | None:
        found = await asyncio.to_thread(LedgerClient(receipts_url).lookup, call.key)
        return {"receipt": found[0]["receipt_id"], "to": call.arguments["to"], "amount": call.arguments["amount"]} \
            if found else None

    store = SqliteCheckpointer(journal)
    runner = DurableRunner(store, effects={"transfer": lookup(find_transfer), "balance": "effect_free"})
    try:
        result = asyncio.run(runner.run(agent, "Pay ana 10, bob 20, carol 30, dave 40 and erin 50.",
                                        run_id=run_id, context=Bank("treasury", receipts_url)))
        out: dict[str, Any] = {"status": result.status, "final": result.final_output.model_dump(),
                               "replayed": result.replayed}
    except UncertainEffect as exc:
        out = {"status": "needs_human", "step": exc.step_id}
    finally:
        store.close()
    print(json.dumps(out), flush=True)


# -- the demonstration ------------------------------------------------------------------------------


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="cuaderno-oai-"))
    journal, run_id = work / "runs.db", "invoice-batch-17"
    try:
        with ProviderProcess(work / "billing.jsonl") as provider, \
                LedgerProcess(work / "receipts.db", mode="nodedup") as receipts:
            first = outcome(run_agent(journal, provider.url, receipts.url, run_id, crash_at="tool.K4:3", script=ME))
            print(f"1. first process: {first['status']} (after the 3rd transfer was recorded, before its reply)")
            second = outcome(run_agent(journal, provider.url, receipts.url, run_id, script=ME))
            print(f"2. second process: {second['status']}, final output {json.dumps(second.get('final'))}")
            t = truth(journal, run_id, receipts.db_path, provider.bills())
            transfers = Counter(json.dumps(r["request"]["args"], sort_keys=True) for r in read_receipts(receipts.db_path)
                                 if r["effect"] == "transfer")
            print(f"3. receipts: {t.effects['transfer']} transfers ({t.duplicated} duplicated), "
                  f"{t.effects['notify']} notification; model requests billed: {t.billed} for 5 steps, "
                  f"{t.rebilled_in_flight} re-billed in flight (journal counts {t.counted_twice} possibly billed "
                  f"twice), {t.rebilled_journaled} re-billed after being journaled, {t.unkeyed} without a key")
            ok = (first["status"] == "killed" and second["status"] == "completed"
                  and second["final"] == {"transfers": 5, "total": 150} and t.duplicated == 0
                  and t.effects == {"transfer": 5, "notify": 1} and len(transfers) == 5
                  and t.rebilled_journaled == 0 and t.unkeyed == 0 and t.billed == 5 + t.rebilled_in_flight)
            print("OK: every transfer once, every answer paid once" if ok else "FAILED")
            return 0 if ok else 1
    finally:
        if os.environ.get("CUADERNO_KEEP"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


ME = Path(__file__).resolve()

if __name__ == "__main__":
    if len(sys.argv) == 5:  # a child: JOURNAL PROVIDER_URL RECEIPTS_URL RUN_ID
        child(*sys.argv[1:5])
    else:
        sys.exit(main())
