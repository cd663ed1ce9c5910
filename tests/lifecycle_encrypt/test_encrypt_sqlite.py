"""Encryption at rest in a SQLite journal: what a run says rests sealed in every file the
journal owns, reads back whole with the key, and is refused without it (or with another key)
before anything is read or written; rows written before encryption was turned on still read;
erasing a run destroys its data key; rekey re-wraps every data key."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from _encrypt_world import file_digests, keys_of, new_key, sqlite_files
from _erase_world import grep_files, run_with_secret, secret

from cuaderno.errors import KeyInvalid, KeyMissing, UsageError
from cuaderno.events import StepEvent
from cuaderno.journal import MemoryCheckpointer, SqliteCheckpointer
from cuaderno.operations import erase, export_lines, fork, rekey, shown


def _keys_table(path: Path) -> dict[str, str]:
    with closing(sqlite3.connect(path)) as db:
        return dict(db.execute("SELECT run_id, key_id FROM cuaderno_keys").fetchall())


async def test_a_secret_in_task_tool_result_and_answer_is_in_no_file_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    token, plain = secret(), secret()
    keys = keys_of(new_key())
    with SqliteCheckpointer(path, keys=keys) as store:
        await run_with_secret(store, "r", token)
        # While the store is open (the -wal holds the commits, nothing folded yet) and after.
        assert sum(grep_files(sqlite_files(path), token).values()) == 0
        events = store.load("r")
        cp = store.checkpoint("r")
    assert grep_files(sqlite_files(path), token) == dict.fromkeys((f.name for f in sqlite_files(path)), 0)
    # With the key, everything reads: the task, the tool's result, the answer, the summary's outcome.
    assert f"find {token}" in str(events[0].payload)
    assert any(f"{token}-tool" in str(e.payload) for e in events if e.kind == "tool")
    assert cp is not None and cp.outcome is not None and f"{token}-answer" in cp.outcome["output"]
    with SqliteCheckpointer(path, keys=keys, readonly=True) as store:
        summary, timeline = shown(store, "r")
        assert summary.status == "completed" and len(timeline) == len(events)
    # The same run without encryption puts the secret in the file: the grep can find it.
    with SqliteCheckpointer(tmp_path / "plain.db") as store:
        await run_with_secret(store, "r", plain)
    assert sum(grep_files(sqlite_files(tmp_path / "plain.db"), plain).values()) > 0


async def test_without_the_key_or_with_another_the_journal_is_refused_and_left_byte_identical(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    keys = keys_of(new_key())
    with SqliteCheckpointer(path, keys=keys) as store:
        await run_with_secret(store, "r", secret())
        # A -wal with commits in it stays beside the file while another connection holds it.
        holder = sqlite3.connect(path)
        holder.execute("SELECT 1 FROM cuaderno_runs LIMIT 1").fetchall()
    try:
        before = file_digests(sqlite_files(path))
        assert before[f"{path.name}-wal"] is not None
        for opening in (lambda: SqliteCheckpointer(path), lambda: SqliteCheckpointer(path, readonly=True),
                        lambda: SqliteCheckpointer(path, keys=keys_of(new_key()))):
            with pytest.raises((KeyMissing, KeyInvalid)) as refused:
                opening()
            assert "nothing was read or written" in str(refused.value)
            assert file_digests(sqlite_files(path)) == before
        with pytest.raises(KeyInvalid, match="k1-"):
            SqliteCheckpointer(path, keys=keys_of(new_key()))
        with pytest.raises(KeyMissing):
            SqliteCheckpointer(path)
    finally:
        holder.close()
    with SqliteCheckpointer(path, keys=keys) as store:  # the right key still opens it
        assert store.checkpoint("r") is not None


async def test_rows_written_before_encryption_was_turned_on_stay_plain_and_read(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    before, after = secret(), secret()
    with SqliteCheckpointer(path) as store:
        await run_with_secret(store, "old", before)
        store.append([StepEvent(run_id="mixed", step_id="run", phase="start", kind="run", payload={"task": before})])
    keys = keys_of(new_key())
    with SqliteCheckpointer(path, keys=keys) as store:
        await run_with_secret(store, "new", after)
        store.append([StepEvent(run_id="mixed", step_id="note", phase="result", kind="tool",
                                payload={"said": after})])
        old, mixed = store.load("old"), store.load("mixed")
        assert f"find {before}" in str(old[0].payload)
        assert [e.payload for e in mixed] == [{"task": before}, {"said": after}]
    with closing(sqlite3.connect(path)) as db:
        codecs = dict(db.execute("SELECT step_id, codec FROM cuaderno_events WHERE run_id='mixed'").fetchall())
    assert codecs == {"run": "json", "note": "json+aesgcm"}
    assert set(_keys_table(path)) == {"new", "mixed"}  # a plain run gets a key once something of it is sealed
    assert sum(grep_files(sqlite_files(path), before).values()) > 0
    assert sum(grep_files(sqlite_files(path), after).values()) == 0
    with pytest.raises(KeyMissing):  # turned on: from now on a store without the key is refused
        SqliteCheckpointer(path)


async def test_fork_and_export_work_with_the_key(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    token = secret()
    keys = keys_of(new_key())
    with SqliteCheckpointer(path, keys=keys) as store:
        await run_with_secret(store, "r", token)
        lines = list(export_lines(store, "r"))
        assert any(token in line for line in lines)
        copy = fork(store, "r", at="t0001.model", new_run_id="copy")
        assert copy.last_seq > 0 and store.load("copy")[0].payload["task"] == f"find {token}"
    assert set(_keys_table(path)) == {"r", "copy"}  # the fork's rows are sealed under a key of its own
    assert sum(grep_files(sqlite_files(path), token).values()) == 0


async def test_erasing_an_encrypted_run_destroys_its_data_key(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    keys = keys_of(new_key())
    with SqliteCheckpointer(path, keys=keys) as store:
        await run_with_secret(store, "gone", secret())
        await run_with_secret(store, "kept", secret())
        before = store.load("gone")
        assert set(_keys_table(path)) == {"gone", "kept"}
        done = erase(store, "gone", reason="ticket 8")
        assert done.rows == len(before)
        assert set(_keys_table(path)) == {"kept"}
        after = store.load("gone")  # the chain still verifies: it was over the plaintext's digest
        cp = store.checkpoint("gone")
    assert [e.row_hash for e in after] == [e.row_hash for e in before] and all(e.erased for e in after)
    assert cp is not None and cp.outcome is not None and cp.outcome["erased"]["reason"] == "ticket 8"
    with SqliteCheckpointer(path, keys=keys) as store:  # a new store (nothing cached) reads both
        assert store.load("gone")[-1].erased and not store.load("kept")[-1].erased


async def test_rekey_rewraps_every_data_key_under_the_current_master_key(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    old, new = new_key(), new_key()
    tokens = {f"r{i}": secret() for i in range(5)}
    with SqliteCheckpointer(path, keys=keys_of(old)) as store:
        for run_id, token in tokens.items():
            await run_with_secret(store, run_id, token)
    files_before = {f.name: f.read_bytes() for f in sqlite_files(path) if f.name == path.name}
    with pytest.raises(UsageError, match="opened with its keys"):
        rekey(MemoryCheckpointer())
    with SqliteCheckpointer(path, keys=keys_of(new, old)) as store:
        done = rekey(store, batch=2)
        assert (done.key_id, done.runs, done.batches) == (new.key_id, 5, 3)
        again = rekey(store, batch=2)
        assert (again.runs, again.batches) == (0, 0)
    assert set(_keys_table(path).values()) == {new.key_id}
    with SqliteCheckpointer(path, keys=keys_of(new)) as store:  # the old key is no longer needed
        for run_id, token in tokens.items():
            assert f"find {token}" in str(store.load(run_id)[0].payload)
    with pytest.raises(KeyInvalid):
        SqliteCheckpointer(path, keys=keys_of(old))
    assert files_before  # rows were not rewritten: only the keys table changed (see the module)


async def test_a_backup_of_an_encrypted_journal_is_sealed_and_checked_with_the_environment_s_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from _encrypt_world import key_text

    from cuaderno.errors import KeyMissing as Missing
    from cuaderno.operations import backup

    path, copy = tmp_path / "j.db", tmp_path / "copy.db"
    key = new_key()
    token = secret()
    with SqliteCheckpointer(path, keys=keys_of(key)) as store:
        await run_with_secret(store, "r", token)
    with pytest.raises(Missing):  # the copy cannot be checked without the key: refused, no copy left
        backup(path, copy)
    assert not list(tmp_path.glob("copy.db*"))
    monkeypatch.setenv("CUADERNO_KEY", key_text(key))
    report = backup(path, copy)
    assert report.runs == 1 and sum(grep_files(sqlite_files(copy), token).values()) == 0
    with SqliteCheckpointer(copy, keys=keys_of(key), readonly=True, accept_rollback=True) as store:
        assert f"find {token}" in str(store.load("r")[0].payload)


def test_a_summary_holding_a_lone_surrogate_is_sealed_and_reads_back(tmp_path: Path) -> None:
    """A model's answer can hold a lone surrogate, which UTF-8 cannot encode: the sealed summary
    escapes it (as an unsealed one does) and reads back the same."""
    answer = "half a pair: \ud83d, then text"
    with SqliteCheckpointer(tmp_path / "j.db", keys=keys_of(new_key())) as store:
        store.append([StepEvent(run_id="r", step_id="run", phase="start", kind="run", payload={"task": "t"})])
        store.append([StepEvent(run_id="r", step_id="final", phase="result", kind="final",
                                payload={"output": answer})])
        cp = store.checkpoint("r")
    assert cp is not None and cp.outcome is not None and cp.outcome["output"] == answer
