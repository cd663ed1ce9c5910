"""Whole stories a user's program and its operators drive to an end, resumable after any kill.

Each story is one agent run plus what people do around it (approve, deny, settle an uncertain
effect after checking the receiver, cancel, compensate), written as a driver that looks at the
journal and does the next thing, so running it again after a SIGKILL goes on from wherever the
last process died. Every journal write of every kind is made by some story:

- ``approvals``: approval requested, approved (transfer runs) and denied (the model is told);
- ``flaky``: a model call lost in flight and re-sent (``intent.2``), a transient model error
  retried, a tool reply lost after its effect (uncertain; a person finds the receipt) and before
  it (uncertain; a person establishes absence, ``resolution``, re-sent as ``intent.2``), a tool
  that is refused its arguments (``invalid_input``) and a transient tool error retried;
- ``cancel``: a transfer, then a payout waiting for approval that is cancelled instead; the
  transfer is compensated (``cleanup00``);
- ``budget``: conflicts until the ``replans`` bound ends the run ``failed``;
- ``bug``: a tool raises an exception nobody classified: the run ends ``failed`` with evidence;
- ``upgrade``: a run waits for approval under version 1 of the agent; once approved it is
  resumed by version 2 (new instructions), which migrates it (``migrate.1``) and finishes it.

In ``flaky`` the provider also refuses one request outright (a permanent error, ``error.1``): the
program stops there, and the next run of it sends the request again (``intent.2``).

Ground truth lives outside the journal: every effect appends a receipt (fsynced) to
``receipts.jsonl`` before it returns; the model provider appends every billed generation to
``billing.jsonl``. A failure "the first time" is decided from files as well (``attempts.jsonl``),
so it happens once per story whatever the kills.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from cuaderno import (
    Agent,
    BudgetExceeded,
    Budgets,
    Compensation,
    ErrorClass,
    GatewayError,
    Migration,
    ModelRequest,
    ModelResponse,
    Policy,
    RunCancelled,
    RunClosed,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    ToolContext,
    ToolError,
    UncertainEffect,
    approve,
    cancel,
    compensate,
    deny,
    resolve,
    tool,
)
from cuaderno.testing.records import append_synced, read_records

STORIES = ("approvals", "flaky", "cancel", "budget", "bug", "upgrade")
RUN = "story"


class World:
    """The files outside the journal that say what happened."""

    def __init__(self, work: Path) -> None:
        self.receipts = work / "receipts.jsonl"
        self.attempts = work / "attempts.jsonl"
        self.billing = work / "billing.jsonl"

    def receipt(self, key: str) -> dict[str, Any] | None:
        return next((r for r in read_records(self.receipts) if r["key"] == key), None)

    def effect(self, key: str, **what: Any) -> dict[str, Any]:
        receipt = {"key": key, **what}
        append_synced(self.receipts, receipt)
        return receipt

    def first_time(self, what: str) -> bool:
        """True exactly once per ``what`` in the whole story (recorded before it is acted on)."""
        if any(r["what"] == what for r in read_records(self.attempts)):
            return False
        append_synced(self.attempts, {"what": what})
        return True


def tools(world: World) -> dict[str, Any]:
    """Every tool the stories use, each recording its effects in ``world``."""
    def lookup(ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        return world.receipt(ctx.effect_key)

    @tool(lookup=lookup, compensation=Compensation("refund", lambda args, result: {"to": args["to"],
                                                                                   "amount": args["amount"]}))
    def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Move money (not idempotent; a lookup asks the bank by effect key)."""
        return world.effect(ctx.effect_key, effect="transfer", to=to, amount=amount)

    @tool(lookup=lookup)
    def payout(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Pay out (needs a person's approval)."""
        return world.effect(ctx.effect_key, effect="payout", to=to, amount=amount)

    @tool(lookup=lookup)
    def refund(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Give money back."""
        return world.effect(ctx.effect_key, effect="refund", to=to, amount=amount)

    @tool
    def notify(text: str, ctx: ToolContext) -> dict[str, Any]:
        """Send a message (not idempotent, no lookup: only a person can tell whether it went out)."""
        if text == "lost-before" and world.first_time("notify-before"):
            raise ToolError("connection reset before the reply", error_class=ErrorClass.AMBIGUOUS, sent=True)
        receipt = world.effect(ctx.effect_key, effect="notify", text=text)
        if text == "lost-after" and world.first_time("notify-after"):
            raise ToolError("reply lost after the message went out", error_class=ErrorClass.AMBIGUOUS, sent=True)
        return receipt

    @tool(idempotent=True)
    def fetch(item: str, ctx: ToolContext) -> dict[str, Any]:
        """Read something (idempotent); the first call meets a 503 before anything is sent."""
        if world.first_time("fetch-503"):
            raise ToolError("503", error_class=ErrorClass.TRANSIENT, sent=False)
        return {"item": item}

    @tool
    def update(version: int) -> str:
        """Update a record that someone else keeps changing."""
        raise ToolError("stale version", error_class=ErrorClass.CONFLICT)

    @tool
    def parse(text: str) -> int:
        """Has a bug."""
        return {"n": 1}[text]

    return {"transfer": transfer, "payout": payout, "refund": refund, "notify": notify, "fetch": fetch,
            "update": update, "parse": parse}


def build(story: str, world: World) -> tuple[Agent, Any]:
    """The story's agent and its model (scripted; ``flaky`` adds lost and refused sends)."""
    t = tools(world)
    transfer, payout, refund, notify, fetch, update = (t[name] for name in (
        "transfer", "payout", "refund", "notify", "fetch", "update"))
    call = ScriptedGateway.call
    if story == "approvals":
        agent = Agent(instructions=story, tools=[transfer], policy=Policy({"transfer": "require_approval"}))
        script = [call("transfer", to="a", amount=5), call("transfer", to="b", amount=7), ScriptedGateway.text("ok")]
    elif story == "flaky":
        agent = Agent(instructions=story, tools=[notify, fetch])
        script = [call("notify", text="lost-after"), call("fetch", item="x"), call("notify", text="lost-before"),
                  call("fetch", item=7), ScriptedGateway.text("ok")]
    elif story == "cancel":
        agent = Agent(instructions=story, tools=[transfer, payout, refund], policy=Policy({"payout": "require_approval"}))
        script = [call("transfer", to="a", amount=5), call("payout", to="b", amount=9), ScriptedGateway.text("ok")]
    elif story == "budget":
        agent = Agent(instructions=story, tools=[update], budgets=Budgets(replans=2))
        script = [call("update", version=1)] * 5
    elif story in ("upgrade", "upgrade-v2"):
        agent = Agent(instructions=story, tools=[transfer], policy=Policy({"transfer": "require_approval"}))
        script = [call("transfer", to="a", amount=5), ScriptedGateway.text("ok")]
    elif story == "bug":
        agent = Agent(instructions=story, tools=[t["parse"]])
        script = [call("parse", text="n"), call("parse", text="oops"), ScriptedGateway.text("never")]
    else:
        raise ValueError(story)
    scripted = ScriptedGateway(script, billing_log=world.billing)
    return agent, flaky(world, scripted) if story == "flaky" else scripted


def flaky(world: World, scripted: ScriptedGateway) -> Any:
    """A provider that loses one reply, refuses one request for a while (429) and one for good
    (a permanent error), each once per story."""

    class Flaky:
        """Turn 1's first send is lost in flight (maybe billed); turn 2's first send is refused (429)."""

        async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
            turn = sum(1 for m in request.messages if m.get("role") == "assistant")
            if turn == 2 and world.first_time("model-429"):
                raise GatewayError("429", error_class=ErrorClass.TRANSIENT, sent=False)
            if turn == 3 and world.first_time("model-refused"):
                raise GatewayError("400 bad request", error_class=ErrorClass.PERMANENT, sent=False)
            response = await scripted.complete(request, idempotency_key=idempotency_key)
            if turn == 1 and world.first_time("model-lost"):
                raise GatewayError("reply lost", error_class=ErrorClass.AMBIGUOUS, sent=True)
            return response

    return Flaky()


async def drive(story: str, db: str, work: Path) -> dict[str, Any]:
    """Take the story from wherever the journal says it is to its end, like its operators would."""
    world = World(work)
    agent, gateway = build(story, world)
    store = SqliteCheckpointer(db)
    session: dict[str, Any] = {}

    async def no_wait(seconds: float) -> None:
        await asyncio.sleep(0)

    try:
        for _ in range(30):
            cp = store.checkpoint(RUN)
            if cp is not None and cp.uncertain:
                _settle(store, world, cp.uncertain)
                continue
            if cp is not None and cp.status == "cancelled":
                results = await compensate(agent, store, RUN)
                return {"status": "cancelled", "cleanup": [r.get("outcome") for r in results]}
            if cp is not None and cp.status in ("completed", "failed"):
                return {"status": cp.status}
            if cp is not None and cp.status == "suspended":
                for step_id, pending in cp.pending.items():
                    _decide(story, store, step_id, pending)
                continue
            if story == "upgrade" and cp is not None and any(
                    e.kind == "approval" and e.phase == "decision" for e in store.load(RUN)):
                # Approved while version 1 waited: version 2 of the program takes it from here.
                agent, gateway = build("upgrade-v2", world)
                session["on_version_mismatch"] = Migration(name="v1-to-v2", migrate=lambda old, new, events: {
                    "note": "instructions reworded; recorded steps stand"})
            try:
                async for _ in agent.run(f"story {story}", session=Session(RUN, gateway, store, sleep=no_wait,
                                                                          **session)):
                    pass
            except (UncertainEffect, BudgetExceeded, RunCancelled, RunClosed, GatewayError):
                pass  # the program stops; whoever runs it next looks at the journal again
            except KeyError:
                pass  # the tool's bug: journaled, the run ended failed
        raise AssertionError(f"story {story} did not end")
    finally:
        store.close()


def _decide(story: str, store: SqliteCheckpointer, step_id: str, pending: dict[str, Any]) -> None:
    """What the person at the approval screen does."""
    if story == "cancel":
        cancel(store, RUN, "changed my mind", by="ops")
    elif (pending.get("arguments") or {}).get("to") == "a":
        approve(store, RUN, step_id, approver="ops")
    else:
        deny(store, RUN, step_id, approver="ops", reason="not this one")


def _settle(store: SqliteCheckpointer, world: World, uncertain: dict[str, dict[str, Any]]) -> None:
    """The person checks the receiving system for each uncertain effect and says what they found."""
    for step_id, evidence in uncertain.items():
        found = world.receipt(str(evidence.get("effect_key")))
        resolve(store, RUN, step_id, happened=found is not None, result=found, by="ops")


def effects(work: Path) -> list[tuple[str, str]]:
    """What the world saw, without keys: each effect and its target, sorted."""
    return sorted((r["effect"], str(r.get("to") or r.get("text"))) for r in read_records(work / "receipts.jsonl"))


def main_forked(story: str, db: str, work: str, crash_at: str | None, result_path: str, count: bool) -> None:
    """Entry point of a forked child: arm the point, drive the story, write the result, exit."""
    from cuaderno.testing import crash

    crash.arm(crash_at)
    counts: dict[str, int] = {}
    if count:  # the clean run: how many times each write point is passed
        crash.on("count.K0", lambda: None)  # makes the points active without arming a kill
        real = crash.point

        def counting(name: str) -> None:
            counts[name] = counts.get(name, 0) + 1
            real(name)

        crash.point = counting  # type: ignore[assignment]
    result = asyncio.run(drive(story, db, Path(work)))
    result["pid"] = os.getpid()
    result["counts"] = {k: v for k, v in counts.items() if k.startswith("append.")}
    Path(result_path).write_text(json.dumps(result))
    os._exit(0)
