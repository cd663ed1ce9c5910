"""Old journals read through the payload types (:mod:`cuaderno.events.payloads`).

Every committed golden journal (the ``schema_v<N>.sqlite`` files as release N wrote them, and the
``*.v<N>.jsonl`` histories) is read event by event through the type of its ``(kind, phase)``:

- every event's ``(kind, phase)`` has a type, and its payload holds to it (:func:`check`);
- reading through the types changes no byte: the payload bytes stored in the file equal the
  encoding of what the typed read returns, and the run's hash chain still checks;
- the projection, which reads the typed payloads, rebuilds exactly the summary stored in the file
  by the release that wrote it;
- typed reads give what the program did: each tool step's name is the name of the call the model
  asked for at its index, and each final answer's turn is a model turn of the run.
"""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
import zstandard
from make_golden import JOURNALS, event_from_record, read_jsonl

from cuaderno import SqliteCheckpointer
from cuaderno.checkpoint import differing, rebuild
from cuaderno.events import StepEvent, encode_payload
from cuaderno.events.payloads import FinalResult, ModelResult, ToolResult, check, type_of, view

SCHEMA_FILES = sorted(JOURNALS.glob("schema_v*.sqlite"))
HISTORIES = sorted(JOURNALS.glob("*.jsonl"))


def _plain(codec: str, blob: bytes) -> bytes:
    """A payload's JSON bytes as the file holds them (a large one is a standard zstd frame), read
    with the zstd library itself, not with cuaderno's journal."""
    return zstandard.ZstdDecompressor().decompress(blob) if codec == "json+zstd" else blob


def _typed_reads(events: list[StepEvent]) -> int:
    """Read every event through its type; check what the reads say against the run. Returns the
    number of tool steps whose call was matched."""
    by_key = {(e.step_id, e.phase): e for e in events}
    matched = 0
    for ev in events:
        assert type_of(ev.kind, ev.phase) is not None, (ev.kind, ev.phase)
        check(ev)
        if ev.kind == "tool" and ev.phase == "result" and ev.step_id.startswith("t"):
            turn, _, index = ev.step_id.partition(".tool")
            model = view(by_key[(f"{turn}.model", "result")], ModelResult)
            response = model["response"]
            assert response is not None
            assert response["tool_calls"][int(index)]["name"] == ev.name
            assert view(ev, ToolResult)["outcome"]
            matched += 1
        if ev.kind == "final":
            turn = view(ev, FinalResult).get("turn")
            assert turn is None or (f"t{turn:04d}.model", "result") in by_key
    return matched


@pytest.mark.parametrize("fixture", SCHEMA_FILES, ids=lambda p: p.name)
def test_an_old_journal_file_reads_through_the_types(fixture: Path, tmp_path: Path) -> None:
    path = tmp_path / fixture.name
    shutil.copy(fixture, path)
    with closing(sqlite3.connect(path)) as db:
        stored = {(r, s, p): _plain(c, bytes(b)) for r, s, p, c, b in
                  db.execute("SELECT run_id, step_id, phase, codec, payload FROM cuaderno_events")}
    store = SqliteCheckpointer(str(path))
    try:
        runs = store.list_runs()
        assert runs, "a golden journal file holds runs"
        matched = 0
        for summary in runs:
            events = store.load(summary.run_id)  # chain-checked
            matched += _typed_reads(events)
            for ev in events:
                assert encode_payload(ev.payload) == stored[ev.key], ev.key  # no byte changed
            assert differing(summary, rebuild(summary.run_id, events, epoch=summary.epoch)) == []
        assert matched > 0
    finally:
        store.close()


@pytest.mark.parametrize("history", HISTORIES, ids=lambda p: p.name)
def test_a_golden_history_reads_through_the_types(history: Path) -> None:
    _, records = read_jsonl(history)
    events = [event_from_record(r) for r in records]
    before = [encode_payload(r["payload"]) for r in records]
    assert _typed_reads(events) > 0
    assert [ev.encoded_payload() for ev in events] == before
