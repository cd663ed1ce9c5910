"""What the ``cuaderno`` command line shows: plain data for ``--json`` and rich renderings for people.

Everything shown here comes from a journal, and a journal holds text a model wrote (tool
arguments, answers, error messages). So nothing from it is ever parsed as rich markup or emoji
codes, and control, format and bidirectional characters (terminal escapes, ``\\r``, right-to-left
overrides, invisible tag characters) are shown as ``\\uXXXX`` escapes: a person approving a call
must see exactly what will run, not what a crafted string makes the terminal draw.
"""

from __future__ import annotations

import json
import shlex
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, NotRequired, TypedDict

from rich import box
from rich.console import Console
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from cuaderno.checkpoint import COUNTERS, Checkpoint, cost_upper_usd
from cuaderno.events import EventHeader, StepEvent, shown_payload
from cuaderno.events.payloads import ApprovalDecision, ModelResult, PendingApproval, ToolResult, shown_as

if TYPE_CHECKING:
    from cuaderno.journal import Offloaded
    from cuaderno.operations import RunState

__all__ = [
    "COUNTER_GROUPS",
    "ENDED_STATUSES",
    "GROUPED_COUNTERS",
    "CompensationState",
    "CostSummary",
    "RunSummary",
    "StateFields",
    "TimelineRow",
    "approval_step",
    "clean",
    "cost_summary",
    "cost_text",
    "counted",
    "counter_groups",
    "dumps",
    "money",
    "render_decision",
    "render_pending_call",
    "render_runs",
    "render_show",
    "run_detail",
    "run_summary",
]

_UNSAFE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})

ENDED_STATUSES: Final = frozenset({"completed", "failed", "cancelled"})
"""Statuses after which nothing of the run runs again: an approval still requested there is not
pending any more (no decision is accepted, and the cancellation record lists it as not started)."""

# How the counters are grouped for people; every name in COUNTERS appears exactly once.
COUNTER_GROUPS: Final[tuple[tuple[str, tuple[tuple[str, str], ...]], ...]] = (
    ("model", (("model_calls", "calls"), ("model_sends", "sends"),
               ("possibly_billed_twice", "possibly billed twice"), ("rejected_responses", "rejected responses"))),
    ("billing", (("calls_paid", "calls paid"), ("unpriced_calls", "unpriced"))),
    ("tokens", (("input_tokens", "input"), ("output_tokens", "output"), ("cached_tokens", "cached"),
                ("reasoning_tokens", "reasoning"))),
    ("tools", (("tool_calls", "calls"), ("tool_denied", "denied"), ("tool_errors", "errors"),
               ("approvals_requested", "approvals requested"))),
    ("recovery", (("retries", "retries"), ("repairs", "repairs"), ("replans", "replans"),
                  ("reflects", "reflects"), ("escalations", "escalations"))),
    ("effects", (("uncertain", "ever uncertain"), ("reconciled", "reconciled by a lookup"))),
)
GROUPED_COUNTERS: Final = frozenset(name for _, names in COUNTER_GROUPS for name, _ in names)


