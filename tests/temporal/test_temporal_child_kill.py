"""Issue 23 (4) under Temporal: a worker running a child episode is SIGKILLed, another finishes it.

The developer agent's ``fix`` episode (``examples/episodes/developer_temporal.py``): three child
passes as child workflows (a rejected answer, a patch the check refuses, the right patch), then
the apply. The worker process kills itself at a named point:

- inside a child's model call: billed, not journaled (``temporal.model.A1``, the provider honours
  the idempotency key: the re-send is not billed again), or journaled, not returned
  (``temporal.model.A2``, a provider that bills every request: billed once proves no re-send);
- after the child's answer, before its child workflow completed (``temporal.episode.C1``);
- in the parent, the child's proposal journaled, before the decision (``episode.P1``, workflow
  code), and inside the decide activity, decided, the answer not in the history yet
  (``temporal.episode.decide.A1``: the check on a copy runs again, nothing else does);
- during the apply: its intent in cuaderno's journal, the effect not run
  (``temporal.episode.apply.A1``), or the effect done, its receipt not journaled
  (``temporal.episode.apply.A2``: the re-executed activity finds it through ``lookup``).

The truth is what cuaderno does not write: the fake provider's billing log (one fsynced line per
billed generation) and the apply callback's receipt file. Every model key is billed once (8
generations, as without a kill) and the patch is applied once.
"""

from __future__ import annotations

import signal
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from cuaderno.journal import open_journal
from cuaderno.temporal import EpisodeInput, EpisodeWorkflow
from cuaderno.testing.records import read_records

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "episodes"
sys.path.insert(0, str(EXAMPLES))

import developer_agent as dev  # noqa: E402
import developer_temporal as dt  # noqa: E402

GENERATIONS = 8
"""Model generations of the uninterrupted ``fix`` episode: 3 + 3 + 2 turns."""

FIGURES: list[str] = []


@pytest.mark.parametrize(("point", "dedup"), [
    ("temporal.model.A1:5", True),           # during pass 2's second model call: billed, not journaled
    ("temporal.model.A2:5", False),          # pass 2's second call journaled, not returned
    ("temporal.tool.A1:4", False),           # inside pass 3's read of test_calc.py: read, not journaled
    ("temporal.episode.C1:2", False),        # pass 2's child has its proposal, its workflow not completed
    ("episode.P1:2", False),                 # the parent has pass 2's proposal, not its decision
    ("temporal.episode.decide.A1:2", False),  # pass 3 decided (apply) in the activity, not in the history
    ("temporal.episode.apply.A1:1", False),  # the apply's intent journaled, the patch not applied
    ("temporal.episode.apply.A2:1", False),  # the patch applied, its receipt not journaled
])
async def test_a_worker_killed_in_a_child_or_its_parent_bills_and_applies_once(
        env: WorkflowEnvironment, tmp_path: Path, point: str, dedup: bool) -> None:
    dev.make_repo(tmp_path)
    address = env.client.service_client.config.target_host
    queue, run_id = f"q-{uuid.uuid4().hex[:8]}", f"dev-{uuid.uuid4().hex[:8]}"
    first = dt.start_worker(address, queue, tmp_path, crash_at=point, dedup=dedup)
    try:
        handle = await env.client.start_workflow(EpisodeWorkflow.run, EpisodeInput(episode="fix", task=dev.TASK),
                                                 id=run_id, task_queue=queue)
        assert first.wait(timeout=120) == -signal.SIGKILL  # it died at the point
    finally:
        dt.stop(first)
    second = dt.start_worker(address, queue, tmp_path, dedup=dedup)
    try:
        result = await handle.result()
    finally:
        dt.stop(second)
    billing = read_records(tmp_path / "billing.jsonl")
    receipts = read_records(tmp_path / "receipts.jsonl")
    keys = Counter(r["key"] for r in billing)
    FIGURES.append(f"{point}: killed, billed {len(billing)} ({len(keys)} keys, max {max(keys.values())} per key), "
                   f"receipts {len(receipts)}, by the first worker {sum(r['pid'] == first.pid for r in billing)}")
    print(FIGURES[-1])
    assert (result["status"], len(result["passes"]), result["rejected"], result["turns"]) == ("applied", 3, 1, 8)
    assert len(billing) == GENERATIONS and set(keys.values()) == {1}  # each model key billed once
    assert len(receipts) == 1  # the patch applied once, from the apply callback's own record
    assert (tmp_path / "repo" / "calc.py").read_text().strip().endswith("return a + b")
    journal = open_journal(f"sqlite:///{tmp_path / 'journal.db'}")
    parent = journal.checkpoint(run_id)
    assert parent is not None and parent.status == "completed"
    applied = [e for e in journal.load(run_id) if e.step_id == "fix.pass03.apply" and e.phase == "result"]
    assert len(applied) == 1 and applied[0].payload["value"]["key"] == receipts[0]["key"]
    children = [journal.checkpoint(f"{run_id}/fix.pass{n:02d}") for n in (1, 2, 3)]
    assert [c.count("model_calls") if c else None for c in children] == [3, 3, 2]
    phases = [e.phase for e in journal.load(run_id) if e.step_id == "fix.pass03.apply"]
    if point.startswith("temporal.episode.apply.A1"):  # provably not applied (lookup: None): applied again
        assert phases == ["intent", "intent.2", "result"]
    elif point.startswith("temporal.episode.apply.A2"):  # applied: the lookup's receipt, not a second patch
        assert phases == ["intent", "result"] and applied[0].payload.get("counters") == {"reconciled": 1}
    else:
        assert phases == ["intent", "result"]
    decisions = [e.decision for e in journal.load(run_id) if e.phase == "decision"]
    assert decisions == ["another_pass", "another_pass", "apply"]  # each pass decided once
