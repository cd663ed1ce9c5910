"""The protocol's public shape serves a caller that is not cuaderno's runner (what the framework
integrations build on): a real process using only ``cuaderno.durable`` is SIGKILLed at each named
point of a model call and a payment, resumed by a second process, and the outcome is proven from
the fake provider's billing log and the payment service's receipts, not from the journal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cuaderno import SqliteCheckpointer

CALLER = Path(__file__).with_name("_caller.py")


def _run(tmp: Path, crash_at: str | None) -> int:
    env = {**os.environ}
    env.pop("CUADERNO_CRASH_AT", None)
    if crash_at:
        env["CUADERNO_CRASH_AT"] = crash_at
    proc = subprocess.run([sys.executable, str(CALLER), str(tmp / "runs.db"), str(tmp / "billing.jsonl"),
                           str(tmp / "receipts.jsonl")], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, -signal.SIGKILL), proc.stderr
    return proc.returncode


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("point", [None, "model.K1", "model.K2", "model.K5", "model.K6", "model.K7",
                                   "tool.K1", "tool.K2", "tool.K5", "tool.K6", "tool.K7"])
def test_a_killed_outside_caller_resumes_without_paying_or_paying_twice(tmp_path: Path, point: str | None) -> None:
    first = _run(tmp_path, point)
    assert first == (0 if point is None else -signal.SIGKILL)
    assert _run(tmp_path, None) == 0
    billed = _lines(tmp_path / "billing.jsonl")
    receipts = _lines(tmp_path / "receipts.jsonl")
    assert len(receipts) == 1 and receipts[0]["key"] == "eff-outside-pay"  # paid exactly once
    # The provider was asked again only when a send may have been billed and its answer was lost
    # (killed after the response, before its result): with the same key, and counted as such.
    # K1 and K6 kill inside the transaction of the intent or the result (the journal's crash
    # points, as the runner's): an intent rolled back was never sent; a result rolled back is a
    # send whose answer was lost.
    assert len(billed) == (2 if point in ("model.K5", "model.K6") else 1)
    assert {b["key"] for b in billed} == {"req-outside-0"}
    with SqliteCheckpointer(tmp_path / "runs.db", readonly=True) as store:
        cp = store.checkpoint("outside")
        events = {(e.step_id, e.phase): e for e in store.load("outside")}
    assert cp is not None and cp.status == "completed" and cp.outcome is not None
    assert cp.outcome["output"] == "paid 42 to ana"
    # A send in flight at a kill is counted as a second send whether or not it left (K2: it had
    # not; the journal cannot know): possibly billed twice, never billed twice unknowingly.
    resent = ("model.K2", "model.K5", "model.K6")
    assert events[("t0000.model", "result")].payload["sends"] == (2 if point in resent else 1)
    result = events[("t0000.tool00", "result")].payload
    assert result["outcome"] == "ok" and result["value"] == {"paid": 42, "key": "eff-outside-pay"}
    assert result.get("counters", {}).get("reconciled") == (1 if point in ("tool.K5", "tool.K6") else None)
    # A third process finds the run closed (open_run): nothing is sent or paid again.
    assert _run(tmp_path, None) == 0
    assert len(_lines(tmp_path / "billing.jsonl")) == len(billed)
    assert len(_lines(tmp_path / "receipts.jsonl")) == 1
