"""An episode's bounds: constants in code, not wishes in a prompt (seed 002).

Three bounds, each counted **per episode**, never per round:

- ``turns_per_pass``: model calls one child pass may make (its agent's ``max_turns``). A model
  that re-reads the same file forever runs into it and the episode ends with that reason.
- ``passes``: child runs in the episode, whatever asked for them (a proposal the parent sent
  back, or an answer that did not validate). ``passes * turns_per_pass`` bounds the model calls
  of the whole episode.
- ``rejected_responses``: answers refused in the whole episode: a final answer that does not
  validate against the output type, and the empty or refused generations the child's loop
  rejects. Three rounds of three attempts would be nine calls; this cap is one number for all.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuaderno.errors import UsageError

__all__ = ["EpisodeBudgets"]


@dataclass(frozen=True, kw_only=True, slots=True)
class EpisodeBudgets:
    """Bounds of one child episode, counted per episode.

    Raises:
        UsageError: a bound that is not a positive integer (zero, negative, ``None``, a float,
            a bool): a bound of zero is a mistake (an episode that may not even try, or whose
            first imperfect answer ends it), not a budget.
    """

    turns_per_pass: int = 8
    passes: int = 3
    rejected_responses: int = 2
    """Rejections admitted; the next one ends the episode (``rejected_responses + 1`` refused)."""

    def __post_init__(self) -> None:
        for name in ("turns_per_pass", "passes", "rejected_responses"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise UsageError(f"EpisodeBudgets.{name} must be an integer of at least 1, got {value!r:.40}")
