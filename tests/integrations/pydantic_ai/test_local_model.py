"""End to end on a real model: pydantic-ai's own OpenAI model and client against the llama.cpp
server on loopback (SmolLM2-135M), one run killed after the server answered and resumed in
another process; the server's own request log is the truth."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cuaderno import SqliteCheckpointer
from cuaderno.testing.llama_server import LlamaServer, local_model_available

REAL = Path(__file__).with_name("_real.py")

pytestmark = pytest.mark.local_model


def _run(journal: Path, server: LlamaServer, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    if crash_at:
        env["CUADERNO_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, str(REAL), str(journal), server.base_url, server.model_alias, "hello"],
                          capture_output=True, text=True, timeout=900, env=env)


def _requests(server: LlamaServer) -> int:
    assert server.log_path is not None
    return server.log_path.read_text(errors="replace").count("POST /v1/chat/completions")


def test_a_run_on_a_real_model_killed_after_the_answer_resumes_with_one_counted_resend(tmp_path: Path) -> None:
    why = local_model_available()
    if why is not None:
        pytest.skip(why)
    journal = tmp_path / "runs.db"
    with LlamaServer(n_threads=1) as server:
        killed = _run(journal, server, "model.K4")
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        assert _requests(server) == 1  # the server answered (and would have billed) the request
        resumed = _run(journal, server, None)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        out = json.loads(resumed.stdout.strip().splitlines()[-1])
        assert out["status"] == "completed" and isinstance(out["output"], str) and out["output"]
        # The one in flight at the kill was sent again, with the same key, and counted.
        assert _requests(server) == 2
        again = _run(journal, server, None)
        assert json.loads(again.stdout.strip().splitlines()[-1])["replayed"] is True
        assert _requests(server) == 2  # a closed run sends nothing
    with SqliteCheckpointer(journal, readonly=True) as store:
        events = store.load("hello")
    intents = [e for e in events if e.kind == "model" and e.phase.startswith("intent")]
    result = next(e for e in events if e.kind == "model" and e.phase == "result")
    assert len(intents) == 2 and intents[1].payload["after"] == "crash"
    assert {e.payload["key"] for e in intents} == {result.payload["key"]} and result.payload["sends"] == 2
