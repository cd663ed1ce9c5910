"""A ladder of request strategies for an empty 200, each rung a journaled step of its own.

Seed 002 measured two answers to an empty generation (HTTP 200, no text, no tool call): re-send
the same request to the same model (rescued 0 of 36) or escalate to the strong tier (36 of 36 at
about seven times the price). It left a third path as a conjecture: *change the request instead of
the tier*. A :class:`Ladder` makes all of them rungs, tried in order after a rejected answer:

- :class:`Resend`: the same request again (a new step, so a new key: the provider must not hand back
  its stored empty answer);
- :class:`FittingTools`: only the tools the task can use;
- :class:`RelaxToolChoice`: the tool obligation relaxed, ``required`` → ``auto``;
- :class:`NamedTool`: a named tool choice where exactly one tool fits (a grammar on most servers);
- :class:`Escalate`: the same request to the strong tier.

How the loop climbs it (:func:`climb`, called by :mod:`cuaderno.loop._model_steps`): every rung is a
model step like any other (``tNNNN.model``), with an intent journaled before the send and a result
after it, so a resumed run replays it without a new call. Which rung a step is on is a pure function
of the journal: the previous turn's result was rejected with an outcome in :attr:`Ladder.on` → the
next rung after the one the previous intent records (``payload["rung"]["position"]``); otherwise the
original request (position 0). Rejected answers add nothing to the conversation, so every rung
changes the same original request.

- A changed body is a new request: the step's idempotency key is derived from the conversation's
  fingerprint *and* the rung's change (:meth:`Plan.keyed`), never the original's key.
- A rung whose request would be identical to the original or to a rung already tried is skipped
  (it would loop); a rung that would remove every tool the task needs is refused; a rung that does
  not apply (no tools, no second tier, more than one tool fits a named choice) is skipped. Each is
  recorded on the next sent step's intent and counted (``rungs_skipped``, ``rungs_refused``).
- Every rung's rejected answer counts against the run's ``rejected_responses`` cap (per episode),
  an escalation against ``escalations``. When the rungs run out before the cap, the run ends
  ``failed`` with reason ``ladder_exhausted`` and :class:`~cuaderno.errors.LadderExhausted` is raised.

The tier a rung goes to travels beside the request, not in it: :meth:`Plan.routed` sets a context
variable for the duration of the send, which :class:`~cuaderno.gateway.tiered.TieredGateway` reads.
A gateway called without it (a Temporal activity, a direct call) sees a plain request and behaves as
it always did.
"""

from __future__ import annotations

import contextvars
import dataclasses
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn, Protocol, TypedDict, TypeVar

from cuaderno.errors import LadderExhausted, UsageError
from cuaderno.events import StepEvent, model_step_id
from cuaderno.fingerprint import chain, fingerprint
from cuaderno.gateway.base import ModelRequest
from cuaderno.gateway.empty import Outcome

__all__ = [
    "DEFAULT_LADDER",
    "DEFAULT_LADDER_ON",
    "LADDER_BUDGET",
    "Escalate",
    "Exhausted",
    "Fit",
    "FittingTools",
    "Ladder",
    "NamedTool",
    "Plan",
    "RelaxToolChoice",
    "Resend",
    "Rung",
    "Skip",
    "climb",
    "current_route",
    "keyword_fit",
]

LADDER_BUDGET = "ladder"
"""The budget name in a run's failure record when its ladder ran out."""

DEFAULT_LADDER_ON = frozenset({Outcome.EMPTY, Outcome.NO_TOOL_CALL})
"""Rejected outcomes that climb the ladder. Refusals do not (a policy decision, not a capacity one);
an invalid structured answer is sent back with its errors instead (:mod:`cuaderno.gateway.structured`)."""

_T = TypeVar("_T")
_ROUTE: contextvars.ContextVar[str | None] = contextvars.ContextVar("cuaderno_ladder_route", default=None)

Fit = Callable[[ModelRequest], Iterable[str]]
"""Which tools the task of a request can use, by name (the agent knows best; see :func:`keyword_fit`)."""

_GENERIC = frozenset({"get", "set", "fetch", "find", "run", "call", "tool", "the", "and", "for", "with", "from",
                      "make", "use", "query", "lookup", "current", "do"})
_WORD = re.compile(r"[a-z0-9]+")
_PARTS = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


