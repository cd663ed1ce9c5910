"""The golden agent programs: fixed instructions, tools, policies and scripted model answers.

The journals in ``journals/`` were recorded from these definitions by ``make_golden.py``, and
``test_golden_replay.py`` resumes them with the definitions as they are *now*. So these programs
are frozen: changing one (its instructions, a tool's signature or docstring, its policy) makes its
committed history diverge, which is exactly what R14 detects. To cover a new behaviour, add a new
program and record it; never edit a recorded one.

Tool results are pure functions of their arguments, so a run resumed from any point records the
same results as the original. Every tool body records its execution (tool name and step id) in a
:class:`World`, independently of the journal, so a test can name each step that ran.

Coverage (``Program.covers``): a multi-turn tool run, parallel tool calls in one turn, a call
denied by policy, an approval that was approved, an invalid-arguments repair, an empty (rejected)
generation followed by an answer, and a transient model error retried.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_type_hints

from cuaderno import (
    Agent,
    ErrorClass,
    FinalStep,
    GatewayError,
    Migration,
    ModelGateway,
    ModelRequest,
    ModelResponse,
    Policy,
    ScriptedGateway,
    Session,
    Step,
    StepEvent,
    Tool,
    ToolContext,
    approve,
    pending_approvals,
    tool,
)
from cuaderno.checkpoint import Checkpoint
from cuaderno.journal.base import Checkpointer
from cuaderno.tools.policy import Rule

__all__ = [
    "MUTATIONS",
    "PROGRAMS",
    "PROGRAM_BY_RUN_ID",
    "REQUEST_CHANGING",
    "Mutation",
    "Program",
    "World",
    "checkpoint_json",
    "drive",
    "model_calls_made",
    "resume_choice",
    "tool_steps_executed",
]

OWNER: Final = "golden"
"""The fencing owner of every golden session (the default names the host and pid)."""

Mutation = Literal["reorder_tools", "insert_tool", "remove_tool", "change_instructions", "add_tool_parameter",
                   "bump_policy_version"]
MUTATIONS: Final[tuple[Mutation, ...]] = ("reorder_tools", "insert_tool", "remove_tool", "change_instructions",
                                          "add_tool_parameter", "bump_policy_version")
REQUEST_CHANGING: Final[frozenset[Mutation]] = frozenset(MUTATIONS) - {"bump_policy_version"}
"""Mutations that change what every model request carries (instructions or tool schemas). A policy
version is journaled and part of every effect key, but it is not part of any model request."""


@dataclass
class World:
    """What the tools did, recorded by the tool bodies themselves (not by the journal)."""

    executions: list[tuple[str, str]] = field(default_factory=list[tuple[str, str]])
    """``(tool name, step id)`` of every tool body that ran, in order."""

    def ran(self, ctx: ToolContext) -> None:
        self.executions.append((ctx.tool, ctx.step_id))

    @property
    def steps(self) -> list[str]:
        """The step ids whose tool body ran, in order (a step twice means it ran twice)."""
        return [step for _, step in self.executions]


def _digest(*parts: object) -> str:
    return hashlib.sha256("\x00".join(map(str, parts)).encode()).hexdigest()[:8]


# -- tools ------------------------------------------------------------------------------------------


def research_tools(world: World) -> list[Tool]:
    @tool(idempotent=True)
    def search(query: str, ctx: ToolContext) -> list[str]:
        """Search the web; returns result URLs."""
        world.ran(ctx)
        return [f"https://example.org/{_digest(query)}/journal", f"https://example.org/{_digest(query)}/replay"]

    @tool(idempotent=True)
    def fetch_page(url: str, ctx: ToolContext) -> dict[str, Any]:
        """Fetch a web page's text."""
        world.ran(ctx)
        return {"url": url, "text": "A durable agent writes each step down before it acts, and replays it."}

    @tool
    def save_note(title: str, body: str, ctx: ToolContext) -> dict[str, str]:
        """Save a note to the team notebook (not idempotent)."""
        world.ran(ctx)
        return {"note_id": f"note-{_digest(title, body)}"}

    return [search, fetch_page, save_note]


