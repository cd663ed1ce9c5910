"""How each tool's side effect is declared: what the effect protocol may do when its fate is unknown.

A tool call whose intent is journaled and whose result is not (the process died in its body) is
settled by its declaration, never guessed (:mod:`cuaderno.durable.effect`):

- ``"non_idempotent"`` (the default for every tool not declared): nothing can tell whether it
  happened, so the step is journaled ``uncertain`` and the run stops ``needs_human``;
- ``"idempotent"``: the receiver deduplicates by the effect key (:func:`current_effect_key`), so
  it is sent again with the same key;
- :class:`Lookup`: the receiver is asked whether the effect with that key happened; a receipt
  becomes the result, a proven absence sends it again, anything else is ``uncertain``;
- ``"effect_free"``: the tool only reads; it runs again.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cuaderno.errors import UsageError

__all__ = ["EffectClass", "Lookup", "ToolEffect", "current_effect_key", "effect_of"]

EffectClass = Literal["idempotent", "non_idempotent", "effect_free"]
_CLASSES: tuple[str, ...] = ("idempotent", "non_idempotent", "effect_free")


@dataclass(frozen=True, slots=True)
class Lookup:
    """A non-idempotent tool whose receiver can be asked whether an effect happened.

    ``find(effect_key, arguments)`` returns the receipt (any JSON value: it becomes the tool's
    result, what the model is told) or ``None`` when the receiver proves it has no effect with
    that key. Raising means "cannot tell": the step stays uncertain.
    """

    find: Callable[[str, dict[str, Any]], Awaitable[Any]]


ToolEffect = EffectClass | Lookup
"""What a tool is declared as in ``DurableAgent(..., effects={name: ...})``."""


def effect_of(effects: Mapping[str, ToolEffect], tool: str) -> ToolEffect:
    """The declaration of ``tool`` (``non_idempotent`` when not declared: the safe default)."""
    return effects.get(tool, "non_idempotent")


def check_effects(effects: object) -> dict[str, ToolEffect]:
    """Refuse a declaration map that is not ``{tool name: class or Lookup}``, before anything runs."""
    if not isinstance(effects, Mapping):
        raise UsageError(f"effects must be a mapping of tool name to effect class, got {type(effects).__name__}")
    out: dict[str, ToolEffect] = {}
    for name, declared in effects.items():
        if not isinstance(name, str) or not name:
            raise UsageError(f"effects: tool names must be non-empty strings, got {name!r}")
        if isinstance(declared, Lookup):
            if not callable(declared.find):
                raise UsageError(f"effects[{name!r}]: Lookup.find must be an async callable")
        elif declared not in _CLASSES:
            raise UsageError(f"effects[{name!r}] must be one of {', '.join(_CLASSES)} or a Lookup, got {declared!r}")
        out[name] = declared
    return out


def declared_as(declared: ToolEffect) -> str:
    """The declaration as text: what the agent definition's fingerprint holds (a changed class is
    a changed agent: a run started under one class must not resume under another)."""
    return "lookup" if isinstance(declared, Lookup) else declared


_EFFECT_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("cuaderno_pydantic_ai_effect_key",
                                                                          default=None)


def current_effect_key() -> str:
    """The effect key of the tool call running now: send it to the receiver (as an idempotency
    key, or to find the receipt later). The same on every attempt and resume of one call.

    Raises:
        UsageError: called outside a tool call run by a :class:`~cuaderno.integrations.pydantic_ai.DurableAgent`.
    """
    key = _EFFECT_KEY.get()
    if key is None:
        raise UsageError("current_effect_key() is only known inside a tool call run by a DurableAgent")
    return key
