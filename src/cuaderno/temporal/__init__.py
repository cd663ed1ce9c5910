"""cuaderno under Temporal: the same loop, one model turn per activity (``pip install cuaderno[temporal]``).

Wrap an existing :class:`~cuaderno.Agent`; there is no second agent definition::

    worker = build_worker(client, agent, task_queue="agents", gateway_factory=make_gateway,
                          journal_url="sqlite:///var/lib/agents/journal.db", effect_policy="effects.toml")
    await client.execute_workflow(CuadernoWorkflow.run, RunInput(agent=agent.name, task="..."),
                                  id="run-42", task_queue="agents")

Child episodes (:mod:`cuaderno.episodes`): :func:`build_episode_worker` and :class:`EpisodeWorkflow`,
each child pass a child workflow (:mod:`cuaderno.temporal._child`).

What crosses the activity boundary (the task, journal events, tool arguments and results) is
kept in the workflow's history; :func:`encrypted_converter` seals it with the journal's master
keys (:class:`JournalPayloadCodec`).

The workflow id is the run id (idempotency and effect keys derive from it, never from Temporal's
run id, so a continue-as-new keeps them). See ``docs/guide/temporal.md``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from cuaderno.gateway.base import ModelGateway
from cuaderno.loop.agent import Agent, RetryPolicy
from cuaderno.temporal._activities import INLINE_BYTES, CuadernoActivities
from cuaderno.temporal._child import EpisodeChildWorkflow, EpisodeInput, EpisodeWorkflow, build_episode_worker
from cuaderno.temporal._codec import JournalPayloadCodec, encrypted_converter
from cuaderno.temporal._names import (
    JOURNAL_MARK,
    LOOKUP,
    MODEL_TURN,
    RECORD,
    REPLAY_RUN,
    TOOL_CALL,
    WORKFLOW,
    ModelTurnInput,
    RecordInput,
    ReplayInput,
    RunInput,
    ToolCallInput,
)
from cuaderno.temporal._profiles import CODE, MODEL, EffectPolicy, EffectPolicyError, Profile, load_effect_policy
from cuaderno.temporal._workflow import AGENTS, CuadernoWorkflow, Decision

__all__ = ["CODE", "INLINE_BYTES", "JOURNAL_MARK", "LOOKUP", "MODEL", "MODEL_TURN", "RECORD", "REPLAY_RUN", "TOOL_CALL", "WORKFLOW",
           "RecordInput", "ReplayInput", "CuadernoActivities",
           "CuadernoWorkflow", "Decision", "EffectPolicy", "EffectPolicyError", "ModelTurnInput", "Profile", "RunInput",
           "ToolCallInput", "build_worker", "cuaderno_activities", "register",
           "EpisodeChildWorkflow", "EpisodeInput", "EpisodeWorkflow", "JournalPayloadCodec", "build_episode_worker",
           "encrypted_converter"]


def register(agent: Agent, effect_policy: str | os.PathLike[str] | None = None, *,
             retry: RetryPolicy | None = None) -> EffectPolicy:
    """Make ``agent`` runnable by :class:`CuadernoWorkflow` in this process; its tools' retry
    profiles come from ``effect_policy`` (:class:`EffectPolicyError` before anything runs).

    ``retry`` is the agent's :class:`~cuaderno.RetryPolicy` (the loop's bounds on failed model
    sends and tool retries), over the policy file's ``[retry]``; a run's ``RunInput.retry`` wins
    over both. Worker losses are not bounded by it (``[activities] max_worker_losses``)."""
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise EffectPolicyError(f"retry must be a cuaderno.RetryPolicy, not {type(retry).__name__}")
    policy = load_effect_policy(agent, effect_policy)
    if retry is not None:
        policy = dataclasses.replace(policy, retry=retry)
    AGENTS[agent.name] = (agent, policy)
    return policy


def cuaderno_activities(agent: Agent, gateway_factory: Callable[[], ModelGateway],
                        journal_url: str) -> Sequence[Callable[..., Any]]:
    """The activities of ``agent``, writing cuaderno's journal at ``journal_url`` (opened now:
    a journal the worker cannot open is refused at worker start)."""
    return CuadernoActivities(agent, gateway_factory, journal_url).activities()


def build_worker(client: Client, agent: Agent, *, task_queue: str, gateway_factory: Callable[[], ModelGateway],
                 journal_url: str, effect_policy: str | os.PathLike[str] | None = None,
                 retry: RetryPolicy | None = None, **worker_options: Any) -> Worker:
    """A worker running :class:`CuadernoWorkflow` and ``agent``'s activities (``retry``: see
    :func:`register`)."""
    register(agent, effect_policy, retry=retry)
    return Worker(client, task_queue=task_queue, workflows=[CuadernoWorkflow],
                  activities=list(cuaderno_activities(agent, gateway_factory, journal_url)), **worker_options)
