"""Issue 35, part 4's first half: a per-payload size limit, refused before anything is written, and a
tool whose result is over it settles its step as a small error record (never retried forever)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
from prune_journals import counts, start

from cuaderno import Agent, PayloadTooLarge, ScriptedGateway, Session, open_journal, tool
from cuaderno.events import StepEvent
from cuaderno.journal._compress import MAX_PAYLOAD
from cuaderno.journal.base import DEFAULT_MAX_PAYLOAD, payload_limit, validate_event


def _digest(path: str) -> dict[str, str]:
    return {s: hashlib.sha256(Path(path + s).read_bytes()).hexdigest()
            for s in ("", "-wal") if os.path.exists(path + s)}


def test_the_default_is_well_below_what_a_row_holds() -> None:
    assert DEFAULT_MAX_PAYLOAD * 50 < MAX_PAYLOAD
    assert payload_limit(object()) == DEFAULT_MAX_PAYLOAD


def test_an_oversized_payload_is_refused_naming_it_and_nothing_is_written(journal_url: str) -> None:
    store = open_journal(journal_url)
    try:
        store.append([start("r1")])
        store.max_payload = 10_000  # type: ignore[attr-defined]
        before = counts(journal_url)
        files = _digest(journal_url) if not journal_url.startswith("postgresql") else {}
        big = StepEvent(run_id="r1", step_id="t0000.model", phase="result", kind="model",
                        payload={"response": {"text": "x" * 20_000}})
        with pytest.raises(PayloadTooLarge) as caught:
            store.append([big])
        err = caught.value
        assert (err.run_id, err.step_id, err.phase, err.limit) == ("r1", "t0000.model", "result", 10_000)
        assert 20_000 < err.size < 20_100
        assert "20,0" in str(err) and "nothing was written" in str(err)
        assert counts(journal_url) == before
        if files:
            assert _digest(journal_url) == files  # byte-identical
        store.append([StepEvent(run_id="r1", step_id="t0000.model", phase="result", kind="model",
                                payload={"response": {"text": "x" * 9_000}})])  # under it: written
    finally:
        store.close()


def test_a_bad_limit_is_a_usage_error(tmp_path: Path) -> None:
    from cuaderno.errors import UsageError

    store = open_journal(str(tmp_path / "runs.db"))
    try:
        store.max_payload = 0  # type: ignore[attr-defined]
        with pytest.raises(UsageError, match="max_payload"):
            store.append([start("r1")])
    finally:
        store.close()


def test_validate_event_and_the_error_round_trip() -> None:
    ev = StepEvent(run_id="r", step_id="s", phase="p", kind="tool", payload={"v": "y" * 100})
    validate_event(ev)
    with pytest.raises(PayloadTooLarge):
        validate_event(ev, 50)
    err = PayloadTooLarge("r", "s", "p", 120, 50)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is PayloadTooLarge and str(again) == str(err) and again.size == 120


calls: list[int] = []


@tool
def dump(size: int) -> dict[str, Any]:
    """Return a result of about ``size`` bytes."""
    calls.append(size)
    return {"data": "z" * size}


def test_a_tool_result_over_the_limit_settles_as_a_small_error_and_is_never_run_again(journal_url: str) -> None:
    calls.clear()
    agent = Agent(instructions="dump it", tools=[dump], name="dumper")
    store = open_journal(journal_url)
    store.max_payload = 50_000  # type: ignore[attr-defined]
    try:
        def gateway() -> ScriptedGateway:
            return ScriptedGateway([ScriptedGateway.call("dump", size=200_000), ScriptedGateway.text("too big, sorry")])

        result = asyncio.run(agent.run_to_end("dump", session=Session("big-1", gateway(), store)))
        assert result.status == "completed"
        events = store.load("big-1")
        tool_result = next(e for e in events if e.kind == "tool" and e.phase == "result")
        assert tool_result.payload["outcome"] == "error"
        assert tool_result.payload["error"]["type"] == "PayloadTooLarge"
        assert tool_result.payload["error"]["size"] > 200_000 and tool_result.payload["error"]["limit"] == 50_000
        assert len(tool_result.encoded_payload()) < 2_000  # the record is small
        assert max(len(e.encoded_payload()) for e in events) < 50_000
        assert calls == [200_000]
        # Resumed again: the step is settled, the tool is not called again.
        again = asyncio.run(agent.run_to_end("dump", session=Session("big-1", gateway(), store)))
        assert again.status == "completed" and calls == [200_000]
    finally:
        store.close()
