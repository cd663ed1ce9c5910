"""The agent loop."""

from cuaderno.loop.agent import LOOP_VERSION, Agent, RetryPolicy, Session
from cuaderno.loop.steps import ApprovalStep, FinalStep, ModelStep, Step, ToolStep

__all__ = ["LOOP_VERSION", "Agent", "ApprovalStep", "FinalStep", "ModelStep", "RetryPolicy", "Session", "Step",
           "ToolStep"]
