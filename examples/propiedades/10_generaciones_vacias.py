"""Generaciones vacías, niveles y costes verdaderos (seed 002).

A generation that ends in a provider error can arrive as HTTP 200 with no content, no tool call
and no price: every other layer stays silent. cuaderno reads the parsed response:

- without tiers, an empty turn on a turn that must call a tool is rejected, journaled, counted
  against a cap *per episode*, and the same request is asked again — until the cap stops the run;
- with ``TieredGateway(cheap, strong)`` the empty turn is escalated to the strong tier instead,
  each escalation journaled and counted;
- an unpriced call is counted as unpriced, never as $0.

The models here are scripted (the local model demo, ``make demo-local``, shows real empty 200s).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _comun import check, cuaderno_cli, example_dir

from cuaderno import (
    Agent,
    BudgetExceeded,
    Budgets,
    ModelRequest,
    ModelResponse,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    TieredGateway,
    tool,
)
from cuaderno.render import cost_text


@tool(idempotent=True)
def get_weather(city: str) -> str:
    """Today's weather in a city."""
    return f"{city}: 21 °C"


def cheap_script(request: ModelRequest) -> ModelResponse:
    """The cheap tier: an empty 200 on every first attempt of a turn (like the seed's bench)."""
    if request.messages[-1]["role"] == "tool":
        return ScriptedGateway.text("It is 21 °C.")
    return ScriptedGateway.empty()


def strong_script(request: ModelRequest) -> ModelResponse:
    return ScriptedGateway.call("get_weather", city="Lima", cost=0.007)


async def run(gateway: Any, run_id: str, store: SqliteCheckpointer) -> str:
    agent = Agent(instructions="Use the tool.", tools=[get_weather], require_tool=False,
                  budgets=Budgets(rejected_responses=3))
    try:
        async for _ in agent.run("weather in Lima?", session=Session(run_id, gateway, store)):
            pass
    except BudgetExceeded as exc:
        return f"failed: {exc}"
    return store.checkpoint(run_id).status  # type: ignore[union-attr]


async def main() -> int:
    print("cuaderno: empty generations, tiers and cost truth (seed 002)\n")
    with example_dir("cuaderno-vacias-") as workdir:
        store = SqliteCheckpointer(workdir / "runs.db")
        same = ScriptedGateway(cheap_script, cost=None)
        print("re-sending to the same model:", await run(same, "same", store))
        tiered = TieredGateway(ScriptedGateway(cheap_script, cost=None), ScriptedGateway(strong_script, cost=0.007))
        print("escalating to the strong tier:", await run(tiered, "tiered", store))
        rows = []
        for run_id in ("same", "tiered"):
            cp = store.checkpoint(run_id)
            assert cp is not None
            rows.append((run_id, cp))
        store.close()
    print(f"\n{'run':<8} {'status':<10} {'rejected':>8} {'escal.':>6} {'sends':>6} {'paid':>5} {'unpriced':>8}  cost")
    for run_id, cp in rows:
        # Worded as `cuaderno show` words it: a run with only unpriced calls has an unknown cost, not $0.
        print(f"{run_id:<8} {cp.status:<10} {cp.count('rejected_responses'):>8} {cp.count('escalations'):>6} "
              f"{cp.count('model_sends'):>6} {cp.count('calls_paid'):>5} {cp.count('unpriced_calls'):>8}  "
              f"{cost_text(cp, short=False)}")
    same_cp, tiered_cp = rows[0][1], rows[1][1]
    print(f"\nescalations counted by the gateway object: {tiered.escalations}")
    kept = cuaderno_cli(workdir, "list")
    if kept:
        print(f"journal kept; look at it with: {kept}")
    check(same_cp.status == "failed" and same_cp.count("rejected_responses") == 4, "the cap must stop re-sending")
    check(tiered_cp.status == "completed" and tiered_cp.count("escalations") == tiered.escalations == 1,
          "the empty turn must be escalated once and counted")
    check(same_cp.cost_usd == 0 and same_cp.count("unpriced_calls") == 4, "unpriced calls are never $0")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
