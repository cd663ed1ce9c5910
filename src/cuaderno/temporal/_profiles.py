"""Retry profiles, derived from the effect class, never set per call.

=====================  ===================  ========  ================================================
profile                start-to-close       attempts  why
=====================  ===================  ========  ================================================
``code``               25 s                 3         cheap, usually transient (idempotent tools,
                                                      lookups)
``model``              210 s                1         not transient, costs money; cuaderno's own
                                                      retry layer re-sends with the same key
``production``         from the policy file 1         a silent replay of a mutation is a decision,
                                                      not a default
=====================  ===================  ========  ================================================

The policy file is TOML::

    [tools.transfer]
    effect = "production"
    timeout_s = 30

    [tools.read_file]
    effect = "code"

``[activities] heartbeat_s`` (default 10) is how long an activity may go without a heartbeat
before the server gives up on its worker (a worker killed inside a model call is noticed after
this, not after the model profile's 210 s); activities heartbeat from their first line to their
last. ``[activities] max_worker_losses`` (default: no bound) bounds how many times one model
step may be lost with its worker before the step fails as a send of unknown fate; worker losses
are counted apart from the provider's failures (``[retry] max_resends``).

``[retry]`` sets the agent's :class:`~cuaderno.RetryPolicy` (``max_retries``, ``max_resends``,
``base_delay``, ``max_delay``); ``register(..., retry=...)`` overrides it, and a run's own
``RunInput.retry`` overrides both.

A tool absent from the file is ``code`` when it is idempotent; a non-idempotent tool must be
listed as ``production`` with its ``timeout_s``. An unknown effect class, a missing or invalid
timeout, a rule for a tool the agent does not have, or an idempotent-only class for a
non-idempotent tool is :class:`EffectPolicyError` when the worker is built: nothing is journaled
and no workflow runs under a guessed timeout.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from cuaderno.errors import UsageError
from cuaderno.loop.agent import Agent, RetryPolicy

__all__ = ["CODE", "MODEL", "EffectPolicy", "EffectPolicyError", "Profile", "load_effect_policy", "retry_policy"]


class EffectPolicyError(UsageError):
    """The effect policy file is missing something a worker needs, or names what does not exist."""


@dataclass(frozen=True, slots=True)
class Profile:
    """An activity's timeout and attempts."""

    effect: str
    timeout_s: float
    attempts: int

    @property
    def timeout(self) -> timedelta:
        return timedelta(seconds=self.timeout_s)


CODE: Final = Profile("code", 25.0, 3)
MODEL: Final = Profile("model", 210.0, 1)
EFFECTS: Final = ("code", "production")


@dataclass(frozen=True, slots=True)
class EffectPolicy:
    """What a worker read from the policy file: each tool's profile, the heartbeat timeout, the
    bound on worker losses of one model step, and the agent's retry bounds."""

    tools: dict[str, Profile]
    heartbeat_s: float = 10.0
    max_worker_losses: int | None = None
    """``None``: a model step lost with its worker is sent again however many times that happens."""
    retry: RetryPolicy | None = None
    """The agent's :class:`~cuaderno.RetryPolicy` (``None``: the defaults)."""

    @property
    def heartbeat(self) -> timedelta:
        return timedelta(seconds=self.heartbeat_s)


