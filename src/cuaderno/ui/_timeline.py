"""A run's journal as steps on a time axis: what the run page draws and opens.

Everything here is computed from the chain-checked events (``checkpoint.verified``); nothing is
written. Times are the events' ``created_at`` (informational in the journal, order comes from
``seq``), so a bar's length is the wall-clock time between a step's first and last row: a model
step's call, a tool's effect, or a person's wait for an approval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from cuaderno.events import StepEvent, shown_payload
from cuaderno.events.payloads import ModelResult, ToolResult, shown_as
from cuaderno.render import dumps, money

__all__ = ["INLINE_EVENTS", "PAYLOAD_SHOWN", "STEPS_SHOWN", "Marker", "Step", "Timeline", "build", "duration_text", "money"]

PAYLOAD_SHOWN: Final = 4_000
"""Characters of a payload shown in a step; the rest behind a link to the whole payload."""

INLINE_EVENTS: Final = 1_200
"""Up to this many events, a run page holds every payload (cut at :data:`PAYLOAD_SHOWN`); past
it, each event links to its payload instead."""

STEPS_SHOWN: Final = 300
"""A run page draws and lists this many steps: by default the last ones, and a long run's others
page by page (earlier / later). Never all at once: a 1000-turn run's 2,001 steps made a page of
2.4 MB that took a second to render, and "show all" of a 10,000-step run one of 15 MB."""

# The picture's geometry, in SVG user units.
_WIDTH: Final = 1000
_LABEL_W: Final = 260
_COST_W: Final = 130
_ROW_H: Final = 22
_TOP: Final = 28
_MIN_BAR: Final = 3.0

_COUNTER_MARKS: Final = (("retries", "retry", "retry"), ("repairs", "repair", "repair"),
                         ("replans", "replan", "replan"), ("reflects", "reflect", "reflect"),
                         ("escalations", "escalated", "escalation"),
                         ("rejected_responses", "rejected response", "rejected"))


@dataclass(frozen=True, slots=True)
class Marker:
    """Something that happened in a step worth seeing in the picture."""

    label: str
    css: str


@dataclass(slots=True)
class Step:
    """The events of one step id, in journal order."""

    index: int
    step_id: str
    kind: str
    name: str | None
    events: list[StepEvent] = field(default_factory=list[StepEvent])
    markers: list[Marker] = field(default_factory=list[Marker])
    cost: float = 0.0
    priced: int = 0
    unpriced: int = 0
    # Geometry, set by build().
    row: int = 0
    x: float = 0.0
    width: float = 0.0
    y: float = 0.0

    @property
    def start(self) -> float:
        return self.events[0].created_at

    @property
    def end(self) -> float:
        return self.events[-1].created_at

    @property
    def cost_text(self) -> str:
        """The step's model cost; unpriced calls are said, never shown as $0."""
        if not self.priced and not self.unpriced:
            return ""
        if self.unpriced and not self.priced:
            return "unpriced" if self.unpriced == 1 else f"{self.unpriced} unpriced"
        text = money(self.cost)
        return f"{text} + {self.unpriced} unpriced" if self.unpriced else text


@dataclass(frozen=True, slots=True)
class Tick:
    x: float
    label: str


@dataclass(slots=True)
class Timeline:
    steps: list[Step]
    ticks: list[Tick]
    width: int = _WIDTH
    height: int = 0
    axis_x0: float = 0.0
    axis_x1: float = 0.0
    span: float = 0.0
    hidden: int = 0
    """Steps before the first one drawn (a long run shows one page of its steps)."""
    after: int = 0
    """Steps after the last one drawn."""
    page: int = 0
    """How many steps a page draws (the ``count`` the timeline was built with)."""

    @property
    def total(self) -> int:
        return self.hidden + len(self.steps) + self.after

    @property
    def earlier(self) -> int | None:
        """The 1-based number of the first step of the page before this one (``None``: none)."""
        return max(0, self.hidden - self.page) + 1 if self.hidden else None

    @property
    def later(self) -> int | None:
        """The 1-based number of the first step of the page after this one (``None``: none)."""
        return self.hidden + len(self.steps) + 1 if self.after else None


def duration_text(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86_400:.1f} d"


def _price(step: Step, cost: Any) -> None:
    if cost is None:
        step.unpriced += 1
    elif isinstance(cost, (int, float)) and not isinstance(cost, bool):
        step.priced += 1
        step.cost = round(step.cost + float(cost), 10)


