"""A streamed run whose process is SIGKILLed mid-stream, resumed in another process.

The child streams a run through the real ``OpenAIGateway`` (the official SDK, an ``httpx2``
MockTransport serving server-sent events). The fake provider bills each request when it starts
generating, in its own fsynced billing log, whatever the key: a provider that does not honour
idempotency keys on streams. The child is killed at ``model.token:3`` (the third token handed to
the caller: the request's intent is journaled, its answer is not); the resumer re-sends with the
same key. The billing log is the ground truth: 2 requests with one key, and the journal counts
the second as possibly billed twice (so the cost's upper bound is twice the known cost).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cuaderno import SqliteCheckpointer
from cuaderno.checkpoint import cost_upper_usd, verified
from cuaderno.testing.records import read_records

CHILD = textwrap.dedent("""
    import asyncio, json, socket, sys
    import httpx2
    from cuaderno import Agent, Session, SqliteCheckpointer
    from cuaderno.gateway.openai import OpenAIGateway
    from cuaderno.gateway.pricing import PriceTable
    from cuaderno.testing.records import append_synced

    PIECES = ["The", " answer", " is", " 42", "."]

    def provider(billing):
        def handler(request):
            append_synced(billing, {"key": request.headers.get("idempotency-key")})  # billed as it starts

            async def body():
                for piece in PIECES:
                    chunk = {"id": "chatcmpl-k", "model": "gpt-test",
                             "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                    yield f"data: {json.dumps(chunk)}\\n\\n".encode()
                end = {"id": "chatcmpl-k", "model": "gpt-test", "choices": [{"index": 0, "delta": {},
                       "finish_reason": "stop"}], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}
                yield f"data: {json.dumps(end)}\\n\\ndata: [DONE]\\n\\n".encode()

            return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body())
        return handler

    async def main() -> None:
        db, billing = sys.argv[1], sys.argv[2]
        listener = socket.socket()  # accepts the loop's preflight connect; requests go to the mock
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        gw = OpenAIGateway("gpt-test", base_url=f"http://127.0.0.1:{listener.getsockname()[1]}/v1",
                           api_key="sk-test", prices=PriceTable({"gpt-test": {"input": 1000.0, "output": 1000.0}}),
                           http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(provider(billing))))
        store = SqliteCheckpointer(db)
        def show(token):  # called as each token arrives, before the next is read
            print(json.dumps({"token": token.text, "replayed": token.replayed}), flush=True)

        r = await Agent(instructions="i", model="gpt-test").stream("what is it?", session=Session("s", gw, store),
                                                                   on_token=show)
        print(json.dumps({"output": r.output, "twice": r.possibly_billed_twice, "cost": r.cost_usd}), flush=True)
        store.close()

    asyncio.run(main())
""")


def _child(db: Path, billing: Path, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    if crash_at is not None:
        env["CUADERNO_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, "-c", CHILD, str(db), str(billing)], env=env, capture_output=True,
                          text=True, timeout=60)


def _lines(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.mark.parametrize(("crash_at", "billed", "twice", "shown"), [
    # Killed at the third token: the caller saw two; the answer was never journaled. Re-sent
    # with the same key, billed again by this provider, counted as possibly billed twice.
    ("model.token:3", 2, 1, [("The", False), (" answer", False), (" is", False), (" 42", False), (".", False)]),
    # Killed after the streamed answer was journaled: the resumer pays nothing and hands the
    # answer over from the journal as one replayed token.
    ("model.K7:1", 1, 0, [("The answer is 42.", True)]),
])
def test_killed_mid_stream_resumes_with_the_same_key(tmp_path: Path, crash_at: str, billed: int, twice: int,
                                                     shown: list[tuple[str, bool]]) -> None:
    db, billing = tmp_path / "runs.db", tmp_path / "billing.jsonl"
    killed = _child(db, billing, crash_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    if crash_at.startswith("model.token"):
        assert [t["token"] for t in _lines(killed.stdout)] == ["The", " answer"]  # shown before the kill
    assert len(read_records(billing)) == 1

    resumed = _child(db, billing, None)
    assert resumed.returncode == 0, resumed.stderr
    lines = _lines(resumed.stdout)
    assert [(t["token"], t["replayed"]) for t in lines[:-1]] == shown
    assert lines[-1]["output"] == "The answer is 42." and lines[-1]["twice"] == twice

    records = read_records(billing)
    assert len(records) == billed and len({r["key"] for r in records}) == 1, "re-sent with another key"
    store = SqliteCheckpointer(db)
    try:
        cp, events = verified(store, "s")
        assert cp.status == "completed" and cp.count("possibly_billed_twice") == twice
        assert cp.count("model_calls") == 1 and cp.cost_usd == pytest.approx(0.015)
        # The upper bound matches what the provider's log says it may have billed.
        assert cost_upper_usd(cp, events) == pytest.approx(0.015 * billed)
    finally:
        store.close()

    # `cuaderno show` gives the same bound: known + possibly doubled, what the provider's log says.
    shown = subprocess.run([sys.executable, "-m", "cuaderno", "show", "s", "--db", str(db)], capture_output=True,
                           text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    line = next(x for x in shown.stdout.splitlines() if x.strip().startswith("max cost"))
    assert f"${0.015 * billed:.6f}" in line and (("1 call possibly billed twice" in line) == (twice == 1))
    data = json.loads(subprocess.run([sys.executable, "-m", "cuaderno", "show", "s", "--db", str(db), "--json"],
                                     capture_output=True, text=True, timeout=60).stdout)
    assert data["cost"]["upper_usd"] == pytest.approx(0.015 * billed) and data["cost"]["usd"] == pytest.approx(0.015)
