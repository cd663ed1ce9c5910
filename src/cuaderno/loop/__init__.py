"""The agent loop."""

from cuaderno.loop.agent import LOOP_VERSION, Agent, RetryPolicy, Session
from cuaderno.loop.result import RunResult
from cuaderno.loop.steps import ApprovalStep, FinalStep, ModelStep, Step, ToolStep
from cuaderno.loop.streaming import Token, TokenStream

__all__ = ["LOOP_VERSION", "Agent", "ApprovalStep", "FinalStep", "ModelStep", "RetryPolicy", "RunResult",
           "Session", "Step", "Token", "TokenStream", "ToolStep"]