def _norm(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") else word


def keyword_fit(request: ModelRequest) -> list[str]:
    """The default :data:`Fit`: the tools a word of whose name appears in the last user message.

    ``get_weather`` fits "what's the weather in Lima?", ``convert_currency`` fits "convert 20
    dollars"; generic parts (``get``, ``find``, ``current``...) never match, plurals and a shared
    five-letter stem do (``translate``/``translation``). A heuristic: an agent that knows which
    tools a task needs passes its own ``fit``.
    """
    text = next((str(m.get("content") or "") for m in reversed(request.messages) if m.get("role") == "user"), "")
    words = {_norm(w) for w in _WORD.findall(text.lower())}
    stems = {w[:5] for w in words if len(w) >= 5}
    out = []
    for tool in request.tools:
        name = str(tool.get("name", ""))
        parts = {_norm(p.lower()) for p in _PARTS.split(name) if len(p) >= 3} - _GENERIC
        if any(p in words or (len(p) >= 5 and p[:5] in stems) for p in parts):
            out.append(name)
    return out


@dataclass(frozen=True, slots=True)
class Skip:
    """A rung that sends nothing this time, and why (journaled on the next sent step's intent)."""

    why: str
    refused: bool = False
    """The rung would remove every tool the task needs: refused, counted in ``rungs_refused``."""


@dataclass(frozen=True, slots=True)
class _Change:
    request: ModelRequest
    tier: str
    changed: bool
    """A changed-request rung (an identical result is then a loop, and skipped)."""


class Rung(Protocol):
    """One strategy. ``name`` is journaled; :meth:`apply` must be a pure function of its arguments."""

    @property
    def name(self) -> str: ...

    def apply(self, request: ModelRequest, tiers: tuple[str, ...]) -> _Change | Skip:
        """The request to send instead of ``request`` (the original), or why not this time."""
        ...


def _narrowed(fit: Fit, request: ModelRequest, tiers: tuple[str, ...], *, named: bool) -> _Change | Skip:
    """The request with only the tools ``fit`` names, in the request's order, to the first tier: both
    narrowing rungs are this one selection. ``named`` (:class:`NamedTool`): only where exactly one
    tool fits, and with the obligation to call it; else (:class:`FittingTools`) the obligation unchanged."""
    if not request.tools:
        return Skip("the request has no tools")
    wanted = set(fit(request))
    tools = tuple(t for t in request.tools if t.get("name") in wanted)
    if not tools:
        return Skip("it would remove every tool the task needs (no tool fits)", refused=True)
    if not named:
        return _Change(dataclasses.replace(request, tools=tools), tiers[0], changed=True)
    if len(tools) > 1:
        return Skip(f"{len(tools)} tools fit, a named choice needs one")
    return _Change(dataclasses.replace(request, tools=tools, require_tool=True), tiers[0], changed=True)


@dataclass(frozen=True, slots=True)
class Resend:
    """The same request to the same tier, as a new step with a new key."""

    name: str = "resend"

    def apply(self, request: ModelRequest, tiers: tuple[str, ...]) -> _Change | Skip:
        return _Change(request, tiers[0], changed=False)


@dataclass(frozen=True, slots=True)
class FittingTools:
    """Only the tools ``fit`` says the task can use (the obligation unchanged)."""

    fit: Fit = keyword_fit
    name: str = "fitting_tools"
    _named: ClassVar[bool] = False
    """Whether the rung names the one tool that fits (:class:`NamedTool`)."""

    def apply(self, request: ModelRequest, tiers: tuple[str, ...]) -> _Change | Skip:
        return _narrowed(self.fit, request, tiers, named=self._named)


@dataclass(frozen=True, slots=True)
class RelaxToolChoice:
    """The tool obligation relaxed: ``required`` → ``auto`` (a text answer is then accepted)."""

    name: str = "relax_tool_choice"

    def apply(self, request: ModelRequest, tiers: tuple[str, ...]) -> _Change | Skip:
        return _Change(dataclasses.replace(request, require_tool=False), tiers[0], changed=True)


@dataclass(frozen=True, slots=True)
class NamedTool(FittingTools):
    """Where exactly one tool fits: only that tool, and the obligation to call it (a named
    ``tool_choice``, which OpenAI-compatible servers turn into a grammar). The same selection as
    :class:`FittingTools` (its ``fit``), narrowed to one tool."""

    name: str = "named_tool"
    _named: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class Escalate:
    """The same request to a stronger tier (the last one unless ``tier`` names another)."""

    tier: str | None = None
    name: str = "escalate"

    def apply(self, request: ModelRequest, tiers: tuple[str, ...]) -> _Change | Skip:
        target = self.tier or tiers[-1]
        if target not in tiers:
            return Skip(f"no tier {target!r} (tiers: {', '.join(tiers)})")
        if target == tiers[0]:
            return Skip("no stronger tier to escalate to")
        return _Change(request, target, changed=True)


class RungChange(TypedDict):
    """What a rung sends, as its step's intent journals it (``rung``): its fingerprint is chained
    into the step's key, and the next step climbs from ``position``."""

    rung: str | None
    position: int
    tier: str | None
    tools: list[str]
    """The names of the tools it sends."""
    require_tool: bool


class SkippedRung(TypedDict):
    """A rung the climb passed over, and why, as the intent of the next rung sent (or the
    run's end, when none is left) journals it. Evidence: replay reads only ``refused`` (counted
    in ``rungs_refused``, the rest in ``rungs_skipped``)."""

    rung: str
    position: int
    why: str
    refused: bool
    """It would have removed every tool the task needs (refused), rather than changed nothing."""


class PlanIntent(TypedDict, total=False):
    """What a rung's step intent adds to its payload (:meth:`Plan.intent_extra`)."""

    rung: RungIntent
    counters: dict[str, int]


class RungIntent(RungChange):
    """:class:`RungChange` with the rungs skipped to reach it."""

    skipped: list[SkippedRung]


@dataclass(frozen=True, slots=True)
class Plan:
    """What one model step sends: the request, its tier, and how it got there.

    ``position`` is 0 for the original request and ``i + 1`` for ``rungs[i]``; the intent records it
    (with the skipped rungs) so the next step knows where to continue.
    """

    request: ModelRequest
    tier: str | None
    position: int = 0
    rung: str | None = None
    skipped: tuple[SkippedRung, ...] = ()
    counters: Mapping[str, int] = field(default_factory=dict[str, int])

    def keyed(self, fp: str) -> str:
        """The body fingerprint the step's idempotency key is derived from: ``fp`` itself for the
        original request, else chained with the change (a changed body never reuses a key)."""
        if self.rung is None:
            return fp
        return chain(fp, fingerprint(self.change()))

    def change(self) -> RungChange:
        """The journaled description of what this rung sends (plain JSON)."""
        return {"rung": self.rung, "position": self.position, "tier": self.tier,
                "tools": [str(t.get("name")) for t in self.request.tools], "require_tool": self.request.require_tool}

    def intent_extra(self, *, first: bool) -> PlanIntent:
        """What the step's intent records of the plan: the rung (and, on a step's first intent
        only, its counters: a re-send after a crash must not count the rung twice); nothing for
        the original request (journaled exactly as without a ladder)."""
        if self.rung is None:
            return {}
        extra: PlanIntent = {"rung": {**self.change(), "skipped": list(self.skipped)}}
        if first and self.counters:
            extra["counters"] = dict(self.counters)
        return extra

    def on_result(self) -> dict[str, int]:
        """What the step's result payload records of the plan: ``{"rung": position}`` for a rung
        (the next step climbs from there), nothing for the original request (journaled as before)."""
        return {} if self.rung is None else {"rung": self.position}

    async def routed(self, send: Awaitable[_T]) -> _T:
        """Await ``send`` with this plan's tier visible to the gateway (:func:`current_route`)."""
        token = _ROUTE.set(self.tier)
        try:
            return await send
        finally:
            _ROUTE.reset(token)


@dataclass(frozen=True, slots=True)
class Exhausted:
    """No rung is left to try."""

    skipped: tuple[SkippedRung, ...]


def current_route() -> str | None:
    """The tier the loop's ladder sends the current request to (``None``: not under a ladder)."""
    return _ROUTE.get()


def _signature(change: _Change) -> tuple[Any, ...]:
    return (change.tier, tuple(str(t.get("name")) for t in change.request.tools), change.request.require_tool)


@dataclass(frozen=True, slots=True)
class Ladder:
    """The rungs tried, in order, after an answer rejected with an outcome in ``on``.

    An empty ladder is "no recovery": the first rejected answer ends the run (``ladder_exhausted``).
    """

    rungs: tuple[Rung, ...] = ()
    on: frozenset[Outcome] = DEFAULT_LADDER_ON

    def __post_init__(self) -> None:
        object.__setattr__(self, "rungs", tuple(self.rungs))
        object.__setattr__(self, "on", frozenset(Outcome(o) for o in self.on))
        for rung in self.rungs:
            if not callable(getattr(rung, "apply", None)) or not isinstance(getattr(rung, "name", None), str):
                raise UsageError(f"{rung!r:.80} is not a ladder rung (Resend, FittingTools, RelaxToolChoice, "
                                 "NamedTool, Escalate)")
        if Outcome.OK in self.on:
            raise UsageError("a ladder climbs on rejected outcomes only, not on 'ok'")

    @property
    def names(self) -> tuple[str, ...]:
        """The rungs' names, in order."""
        return tuple(r.name for r in self.rungs)

    def plan(self, request: ModelRequest, start: int, tiers: tuple[str, ...]) -> Plan | Exhausted:
        """The first rung from ``rungs[start]`` on that sends something new for ``request``.

        The rungs before ``start`` are applied again (they are pure) only to know which requests
        this climb already sent: a changed rung identical to one of them, or to the original, is a
        loop and is skipped.
        """
        if not tiers:
            raise UsageError("a ladder needs at least one tier")
        tried = {_signature(_Change(request, tiers[0], changed=False))}
        skipped: list[SkippedRung] = []
        for index, rung in enumerate(self.rungs):
            change = rung.apply(request, tiers)
            if index < start:
                if isinstance(change, _Change):
                    tried.add(_signature(change))
                continue
            if isinstance(change, Skip):
                skipped.append({"rung": rung.name, "position": index + 1, "why": change.why,
                                "refused": change.refused})
                continue
            sig = _signature(change)
            if change.changed and sig in tried:
                skipped.append({"rung": rung.name, "position": index + 1, "refused": False,
                                "why": "identical to a request already sent in this climb (it would loop)"})
                continue
            counters = {"ladder_rungs": 1}
            refused = sum(1 for s in skipped if s["refused"])
            if refused:
                counters["rungs_refused"] = refused
            if len(skipped) - refused:
                counters["rungs_skipped"] = len(skipped) - refused
            if change.tier != tiers[0]:
                counters["escalations"] = 1
            return Plan(request=change.request, tier=change.tier, position=index + 1, rung=rung.name,
                        skipped=tuple(skipped), counters=counters)
        return Exhausted(tuple(skipped))


DEFAULT_LADDER = Ladder((NamedTool(), Escalate()))
"""The ladder :class:`~cuaderno.gateway.tiered.TieredGateway` climbs by default. In
``benchmarks/empty_generations.py`` (README, "Empty generations: the ladder"; 150 turns per arm)
the named tool alone was the cheapest ladder at the best answered rate (149/150, 0.96x the cost of
no recovery); escalation behind it costs nothing while the named tool answers (no strong call in
150 turns) and rescues the tasks where no single tool fits, where the named rung is refused."""


class _Loop(Protocol):
    """What :func:`climb` reads of the loop (:class:`cuaderno.loop._state.RunState`)."""

    run_id: str
    epoch: int
    journal: dict[tuple[str, str], StepEvent]
    pending: list[StepEvent]

    def charge(self, counters: dict[str, int]) -> None: ...

    def commit(self) -> None: ...

    @property
    def store(self) -> Any: ...


def climb(loop: _Loop, gateway: object, turn: int, request: ModelRequest) -> Plan:
    """The plan for turn ``turn``'s model step: the original ``request`` (no ladder, or the previous
    answer was accepted), or the ladder's next rung after a rejected previous answer.

    Charges the rung's counters when the step has no intent yet (a re-send after a crash was
    counted the first time). When no rung is left, journals the run's end (``failed``, reason
    ``ladder_exhausted``) and raises :class:`~cuaderno.errors.LadderExhausted`.
    """
    ladder = getattr(gateway, "ladder", None)
    if not isinstance(ladder, Ladder):
        return Plan(request=request, tier=None)
    tiers = tuple(getattr(gateway, "names", ("default",)))
    start = _start(loop, turn, ladder)
    if start is None:
        return Plan(request=request, tier=tiers[0])
    plan = ladder.plan(request, start, tiers)
    first = (model_step_id(turn), "intent") not in loop.journal
    if isinstance(plan, Exhausted):
        _exhausted(loop, ladder, plan, turn)
    if first:
        loop.charge(dict(plan.counters))
    return plan


def _start(loop: _Loop, turn: int, ladder: Ladder) -> int | None:
    """Where this turn climbs from (``None``: it sends the original request).

    Reads the previous turn's result: from the journal index on a resume, or, in the process that
    just made it, from the events waiting for the commit that carries this turn's intent.
    """
    if turn == 0:
        return None
    key = (model_step_id(turn - 1), "result")
    result = loop.journal.get(key) or next(
        (ev for ev in reversed(loop.pending) if (ev.step_id, ev.phase) == key), None)
    if result is None:
        return None
    verdict = result.payload.get("verdict") or {}
    if verdict.get("outcome") not in ladder.on:
        return None
    position = result.payload.get("rung", 0)
    return position if type(position) is int and position >= 0 else 0


def _exhausted(loop: _Loop, ladder: Ladder, plan: Exhausted, turn: int) -> NoReturn:
    skipped = list(plan.skipped)
    payload: dict[str, object] = {"status": "failed", "reason": "ladder_exhausted", "budget": LADDER_BUDGET,
                                  "limit": len(ladder.rungs), "rungs": list(ladder.names), "skipped": skipped,
                               "turn": turn}
    loop.commit()  # the rejected answer that ended the climb lands before the record that ends the run
    loop.store.append([StepEvent(run_id=loop.run_id, step_id="run", phase="end", kind="run", payload=payload)],
                      epoch=loop.epoch)
    raise LadderExhausted(loop.run_id, list(ladder.names), skipped)
