"""Idempotent starts across processes (issue 36 part 3): ten processes submit the same
idempotency key at the same moment; the journal ends with one run, and all ten handles name it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cuaderno import open_journal
from cuaderno.journal import queue_of

HERE = Path(__file__).resolve().parent


def test_ten_processes_submitting_one_key_make_one_run(fq_world: Any) -> None:
    go = fq_world.dir / "go"
    children = [fq_world.python(str(HERE / "flowq_submit.py"), fq_world.journal, str(go), "invoice-42") for _ in range(10)]
    for child in children:  # each has opened the journal and waits for the go
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
    go.touch()
    handles = []
    for child in children:
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        handles.append(json.loads(out.strip().splitlines()[-1]))
    assert len(handles) == 10
    assert len({h["run_id"] for h in handles}) == 1
    assert sum(h["created"] for h in handles) == 1
    store = open_journal(fq_world.journal)
    try:
        runs = store.list_runs(limit=100)
        assert [cp.run_id for cp in runs] == [handles[0]["run_id"]]
        assert [e.phase for e in store.load(handles[0]["run_id"])] == ["start"]
        assert queue_of(store).entry(handles[0]["run_id"]) is not None
    finally:
        store.close()
