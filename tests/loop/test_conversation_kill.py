"""A conversation whose process is SIGKILLed mid-way, resumed in another process.

The child sends three messages; it is killed at a named crash point inside one of them. Another
process sends the same messages (or calls ``resume()``). Ground truth is the fake provider's
billing log (``ScriptedGateway(billing_log=...)``, fsynced by the provider before it answers), not
the journal: every earlier answer is billed exactly once; only a call killed after the provider
billed it and before the journal had it is sent again, with the same key, and counted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from cuaderno import SqliteCheckpointer
from cuaderno.testing.records import read_records

CHILD = textwrap.dedent("""
    import asyncio, json, sys
    from cuaderno import Agent, ScriptedGateway, Session, SqliteCheckpointer

    def echo(request):
        last = [m for m in request.messages if m["role"] == "user"][-1]["content"]
        seen = sum(1 for m in request.messages if m["role"] == "assistant")
        return ScriptedGateway.text(f"re: {last} (after {seen})")

    async def main() -> None:
        db, billing, mode = sys.argv[1], sys.argv[2], sys.argv[3]
        store = SqliteCheckpointer(db)
        conv = Agent(instructions="chat").conversation(
            session=Session("chat", ScriptedGateway(echo, billing_log=billing), store))
        out = []
        if mode == "resume":
            last = await conv.resume()
            out.append(last.output if last is not None else None)
            texts = ["a", "b", "c"][conv.position:]
        else:
            texts = ["a", "b", "c"]
        for text in texts:
            out.append((await conv.send(text)).output)
        print(json.dumps(out))
        store.close()

    asyncio.run(main())
""")

ANSWERS = ["re: a (after 0)", "re: b (after 1)", "re: c (after 2)"]


def _child(db: Path, billing: Path, mode: str, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    if crash_at is not None:
        env["CUADERNO_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, "-c", CHILD, str(db), str(billing), mode], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize(("crash_at", "mode", "billed_twice"), [
    ("model.K7:2", "send", None),          # message 2's answer journaled, its final not yet
    ("model.K4:3", "send", "chat/m0003"),  # message 3 billed by the provider, not journaled
    ("conversation.M1:2", "send", None),   # message 2 recorded in the head, its run not started
    ("final.K7:1", "resume", None),        # message 1 closed; a process that knows no messages resumes
    ("model.K4:2", "resume", "chat/m0002"),
])
def test_killed_mid_conversation_resumes_in_another_process_paying_nothing_again(
        tmp_path: Path, crash_at: str, mode: str, billed_twice: str | None) -> None:
    db, billing = tmp_path / "runs.db", tmp_path / "billing.jsonl"
    killed = _child(db, billing, "send", crash_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = len(read_records(billing))

    resumed = _child(db, billing, mode, None)
    assert resumed.returncode == 0, resumed.stderr
    outputs = json.loads(resumed.stdout)
    # Replaying the script gives every answer; resume() gives the last recorded message's, then the rest.
    assert outputs == (ANSWERS if mode == "send" else ANSWERS[-len(outputs):])
    records = read_records(billing)
    per_key = Counter(r["key"] for r in records)
    assert len(per_key) == 3, "one model call per message"
    twice = [k for k, n in per_key.items() if n > 1]
    store = SqliteCheckpointer(db)
    try:
        counted = {f"chat/m000{i}": store.checkpoint(f"chat/m000{i}").count("possibly_billed_twice")  # type: ignore[union-attr]
                   for i in (1, 2, 3)}
        if billed_twice is None:
            assert twice == [], f"paid again: {twice}"
            assert sum(counted.values()) == 0
        else:
            # Only the call in flight at the kill (billed, not journaled) was sent again, with its
            # key, and the journal counts it; every journaled answer was billed once.
            assert len(twice) == 1 and per_key[twice[0]] == 2
            assert counted == {**dict.fromkeys(counted, 0), billed_twice: 1}
        assert len(records) == 3 + (1 if billed_twice else 0) and before <= len(records)
        assert all(store.checkpoint(f"chat/m000{i}").status == "completed" for i in (1, 2, 3))  # type: ignore[union-attr]
        head = [e.step_id for e in store.load("chat") if e.phase == "message"]
        assert head == ["m0001", "m0002", "m0003"]
    finally:
        store.close()
