"""Issue 23 (5): the developer agent on the local model (SmolLM2-135M on llama.cpp, loopback).

So small a model mostly fails to propose a valid patch; what is tested is that the episode ends
bounded by its budgets whatever the model does, and that what it counted matches the journal.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cuaderno import SqliteCheckpointer
from cuaderno.testing.llama_server import LlamaServer, local_model_available
from cuaderno.testing.records import read_records

pytestmark = [pytest.mark.local_model, pytest.mark.xdist_group("local_model")]

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "episodes"


async def test_the_developer_agent_on_the_local_model_ends_bounded(tmp_path: Path) -> None:
    missing = local_model_available()
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(missing)
        pytest.skip(missing)
    sys.path.insert(0, str(EXAMPLE_DIR))
    try:
        import developer_agent as dev
    finally:
        sys.path.remove(str(EXAMPLE_DIR))
    dev.make_repo(tmp_path)
    budgets = dev.LOCAL_BUDGETS
    with LlamaServer(n_threads=int(os.environ.get("CUADERNO_LLAMA_THREADS", "1")), extra_args=["--seed", "1234"]) as s:
        result = await dev.run_local(tmp_path, s.base_url, s.model_alias)
    assert result.status in ("applied", "discarded", "exhausted", "failed")
    assert 1 <= len(result.passes) <= budgets.passes
    assert all(1 <= p.turns <= budgets.turns_per_pass for p in result.passes)
    assert result.rejected <= budgets.rejected_responses + 1
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        turns = sum(store.checkpoint(p.child_run_id).count("model_calls") for p in result.passes)  # type: ignore[union-attr]
        assert turns == result.turns and result.unpriced_calls == turns  # llama.cpp reports no price
        assert store.checkpoint("dev-fix").status in ("completed", "failed")  # type: ignore[union-attr]
    applied = read_records(tmp_path / "receipts.jsonl")
    assert len(applied) == (1 if result.status == "applied" else 0)