def load_effect_policy(agent: Agent, path: str | os.PathLike[str] | None) -> EffectPolicy:
    """Each tool's profile, by tool name. Raises :class:`EffectPolicyError` (nothing else runs)."""
    rules: dict[str, Any] = {}
    heartbeat, losses = 10.0, None
    retry: RetryPolicy | None = None
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise EffectPolicyError(f"cannot read the effect policy {os.fspath(path)!r}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise EffectPolicyError(f"the effect policy {os.fspath(path)!r} is not TOML: {exc}") from None
        tools = data.get("tools", {})
        if not isinstance(tools, dict):
            raise EffectPolicyError("the effect policy's [tools] must be a table of tables")
        rules = tools
        heartbeat, losses = _activities(data.get("activities") or {})
        if "retry" in data:
            retry = retry_policy(data["retry"], "the effect policy's [retry]")
    unknown = sorted(set(rules) - set(agent.tools))
    if unknown:
        raise EffectPolicyError(f"the effect policy has rules for tools agent {agent.name!r} does not have: "
                                f"{unknown}; its tools are {sorted(agent.tools)}")
    out: dict[str, Profile] = {}
    for name, tool in sorted(agent.tools.items()):
        rule = rules.get(name)
        if rule is None:
            if not tool.idempotent:
                raise EffectPolicyError(f"tool {name!r} is not idempotent: the effect policy must list it as "
                                        f'[tools.{name}] effect = "production" with its timeout_s')
            out[name] = CODE
            continue
        if not isinstance(rule, dict):
            raise EffectPolicyError(f"[tools.{name}] must be a table")
        effect = rule.get("effect")
        if effect not in EFFECTS:
            raise EffectPolicyError(f"[tools.{name}] effect = {effect!r} is not an effect class; use one of "
                                    f"{list(EFFECTS)}")
        if effect == "code":
            if not tool.idempotent:
                raise EffectPolicyError(f"tool {name!r} is not idempotent: it cannot take the 'code' profile "
                                        '(3 attempts would send a mutation again); use effect = "production"')
            out[name] = CODE
            continue
        timeout = rule.get("timeout_s")
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout <= 86400:
            raise EffectPolicyError(f'[tools.{name}] effect = "production" needs timeout_s, a number of seconds '
                                    f"in (0, 86400]; got {timeout!r}")
        out[name] = Profile("production", float(timeout), 1)
    return EffectPolicy(out, float(heartbeat), losses, retry)


def _activities(table: Any) -> tuple[float, int | None]:
    """``[activities]``: the heartbeat timeout and the bound on worker losses of one model step."""
    if not isinstance(table, dict):
        raise EffectPolicyError("the effect policy's [activities] must be a table")
    heartbeat = table.get("heartbeat_s", 10.0)
    if not isinstance(heartbeat, (int, float)) or isinstance(heartbeat, bool) or not 0 < heartbeat <= 3600:
        raise EffectPolicyError(f"[activities] heartbeat_s must be a number of seconds in (0, 3600]; "
                                f"got {heartbeat!r}")
    losses = table.get("max_worker_losses")
    if losses is not None and (not isinstance(losses, int) or isinstance(losses, bool) or losses < 0):
        raise EffectPolicyError(f"[activities] max_worker_losses must be a whole number >= 0; got {losses!r}")
    return float(heartbeat), losses


RETRY_FIELDS: Final = {"max_retries": int, "max_resends": int, "base_delay": float, "max_delay": float}


def retry_policy(table: Any, where: str) -> RetryPolicy:
    """A :class:`~cuaderno.RetryPolicy` from a table of its fields (:class:`EffectPolicyError`
    naming ``where`` for an unknown field or a value out of range)."""
    if not isinstance(table, dict):
        raise EffectPolicyError(f"{where} must be a table of {sorted(RETRY_FIELDS)}")
    unknown = sorted(set(table) - set(RETRY_FIELDS))
    if unknown:
        raise EffectPolicyError(f"{where} has unknown fields {unknown}; it takes {sorted(RETRY_FIELDS)}")
    for name, value in table.items():
        whole = RETRY_FIELDS[name] is int
        good = (isinstance(value, int) if whole else isinstance(value, (int, float))) and not isinstance(value, bool)
        if not good or value < 0 or (whole and value > 1000) or (not whole and value > 86400):
            kind = "a whole number in [0, 1000]" if whole else "a number of seconds in [0, 86400]"
            raise EffectPolicyError(f"{where}: {name} must be {kind}; got {value!r}")
    return RetryPolicy(**table)
