"""The agent loop."""

from cuaderno.loop.agent import LOOP_VERSION, Agent, RetryPolicy, Session
from cuaderno.loop.result import RunResult
from cuaderno.loop.steps import ApprovalStep, FinalStep, ModelStep, Step, ToolStep

__all__ = ["LOOP_VERSION", "Agent", "ApprovalStep", "FinalStep", "ModelStep", "RetryPolicy", "RunResult", "Session", "Step",
           "ToolStep"]
