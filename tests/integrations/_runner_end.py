"""How cuaderno's own runner leaves a run whose model call failed past the retry bounds: the
reference the integrations' end states are compared with (status, and whether anyone holds it)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cuaderno import Agent, RetryPolicy, Session, SqliteCheckpointer
from cuaderno.errors import ErrorClass, GatewayError, RunBusy
from cuaderno.gateway.base import ModelRequest, ModelResponse


def held(store: SqliteCheckpointer, run_id: str) -> bool:
    """Whether a holder keeps the run (another owner cannot take it without forcing)."""
    try:
        epoch = store.acquire(run_id, "someone-else", force=False)
    except RunBusy:
        return True
    store.release(run_id, epoch)
    return False


def runner_end(tmp: Path, error_class: ErrorClass) -> tuple[str, bool]:
    """The runner's run status and hold after a model failure of ``error_class`` past the bounds."""
    class Failing:
        async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
            raise GatewayError("scripted", error_class=error_class, sent=error_class is not ErrorClass.TRANSIENT)

    async def go() -> None:
        async for _ in Agent(instructions="i").run("t", session=session):
            pass

    with SqliteCheckpointer(tmp / "runner-reference.db") as store:
        session = Session("ref", Failing(), store, retry=RetryPolicy(max_retries=0, max_resends=0))
        with pytest.raises(GatewayError):
            asyncio.run(go())
        cp = store.checkpoint("ref")
        assert cp is not None
        return cp.status, held(store, "ref")