def _mark(step: Step) -> None:
    """Costs and markers from the step's events (the same payload fields the summary counts)."""
    counters: dict[str, int] = {}
    phases = [ev.phase for ev in step.events]
    for ev in step.events:
        # Read as a model result: every row that carries counters (model intent/error/result,
        # tool result, run) declares them as ModelResult does.
        row = shown_as(ev, ModelResult)
        for name, n in (row.get("counters") or {}).items():
            if isinstance(n, int) and not isinstance(n, bool):
                counters[name] = counters.get(name, 0) + n
        response = row.get("response")
        if ev.kind == "model" and ev.phase == "result" and isinstance(response, dict):
            _price(step, response.get("cost"))
            for esc in response.get("escalations") or ():
                counters["escalations"] = counters.get("escalations", 0) + 1
                _price(step, esc.get("cost") if isinstance(esc, dict) else None)
        if ev.decision in ("deny", "rejected") or shown_as(ev, ToolResult).get("outcome") == "denied":
            step.markers.append(Marker("denied" if ev.decision == "deny" else "rejected by a person", "denied"))
    resends = sum(1 for p in phases if p.startswith("intent."))
    if resends:
        step.markers.append(Marker(f"re-sent ×{resends}", "resend"))
    errors = sum(1 for p in phases if p.startswith("error"))
    if errors:
        step.markers.append(Marker(f"failed attempt ×{errors}", "error"))
    for name, label, css in _COUNTER_MARKS:
        if counters.get(name):
            step.markers.append(Marker(f"{label} ×{counters[name]}", css))
    if any(p.startswith("uncertain") for p in phases):
        step.markers.append(Marker("uncertain", "uncertain"))
    if any(p.startswith("resolution") for p in phases) or any(ev.decision == "resolved" for ev in step.events):
        step.markers.append(Marker("settled by a person", "resolved"))
    if step.kind == "approval" and "request" in phases and "decision" not in phases:
        step.markers.append(Marker("waiting for a person", "waiting"))


def _ticks(x0: float, x1: float, span: float) -> list[Tick]:
    return [Tick(x0 + (x1 - x0) * i / 4, duration_text(span * i / 4) if i else "0") for i in range(5)]


def build(events: Sequence[StepEvent], *, start: int | None = None, count: int | None = None) -> Timeline:
    """The steps of a run, in the order each first appears in the journal, laid out on one axis:
    ``count`` of them from the 0-based ``start`` (by default the last ``count``; every step when
    ``count`` is ``None``). ``Timeline.hidden`` and ``Timeline.after`` say how many are not drawn."""
    by_id: dict[str, Step] = {}
    for ev in events:
        step = by_id.get(ev.step_id)
        if step is None:
            step = by_id[ev.step_id] = Step(index=len(by_id), step_id=ev.step_id, kind=ev.kind, name=ev.name)
        step.events.append(ev)
        if step.name is None and ev.name is not None:
            step.name = ev.name
    steps = list(by_id.values())
    total = len(steps)
    size = total if count is None else max(1, count)
    hidden = max(0, total - size) if start is None else max(0, min(start, total - 1 if total else 0))
    steps = steps[hidden:hidden + size]
    for row, step in enumerate(steps):
        step.row = row
        _mark(step)
    x0, x1 = float(_LABEL_W + 10), float(_WIDTH - _COST_W - 10)
    t0 = min((s.start for s in steps), default=0.0)
    span = max((s.end for s in steps), default=0.0) - t0
    scale = (x1 - x0) / span if span > 0 else 0.0
    for step in steps:
        step.x = x0 + (step.start - t0) * scale
        step.width = max(_MIN_BAR, (step.end - step.start) * scale)
        step.x = min(step.x, x1 - _MIN_BAR)
        step.y = _TOP + step.row * _ROW_H
    return Timeline(steps=steps, ticks=_ticks(x0, x1, span), height=_TOP + len(steps) * _ROW_H + 8,
                    axis_x0=x0, axis_x1=x1, span=span, hidden=hidden, after=total - hidden - len(steps),
                    page=size)


def payload_text(ev: StepEvent) -> tuple[str, bool]:
    """The event's payload as indented JSON for people (unsafe characters escaped), and whether
    it was cut to :data:`PAYLOAD_SHOWN` characters."""
    text = dumps(shown_payload(ev), indent=2)
    if len(text) <= PAYLOAD_SHOWN:
        return text, False
    return text[:PAYLOAD_SHOWN], True
