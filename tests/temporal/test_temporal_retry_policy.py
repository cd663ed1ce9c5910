"""The loop's retry bounds under Temporal, per agent and per run.

The provider fails the first two sends of the first model call with a timeout after sending
(``ambiguous``): the default ``RetryPolicy(max_resends=1)`` gives up; an agent registered with
``max_resends=2`` (``build_worker(retry=...)`` or the policy file's ``[retry]``) completes; a run's
``RunInput.retry`` wins over the agent's, both ways.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from test_temporal_giveup import agent, flaky, what_it_says

from cuaderno import RetryPolicy
from cuaderno.errors import ErrorClass
from cuaderno.temporal import CuadernoWorkflow, EffectPolicyError, RunInput, build_worker, register

TWO_LOST = {1: ErrorClass.AMBIGUOUS, 2: ErrorClass.AMBIGUOUS}
PATIENT = RetryPolicy(max_resends=2, base_delay=0.0)


async def outcome(env: WorkflowEnvironment, tmp_path: Path, *, retry: RetryPolicy | None = None,
                  policy: str | None = None, run_retry: RetryPolicy | None = None) -> tuple[str, dict[str, Any]]:
    journal, run_id = f"sqlite:///{tmp_path / 'j.db'}", f"run-{uuid.uuid4().hex[:8]}"
    queue = f"q-{uuid.uuid4().hex[:8]}"
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = None
    if policy is not None:
        path = tmp_path / "effects.toml"
        path.write_text(policy)
    gateway = flaky(TWO_LOST)
    async with build_worker(env.client, agent(), task_queue=queue, journal_url=journal, effect_policy=path,
                            retry=retry, gateway_factory=lambda: gateway):
        try:
            await env.client.execute_workflow(CuadernoWorkflow.run,
                                              RunInput(agent="looker", task="find x", retry=run_retry),
                                              id=run_id, task_queue=queue)
        except WorkflowFailureError as exc:
            assert isinstance(exc.cause, ApplicationError)
            return f"gave up: {exc.cause.type}", what_it_says(journal, run_id)
    return "completed", what_it_says(journal, run_id)


async def test_the_default_policy_gives_up_after_one_resend(env: WorkflowEnvironment, tmp_path: Path) -> None:
    said, journal = await outcome(env, tmp_path)
    assert said == "gave up: GatewayError"
    assert journal["counters"]["model_sends"] == 2


@pytest.mark.parametrize("how", ["build_worker", "policy file"])
async def test_an_agent_registered_with_more_resends_completes(env: WorkflowEnvironment, tmp_path: Path,
                                                               how: str) -> None:
    if how == "build_worker":
        said, journal = await outcome(env, tmp_path, retry=PATIENT)
    else:
        said, journal = await outcome(env, tmp_path, policy="[retry]\nmax_resends = 2\nbase_delay = 0\n")
    assert said == "completed"
    assert journal["sends"][:3] == [("t0000.model", "intent", None), ("t0000.model", "intent.2", "ambiguous"),
                                    ("t0000.model", "intent.3", "ambiguous")]
    assert journal["counters"]["possibly_billed_twice"] == 2


async def test_the_runs_own_policy_wins_over_the_agents(env: WorkflowEnvironment, tmp_path: Path) -> None:
    said, _ = await outcome(env, tmp_path / "a", run_retry=PATIENT)
    assert said == "completed"
    said, journal = await outcome(env, tmp_path / "b", retry=PATIENT, run_retry=RetryPolicy(max_resends=0))
    assert said == "gave up: GatewayError" and journal["counters"]["model_sends"] == 1


@pytest.mark.parametrize(("table", "says"), [
    ("[retry]\nmax_resend = 2\n", "unknown fields ['max_resend']"),
    ("[retry]\nmax_resends = -1\n", "max_resends must be a whole number"),
    ("[retry]\nmax_resends = 1.5\n", "max_resends must be a whole number"),
    ('[retry]\nbase_delay = "soon"\n', "base_delay must be a number of seconds"),
    ("retry = 3\n", "must be a table"),
    ("[activities]\nmax_worker_losses = -2\n", "max_worker_losses must be a whole number"),
])
def test_a_bad_retry_table_is_refused_when_the_worker_is_built(tmp_path: Path, table: str, says: str) -> None:
    path = tmp_path / "effects.toml"
    path.write_text(table)
    with pytest.raises(EffectPolicyError, match=says.replace("[", r"\[").replace("]", r"\]")):
        register(agent(), path)


def test_a_retry_that_is_not_a_retry_policy_is_refused() -> None:
    with pytest.raises(EffectPolicyError, match="must be a cuaderno.RetryPolicy"):
        register(agent(), retry={"max_resends": 2})  # type: ignore[arg-type]
