"""Resuming a run that was started under other versions: an explicit choice, never a default.

A checkpoint records the schema, loop, policy, capability and agent versions its run started
under. When the code that resumes it has other versions, :class:`~cuaderno.loop.agent.Session`
takes ``on_version_mismatch``:

- ``"refuse"`` (default): raise :class:`~cuaderno.errors.VersionMismatch`, change nothing;
- ``"resume"``: continue unchanged, on the caller's explicit responsibility;
- ``"drain"``: leave the run to a worker that still runs the old versions
  (:class:`~cuaderno.errors.DrainOnOldWorker`), change nothing;
- ``"cancel"``: cancel the run (keeping what completed and what is uncertain) so the caller can
  start a new one;
- a :class:`Migration`: a tested function decides whether the recorded history can continue under
  the new versions; its record is journaled with the new versions, or nothing is written.

A closed run follows the same rule, and nothing is ever written to it. A completed run under
other versions is refused by ``"refuse"`` and ``"drain"`` as an open one is; ``"resume"``,
``"cancel"`` and a :class:`Migration` return its recorded answer as a replayed
:class:`~cuaderno.loop.steps.FinalStep` whose ``version_mismatch`` holds both sets of versions
(there is nothing left to continue, cancel or migrate: no record is written and the migration
function is not called). A failed or cancelled run is :class:`~cuaderno.errors.RunClosed`
whatever the versions.

Every choice is applied before the run is taken over, and so is the check of the first request
(which depends only on the agent's configuration and the task): a resume refused there, by a
``VersionMismatch`` or by the ``ReplayDivergence`` that ``"resume"`` meets under other
instructions or tools, leaves the journal files byte-identical.

Old state is never read with silent defaults for permissions or effects: after a migration the
recorded steps stand as they were decided, and only new steps follow the new policy and tools.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cuaderno.events import StepEvent

__all__ = ["Migration"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Migration:
    """A named, tested function that moves a run to the resuming code's versions.

    Attributes:
        name: journaled with the migration, so the timeline says which function moved the run.
        migrate: ``(recorded_versions, new_versions, events) -> record``. Raise to refuse: the
            run is left exactly as it was. The returned record (plain JSON) is journaled.
    """

    name: str
    migrate: Callable[[dict[str, Any], dict[str, Any], list[StepEvent]], dict[str, Any]]
