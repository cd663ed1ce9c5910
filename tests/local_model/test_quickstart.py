"""The OpenAI-compatible quickstart, run as a stranger runs it, against the real llama.cpp server."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cuaderno.testing.llama_server import LlamaServer

pytestmark = pytest.mark.local_model
PAGE = Path(__file__).resolve().parents[2] / "docs" / "quickstart" / "openai-compatible.md"


def test_the_quickstart_agent_runs_then_replays_without_a_call(llama_server: LlamaServer, tmp_path: Path) -> None:
    code = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)[0]
    # The page serves the model on :8080 as "smollm2"; the test's server has its own port and alias.
    code = code.replace("http://127.0.0.1:8080/v1", llama_server.base_url).replace('"smollm2"', f'"{llama_server.model_alias}"')
    (tmp_path / "agent.py").write_text(code)
    before = _server_posts(llama_server)
    runs = [_run(tmp_path)]
    # The server logs a request just after answering it: wait for the first run's line.
    deadline = time.monotonic() + 10
    while _server_posts(llama_server) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    runs.append(_run(tmp_path))
    assert _server_posts(llama_server) - before == 1, "the server's own log must show one chat request in all"
    for proc in runs:
        assert proc.returncode == 0, proc.stderr[-2000:]
    first, second = (proc.stdout.splitlines() for proc in runs)
    assert first[0] == "ModelStep t0000.model" and "FinalStep final" in first
    assert first[-1] == "completed - model calls journaled: 1"
    # The second run is answered from the journal: no ModelStep, and the count did not move.
    assert second == ["FinalStep final", "completed - model calls journaled: 1"]


def _run(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "agent.py"], cwd=cwd, capture_output=True, text=True, timeout=300)


def _server_posts(server: LlamaServer) -> int:
    # uvicorn's access log, written by the server process: a record cuaderno does not write.
    assert server.log_path is not None
    text = server.log_path.read_text(errors="replace")
    return sum(1 for line in text.splitlines() if '"POST /v1/chat/completions HTTP/1.1"' in line)
