"""What ``Agent.run`` yields: one object per step that happened in this process.

Steps are yielded only after the journal has committed them, so whatever a caller sees has
already survived a crash. History is not re-emitted on resume: a resumed run yields only the
steps that happen now, and a closed run yields its :class:`FinalStep` once, marked ``replayed``.
The full timeline is :meth:`Checkpointer.load <cuaderno.journal.base.Checkpointer.load>`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

from cuaderno.events.payloads import FinalResult
from cuaderno.gateway.base import ModelResponse
from cuaderno.plainjson import JSONObject

__all__ = ["ApprovalStep", "FinalStep", "ModelStep", "Step", "ToolStep"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelStep:
    """A model call whose response is journaled."""

    step_id: str
    turn: int
    response: ModelResponse
    idempotency_key: str
    attempts: int = 1
    """How many sends were journaled for this request (more than one after a crash or a timeout in
    flight; a send journaled just before a crash may never have left the process)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolStep:
    """A tool call and what became of it."""

    step_id: str
    tool: str
    arguments: JSONObject
    decision: str
    """``allow``, ``deny``, ``require_approval`` (policy) or ``approved``/``rejected`` (a person)."""
    outcome: str
    """``ok``, ``error``, ``denied`` or ``pending`` (waiting for approval)."""
    result: Any = None
    error: dict[str, Any] | None = None
    effect_key: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ApprovalStep:
    """A tool call waiting for a person, or the person's decision."""

    step_id: str
    tool_step_id: str
    tool: str
    arguments: JSONObject
    fingerprint: str
    """The fingerprint of exactly these arguments; an approval is bound to it."""
    status: str
    """``pending``, ``approved`` or ``rejected``."""
    approver: str | None = None
    reason: str | None = None


class VersionChange(TypedDict):
    """The versions a closed run was recorded under and those of the agent replaying it."""

    recorded: Mapping[str, object]
    current: Mapping[str, object]


@dataclass(frozen=True, kw_only=True, slots=True)
class FinalStep:
    """The run's final answer."""

    step_id: str
    output: str
    replayed: bool = False
    """``True`` when the run was already closed: this is what happened, not a new answer."""
    data: FinalResult = field(default_factory=lambda: cast(FinalResult, {}))
    """The journaled final record (``output``, ``turn``), the same on the first answer and on
    every replay of the closed run."""
    version_mismatch: VersionChange | None = None
    """Set only on the replay of a run that closed under other versions than the agent replaying
    it, which an explicit ``on_version_mismatch`` choice let through (``"refuse"``, the default,
    raises :class:`~cuaderno.errors.VersionMismatch` instead): ``{"recorded": ..., "current":
    ...}``, the versions the run was started (or last migrated) under and the replaying agent's.
    The answer is the journal's, given by other code than this agent's."""


Step = ModelStep | ToolStep | ApprovalStep | FinalStep
