"""Erasing a run in a SQLite journal (issue 35, part 2): its content leaves every file the
journal owns, its structure and chain stay, and it can be neither resumed, forked nor exported."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from _erase_world import grep_files, run_with_secret, secret

from cuaderno import Agent, RunErased, ScriptedGateway, Session
from cuaderno.errors import JournalCorrupt, RunStillOpen, UsageError
from cuaderno.events import StepEvent
from cuaderno.journal import MemoryCheckpointer, SqliteCheckpointer
from cuaderno.operations import erase, export_lines, fork


def _files(path: Path) -> list[Path]:
    """The database, its -wal and -shm, the anchor, and any other file the journal made beside it."""
    named = {path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-anchor")}
    return sorted(named | set(path.parent.glob(path.name + "*")))


@pytest.mark.parametrize("thorough", [False, True])
async def test_an_erased_run_leaves_no_byte_of_its_content_in_any_file(tmp_path: Path, thorough: bool) -> None:
    path = tmp_path / "j.db"
    gone, kept = secret(), secret()
    with SqliteCheckpointer(path) as store:
        await run_with_secret(store, "gone", gone)
        await run_with_secret(store, "kept", kept)
        before = store.load("gone")
        cp_before = store.checkpoint("gone")
        # Before: the secret is in the files (the test can fail).
        assert sum(grep_files(_files(path), gone).values()) > 0
        done = erase(store, "gone", reason="ticket 7", thorough=thorough)
        assert (done.rows, done.already, done.scrubbed) == (len(before), False, True)
        # The files as they are while the store is still open (nothing closed or folded them yet).
        assert grep_files(_files(path), gone) == dict.fromkeys((f.name for f in _files(path)), 0)
        after = store.load("gone")  # the chain still verifies, against the same head
        cp = store.checkpoint("gone")
    assert cp is not None and cp_before is not None
    assert [(e.seq, e.step_id, e.phase, e.kind, e.name, e.decision, e.row_hash) for e in after] == \
        [(e.seq, e.step_id, e.phase, e.kind, e.name, e.decision, e.row_hash) for e in before]
    assert all(e.erased and e.fingerprint is None and e.salt is None for e in after)
    assert any(e.fingerprint for e in before) and cp.task_fingerprint is None
    assert (cp.status, cp.counters, cp.cost_usd, cp.last_hash) == \
        (cp_before.status, cp_before.counters, cp_before.cost_usd, cp_before.last_hash)
    assert cp.outcome is not None and cp.outcome["erased"]["reason"] == "ticket 7"
    assert grep_files(_files(path), gone) == dict.fromkeys((f.name for f in _files(path)), 0)
    # The other run is whole.
    assert grep_files(_files(path), kept)["j.db"] > 0
    with SqliteCheckpointer(path) as store:
        assert any(kept in str(e.payload) for e in store.load("kept"))


async def test_an_erased_run_cannot_be_resumed_forked_or_exported_and_erase_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    token = secret()
    with SqliteCheckpointer(path) as store:
        await run_with_secret(store, "r", token)
        erase(store, "r")
        again = erase(store, "r")
        assert (again.rows, again.already, again.scrubbed) == (0, True, True)
        gw = ScriptedGateway([])
        with pytest.raises(RunErased):
            async for _ in Agent(instructions="answer").run("t", session=Session("r", gw, store)):
                pass
        assert gw.calls == 0
        with pytest.raises(RunErased):
            fork(store, "r", at="t0000.tool00", new_run_id="copy")
        with pytest.raises(RunErased):
            list(export_lines(store, "r"))
        with pytest.raises(RunErased):
            store.append([StepEvent(run_id="r", step_id="note", phase="result", kind="tool", payload={})])
        assert store.checkpoint("copy") is None


def test_an_open_run_is_not_erased_and_nothing_changes(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path) as store:
        store.append([StepEvent(run_id="r", step_id="run", phase="start", kind="run", payload={"task": "keep me"})])
    with SqliteCheckpointer(path) as store:
        before = [f.read_bytes() if f.exists() else None for f in _files(path)]
        with pytest.raises(RunStillOpen, match="running"):
            erase(store, "r")
        assert [f.read_bytes() if f.exists() else None for f in _files(path)] == before
        assert store.load("r")[0].payload == {"task": "keep me"}
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT count(*) FROM cuaderno_events WHERE codec='erased'").fetchone()[0] == 0


def test_a_journal_without_erasure_says_so() -> None:
    with pytest.raises(UsageError, match="cannot erase"):
        erase(MemoryCheckpointer(), "r")


async def test_the_command_line_erases_and_refuses_with_a_message_and_a_status(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cuaderno.cli import app

    path = tmp_path / "j.db"
    token = secret()
    with SqliteCheckpointer(path) as store:
        await run_with_secret(store, "r", token)
        store.append([StepEvent(run_id="open", step_id="run", phase="start", kind="run", payload={"task": "t"})])
    runner = CliRunner()
    done = runner.invoke(app, ["--db", str(path), "erase", "r", "--reason", "ticket 3"])
    assert done.exit_code == 0 and "content of its 8 journaled event(s) was erased" in done.output
    again = runner.invoke(app, ["--db", str(path), "erase", "r"])
    assert again.exit_code == 0 and "already erased" in again.output
    shown = runner.invoke(app, ["--db", str(path), "show", "r"])
    assert shown.exit_code == 0 and '"erased": true' in shown.output and token not in shown.output
    refused = runner.invoke(app, ["--db", str(path), "erase", "open"])
    assert refused.exit_code == 4 and refused.output.startswith("error: run 'open' is running")
    missing = runner.invoke(app, ["--db", str(path), "erase", "nope"])
    assert missing.exit_code == 3 and "Traceback" not in missing.output
    exported = runner.invoke(app, ["--db", str(path), "export", "r"])
    assert exported.exit_code == 4 and "its content was erased" in exported.output
    assert sum(grep_files(_files(path), token).values()) == 0


async def test_arguments_a_person_approved_leave_every_file_too(tmp_path: Path) -> None:
    """Pending arguments live in the run's summary too, rewritten by every append of the run:
    the erasure leaves none of their copies, and keeps who approved."""
    from cuaderno import Policy, harness, tool

    @tool
    def transfer(to: str, amount: int) -> str:
        """Move money."""
        return "sent"

    path = tmp_path / "j.db"
    token = secret()
    agent = Agent(instructions="i", tools=[transfer], policy=Policy({"transfer": "require_approval"}))
    gw = ScriptedGateway([ScriptedGateway.call("transfer", to=token, amount=1), ScriptedGateway.text("done")])
    with SqliteCheckpointer(path) as store:
        async for _ in agent.run("t", session=Session("r", gw, store)):
            pass
        for i in range(20):  # other runs' rows between the approval and its decision
            store.append([StepEvent(run_id=f"x{i}", step_id="run", phase="start", kind="run", payload={"n": i})])
        harness.approve(store, "r", "t0000.tool00.approval", approver="alice")
        async for _ in agent.run("t", session=Session("r", gw, store)):
            pass
        assert sum(grep_files(_files(path), token).values()) > 0
        erase(store, "r")
        cp = store.checkpoint("r")
    assert cp is not None and cp.outcome is not None
    assert cp.outcome["erased"]["approvers"] == {"t0000.tool00.approval": "alice"}
    assert sum(grep_files(_files(path), token).values()) == 0


@pytest.mark.parametrize("golden", ["schema_v1.sqlite", "schema_v2.sqlite"])
def test_a_run_written_before_keyed_digests_is_checked_whole_then_erased(tmp_path: Path, golden: str) -> None:
    """Rows of the first chain version linked over their payload: erase checks the whole chain
    first; afterwards their hashes are kept as stored (not recomputable), and what is still
    checked is the numbering and that the summary's head is the last row's hash."""
    import shutil

    path = tmp_path / "old.db"
    shutil.copyfile(Path(__file__).resolve().parents[1] / "golden" / "journals" / golden, path)
    with SqliteCheckpointer(path) as store:  # migrated to schema 3 at open
        before = store.load("golden-support")
        assert before and all(e.salt is None for e in before)
        task = before[0].payload["task"]
        assert sum(grep_files(_files(path), task).values()) > 0
        done = erase(store, "golden-support", reason="old rows")
        assert done.rows == len(before)
        after = store.load("golden-support")
        assert [e.row_hash for e in after] == [e.row_hash for e in before] and all(e.erased for e in after)
        assert all(e.encoded_payload() == b"" for e in after)  # nothing to keep: no key, no digest
        assert store.load("golden-research")[0].payload  # the other runs are whole
    assert sum(grep_files(_files(path), task).values()) == 0
    with closing(sqlite3.connect(path)) as db, db:  # removing its last row is still caught
        db.execute("DELETE FROM cuaderno_events WHERE run_id='golden-support' AND seq=?", (len(before),))
    with SqliteCheckpointer(path, accept_rollback=True) as store, pytest.raises(JournalCorrupt, match="rows removed"):
        store.load("golden-support")


async def test_the_page_shows_an_erased_run_and_none_of_its_content(tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from cuaderno.ui.app import create_app

    path = tmp_path / "j.db"
    token = secret()
    with SqliteCheckpointer(path) as store:
        await run_with_secret(store, "r", token)
        erase(store, "r", reason="ticket 5")
    with TestClient(create_app(path, allowed_hosts=["testserver"]), headers={"origin": "http://testserver"}) as client:
        page = client.get("/run", params={"id": "r"})
        event = client.get("/run/event", params={"id": "r", "seq": "1"})
    assert page.status_code == 200 and "ticket 5" in page.text and token not in page.text
    assert event.status_code == 200 and "erased" in event.text and token not in event.text
