"""The names a journal row can carry in its ``kind`` and ``phase`` columns, all of them.

Both columns are part of the journal format: replay compares a recorded kind with the one the code
asks for at that step id, and the checkpoint's projection (:func:`cuaderno.checkpoint.project`)
dispatches on the kind and reads the phase. A name written here is written for ever: a journal
recorded today must read the same way in every later version, so names are added, never renamed.

A *numbered* phase repeats at one step: the first is the bare name (``intent``), later ones carry
their number (``intent.2``, ``intent.3``...). Some are numbered from their first row instead:
``error.N`` (``N`` is the send it ended), ``base.N`` (``N`` the seq of the summary a snapshot
holds), ``migrate.N`` (``N`` counts the run's version migrations). :func:`family` maps either form
to its name.

``tests/events/test_names.py`` reads every module of the package and fails when one writes a kind
or a phase not named here (a new name must be added here, with what it means, before it is written).
"""

from __future__ import annotations

from typing import Final

__all__ = ["KINDS", "NUMBERED", "PHASES", "Kind", "Phase", "family", "nth"]


class Kind:
    """Every ``kind`` a row is written with."""

    RUN: Final = "run"
    """The run itself: ``start``, ``end``, ``migrate.N``, ``counters``, ``pass`` (a trace marker)."""
    MODEL: Final = "model"
    """A model call (``tNNNN.model``): ``intent``/``intent.N`` (a send), ``error.N``, ``result``."""
    TOOL: Final = "tool"
    """An effect step (``tNNNN.toolMM``, ``cleanupNN``, an episode's apply): ``decision``,
    ``intent``/``intent.N``, ``result``, ``uncertain``/``uncertain.N``, ``resolution``/``resolution.N``."""
    APPROVAL: Final = "approval"
    """A person's approval of a tool call (``...approval``): ``request``, ``decision``."""
    FINAL: Final = "final"
    """The final answer (step ``final``): ``result``."""
    CANCEL: Final = "cancel"
    """A cancellation asked for (step ``cancel``): ``request``."""
    SNAPSHOT: Final = "snapshot"
    """A resume point (step ``snapshot``): ``base.N`` (:mod:`cuaderno.loop._snapshots`)."""
    EPISODE: Final = "episode"
    """A pass of an episode (:mod:`cuaderno.episodes`): ``intent``, ``result``, ``decision``."""
    CONVERSATION: Final = "conversation"
    """A user message of a conversation (``mNNNN``): ``message`` (:mod:`cuaderno.loop.conversation`)."""


class Phase:
    """Every ``phase`` a row is written with (numbered ones by their family's name)."""

    START: Final = "start"
    """``run``: the run began (task, versions, tenant)."""
    END: Final = "end"
    """``run``: the run ended other than by a final answer (failed, cancelled, closed)."""
    MIGRATE: Final = "migrate"
    """``run``, numbered from the first (``migrate.1``): the run moved to other versions."""
    COUNTERS: Final = "counters"
    """``run``: counters charged outside any step (read by the projection; kept for journals
    that hold it)."""
    PASS: Final = "pass"
    """``run``, numbered: a trace marker naming the span of the pass that wrote it."""
    INTENT: Final = "intent"
    """``model``/``tool``/``episode``, numbered: about to act; committed before acting."""
    RESULT: Final = "result"
    """``model``/``tool``/``final``/``episode``: how the step ended."""
    ERROR: Final = "error"
    """``model``, numbered from the first (``error.N``: the send it ended): a classified failure."""
    DECISION: Final = "decision"
    """``tool`` (the policy's), ``approval`` (a person's), ``episode`` (a pass's verdict)."""
    REQUEST: Final = "request"
    """``approval`` (a person is asked), ``cancel`` (a cancellation is asked)."""
    UNCERTAIN: Final = "uncertain"
    """``tool``, numbered: nobody can know whether the effect happened; the evidence."""
    RESOLUTION: Final = "resolution"
    """``tool``, numbered: a person settled an uncertain effect as not having happened."""
    BASE: Final = "base"
    """``snapshot``, numbered from the first (``base.N``: the seq of the summary it holds)."""
    MESSAGE: Final = "message"
    """``conversation``: one user message of a conversation."""


def _values(cls: type) -> frozenset[str]:
    return frozenset(v for k, v in vars(cls).items() if k.isupper() and isinstance(v, str))


KINDS: Final = _values(Kind)
"""Every kind, as written."""

PHASES: Final = _values(Phase)
"""Every phase family, as written (a numbered one by its bare name)."""

NUMBERED: Final = frozenset({Phase.MIGRATE, Phase.PASS, Phase.INTENT, Phase.ERROR, Phase.UNCERTAIN,
                             Phase.RESOLUTION, Phase.BASE})
"""The phases written with a number (``intent.2``; ``error.1``): the same step holds several."""


def family(phase: str) -> str:
    """The name of a phase without its number: ``intent.3`` → ``intent``, ``result`` → ``result``."""
    head, dot, tail = phase.partition(".")
    return head if dot and tail.isdigit() else phase


def nth(name: str, n: int) -> str:
    """The ``n``-th (1-based) phase of a numbered family as the loop writes it: the bare name first,
    then ``name.n``. (``error``, ``base`` and ``migrate`` carry their number from the first.)"""
    return name if n == 1 else f"{name}.{n}"
