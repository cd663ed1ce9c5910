"""The checkpoint: a compact projection of a run's journal, for fast resume and for people.

The checkpoint answers "where do I continue, and what has this run spent?"; the journal answers
"how did I get here and what must I reconcile?". Every backend writes the checkpoint in the same
transaction as the event it follows from, by folding that event with :func:`project`. Because it
is a pure function of the journal, a checkpoint can always be rebuilt from the events
(:func:`rebuild`), and the conformance suite checks that the stored one equals the rebuilt one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, cast

from cuaderno.errors import JournalCorrupt, JournalError, RunNotFound
from cuaderno.events import Kind, StepEvent
from cuaderno.events.payloads import (
    CancelState,
    Counters,
    Escalation,
    InFlight,
    ModelError,
    ModelIntent,
    ModelResult,
    Outcome,
    PendingApproval,
    RunCounters,
    RunEnd,
    RunMigrate,
    RunStart,
    ToolResult,
    UncertainEvidence,
    UsageJSON,
)
from cuaderno.plainjson import compact, compact_ascii

if TYPE_CHECKING:
    from cuaderno.journal.base import Checkpointer

__all__ = ["COUNTERS", "OPEN_STATUSES", "Checkpoint", "cost_upper_usd", "differing", "project", "rebuild", "verified"]

COUNTERS: Final = (
    "model_calls",            # model responses journaled (each one paid once)
    "model_sends",            # requests sent to a provider, re-sends included
    "possibly_billed_twice",  # re-sends of a request whose first send may have been billed
    "calls_paid",             # journaled responses that carried a price
    "unpriced_calls",         # journaled responses with no price: a loss made visible, not free
    "tool_calls",             # tool bodies that ran to a journaled result
    "tool_denied",            # tool calls denied by policy or by a person (known outcomes)
    "tool_errors",            # tool calls that ended in a classified error
    "approvals_requested",
    "retries",                # same intent, same arguments, same effect identity
    "reconciled",             # effects of unknown fate settled by a lookup
    "repairs",                # invalid input sent back to the model to fix
    "replans",                # conflicts: fresh state, new plan
    "reflects",
    "escalations",            # to a stronger tier or to a person
    "rejected_responses",     # empty or refused generations, final answers failing the output_type
    "uncertain",              # effects nobody can know happened
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "reasoning_tokens",
)

OPEN_STATUSES: Final = frozenset({"running", "suspended"})
"""Statuses a run can be resumed from without a decision by a person."""


@dataclass(kw_only=True, slots=True)
class Checkpoint:
    """The projection of one run. Every field is derived from the journal."""

    run_id: str
    status: str = "running"
    """``running``, ``suspended`` (waiting for a person), ``completed``, ``failed``,
    ``cancelled``, ``needs_human`` (uncertain effect or failed reconciliation)."""
    last_seq: int = 0
    """The ``seq`` of the last event folded in."""
    last_hash: str = ""
    """The ``row_hash`` of that event: the head of the run's hash chain."""
    next_step: str = "run"
    """The last step touched and its phase, for people (``t0003.tool00:intent``)."""
    epoch: int = 0
    """Fencing epoch of the process that owns the run; bumped by every takeover."""
    versions: dict[str, Any] = field(default_factory=dict[str, Any])
    """Schema, loop, policy and capability versions the run started under."""
    task_fingerprint: str | None = None
    tenant: str | None = None
    """The tenant the run started under (part of every effect key); ``None`` for runs journaled
    before it was recorded."""
    counters: dict[str, int] = field(default_factory=dict[str, int])
    cost_usd: float = 0.0
    """Sum of priced calls only; unpriced calls are counted in ``counters['unpriced_calls']``."""
    pending: dict[str, PendingApproval] = field(default_factory=dict[str, PendingApproval])
    """Approvals waiting for a person, by approval step id: tool, arguments, fingerprint."""
    uncertain: dict[str, UncertainEvidence] = field(default_factory=dict[str, UncertainEvidence])
    """Evidence for each step whose effect nobody can know happened, by step id."""
    outcome: Outcome | None = None
    """The final answer, failure or cancellation record once the run ended."""
    cancel_requested: CancelState | None = None
    """Set when someone asked to cancel: from then on no intent is admitted (results still are,
    so an effect in flight is journaled)."""

    @property
    def is_open(self) -> bool:
        """Whether the run has not ended."""
        return self.status in OPEN_STATUSES

    def count(self, name: str) -> int:
        """One counter (0 when never incremented)."""
        return self.counters.get(name, 0)

    def to_json(self) -> dict[str, Any]:
        """The stored form. ``tenant`` only when the run recorded one, so the projection of a
        journal written before it existed is unchanged."""
        out = {"run_id": self.run_id, "status": self.status, "last_seq": self.last_seq,
               "last_hash": self.last_hash, "next_step": self.next_step, "epoch": self.epoch,
               "versions": self.versions, "task_fingerprint": self.task_fingerprint,
               "counters": self.counters, "cost_usd": self.cost_usd, "pending": self.pending,
               "uncertain": self.uncertain, "outcome": self.outcome, "cancel_requested": self.cancel_requested}
        if self.tenant is not None:
            out["tenant"] = self.tenant
        return out

    def dumps(self) -> str:
        """The stored form, encoded. With ASCII escapes when it holds a lone surrogate (a model's
        answer or a tool's arguments can): SQLite stores text as UTF-8, which cannot hold one."""
        text = compact(self.to_json())
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return compact_ascii(self.to_json())
        return text

    @classmethod
    def loads(cls, text: str | bytes) -> Checkpoint:
        """Read a stored summary (what :meth:`dumps` wrote).

        Raises:
            JournalCorrupt: it is not JSON, or not a summary (see :meth:`from_json`).
        """
        try:
            data = json.loads(text)
        except (ValueError, TypeError) as exc:  # TypeError: a stored value that is not text at all
            raise JournalCorrupt(f"a run's stored summary (checkpoint) is not JSON ({exc}); it was altered or "
                                 "damaged") from None
        except RecursionError:  # the parser recurses once per level; no summary nests that deep
            raise JournalCorrupt("a run's stored summary (checkpoint) is nested too deeply to be one; it was "
                                 "altered or damaged") from None
        return cls.from_json(data)

    @classmethod
    def from_json(cls, data: Any) -> Checkpoint:
        """Rebuild from :meth:`to_json` output.

        Raises:
            JournalCorrupt: a field missing or of the wrong type (the stored summary was altered or
                damaged). Every reader goes through here, so a damaged summary is a typed error
                wherever it is read (``list``, ``show``, a resume), never a traceback later.
        """
        problem = _malformed(data)
        if problem is not None:
            run = data.get("run_id") if isinstance(data, dict) else None
            where = f"run {run!r}" if isinstance(run, str) else "a run"
            raise JournalCorrupt(f"{where}: its stored summary (checkpoint) {problem}; it was altered or damaged")
        return cls(run_id=data["run_id"], status=data["status"], last_seq=data["last_seq"],
                   last_hash=data["last_hash"], next_step=data["next_step"], epoch=data.get("epoch", 0),
                   versions=data.get("versions") or {}, task_fingerprint=data.get("task_fingerprint"),
                   tenant=data.get("tenant"),
                   counters=data.get("counters") or {}, cost_usd=data.get("cost_usd", 0.0),
                   pending=data.get("pending") or {}, uncertain=data.get("uncertain") or {},
                   outcome=data.get("outcome"), cancel_requested=data.get("cancel_requested"))

    def _bump(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n


def _is_int(value: object) -> bool:
    return type(value) is int


def _is_number(value: object) -> bool:
    return type(value) is int or type(value) is float


def _is_map_of(check: Any) -> Any:
    return lambda value: type(value) is dict and all(type(k) is str and check(v) for k, v in value.items())


_FIELDS: Final[tuple[tuple[str, bool, Any, str], ...]] = (
    # (field, required, check, what it must be); optional fields may also be null.
    ("run_id", True, lambda v: type(v) is str, "a string"),
    ("status", True, lambda v: type(v) is str, "a string"),
    ("last_seq", True, lambda v: _is_int(v) and v >= 0, "a count"),
    ("last_hash", True, lambda v: type(v) is str, "a string"),
    ("next_step", True, lambda v: type(v) is str, "a string"),
    ("epoch", False, lambda v: _is_int(v) and v >= 0, "a count"),
    ("versions", False, lambda v: type(v) is dict, "an object"),
    ("task_fingerprint", False, lambda v: type(v) is str, "a string"),
    ("tenant", False, lambda v: type(v) is str, "a string"),
    ("counters", False, _is_map_of(_is_int), "an object of integers"),
    ("cost_usd", False, _is_number, "a number"),
    ("pending", False, _is_map_of(lambda v: type(v) is dict), "an object of objects"),
    ("uncertain", False, _is_map_of(lambda v: type(v) is dict), "an object of objects"),
    ("outcome", False, lambda v: type(v) is dict, "an object"),
    ("cancel_requested", False, lambda v: type(v) is dict, "an object"),
)


def _malformed(data: object) -> str | None:
    """What is wrong with a stored checkpoint's decoded JSON, or ``None``."""
    if type(data) is not dict:
        return f"is {type(data).__name__}, not an object"
    for name, required, check, what in _FIELDS:
        if name not in data:
            if required:
                return f"has no {name!r}"
            continue
        value = data[name]
        if value is None and not required:
            continue
        if not check(value):
            return f"has {name!r} = {value!r:.60}, which is not {what}"
    return None


def project(cp: Checkpoint, ev: StepEvent) -> None:
    """Fold one event into the checkpoint (in place).

    Part of the journal format: a stored summary must equal the events' projection
    (:func:`verified`, which every resume calls), so a change to what is computed here makes
    every summary written before it refuse to open. The committed golden journals
    (``tests/golden/journals/schema_v*.sqlite``, resumed by R13) fail first; such a change needs a
    schema step that rewrites the summaries from their events.
    """
    cp.last_seq = ev.seq
    cp.last_hash = ev.row_hash
    cp.next_step = f"{ev.step_id}:{ev.phase}"
    handler = _HANDLERS.get(ev.kind)
    if handler is not None:
        handler(cp, ev)


def rebuild(run_id: str, events: Iterable[StepEvent], epoch: int = 0) -> Checkpoint:
    """The checkpoint of a run, rebuilt from its events alone."""
    cp = Checkpoint(run_id=run_id, epoch=epoch)
    for ev in events:
        project(cp, ev)
    return cp


def verified(store: Checkpointer, run_id: str) -> tuple[Checkpoint, list[StepEvent]]:
    """The run's stored checkpoint, checked against its journal, and the journal's events.

    For what is decided from the summary: by a person (approve, deny, resolve, cancel, ``show``),
    and by a loop that opens a run (closed or not, the budgets already spent). The summary row is
    a projection, kept beside the journal but outside its hash chain, so a damaged or edited one
    could show a person other arguments than the ones the decision binds, give a resumed run its
    budgets back, or number the next row wrongly. Here it must equal the projection rebuilt from
    the chain-checked events. Costs a load and a rebuild (about 10 ms for a 1000-turn run, of
    which a resume, which loads and decodes the events anyway, pays about 4 ms more), so the loop
    calls it when it opens a run, never on its per-step path.

    Raises:
        RunNotFound: no such run.
        JournalCorrupt: the chain is broken, or the summary differs from the rebuilt projection.
        JournalError: the run kept changing between the two reads (another process is writing).
    """
    for _ in range(_VERIFY_TRIES):
        stored = store.checkpoint(run_id)
        if stored is None:
            raise RunNotFound(run_id)
        events = store.load(run_id)  # checks the chain against the summary's head, in one read
        if len(events) != stored.last_seq:
            continue  # appended between the two reads: read both again
        differ = differing(stored, rebuild(run_id, events, epoch=stored.epoch))
        if differ:
            raise JournalCorrupt(f"run {run_id!r}: its stored summary (checkpoint) does not match its journal "
                                 f"({', '.join(differ)} differ): it was altered or damaged, or written by a cuaderno "
                                 "that summarised runs differently; nothing was written. `cuaderno rebuild-summary "
                                 "RUN` rebuilds it from the journal")
        return stored, events
    raise JournalError(f"run {run_id!r} kept changing while it was read; nothing was written, try again")


_VERIFY_TRIES: Final = 20


def differing(stored: Checkpoint, rebuilt: Checkpoint) -> list[str]:
    """The fields in which a stored summary differs from the one rebuilt from the journal, sorted."""
    have, want = stored.to_json(), rebuilt.to_json()
    if have == want:
        return []
    return sorted(k for k in have.keys() | want.keys() if have.get(k) != want.get(k))


# The handlers read each payload through its type (:mod:`cuaderno.events.payloads`): a read-only
# view of the decoded JSON, taken once per event with ``cast`` (on the per-step path an annotated
# assignment instead, which costs no call). Not an object built from it: this
# fold runs on every event of every resume and append, and building one per event cost more than
# the fold (benchmarks/bench_projection.py; the types' module says what was measured).


def _on_run(cp: Checkpoint, ev: StepEvent) -> None:
    phase = ev.phase
    if phase == "start":
        start = cast(RunStart, ev.payload)
        cp.status = "running"
        cp.versions = dict(start.get("versions") or {})
        cp.task_fingerprint = ev.fingerprint
        tenant = start.get("tenant")
        cp.tenant = tenant if isinstance(tenant, str) else None
    elif phase == "end":
        end = cast(RunEnd, ev.payload)
        cp.status = str(end.get("status", "failed"))
        cp.outcome = cast(Outcome, ev.payload)
        # Effects in flight when the run ended stay open questions a person can settle
        # (``resolve``), listed with the uncertain ones.
        for entry in end.get("uncertain") or ():
            if isinstance(entry, dict) and isinstance(entry.get("step_id"), str):
                _in_flight(cp, entry)
    elif phase.startswith("migrate"):
        cp.versions = dict(cast(RunMigrate, ev.payload).get("to") or {})
    elif phase == "counters":
        _charge(cp, cast(RunCounters, ev.payload).get("counters"))


def _in_flight(cp: Checkpoint, entry: InFlight) -> None:
    step_id = entry["step_id"]
    if step_id not in cp.uncertain:
        cp._bump("uncertain")
    found = entry.get("evidence")
    evidence: Mapping[str, Any] = found if isinstance(found, dict) else {}
    cp.uncertain.setdefault(step_id, cast(UncertainEvidence, {
        **evidence, "tool": entry.get("tool"), "effect_key": entry.get("effect_key"),
        "reason": evidence.get("reason") or "in flight when the run ended"}))


def _charge(cp: Checkpoint, counters: Counters | None) -> None:
    if counters:
        for name, n in counters.items():
            cp._bump(name, int(n))


def _on_model(cp: Checkpoint, ev: StepEvent) -> None:
    phase = ev.phase
    if phase.startswith("intent"):
        intent: ModelIntent = ev.payload  # type: ignore[assignment]
        cp._bump("model_sends")
        # "intent.2", "intent.3": a re-send. It may double a bill only when the previous send's
        # fate is unknown (a crash in flight, or a timeout after sending).
        if phase != "intent" and intent.get("after") in ("crash", "ambiguous"):
            cp._bump("possibly_billed_twice")
        _charge(cp, intent.get("counters"))
        return
    if phase.startswith("error"):  # a classified failure: count what it spent
        error = cast(ModelError, ev.payload)
        _charge(cp, error.get("counters"))
        _escalated(cp, (error.get("error") or {}).get("escalations") or ())
        return
    if phase != "result":
        return
    result: ModelResult = ev.payload  # type: ignore[assignment]
    response = result.get("response")
    if response is None:  # a classified failure, journaled as evidence
        _charge(cp, result.get("counters"))
        return
    cp._bump("model_calls")
    _used(cp, response.get("usage"))
    _price(cp, response.get("cost"))
    _escalated(cp, response.get("escalations") or ())
    _charge(cp, result.get("counters"))


def _used(cp: Checkpoint, usage: UsageJSON | None) -> None:
    """Add a call's tokens (every one of the four counters, 0 included: a summary lists them)."""
    c = cp.counters
    u: UsageJSON = usage or {}
    c["input_tokens"] = c.get("input_tokens", 0) + int(u.get("input_tokens", 0))
    c["output_tokens"] = c.get("output_tokens", 0) + int(u.get("output_tokens", 0))
    c["cached_tokens"] = c.get("cached_tokens", 0) + int(u.get("cached_tokens", 0))
    c["reasoning_tokens"] = c.get("reasoning_tokens", 0) + int(u.get("reasoning_tokens", 0))


def _escalated(cp: Checkpoint, escalations: Iterable[Escalation]) -> None:
    """Count lower-tier calls that were made and rejected within one step."""
    for esc in escalations:
        cp._bump("escalations")
        cp._bump("model_sends")
        _used(cp, esc.get("usage"))
        _price(cp, esc.get("cost"))


def _price(cp: Checkpoint, cost: float | None) -> None:
    if cost is None:
        cp._bump("unpriced_calls")
    else:
        cp._bump("calls_paid")
        cp.cost_usd = round(cp.cost_usd + float(cost), 10)


def _on_tool(cp: Checkpoint, ev: StepEvent) -> None:
    phase = ev.phase
    if phase == "result":
        result: ToolResult = ev.payload  # type: ignore[assignment]
        outcome = result.get("outcome")
        if outcome == "ok":
            cp._bump("tool_calls")
        elif outcome == "denied":
            cp._bump("tool_denied")
        elif outcome != "nothing_to_do":  # a compensation the tool does not declare: nothing ran
            cp._bump("tool_errors")
        _charge(cp, result.get("counters"))
        if ev.step_id in cp.uncertain:  # resolved by reconciliation or by a person
            del cp.uncertain[ev.step_id]
            if cp.status == "needs_human" and not cp.uncertain:
                cp.status = "running"
    elif phase.startswith("resolution") or (phase.startswith("intent.") and ev.step_id in cp.uncertain):
        # Settled by a person, or sent again (a lookup proved it absent, or a person said it did
        # not happen): no longer an open question. A re-send in flight must not be settled by a
        # person who saw the old evidence (that re-send would then be sent once more); if its
        # outcome is unknown too, it comes back as ``uncertain.N``.
        cp.uncertain.pop(ev.step_id, None)
        if cp.status == "needs_human" and not cp.uncertain:
            cp.status = "running"
    elif phase.startswith("uncertain"):
        cp._bump("uncertain")
        cp.uncertain[ev.step_id] = cast(UncertainEvidence, ev.payload)  # the evidence, whole
        if cp.status in OPEN_STATUSES:  # a compensation of a cancelled run does not reopen it
            cp.status = "needs_human"


def _on_approval(cp: Checkpoint, ev: StepEvent) -> None:
    if ev.phase == "request":
        cp._bump("approvals_requested")
        cp.pending[ev.step_id] = cast(PendingApproval, {"tool": ev.name, "fingerprint": ev.fingerprint, **ev.payload})
        cp.status = "suspended"
    elif ev.phase == "decision":
        cp.pending.pop(ev.step_id, None)
        if cp.status == "suspended" and not cp.pending:
            cp.status = "running"


def _on_final(cp: Checkpoint, ev: StepEvent) -> None:
    if ev.phase == "result":
        cp.status = "completed"
        cp.outcome = cast(Outcome, ev.payload)  # a FinalResult, whole


def _on_cancel(cp: Checkpoint, ev: StepEvent) -> None:
    if ev.phase == "request":
        cp.cancel_requested = cast(CancelState, ev.payload)  # a CancelRequest, whole


_HANDLERS = {Kind.RUN: _on_run, Kind.MODEL: _on_model, Kind.TOOL: _on_tool, Kind.APPROVAL: _on_approval,
             Kind.FINAL: _on_final, Kind.CANCEL: _on_cancel}


def cost_upper_usd(cp: Checkpoint, events: Iterable[StepEvent]) -> float:
    """What the providers may have billed the run: ``cp.cost_usd`` plus, for every re-send counted
    in ``possibly_billed_twice``, the cost of the answer that step finally got.

    ``cost_usd`` sums the journaled answers, each paid once; a request re-sent after a crash in
    flight or an ambiguous failure (``intent.N`` with ``after`` ``crash``/``ambiguous``) may have
    been billed for the lost answer too, at about the same price (same body, same model). The
    answer's own cost and its rejected lower-tier calls (``escalations``) are both counted, as in
    ``cost_usd``. A doubled send whose step got no priced answer adds nothing (it is unpriced, and
    counted as such): this is an upper bound of the *priced* calls, like ``cost_usd`` a lower one.

    Computed from the events, not stored in the summary, so summaries written before it open as they
    did; ``cp`` must be the projection of ``events`` (:func:`verified` returns both).
    """
    doubled: dict[str, int] = {}
    extra = 0.0
    for ev in events:
        if ev.kind != "model":
            continue
        if ev.phase.startswith("intent.") and cast(ModelIntent, ev.payload).get("after") in ("crash", "ambiguous"):
            doubled[ev.step_id] = doubled.get(ev.step_id, 0) + 1  # the same test as _on_model's counter
        elif ev.phase == "result" and ev.step_id in doubled:
            response = cast(ModelResult, ev.payload).get("response")
            times = doubled.pop(ev.step_id)
            if isinstance(response, dict):
                costs = [response.get("cost")] + [e.get("cost") for e in response.get("escalations") or ()]
                extra += times * sum(float(c) for c in costs if c is not None)
    return round(cp.cost_usd + extra, 10)
