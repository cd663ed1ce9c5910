"""A worker of the queue looks through the open runs (and fires its schedules) when idle, and
while busy at most once per ``_SCAN_WHILE_BUSY`` poll intervals. Busy counts the runs a claim
just took: a worker whose runs all end in one wake and are replaced by the queue's next ones was
never idle, and looked at every such wake (once per ``concurrency`` runs). Both backends."""

from __future__ import annotations

from typing import Any

from cuaderno import Agent, ScriptedGateway, StepEvent, tool
from cuaderno.fingerprint import fingerprint
from cuaderno.flow import submit
from cuaderno.worker import Worker


@tool(effect_free=True)
def tick(n: int) -> str:
    """Tick."""
    return f"tick {n}"


agent = Agent(instructions="tick once", tools=[tick], name="scan-pace")


def _gateway() -> ScriptedGateway:
    def script(request: Any) -> Any:
        turn = sum(1 for m in request.messages if m.get("role") == "assistant")
        return ScriptedGateway.call("tick", n=turn) if turn == 0 else ScriptedGateway.text("done")
    return ScriptedGateway(script, cost=None)


def _counting(worker: Worker) -> list[bool]:
    looks: list[bool] = []
    due = worker._scan_due

    def counted(busy: bool) -> bool:
        found = due(busy)
        looks.append(found)
        return found

    worker._scan_due = counted  # type: ignore[method-assign]
    return looks


def test_a_worker_refilled_by_its_claims_looks_only_at_its_start_and_when_idle(store: Any) -> None:
    runs = [submit(store, agent, f"task {i}").run_id for i in range(32)]
    # A long poll interval: while busy, no look is due for 4 of them (longer than this test).
    worker = Worker(store, agent, _gateway, concurrency=8, poll_interval=30, log=None)
    looks = _counting(worker)
    stats = worker.run_sync(until_idle=True)
    assert stats.completed == 32 and stats.errors == 0
    assert all(store.checkpoint(r).status == "completed" for r in runs)
    assert len(looks) >= 5  # it woke as its runs ended (8 at a time, stepping together), and claimed more
    # The first wake (nothing looked at yet) and the last (idle: nothing in flight, nothing claimed);
    # before, every wake whose 8 runs had all ended looked too (5 looks here).
    assert sum(looks) == 2


def test_an_idle_worker_still_finds_a_run_outside_the_queue(store: Any) -> None:
    submit(store, agent, "queued")
    start = {"task": "by hand", "versions": agent.versions(), "tenant": "default"}
    store.append([StepEvent(run_id="by-hand", step_id="run", phase="start", kind="run", name=agent.name,
                            fingerprint=fingerprint({"task": "by hand"}), payload=start)])
    worker = Worker(store, agent, _gateway, concurrency=2, poll_interval=0.05, log=None)
    stats = worker.run_sync(until_idle=True)
    assert stats.errors == 0
    assert store.checkpoint("by-hand").status == "completed"  # found by looking, driven to its end
