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
this, not after the model profile's 210 s); activities heartbeat while they wait.

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
from cuaderno.loop.agent import Agent

__all__ = ["CODE", "MODEL", "EffectPolicy", "EffectPolicyError", "Profile", "load_effect_policy"]


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
    """What a worker read from the policy file: each tool's profile and the heartbeat timeout."""

    tools: dict[str, Profile]
    heartbeat_s: float = 10.0

    @property
    def heartbeat(self) -> timedelta:
        return timedelta(seconds=self.heartbeat_s)


def load_effect_policy(agent: Agent, path: str | os.PathLike[str] | None) -> EffectPolicy:
    """Each tool's profile, by tool name. Raises :class:`EffectPolicyError` (nothing else runs)."""
    rules: dict[str, Any] = {}
    heartbeat: Any = 10.0
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
        heartbeat = (data.get("activities") or {}).get("heartbeat_s", 10.0)
        if not isinstance(heartbeat, (int, float)) or isinstance(heartbeat, bool) or not 0 < heartbeat <= 3600:
            raise EffectPolicyError(f"[activities] heartbeat_s must be a number of seconds in (0, 3600]; "
                                    f"got {heartbeat!r}")
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
    return EffectPolicy(out, float(heartbeat))
