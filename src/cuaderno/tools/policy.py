"""Policies: decide each tool call before it runs.

A policy answers ``allow``, ``deny`` or ``require_approval`` for one call. The loop records the
answer on the step with the policy's version, so replay can tell "not executed because denied or
waiting for a person" from "nobody knows", and a later policy change is visible as a version
change instead of silently re-deciding old steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from cuaderno.errors import UsageError
from cuaderno.plainjson import JSONObject

__all__ = ["Policy", "PolicyDecision", "Rule"]

Verdict = Literal["allow", "deny", "require_approval"]
_VERDICTS = ("allow", "deny", "require_approval")


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicyDecision:
    """One decision about one tool call."""

    decision: Verdict
    reason: str = ""

    def __post_init__(self) -> None:
        # Checked here, not where it is used: a misspelt verdict ("require-approval") must never
        # reach the loop, which would otherwise have to guess what it meant.
        if self.decision not in _VERDICTS:
            raise UsageError(f"PolicyDecision.decision must be one of {_VERDICTS}, got {self.decision!r:.60}")
        if not isinstance(self.reason, str):
            raise UsageError(f"PolicyDecision.reason must be a string, got {type(self.reason).__name__}")


Rule = Verdict | Callable[[str, JSONObject], "Verdict | PolicyDecision"]
"""A fixed verdict, or a function of (tool name, arguments)."""


class Policy:
    """Per-tool rules with a default.

    Example::

        Policy({"transfer": "require_approval", "rm": "deny"}, default="allow", version="2026-12")

    Args:
        rules: tool name -> verdict, or a callable ``(name, arguments) -> verdict``.
        default: the verdict for tools with no rule.
        version: journaled with every decision; bump it when the rules change, so runs started
            under the old rules are recognisable on resume.
    """

    def __init__(self, rules: Mapping[str, Rule] | None = None, *, default: Verdict = "allow",
                 version: str = "1") -> None:
        if rules is not None and not isinstance(rules, Mapping):
            raise UsageError("policy rules must be a mapping of tool name to verdict")
        if not isinstance(version, str) or not version:
            raise UsageError("the policy version must be a non-empty string (it is journaled with every decision)")
        self.rules = dict(rules or {})
        for name, rule in self.rules.items():
            if not callable(rule) and rule not in _VERDICTS:
                raise UsageError(f"policy rule for {name!r} must be one of {_VERDICTS} or a callable")
        if default not in _VERDICTS:
            raise UsageError(f"policy default must be one of {_VERDICTS}")
        self.default: Verdict = default
        self.version = version

    def decide(self, tool: str, arguments: JSONObject) -> PolicyDecision:
        """Decide one call."""
        rule = self.rules.get(tool, self.default)
        verdict = rule(tool, arguments) if callable(rule) else rule
        if isinstance(verdict, PolicyDecision):
            return verdict
        if verdict not in _VERDICTS:
            raise UsageError(f"policy rule for {tool!r} returned {verdict!r}, not one of {_VERDICTS}")
        return PolicyDecision(decision=verdict, reason=f"policy {self.version}: {verdict}")


ALLOW_ALL = Policy(version="allow-all")