# -- text safety -------------------------------------------------------------------------------------


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, so escaped JSON stays valid JSON
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def clean(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control, format, bidi, separator, private or unassigned character escaped."""
    if text.isascii() and text.isprintable():
        return text
    return "".join(ch if (keep_newlines and ch == "\n") or unicodedata.category(ch) not in _UNSAFE_CATEGORIES
                   else _escape_char(ch) for ch in text)


def dumps(value: Any, *, indent: int | None = None) -> str:
    """``value`` as JSON for people: readable Unicode, unsafe characters escaped, still valid JSON."""
    text = json.dumps(value, indent=indent, ensure_ascii=False, separators=None if indent else (", ", ": "))
    return clean(text, keep_newlines=indent is not None)


def _line(console: Console, *parts: str | Text) -> None:
    text = Text()
    for part in parts:
        text.append(part)
    console.print(text, soft_wrap=True)


def _heading(console: Console, title: str) -> None:
    console.print()
    console.print(Text(title, style="bold"), soft_wrap=True)


# -- plain data (also the --json shapes) --------------------------------------------------------------


class CostSummary(TypedDict):
    """A run's cost in ``--json`` output (``cost``): never hides unpriced calls."""

    usd: float
    """The sum of priced calls only."""
    calls_paid: int
    unpriced_calls: int
    complete: bool
    """``usd`` is the whole cost: no call was unpriced."""
    upper_usd: NotRequired[float | None]
    """``show --json``: what the providers may have billed (known + possibly doubled); ``None``
    when the events were not read (``--no-timeline``)."""


class StateFields(TypedDict, total=False):
    """What the run does now (:func:`cuaderno.operations.run_state`); absent when not asked."""

    state: str
    waiting_for: str | None
    held_by: str | None


class RunSummary(StateFields):
    """One row of ``cuaderno list --json``."""

    run_id: str
    status: str
    next_step: str
    model_calls: int
    tool_calls: int
    cost: CostSummary
    pending_approvals: int
    uncertain: int


class TimelineRow(EventHeader):
    """One event of ``show --json``'s ``timeline``: the row's header, never its payload."""

    seq: int
    created_at: str
    """ISO 8601, UTC, to the millisecond."""


class CompensationState(TypedDict):
    """Where one compensation a cancellation scheduled stands (``show --json``'s ``compensations``)."""

    step_id: str
    """The compensation's own step (``cleanupNN``)."""
    for_step: object
    """The step whose effect it undoes, as the cancellation record names it."""
    state: str


def cost_summary(cp: Checkpoint) -> CostSummary:
    """What the run cost, never hiding unpriced calls: ``usd`` is the sum of priced calls only."""
    unpriced = cp.count("unpriced_calls")
    return {"usd": cp.cost_usd, "calls_paid": cp.count("calls_paid"), "unpriced_calls": unpriced,
            "complete": unpriced == 0}


def _counters(cp: Checkpoint) -> dict[str, int]:
    out = {name: cp.count(name) for name in COUNTERS}
    out.update({name: n for name, n in sorted(cp.counters.items()) if name not in out})
    return out


def counter_groups(cp: Checkpoint) -> list[tuple[str, list[tuple[str, int]]]]:
    """The run's counters as people read them (the CLI's ``show`` and the page): each group of
    :data:`COUNTER_GROUPS` with its labels and counts, then ``other`` with any counter this file
    does not name yet, by name (a counter added later is still shown, never dropped)."""
    groups = [(group, [(label, cp.count(name)) for name, label in names]) for group, names in COUNTER_GROUPS]
    others = [(name, n) for name, n in sorted(cp.counters.items()) if name not in GROUPED_COUNTERS]
    return groups + ([("other", others)] if others else [])


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 call``, ``2 calls``: a count with its noun in the right number."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def _pending(cp: Checkpoint) -> Mapping[str, Mapping[str, Any]]:
    """The approvals a person can still decide: none once the run ended, whatever it requested."""
    return {} if cp.status in ENDED_STATUSES else cp.pending


def _pending_list(cp: Checkpoint) -> list[Mapping[str, Any]]:
    return [{"step_id": step_id, **entry} for step_id, entry in sorted(_pending(cp).items())]


def _state_fields(state: RunState | None) -> StateFields:
    """``state``, ``waiting_for`` and ``held_by`` (see :func:`cuaderno.operations.run_state`):
    what the run does now. ``status`` is the journal's; ``state`` is ``running`` only while a live
    process holds the run."""
    if state is None:
        return {}
    return {"state": state["state"], "waiting_for": state["waiting_for"], "held_by": state["held_by"]}


def run_summary(cp: Checkpoint, state: RunState | None = None) -> RunSummary:
    """One row of ``cuaderno list --json``."""
    return {"run_id": cp.run_id, "status": cp.status, **_state_fields(state), "next_step": cp.next_step,
            "model_calls": cp.count("model_calls"), "tool_calls": cp.count("tool_calls"),
            "cost": cost_summary(cp), "pending_approvals": len(_pending(cp)), "uncertain": len(cp.uncertain)}


def iso_time(ts: float) -> str:
    """A journal time (Unix seconds) as ISO 8601 in UTC, to the millisecond: ``2026-12-04T18:31:07.123Z``."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _event_json(ev: StepEvent) -> TimelineRow:
    return {"seq": ev.seq, "step_id": ev.step_id, "phase": ev.phase, "kind": ev.kind, "name": ev.name,
            "decision": ev.decision, "fingerprint": ev.fingerprint, "created_at": iso_time(ev.created_at)}


def run_detail(cp: Checkpoint, events: Sequence[StepEvent] | None,
               state: RunState | None = None, *, offloaded: Sequence[Offloaded] = ()) -> dict[str, object]:
    """``cuaderno show --json``: the checkpoint, every counter, the offloaded payloads (count, bytes,
    and each one's step, size and content digest), and the timeline unless ``events`` is None."""
    cost = cost_summary(cp)
    # What the providers may have billed: known + possibly doubled (computed from the events;
    # None when they were not read, --no-timeline).
    cost["upper_usd"] = cost_upper_usd(cp, events) if events is not None else None
    out: dict[str, object] = {
        "run_id": cp.run_id, "status": cp.status, **_state_fields(state), "open": cp.is_open, "next_step": cp.next_step,
        "last_seq": cp.last_seq, "epoch": cp.epoch, "versions": cp.versions,
        "task_fingerprint": cp.task_fingerprint, "counters": _counters(cp), "cost": cost,
        "pending_approvals": _pending_list(cp), "uncertain": cp.uncertain, "outcome": cp.outcome,
    }
    out["offloaded"] = {"payloads": len(offloaded), "bytes": sum(o.size for o in offloaded),
                        "each": [{"step_id": o.step_id, "phase": o.phase, "size": o.size, "sha256": o.sha256}
                                 for o in offloaded]}
    if events is not None:
        out["compensations"] = compensations(cp, events)
        out["timeline"] = [_event_json(ev) for ev in events]
    return out


def approval_step(step: str) -> str:
    """The approval step id named by ``step`` (an approval step id or its tool step id)."""
    return step if step.endswith(".approval") else f"{step}.approval"


# -- renderings ---------------------------------------------------------------------------------------


def money(usd: float) -> str:
    """A dollar amount as the CLI and the page show it: six decimals, or three significant digits
    below a millionth (a cheap call must not show as $0.000000)."""
    if usd == 0 or abs(usd) >= 0.000001:
        return f"${usd:.6f}"
    return f"${usd:.3g}"


def cost_text(cp: Checkpoint, *, short: bool) -> str:
    """The cost for people: unpriced calls are said, never folded into a $0 (``short`` for a table cell)."""
    cost = cost_summary(cp)
    paid, unpriced = cost["calls_paid"], cost["unpriced_calls"]
    if unpriced and not paid:
        return f"unpriced: {unpriced}" if short else \
            f"unknown, unpriced: {unpriced} call(s) carried no price (this is not $0)"
    if unpriced:
        return f">= {money(cp.cost_usd)}, unpriced: {unpriced}" if short else \
            f"at least {money(cp.cost_usd)} for {paid} priced call(s), unpriced: {unpriced} call(s) not included"
    return money(cp.cost_usd) if short else f"{money(cp.cost_usd)} for {paid} priced call(s)"


def render_runs(console: Console, runs: Iterable[Checkpoint],
                states: dict[str, RunState] | None = None) -> None:
    """``cuaderno list``."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    # Narrow terminals fold the run id and the cost rather than drop a column. The counts' titles
    # take two lines, so a usual row (short run id, needs_human, a plain cost) fits 80 columns.
    table.add_column("RUN", overflow="fold", min_width=12)
    table.add_column("STATUS", overflow="fold", min_width=9)
    table.add_column("MODEL\nCALLS", justify="right")
    table.add_column("TOOL\nCALLS", justify="right")
    table.add_column("COST", overflow="fold", min_width=10)
    table.add_column("PENDING", justify="right")
    table.add_column("UNCERTAIN", justify="right")
    for cp in runs:
        status = Text(clean(cp.status), style=_status_style(cp.status))
        now = states.get(cp.run_id) if states is not None else None
        if cp.status == "running" and states is not None and (now is None or now["state"] != "running"):
            status = Text("waiting", style="yellow")  # nothing runs it: never shown as running
        table.add_row(Text(clean(cp.run_id)), status, str(cp.count("model_calls")), str(cp.count("tool_calls")),
                      Text(cost_text(cp, short=True)), str(len(_pending(cp))), str(len(cp.uncertain)))
    _print_table(console, table)


def _fits(console: Console, table: Table) -> bool:
    """Whether rich lays ``table`` out within the terminal. Its measured minimum is not enough: after
    rich narrows the widest columns, a column's ``min_width`` can widen it back, and the terminal
    then crops the last column (its cells vanish). So the table is laid out for the terminal's
    width and rendered without cropping, and its real width is compared."""
    wide = console.options.update_width(1_000_000)
    if console.measure(table, options=wide).minimum > console.width:
        return False
    table.width = console.width
    try:
        lines = console.render_lines(table, wide, pad=False)
    finally:
        table.width = None
    return all(Segment.get_line_length(line) <= console.width for line in lines)


def _print_table(console: Console, table: Table) -> None:
    """The table, or one line per row when the terminal is too narrow for it (rich would crop cells)."""
    if _fits(console, table):
        console.print(table)
        return
    titles = ["_".join(str(column.header).lower().split()) for column in table.columns]
    for row in zip(*(column.cells for column in table.columns), strict=True):
        line = Text()
        for title, cell in zip(titles, row, strict=True):
            value = cell if isinstance(cell, Text) else Text(str(cell))
            if value.plain:
                line.append(" " if line else "").append(f"{title}=", style="dim").append(value)
        console.print(line, soft_wrap=True)


def _status_style(status: str) -> str:
    return {"completed": "green", "suspended": "yellow", "needs_human": "bold red", "failed": "red",
            "cancelled": "magenta"}.get(status, "")


def _kv(console: Console, key: str, value: str | Text) -> None:
    _line(console, Text(f"{key:<11} ", style="dim"), value)


def command_line(db: str | None, *words: str) -> str:
    """A ``cuaderno`` command a person can paste as is: every word quoted for the shell, and the
    journal named (``--db``) when the command being run named one."""
    head = ["cuaderno"] + (["--db", db] if db else [])
    return " ".join(shlex.quote(w) for w in [*head, *words])


def max_cost_text(cp: Checkpoint, upper: float) -> str:
    """The upper bound for people: the known cost plus every call possibly billed twice, at the
    price its answer had (``show``'s "max cost" line). Unpriced calls are in neither figure."""
    twice = cp.count("possibly_billed_twice")
    unpriced = cp.count("unpriced_calls")
    text = f"{money(upper)}" + (f" (known {money(cp.cost_usd)} + {counted(twice, 'call')} possibly billed twice)"
                                 if twice else " (no call possibly billed twice)")
    return text + (f", unpriced: {unpriced} call(s) not included" if unpriced else "")


def render_show(console: Console, cp: Checkpoint, events: Sequence[StepEvent] | None, *,
                db: str | None = None, state: RunState | None = None, offloaded: Sequence[Offloaded] = ()) -> None:
    """``cuaderno show``: status, versions, counters, cost, approvals, uncertain effects, outcome, timeline.

    Every command it suggests pastes as is: quoted, with ``--db`` naming the same journal."""
    _kv(console, "run", clean(cp.run_id))
    if state is not None and cp.status == "running" and state["state"] != "running":
        # The journal says running, but no live process holds the run: say what would move it on.
        _kv(console, "status", Text(clean(f"{state['summary']} (journal status: running)"), style="yellow"))
    else:
        _kv(console, "status", Text(clean(cp.status), style=_status_style(cp.status)))
        if state is not None and state["summary"] != cp.status:
            _kv(console, "now", clean(state["summary"]))
    _kv(console, "next step", clean(cp.next_step))
    _kv(console, "last seq", f"{cp.last_seq} (epoch {cp.epoch})")
    _kv(console, "task", clean(cp.task_fingerprint or "-"))
    versions = ", ".join(f"{k}={v if isinstance(v, str) else dumps(v)}" for k, v in cp.versions.items())
    _kv(console, "versions", clean(versions) or "-")

    _heading(console, "Counters")
    for group, counts in counter_groups(cp):
        _kv(console, f"  {group}", ", ".join(f"{clean(label)} {n}" for label, n in counts))
    _kv(console, "  cost", cost_text(cp, short=False))
    if events is not None:
        _kv(console, "  max cost", max_cost_text(cp, cost_upper_usd(cp, events)))
    if offloaded:
        _kv(console, "  offloaded", f"{counted(len(offloaded), 'payload')}, {sum(o.size for o in offloaded):,} bytes "
                                    "of JSON (kept once each, by content, in the journal's blob table)")

    pending = _pending_list(cp)
    _heading(console, f"Pending approvals: {len(pending)}")
    for entry in pending:
        _render_pending_entry(console, cp, entry, db=db)
    if cp.pending and not pending:
        # Still requested in the journal, but the run ended: say so rather than offer a decision
        # that would be refused.
        _heading(console, f"Approvals that will not run: {len(cp.pending)} (the run ended {clean(cp.status)})")
        for step_id, entry in sorted(cp.pending.items()):
            _render_pending_entry(console, cp, {"step_id": step_id, **entry}, decidable=False, db=db)

    _heading(console, f"Uncertain effects: {len(cp.uncertain)}")
    for step_id, evidence in sorted(cp.uncertain.items()):
        tool = evidence.get("tool")
        _line(console, "  ", clean(step_id), f"  tool {clean(str(tool))}" if tool is not None else "")
        _line(console, "    evidence     ", dumps(evidence))
        happened = command_line(db, "resolve", cp.run_id, step_id, "--happened")
        not_happened = command_line(db, "resolve", cp.run_id, step_id, "--not-happened")
        if cp.status not in ENDED_STATUSES:
            _line(console, "    settle with  ", clean(happened),
                  Text("   (it exists: the resume goes on; add --result JSON for its receipt)", style="dim"))
            _line(console, "                 ", clean(not_happened),
                  Text("   (it does not: the resume sends it again, same effect key)", style="dim"))
        elif cp.status == "cancelled":
            # Settling it still matters: a confirmed effect (or compensation) is then undone or
            # recorded by compensate(); nothing is sent for a closed run's own steps.
            again = "compensate() sends it again" if step_id.startswith("cleanup") else "nothing is sent"
            _line(console, "    settle with  ", clean(happened),
                  Text("   (it exists: compensate() then schedules or records its compensation)", style="dim"))
            _line(console, "                 ", clean(not_happened),
                  Text(f"   (it does not: {again})", style="dim"))

    _heading(console, "Outcome")
    outcome = dumps(cp.outcome, indent=2).replace("\n", "\n  ") if cp.outcome is not None else "- (not ended)"
    _line(console, "  ", outcome)

    cleanup = compensations(cp, events) if events is not None else []
    if cleanup:
        _heading(console, f"Compensations: {len(cleanup)}")
        for entry in cleanup:
            _line(console, "  ", clean(entry["step_id"]), f"  for {clean(str(entry['for_step']))}",
                  f"  {clean(entry['state'])}")

    if events is not None:
        _heading(console, f"Timeline: {len(events)} event(s), times in UTC, +MS since the event before")
        _render_timeline(console, events, {(o.step_id, o.phase): o for o in offloaded})


def compensations(cp: Checkpoint, events: Sequence[StepEvent]) -> list[CompensationState]:
    """Where each compensation the cancellation scheduled stands, from the journal: the record's
    ``status`` is what was scheduled when the run closed, this is what happened since."""
    if cp.status != "cancelled":
        return []
    by_key = {(e.step_id, e.phase): e for e in events}
    out: list[CompensationState] = []
    for index, entry in enumerate((cp.outcome or {}).get("cleanup") or []):
        step_id = f"cleanup{index:02d}"
        result = by_key.get((step_id, "result"))
        if result is not None:
            state = f"done: {shown_as(result, ToolResult).get('outcome')}"
        elif step_id in cp.uncertain:
            state = "uncertain: settle it (cuaderno resolve), then run compensate() again"
        elif (step_id, "intent") in by_key:
            state = "started, not recorded: run compensate() again (it reconciles first)"
        else:
            state = "not run yet: run compensate()"
        out.append({"step_id": step_id, "for_step": entry.get("for_step"), "state": state})
    return out


def _render_pending_entry(console: Console, cp: Checkpoint, entry: Mapping[str, Any], *,
                          decidable: bool = True, db: str | None = None) -> None:
    step_id = str(entry.get("step_id"))
    fingerprint = entry.get("fingerprint")
    _line(console, "  ", Text(clean(step_id), style="bold"), f"  tool {clean(str(entry.get('tool')))}",
          f"  (tool step {clean(str(entry.get('tool_step')))})")
    _line(console, "    fingerprint  ", clean(str(fingerprint)))
    _line(console, "    arguments    ", dumps(entry.get("arguments")))
    extra = {k: v for k, v in entry.items() if k not in ("step_id", "tool", "fingerprint", "tool_step", "arguments")}
    if extra:
        _line(console, "    request      ", dumps(extra))
    if not decidable:
        return
    fp = ["--fingerprint", str(fingerprint)] if fingerprint is not None else []
    # A decision is refused while an effect is uncertain (the run is not open): settle that first.
    after = "" if cp.is_open else "   (once the uncertain effects below are settled)"
    _line(console, "    decide with  ", clean(command_line(db, "approve", cp.run_id, step_id, *fp)),
          Text(after, style="dim"))
    _line(console, "             or  ", clean(command_line(db, "deny", cp.run_id, step_id, *fp)))


PREVIEW_CHARS: Final = 48
"""How much of an event's payload the timeline shows (``show --json`` and the web page show all)."""


def _step_cost(ev: StepEvent) -> str:
    """What a model answer cost, as journaled: its price, ``unpriced``, or nothing for other events."""
    if ev.kind != "model" or ev.phase != "result":
        return ""
    response = shown_as(ev, ModelResult).get("response")
    if not isinstance(response, dict):
        return ""
    cost = response.get("cost")
    return money(float(cost)) if isinstance(cost, int | float) else "unpriced"


def _preview(ev: StepEvent, offloaded: Offloaded | None = None) -> str:
    if offloaded is not None:  # a reference, not megabytes of text encoded to show 48 characters
        return f"[offloaded: {offloaded.size:,} bytes, sha256 {offloaded.sha256[:16]}…]"
    payload = shown_payload(ev)
    text = clean(dumps(payload)) if payload else ""
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS - 1] + "…"


def _render_timeline(console: Console, events: Sequence[StepEvent],
                     offloaded: Mapping[tuple[str, str], Offloaded] | None = None) -> None:
    """One row per event: when it was written (UTC), the time since the event before it (what the
    step took: a send, a tool body, a person's wait), its cost, and the start of its payload."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("SEQ", justify="right", no_wrap=True)
    table.add_column("TIME", no_wrap=True)
    table.add_column("+MS", justify="right", no_wrap=True)
    for title in ("STEP", "PHASE", "KIND", "NAME", "DECISION"):
        table.add_column(title, overflow="fold", min_width=4)
    table.add_column("COST", justify="right", no_wrap=True)
    table.add_column("PAYLOAD", overflow="fold", min_width=8)
    previous: float | None = None
    for ev in events:
        took = "" if previous is None else f"{max(ev.created_at - previous, 0.0) * 1000:.0f}"
        previous = ev.created_at
        table.add_row(str(ev.seq), iso_time(ev.created_at)[11:23], took, Text(clean(ev.step_id)),
                      Text(clean(ev.phase)), Text(clean(ev.kind)), Text(clean(ev.name or "")),
                      Text(clean(ev.decision or "")), _step_cost(ev),
                      Text(_preview(ev, (offloaded or {}).get((ev.step_id, ev.phase)))))
    _print_table(console, table)


def render_pending_call(console: Console, run_id: str, step_id: str, entry: PendingApproval, verb: str) -> None:
    """What a decision is about to be written for: the tool, its exact arguments and their fingerprint."""
    _line(console, Text(f"{verb} ", style="bold"), f"run {clean(run_id)}, step {clean(step_id)}",
          f" (tool step {clean(str(entry.get('tool_step')))})")
    _line(console, "  tool         ", clean(str(entry.get("tool"))))
    arguments = entry.get("arguments")
    text = dumps(arguments, indent=2)
    _line(console, "  arguments    ", text.replace("\n", "\n               "))
    if not text.isascii():
        _line(console, "  (ASCII)      ", json.dumps(arguments, ensure_ascii=True))
    _line(console, "  fingerprint  ", clean(str(entry.get("fingerprint"))))


def render_decision(console: Console, event: StepEvent) -> None:
    """The decision that was journaled."""
    payload = shown_as(event, ApprovalDecision)
    who = f" by {clean(str(payload.get('approver')))}" if payload.get("approver") else ""
    _line(console, Text(clean(event.decision or "?"), style="bold"), who,
          f": journaled at seq {event.seq} ({clean(event.step_id)}:{clean(event.phase)}). "
          "The next resume of the run acts on it.")