def travel_tools(world: World) -> list[Tool]:
    @tool(idempotent=True)
    def weather(city: str, ctx: ToolContext) -> dict[str, Any]:
        """Today's weather in a city."""
        world.ran(ctx)
        sunny = city == "Lisbon"
        return {"city": city, "sky": "sunny" if sunny else "cloudy", "celsius": 24 if sunny else 19}

    @tool(idempotent=True)
    def local_time(city: str, ctx: ToolContext) -> str:
        """The local time in a city."""
        world.ran(ctx)
        return "14:05 WEST"

    @tool
    def book_hotel(city: str, nights: int, ctx: ToolContext) -> dict[str, Any]:
        """Book a hotel room (not idempotent)."""
        world.ran(ctx)
        return {"booking": f"H-{_digest(city, nights)}", "city": city, "nights": nights}

    return [weather, local_time, book_hotel]


def payments_tools(world: World) -> list[Tool]:
    @tool(idempotent=True)
    def balance(account: str, ctx: ToolContext) -> dict[str, Any]:
        """An account's balance in euros."""
        world.ran(ctx)
        return {"account": account, "eur": 1250}

    @tool
    def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Move money out of the account (not idempotent; needs a person's approval)."""
        world.ran(ctx)
        return {"receipt": f"tr-{_digest(to, amount)}", "to": to, "amount": amount}

    @tool
    def close_account(account: str, ctx: ToolContext) -> dict[str, Any]:
        """Close an account (denied by policy)."""
        world.ran(ctx)
        return {"closed": account}

    return [balance, transfer, close_account]


def support_tools(world: World) -> list[Tool]:
    @tool(idempotent=True)
    def lookup_order(order_id: str, ctx: ToolContext) -> dict[str, Any]:
        """Look an order up."""
        world.ran(ctx)
        return {"order_id": order_id, "customer": "c-881", "total_cents": 1999, "status": "delivered damaged"}

    @tool
    def refund(order_id: str, amount_cents: int, ctx: ToolContext) -> dict[str, Any]:
        """Refund an order (not idempotent)."""
        world.ran(ctx)
        return {"refund": f"rf-{_digest(order_id, amount_cents)}", "amount_cents": amount_cents}

    @tool
    def notify_customer(customer: str, text: str, ctx: ToolContext) -> dict[str, bool]:
        """Send the customer a message (not idempotent)."""
        world.ran(ctx)
        return {"sent": True}

    return [lookup_order, refund, notify_customer]


def _audit_tool(world: World) -> Tool:
    @tool
    def audit(message: str, ctx: ToolContext) -> str:
        """Write an audit line."""
        world.ran(ctx)
        return "logged"

    return audit


def _with_added_parameter(t: Tool, name: str = "reason") -> Tool:
    """``t`` as if its function had gained an optional keyword parameter ``name: str = ""``."""
    fn = t.fn
    sig = inspect.signature(fn)
    added = inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default="", annotation=str)

    def variant(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop(name, None)
        return fn(*args, **kwargs)

    variant.__name__, variant.__doc__ = fn.__name__, fn.__doc__
    variant.__annotations__ = {**get_type_hints(fn), name: str}
    setattr(variant, "__signature__", sig.replace(parameters=[*sig.parameters.values(), added]))  # noqa: B010
    return Tool(variant, name=t.name, description=t.description, idempotent=t.idempotent,
                effect_type=t.effect_type, lookup=t.lookup, business_id=t.business_id, compensation=t.compensation)


# -- programs ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Program:
    """One golden agent program and the scripted model that drives it.

    Attributes:
        script: the model's answer at each position (the number of assistant messages already in
            the request, as :class:`ScriptedGateway` counts them).
        fail_once_at: at this position the first request fails with a transient, provably unsent
            ``GatewayError`` (the loop retries it with the same key).
        empty_once_at: at this position the first answer is an empty generation (rejected, and
            the same request is asked again at the next turn).
        approver: approves every approval the run waits for (``None``: none expected).
        cut_after: the model step whose result ends the truncated journal the mutation tests resume.
    """

    name: str
    task: str
    instructions: str
    tools: Callable[[World], list[Tool]]
    policy_rules: dict[str, Rule] = field(default_factory=dict[str, Rule])
    policy_version: str = "1"
    script: tuple[ModelResponse, ...]
    fail_once_at: int | None = None
    empty_once_at: int | None = None
    approver: str | None = None
    cut_after: str
    covers: tuple[str, ...]

    @property
    def run_id(self) -> str:
        return f"golden-{self.name}"

    @property
    def final_text(self) -> str:
        return self.script[-1].text

    def agent(self, world: World, mutation: Mutation | None = None) -> Agent:
        """The program's agent, or a mutated copy of it (what a code change would produce)."""
        tools = self.tools(world)
        instructions = self.instructions
        policy_version = self.policy_version
        if mutation == "reorder_tools":
            tools = tools[::-1]
        elif mutation == "insert_tool":
            tools = [tools[0], _audit_tool(world), *tools[1:]]
        elif mutation == "remove_tool":
            tools = tools[:-1]
        elif mutation == "change_instructions":
            instructions += " Answer in one sentence."
        elif mutation == "add_tool_parameter":
            tools = [_with_added_parameter(tools[0]), *tools[1:]]
        elif mutation == "bump_policy_version":
            policy_version += "-next"
        else:
            assert mutation is None, mutation
        names = {t.name for t in tools}  # a removed tool takes its policy rule with it (Agent refuses strays)
        return Agent(instructions=instructions, tools=tools, name=self.name, model="scripted-1",
                     policy=Policy({k: v for k, v in self.policy_rules.items() if k in names}, version=policy_version))

    def gateway(self, *, empty_already_returned: bool = False) -> ScriptedGateway:
        """A fresh scripted model. ``gateway.calls`` counts every call, failed ones included.

        Args:
            empty_already_returned: the journal being resumed already holds the empty generation,
                so this gateway must not produce it again.
        """
        fail_at = [self.fail_once_at]
        empty_at = [None if empty_already_returned else self.empty_once_at]
        script = self.script

        def answer(request: ModelRequest) -> ModelResponse:
            position = sum(1 for m in request.messages if m.get("role") == "assistant")
            if position == fail_at[0]:
                fail_at[0] = None
                raise GatewayError("connection refused before the request was sent",
                                   error_class=ErrorClass.TRANSIENT, sent=False)
            if position == empty_at[0]:
                empty_at[0] = None
                return ScriptedGateway.empty()
            return script[min(position, len(script) - 1)]

        return ScriptedGateway(answer)

    def session(self, store: Checkpointer, gateway: ModelGateway, **kwargs: Any) -> Session:
        return Session(self.run_id, gateway, store, owner=OWNER, sleep=_no_sleep, seed=0, **kwargs)


async def _no_sleep(seconds: float) -> None:
    await asyncio.sleep(0)


_call = ScriptedGateway.call
_parallel = ScriptedGateway.parallel
_text = ScriptedGateway.text

PROGRAMS: Final[tuple[Program, ...]] = (
    Program(
        name="research",
        task="Find out how durable agents avoid paying for work twice and save a note about it.",
        instructions="You are a research assistant. Search, read the best source, save one note, then answer.",
        tools=research_tools,
        policy_version="research-1",
        script=(
            _call("search", query="durable execution LLM agents journal"),
            _call("fetch_page", url="https://example.org/journal"),
            _call("save_note", title="Journaling", body="Every step is written down before it acts."),
            _text("Saved note: a durable agent journals each step before acting and replays it on resume."),
        ),
        fail_once_at=2,
        cut_after="t0001.model",
        covers=("multi-turn tool run", "transient model error retried"),
    ),
    Program(
        name="travel",
        task="Book three nights in Lisbon; compare the weather with Porto first.",
        instructions="You are a travel agent. Check the weather and time, then book the hotel.",
        tools=travel_tools,
        policy_version="travel-1",
        script=(
            _parallel(("weather", {"city": "Lisbon"}), ("weather", {"city": "Porto"}),
                      ("local_time", {"city": "Lisbon"})),
            _call("book_hotel", city="Lisbon", nights="three"),
            _call("book_hotel", city="Lisbon", nights=3),
            _text("Booked 3 nights in Lisbon (sunny, 24 °C; Porto is cloudy, 19 °C)."),
        ),
        cut_after="t0001.model",
        covers=("parallel tool calls in one turn", "invalid-arguments repair", "multi-turn tool run"),
    ),
    Program(
        name="payments",
        task="Pay bob 120 EUR from acme and close the acme account.",
        instructions="You are a payments clerk. Check the balance before any transfer.",
        tools=payments_tools,
        policy_rules={"transfer": "require_approval", "close_account": "deny"},
        policy_version="payments-1",
        script=(
            _parallel(("balance", {"account": "acme"}), ("close_account", {"account": "acme"})),
            _call("transfer", to="bob", amount=120),
            _text("Paid 120 EUR to bob. Closing the account was denied by policy."),
        ),
        approver="ana",
        cut_after="t0001.model",
        covers=("parallel tool calls in one turn", "denied call", "approval approved"),
    ),
    Program(
        name="support",
        task="Order A-17 arrived damaged: refund it and tell the customer.",
        instructions="You are a support agent. Look the order up, refund it, notify the customer.",
        tools=support_tools,
        policy_version="support-1",
        script=(
            _call("lookup_order", order_id="A-17"),
            _call("refund", order_id="A-17", amount_cents=1999),
            _call("notify_customer", customer="c-881", text="Your refund of 19.99 EUR is on its way."),
            _text("Refunded 19.99 EUR for order A-17 and told the customer."),
        ),
        empty_once_at=3,
        cut_after="t0001.model",
        covers=("empty generation rejected, then an answer", "multi-turn tool run"),
    ),
)

PROGRAM_BY_RUN_ID: Final[dict[str, Program]] = {p.run_id: p for p in PROGRAMS}


# -- driving a run ----------------------------------------------------------------------------------


async def drive(program: Program, agent: Agent, store: Checkpointer, gateway: ModelGateway,
                **session: Any) -> list[Step]:
    """Run (or resume) the program's run until it ends, approving what it waits for.

    Each pass is a separate :meth:`Agent.run` on a new :class:`Session` (as after a restart).
    Returns every step yielded, over all passes.
    """
    steps: list[Step] = []
    for _ in range(4):
        async for step in agent.run(program.task, session=program.session(store, gateway, **session)):
            steps.append(step)
        if steps and isinstance(steps[-1], FinalStep):
            return steps
        pending = pending_approvals(store, program.run_id)
        assert pending and program.approver is not None, f"{program.name}: stopped without waiting for anyone"
        for appr_id, request in sorted(pending.items()):
            approve(store, program.run_id, appr_id, fingerprint=request["fingerprint"], approver=program.approver,
                    reason="within the daily limit")
    raise AssertionError(f"{program.name}: did not finish")


def resume_choice(recorded: dict[str, Any], current: dict[str, Any]) -> Literal["refuse"] | Migration:
    """How a golden history is resumed by this code.

    Today every fixture was recorded under the current versions, so this is ``"refuse"`` (the
    default, never triggered): the ``schema`` a run records is the event schema
    (``EVENT_SCHEMA_VERSION``), which file schema 2 (compressed payloads) left at 1. After a bump
    of the event schema, histories recorded under an older one differ from the current versions
    in ``schema`` only: a library upgrade, which is accepted by a named migration. Any other
    difference means a program changed, which must stay a :class:`~cuaderno.errors.VersionMismatch`.
    """
    if recorded == current:
        return "refuse"

    def accept_schema_upgrade(old: dict[str, Any], new: dict[str, Any], events: list[StepEvent]) -> dict[str, Any]:
        changed = {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)}
        if changed != {"schema"}:
            raise ValueError(f"not a schema-only upgrade: {sorted(changed)}")
        return {"schema": [old.get("schema"), new.get("schema")]}

    return Migration(name="golden-schema-upgrade", migrate=accept_schema_upgrade)


def checkpoint_json(cp: Checkpoint | None) -> dict[str, Any]:
    """A checkpoint's stored form without its fencing epoch (which counts takeovers, not events)."""
    assert cp is not None
    data = cp.to_json()
    data.pop("epoch")
    return data


def tool_steps_executed(events: Iterable[StepEvent]) -> list[str]:
    """The tool steps of a journal whose body was started: exactly those with a tool intent."""
    return [e.step_id for e in events if e.kind == "tool" and e.phase == "intent"]


def model_calls_made(events: Iterable[StepEvent]) -> int:
    """How many gateway calls a journal's model results cost: one per result, plus its retries."""
    return sum(1 + int((e.payload.get("counters") or {}).get("retries", 0))
               for e in events if e.kind == "model" and e.phase == "result")
