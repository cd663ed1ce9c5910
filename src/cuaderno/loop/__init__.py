"""The agent loop.

Imports inside this package go one way, from the higher layer to the lower
(``tests/architecture/test_loop_layers.py`` checks it):

1. ``executor``, ``holds``, ``model_calls``, ``runtime``, ``steps``, ``versions``: the seams;
2. ``ownership``; 3. ``agent`` (``Agent``, ``Session``);
4. ``_state``: one run's state, a plain record (``RunState``) with no behaviour;
5. ``_snapshots``: functions that receive the state (a snapshot row, a resume from one);
6. ``_log``: ``RunLog``, the run's journal as the steps write it (the durable protocols'
   ``StepLog``), the budgets charged, the conversation and its fingerprint;
7. ``_model_steps`` and ``_tool_steps``: ``ModelSteps(state, log)`` and ``ToolSteps(state, log)``,
   siblings (neither imports the other);
8. ``runner`` (``Runner`` composes the above over one state) and ``cleanup``;
9. ``result``, ``streaming``, ``conversation``: what drives a runner.

The one exception: ``Agent.run`` and its siblings import what they build (a runner, a stream, a
conversation) when called. No module writes another object's private fields.
"""

from cuaderno.loop.agent import LOOP_VERSION, Agent, RetryPolicy, Session
from cuaderno.loop.result import RunResult
from cuaderno.loop.steps import ApprovalStep, FinalStep, ModelStep, Step, ToolStep
from cuaderno.loop.streaming import Token, TokenStream

__all__ = ["LOOP_VERSION", "Agent", "ApprovalStep", "FinalStep", "ModelStep", "RetryPolicy", "RunResult",
           "Session", "Step", "Token", "TokenStream", "ToolStep"]
