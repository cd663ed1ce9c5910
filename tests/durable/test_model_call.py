"""ModelCall as a caller that is not the runner uses it (a framework integration): a framework's
own response journaled beside cuaderno's and handed back on replay, and a started step's key
kept whatever the caller would derive now."""

from __future__ import annotations

import asyncio
import math
import random
from pathlib import Path
from typing import Any

import pytest

from cuaderno import RetryPolicy, SqliteCheckpointer
from cuaderno.durable import FrameworkPayload, ModelCall, Opened, open_run
from cuaderno.errors import ReplayDivergence, UsageError
from cuaderno.gateway.base import ModelResponse

RUN = "mc"
STEP = "t0000.model"


def _open(store: SqliteCheckpointer) -> Opened:
    return open_run(store, RUN, task="ask", task_fingerprint="fp-ask", versions={}, tenant="default", owner="me")


async def _answer(call: ModelCall, sent_keys: list[str], **finish: Any) -> dict[str, Any]:
    async def provider() -> ModelResponse:
        sent_keys.append(call.key)
        return ModelResponse(text="hello")

    sent = await call.send(provider, retry=RetryPolicy(), sleep=asyncio.sleep, rng=random.Random(0))
    payload = call.finish(sent, **finish)
    call.log.commit()
    return payload


# The framework's own dump: what it needs back (ids, part kinds) and cuaderno's response lacks.
DUMP = {"kind": "response", "parts": [{"part_kind": "text", "content": "hello", "id": "p-1"}], "score": 0.5}


def test_a_framework_payload_is_journaled_and_given_back_on_replay(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        opened = _open(store)
        call = ModelCall(opened.log, STEP, key="k-1", turn=0, fingerprint="req")
        assert call.framework_payload("pydantic-ai") is None  # nothing answered yet
        asyncio.run(_answer(call, [], framework=FrameworkPayload("pydantic-ai", DUMP)))
        opened.release()
        again = _open(store)  # another process's view: the journal only
        replay = ModelCall(again.log, STEP, key="k-1", turn=0, fingerprint="req")
        assert replay.answered() is not None
        assert replay.framework_payload("pydantic-ai") == DUMP
        # The response cuaderno reads (show, verdicts, cost) is still journaled as before.
        assert replay.answered().payload["response"]["text"] == "hello"  # type: ignore[union-attr]
        # Another framework's reading of this step is not this step: a divergence, not a guess.
        with pytest.raises(ReplayDivergence):
            replay.framework_payload("openai-agents")
        again.release()


def test_a_result_without_a_framework_payload_reads_none(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        opened = _open(store)
        call = ModelCall(opened.log, STEP, key="k-1", turn=0)
        payload = asyncio.run(_answer(call, []))
        assert "framework" not in payload  # the runner's path writes the same bytes as before
        assert call.framework_payload("pydantic-ai") is None
        opened.release()


@pytest.mark.parametrize("bad", [{"x": math.nan}, {"x": object()}, {1: "int key"}])
def test_a_framework_payload_that_is_not_plain_json_is_refused_before_anything_is_staged(
        tmp_path: Path, bad: Any) -> None:
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        opened = _open(store)
        call = ModelCall(opened.log, STEP, key="k-1", turn=0)
        with pytest.raises(UsageError, match="framework payload"):
            asyncio.run(_answer(call, [], framework=FrameworkPayload("pydantic-ai", bad)))
        opened.log.commit()
        # The intent is journaled (the request left), the result is not: a resume sends again
        # with the key, counted, instead of finding half a result.
        assert opened.log.get(STEP, "intent") is not None and opened.log.get(STEP, "result") is None
        opened.release()


def test_a_started_step_keeps_the_key_its_first_intent_carried(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        opened = _open(store)
        first = ModelCall(opened.log, STEP, key="key-as-first-sent", turn=0)
        first.intend(1)
        opened.log.commit()  # the process died after the intent: the provider may know this key
        opened.release()
        again = _open(store)
        # A resume that derives another key (another policy, another library version) must not
        # send the step under it: the provider would bill a second, unrelated request.
        call = ModelCall(again.log, STEP, key="key-derived-now", turn=0, keep_key=True)
        assert call.key == "key-as-first-sent"
        # Off by default: the runner derives its key from the request (another body, another key).
        assert ModelCall(again.log, STEP, key="key-derived-now", turn=0).key == "key-derived-now"
        sent: list[str] = []
        payload = asyncio.run(_answer(call, sent))
        assert sent == ["key-as-first-sent"]
        assert payload["key"] == "key-as-first-sent" and payload["sends"] == 2
        assert again.log.get(STEP, "intent.2").payload["key"] == "key-as-first-sent"  # type: ignore[union-attr]
        again.release()
