"""Cancelling a wrapped Pydantic AI run: the journal refuses its next step, the run is closed with
cuaderno's cancellation record, and each transfer that happened is undone by its declared
compensation (a refund), once, as an effect, across a SIGKILL in the middle of the refunds. The
payment service's receipts and refunds logs and the provider's billing are the proof."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from _program import Deps, build_agent, compensations, effects
from _pyd_runs import Runner, cli
from _servers import Provider, Receipts

from cuaderno import SqliteCheckpointer
from cuaderno.cancellation import cancel
from cuaderno.errors import RunCancelled
from cuaderno.integrations.pydantic_ai import DurableAgent

HERE = Path(__file__).resolve().parent
PROMPT = "PAY: " + json.dumps([["transfer", "ana", 10], ["transfer", "bob", 20], ["transfer", "cy", 30]])


def _cancel_on_second_transfer(db: Path, name: str, servers: tuple[Provider, Receipts]) -> RunCancelled:
    """Run the agent in this process; cancel it (as ``cuaderno cancel`` does) the moment bob's
    transfer is answered by the payment service, while the run holds it."""
    provider, receipts = servers
    url = receipts.base_url(name)

    async def go() -> RunCancelled:
        async def on_reply(response: httpx.Response) -> None:
            if response.request.method == "POST" and len(receipts.receipts(name)) == 2:
                cancel(store, "pay", "stop paying", by="ana")

        async with httpx.AsyncClient(event_hooks={"response": [on_reply]}) as http:
            with SqliteCheckpointer(db) as store:
                durable = DurableAgent(build_agent(provider.base_url(name)), journal=store,
                                       effects=effects("lookup", url, http), compensations=compensations(url))
                try:
                    await durable.run(PROMPT, run_id="pay", deps=Deps(url, http))
                except RunCancelled as exc:
                    return exc
        raise AssertionError("the run was not cancelled")

    return asyncio.run(go())


def test_a_cancelled_run_is_closed_and_its_refunds_are_made_once_across_a_kill(
        tmp_path: Path, servers: tuple[Provider, Receipts], runner: Runner) -> None:
    provider, receipts = servers
    name, db = "cancel-refund", tmp_path / "runs.db"
    cancelled = _cancel_on_second_transfer(db, name, servers)
    # Bob's transfer was in flight when the cancellation committed: its result is admitted and
    # journaled; the next model request is refused. Both transfers are scheduled for a refund.
    assert [r["to"] for r in receipts.receipts(name)] == ["ana", "bob"]
    assert len(cancelled.record["completed"]) == 2 and len(cancelled.record["cleanup"]) == 2
    billed = len(provider.billing(name))
    assert billed == 2  # the third model request was never sent
    with SqliteCheckpointer(db, readonly=True) as store:
        cp = store.checkpoint("pay")
    assert cp is not None and cp.status == "cancelled"

    # The refunds, in another process, killed once bob's refund is made and its reply unread.
    run = lambda **kw: runner.run(db, provider.base_url(name), receipts.base_url(name), "pay",  # noqa: E731
                                  PROMPT, kind="compensate", **kw)
    assert run(crash_at="tool.K4:2").killed
    assert [r["to"] for r in receipts.refunds(name)] == ["ana", "bob"]
    done = run()
    assert done.out == {"status": "compensated", "outcomes": ["ok", "ok"]}
    refunds = receipts.refunds(name)
    assert [r["to"] for r in refunds] == ["ana", "bob"] and len({r["key"] for r in refunds}) == 2
    # The refunds' keys are their own, never the transfers'.
    assert not {r["key"] for r in refunds} & {r["key"] for r in receipts.receipts(name)}
    again = run()  # running it again makes nothing twice
    assert again.out == {"status": "compensated", "outcomes": ["ok", "ok"]}
    assert len(receipts.refunds(name)) == 2 and len(provider.billing(name)) == billed
    # The run itself stays closed: calling it again answers with its record and sends nothing.
    closed = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT)
    assert closed.out == {"status": "cancelled", "cleanup": 2} and len(provider.billing(name)) == billed


def test_a_killed_run_cancelled_by_cli_is_closed_by_the_worker_which_runs_its_refunds(
        tmp_path: Path, servers: tuple[Provider, Receipts], runner: Runner) -> None:
    provider, receipts = servers
    name, db = "cancel-worker", tmp_path / "runs.db"
    killed = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, crash_at="tool.K7:2")
    assert killed.killed and [r["to"] for r in receipts.receipts(name)] == ["ana", "bob"]
    asked = cli(db, "cancel", "pay", "--reason", "stop paying")
    assert asked.returncode == 0, asked.stderr
    billed = len(provider.billing(name))

    env = {**os.environ, "PYD_JOURNAL": str(db), "PYD_PROVIDER": provider.base_url(name),
           "PYD_RECEIPTS": receipts.base_url(name)}
    env.pop("CUADERNO_CRASH_AT", None)
    worker = subprocess.run([sys.executable, "-m", "cuaderno", "worker", "--journal", str(db), "--agent",
                             "_pyd_worker_target:resumable", "--until-idle", "--poll-interval", "0.05"],
                            cwd=HERE, env=env, capture_output=True, text=True, timeout=120)
    assert worker.returncode == 0, worker.stderr
    stats: dict[str, Any] = json.loads(worker.stderr.strip().splitlines()[-1])
    assert stats["cancelled"] == 1 and stats["compensated"] == 1, worker.stderr
    with SqliteCheckpointer(db, readonly=True) as store:
        cp = store.checkpoint("pay")
    assert cp is not None and cp.status == "cancelled" and len(cp.outcome["cleanup"]) == 2
    assert [r["to"] for r in receipts.refunds(name)] == ["ana", "bob"]
    assert [r["to"] for r in receipts.receipts(name)] == ["ana", "bob"]  # cy was never paid
    assert len(provider.billing(name)) == billed  # closing it asked the model nothing
