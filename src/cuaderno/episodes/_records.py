"""What the parent decides and returns: a :class:`Decision` per proposal, a :class:`PassRecord`
per child pass, the :class:`EpisodeResult`; and the types of the callbacks that decide, apply and
look an apply up (:meth:`cuaderno.episodes.episode.Episode.run`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, cast, overload

from pydantic import BaseModel

T = TypeVar("T", bound=BaseModel)
N = TypeVar("N", int, float)


@dataclass(frozen=True, slots=True)
class Decision:
    """What the parent does with a proposal. Build it with :meth:`apply`, :meth:`discard` or
    :meth:`another_pass`; it is journaled as the pass's ``decision`` step."""

    action: Literal["apply", "discard", "another_pass"]
    reason: str = ""
    """Why (journaled). For ``another_pass``, the feedback the next pass's task carries."""

    @classmethod
    def apply(cls, reason: str = "") -> Decision:
        """Apply the proposal (through the episode's ``apply`` callback) and close the episode."""
        return cls("apply", reason)

    @classmethod
    def discard(cls, reason: str = "") -> Decision:
        """Keep nothing and close the episode."""
        return cls("discard", reason)

    @classmethod
    def another_pass(cls, feedback: str) -> Decision:
        """Run another child pass whose task carries ``feedback`` (within the budgets)."""
        return cls("another_pass", feedback)


@dataclass(frozen=True, kw_only=True, slots=True)
class PassRecord:
    """One child pass as the parent's journal holds it."""

    number: int
    child_run_id: str
    outcome: str
    """``proposal``, ``rejected`` (the answer did not validate) or ``ended`` (a child budget or a
    failure ended it without an answer)."""
    turns: int
    """Model calls the child pass made (responses journaled in its run)."""
    rejected: int
    """Rejected responses in this pass: the invalid answer, and the empty generations the child's
    loop rejected."""
    cost_usd: float
    unpriced_calls: int
    tool_errors: int = 0
    """Tool calls of the pass that ended in an error told to the model (a path the snapshot
    refused, a file that does not exist)."""
    possibly_billed_twice: int = 0
    """Re-sends of a request whose first send's fate was unknown (a crash in flight), counted by
    the child's loop: visible, never silent."""
    decision: str | None = None
    """``apply``, ``discard``, ``another_pass``, or ``None`` when the episode ended on this pass
    without one (a budget)."""
    reason: str = ""
    """The decision's reason, the validation errors, or why the child ended."""


class _Summed(Generic[N]):
    """A total of :class:`_PassTotals`: one :class:`PassRecord` field summed over its passes
    (``ndigits``: rounded, for money)."""

    def __init__(self, doc: str, *, ndigits: int | None = None) -> None:
        self.__doc__, self.ndigits, self.field = doc, ndigits, ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.field = name

    @overload
    def __get__(self, totals: None, owner: type) -> _Summed[N]: ...
    @overload
    def __get__(self, totals: _PassTotals, owner: type) -> N: ...
    def __get__(self, totals: _PassTotals | None, owner: type) -> N | _Summed[N]:
        if totals is None:
            return self
        total = sum(getattr(p, self.field) for p in totals.passes)
        return cast(N, total if self.ndigits is None else round(total, self.ndigits))


class _PassTotals:
    """What a run of passes spent, summed over its :attr:`passes` (an episode's result, and the
    parent's tally while it walks)."""

    __slots__ = ()
    passes: Sequence[PassRecord]

    turns = _Summed[int]("Model calls of every pass.")
    rejected = _Summed[int]("Rejected responses in the episode.")
    cost_usd = _Summed[float]("Cost of the priced calls of every pass (unpriced ones are counted in "
                              ":attr:`unpriced_calls`).", ndigits=10)
    unpriced_calls = _Summed[int]("Calls with no price: a loss made visible, not free.")
    possibly_billed_twice = _Summed[int]("Re-sends after a crash in flight, in every pass.")


@dataclass(frozen=True, kw_only=True, slots=True)
class EpisodeResult(_PassTotals, Generic[T]):
    """How an episode ended, with everything it spent (all counted per episode)."""

    status: Literal["applied", "discarded", "exhausted", "failed"]
    reason: str
    """``applied``/``discarded``: the decision's reason; ``exhausted``: the budget that ran out
    (``turns_per_pass``, ``passes``, ``rejected_responses``, or a child loop's own bound);
    ``failed``: what failed (``child_failed``, ``apply_failed``)."""
    proposal: T | None
    """The last valid proposal (the applied one when ``status == "applied"``)."""
    receipt: Any = None
    """What the apply callback (or its lookup, or a person) returned."""
    passes: tuple[PassRecord, ...] = ()
    replayed: bool = False
    """The parent run was already closed: this is what happened, read from its journal."""


Decide = Callable[[T], "Decision | Awaitable[Decision]"]
Apply = Callable[[T, str], "Any | Awaitable[Any]"]
Lookup = Callable[[T, str], "Any | Awaitable[Any]"]
