"""Tools and the policies that decide them."""

from cuaderno.tools.definition import Compensation, Lookup, Tool, ToolContext, tool
from cuaderno.tools.policy import Policy, PolicyDecision

__all__ = ["Compensation", "Lookup", "Policy", "PolicyDecision", "Tool", "ToolContext", "tool"]
