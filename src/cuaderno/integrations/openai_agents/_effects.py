"""How a function tool declares its effect, and what its body can read while it runs.

A tool of the OpenAI Agents SDK is a plain function: nothing in it says whether running it twice
is harmless. The runner asks the caller (``DurableRunner(effects={"tool name": ...})``) and
defaults to the safe answer, ``non_idempotent``: an unknown outcome stops the run ``needs_human``
rather than send the effect again.

- ``idempotent``: the receiver deduplicates on the effect key (:func:`effect_key`), or repeating
  is harmless: an unknown outcome is sent again with the same key.
- ``non_idempotent`` (the default): an unknown outcome is never sent again; the run stops with
  :class:`~cuaderno.errors.UncertainEffect` and ``cuaderno resolve`` settles it.
- :func:`lookup` (``Lookup(fn)``): an unknown outcome is asked about first; found → its receipt
  is the result, absence proven → sent again with the same key.
- ``effect_free``: the tool only reads; it is journaled like any step (a resume does not run it
  again) and an unknown outcome runs it again.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cuaderno.errors import UsageError

__all__ = ["EffectCall", "EffectKind", "Lookup", "ToolEffect", "current_effect", "effect_key", "lookup",
           "resolve_effects"]

EffectKind = Literal["idempotent", "non_idempotent", "lookup", "effect_free"]
_KINDS: tuple[str, ...] = ("idempotent", "non_idempotent", "lookup", "effect_free")


@dataclass(frozen=True, slots=True)
class EffectCall:
    """One run of a tool's effect, as its body and its lookup see it.

    ``key`` is the effect key: the same for every send, lookup and resume of the step (derived
    from the tenant, the run, the step and the arguments, never from the process), so a receiver
    that deduplicates or answers lookups by it recognises a repeated call. ``attempt`` is 1 for
    the first send."""

    key: str
    run_id: str
    step_id: str
    tool: str
    arguments: Mapping[str, Any]
    attempt: int


Lookups = Callable[[EffectCall], Awaitable[Any]]
"""Asks the receiver whether the effect with ``call.key`` happened: its receipt, or ``None`` when
absence is proven. Raise when it cannot tell (the step then stays uncertain)."""


@dataclass(frozen=True, slots=True)
class ToolEffect:
    """A tool's declared effect class (see the module docstring)."""

    kind: EffectKind = "non_idempotent"
    lookup: Lookups | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise UsageError(f"effect kind must be one of {', '.join(_KINDS)}, got {self.kind!r}")
        if (self.kind == "lookup") != (self.lookup is not None):
            raise UsageError("a lookup effect needs its lookup function (use openai_agents.lookup(fn)), "
                             "and only a lookup effect takes one")

    def to_json(self) -> dict[str, Any]:
        """What the agent's fingerprint covers: the kind (a lookup's code is not fingerprinted)."""
        return {"kind": self.kind}


def lookup(fn: Lookups) -> ToolEffect:
    """Declare a tool whose unknown outcome is settled by asking ``fn`` (see :data:`Lookups`)."""
    if not callable(fn):
        raise UsageError(f"lookup() takes an async function, got {type(fn).__name__}")
    return ToolEffect("lookup", fn)


Lookup = lookup
"""An alias of :func:`lookup` for callers that read declarations as types."""


def resolve_effects(effects: Mapping[str, ToolEffect | str] | None) -> dict[str, ToolEffect]:
    """The declarations by tool name, each a :class:`ToolEffect`; a bad one is refused here,
    before any run is opened."""
    out: dict[str, ToolEffect] = {}
    for name, spec in (effects or {}).items():
        if not isinstance(name, str) or not name:
            raise UsageError(f"effects are keyed by tool name, got {name!r}")
        if isinstance(spec, str):
            if spec == "lookup":
                raise UsageError(f"tool {name!r}: a lookup effect needs its function: lookup(fn)")
            spec = ToolEffect(spec)  # type: ignore[arg-type]  # checked in __post_init__
        if not isinstance(spec, ToolEffect):
            raise UsageError(f"tool {name!r}: an effect is a kind name or a ToolEffect, got {type(spec).__name__}")
        out[name] = spec
    return out


_CURRENT: contextvars.ContextVar[EffectCall | None] = contextvars.ContextVar("cuaderno_openai_effect", default=None)


def current_effect() -> EffectCall | None:
    """The effect the running tool body is (``None`` outside a durable tool call)."""
    return _CURRENT.get()


def effect_key() -> str:
    """The effect key of the running tool call: send it to the receiver as its idempotency key
    and look up by it. Raises :class:`~cuaderno.errors.UsageError` outside a durable tool call."""
    call = _CURRENT.get()
    if call is None:
        raise UsageError("effect_key() is only known inside a tool called by DurableRunner")
    return call.key


def enter(call: EffectCall) -> contextvars.Token[EffectCall | None]:
    """Make ``call`` the current effect (the tool wrapper, around the body)."""
    return _CURRENT.set(call)


def leave(token: contextvars.Token[EffectCall | None]) -> None:
    _CURRENT.reset(token)
