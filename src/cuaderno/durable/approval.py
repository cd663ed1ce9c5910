"""The approval protocol: a person's decision on one tool call, bound to its exact arguments.

A tool step that needs a person is: an approval ``request`` journaled at the step's approval id
(``<tool step>.approval``), carrying the fingerprint of the exact arguments the person is shown
→ a ``decision`` written by ``cuaderno approve``/``deny`` or the page (never by this module: a
decision is a person's) → the next pass over the run reads it, and the tool runs only if the
decision approves exactly the arguments it is about to run with.

The request is written in the shape cuaderno's own loop writes (``kind="approval"``,
``phase="request"``, ``decision="require_approval"``, the tool's name, the fingerprint; payload
``tool_step``, ``arguments``, ``reason``), so ``cuaderno show``, ``cuaderno approve``, the page and
the run's summary (``pending``, ``suspended``) read a framework's approvals as the loop's.

What replay needs from each journaled field:

- request ``fingerprint``: what the decision binds (``cuaderno approve --fingerprint`` must name
  it); ``arguments``: what the person is shown; ``tool_step``: the step the decision lets run;
  ``reason``: why it waits; anything the caller adds (``extra``: the framework's call id, the
  policy version) is the caller's to read back.
- decision ``decision`` (``approved``/``rejected``) and ``fingerprint``: whether the call may run,
  and for which arguments; ``reason``, ``approver``: what the model and the record are told.

Integrations under other agent frameworks write and read approvals only through this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cuaderno.durable.log import StepLog
from cuaderno.errors import ApprovalMismatch, UsageError
from cuaderno.events import StepEvent, approval_step_id
from cuaderno.plainjson import not_plain

__all__ = ["Approval", "Decided"]


@dataclass(frozen=True, slots=True)
class Decided:
    """A person's decision on one approval: ``approved`` or ``rejected``, with their reason and
    name as journaled (``None`` when they gave none)."""

    decision: Literal["approved", "rejected"]
    reason: str | None
    approver: str | None

    @property
    def approved(self) -> bool:
        return self.decision == "approved"


@dataclass(frozen=True, slots=True)
class Approval:
    """The approval of one tool call of one run (see the module docstring).

    Attributes:
        log: the run's journal.
        tool_step: the tool step that waits (the approval's id is ``<tool_step>.approval``).
        tool: the tool's name.
        arguments: the exact arguments the call would run with (plain JSON), shown to the person.
        fingerprint: the fingerprint of ``tool`` and ``arguments``: what a decision binds.
    """

    log: StepLog
    tool_step: str
    tool: str
    arguments: Mapping[str, Any]
    fingerprint: str

    @property
    def step_id(self) -> str:
        """The approval's step id (what ``cuaderno approve RUN STEP`` names)."""
        return approval_step_id(self.tool_step)

    def requested(self) -> bool:
        """Whether a request is journaled for this call.

        Raises:
            ApprovalMismatch: the request journaled at this step binds other arguments (the call
                at this position is not the call the person is asked about).
        """
        return self._bound("request") is not None

    def request(self, reason: str, *, extra: Mapping[str, Any] | None = None) -> bool:
        """Stage the approval request unless one is journaled; ``True`` if staged. The caller
        commits it (the run then shows ``suspended``, the call pending). ``approval.K1`` names its
        transaction's crash point, as the loop's request does.

        Raises:
            ApprovalMismatch: a request journaled here binds other arguments.
            UsageError: arguments or ``extra`` that are not plain JSON, or ``extra`` naming a
                field of the request's own; nothing is staged.
        """
        if self.requested():
            return False
        problem = not_plain(dict(self.arguments)) or not_plain(dict(extra or {}))
        if problem is not None:
            raise UsageError(f"approval of {self.tool!r}: the request is not plain JSON: it holds {problem}")
        payload: dict[str, object] = {"tool_step": self.tool_step, "arguments": dict(self.arguments), "reason": reason}
        clash = sorted(set(payload) & set(extra or {}))
        if clash:
            raise UsageError(f"approval of {self.tool!r}: extra may not replace {', '.join(clash)}")
        payload.update(extra or {})
        self.log.stage(StepEvent(run_id=self.log.run_id, step_id=self.step_id, phase="request", kind="approval",
                                 name=self.tool, decision="require_approval", fingerprint=self.fingerprint,
                                 payload=payload), "approval.K1")
        return True

    def decided(self) -> Decided | None:
        """The person's decision, or ``None`` while it waits (or was never requested).

        Raises:
            ApprovalMismatch: the decision binds other arguments than this call's (the call would
                run with arguments nobody approved).
        """
        if not self.requested():
            return None
        rec = self._bound("decision")
        if rec is None:
            return None
        reason, approver = rec.payload.get("reason"), rec.payload.get("approver")
        return Decided("approved" if rec.decision == "approved" else "rejected",
                       reason if isinstance(reason, str) else None, approver if isinstance(approver, str) else None)

    def _bound(self, phase: str) -> StepEvent | None:
        """The journaled ``request`` or ``decision`` of this step, if any; it must bind this call's
        fingerprint (a request or decision about other arguments never lets this call run)."""
        rec = self.log.get(self.step_id, phase)
        if rec is not None and rec.fingerprint != self.fingerprint:
            raise ApprovalMismatch(f"run {self.log.run_id!r} step {self.step_id!r}: the {phase} binds "
                                   f"{rec.fingerprint}, the call has {self.fingerprint}; nothing ran")
        return rec

    def require_approved(self) -> None:
        """Return only if a person approved exactly this call: what a tool wrapper asks before the
        body of a call that needs approval (a framework's own "approved" flag is one anyone can
        pass; the journal's decision is the one that binds).

        Raises:
            ApprovalMismatch: no request, no decision, a rejection, or other arguments.
        """
        decided = self.decided()
        if decided is None or not decided.approved:
            what = "was rejected" if decided is not None else "has no approval journaled"
            raise ApprovalMismatch(f"run {self.log.run_id!r} step {self.tool_step!r}: {self.tool} requires approval "
                                   f"and {what}; decide it with `cuaderno approve`; nothing ran")
