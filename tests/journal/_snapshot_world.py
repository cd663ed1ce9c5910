"""A long run with every kind of tool outcome, run whole or stopped and resumed, for the snapshot
tests (SQLite and PostgreSQL share it)."""

from __future__ import annotations

from collections import Counter
from contextlib import aclosing, closing
from typing import Any

from cuaderno import Agent, Budgets, ErrorClass, Policy, ScriptedGateway, Session, ToolError, open_journal, tool
from cuaderno.gateway.base import ModelRequest, ModelResponse
from cuaderno.loop import _snapshots


class World:
    """The agent, a gateway factory, and what the tool bodies did (outside the journal)."""

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.ran: Counter[str] = Counter()

        @tool(idempotent=True)
        def note(text: str) -> str:
            """Write a note."""
            self.ran[f"note:{text}"] += 1
            return f"noted {text} " + "x" * 40

        @tool(idempotent=True)
        def fail(text: str) -> str:
            """Always refused by the service."""
            self.ran[f"fail:{text}"] += 1
            raise ToolError(f"refused {text}", error_class=ErrorClass.PERMANENT)

        @tool(idempotent=True)
        def secret(text: str) -> str:
            """Denied by the policy: never runs."""
            self.ran[f"secret:{text}"] += 1
            return text

        self.tools = [note, fail, secret]
        self.agent = Agent(instructions="snapshot world", tools=self.tools,
                           policy=Policy({"secret": "deny"}, version="snap-1"), max_turns=turns + 5,
                           budgets=Budgets(repairs=None, reflects=None))

    def answer(self, request: ModelRequest) -> ModelResponse:
        """Turn t's answer (t: the assistant messages so far): a mix of outcomes, then "done"."""
        t = sum(1 for m in request.messages if m.get("role") == "assistant")
        if t >= self.turns:
            return ScriptedGateway.text("done")
        if t % 7 == 3:
            return ScriptedGateway.parallel(("note", {"text": f"a{t}"}), ("fail", {"text": f"b{t}"}),
                                            call_id=f"c{t}")
        if t % 11 == 5:
            return ScriptedGateway.call("secret", text=f"s{t}")
        if t % 13 == 6:
            return ScriptedGateway.call("nosuch", text=f"u{t}")
        return ScriptedGateway.call("note", text=f"n{t}")

    def gateway(self) -> ScriptedGateway:
        return ScriptedGateway(self.answer)


async def drive(world: World, url: str, run_id: str, gateway: ScriptedGateway, stop_after: int | None = None) -> Any:
    """Run (or resume) ``run_id``; stop after ``stop_after`` steps (results committed, the run
    released, as a worker that is shut down). Returns the last step."""
    last = None
    with closing(open_journal(url)) as store:
        async with aclosing(world.agent.run("task", session=Session(run_id, gateway, store))) as steps:
            n = 0
            async for step in steps:
                last = step
                n += 1
                if stop_after is not None and n >= stop_after:
                    break
    return last


class TailSpy:
    """Records whether each opening went on from a snapshot (``monkeypatch`` it in)."""

    def __init__(self) -> None:
        self.used: list[bool] = []
        self._orig = _snapshots.tail_open

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        got = self._orig(*args, **kwargs)
        self.used.append(got is not None)
        return got


def bodies(gateway: ScriptedGateway) -> list[Any]:
    return [r.body() for r in gateway.requests]
