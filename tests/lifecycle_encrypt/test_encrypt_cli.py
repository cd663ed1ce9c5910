"""The command line and the page on a journal encrypted at rest: with the key (``--key-file``,
``CUADERNO_KEY``) ``list``, ``show``, ``export``, ``fork``, ``rekey`` and the page work; without
it each refuses with one ``error:`` line naming the missing key, exit status 4, and the
journal's files are left byte-identical."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from _encrypt_world import file_digests, key_text, keys_of, new_key, sqlite_files, write_key_file
from _erase_world import grep_files, run_with_secret, secret
from typer.testing import CliRunner

from cuaderno.cli import app
from cuaderno.journal import SqliteCheckpointer
from cuaderno.journal.keys import file_keys


async def _journal(tmp_path: Path) -> tuple[Path, Path, str]:
    path = tmp_path / "j.db"
    key = new_key()
    token = secret()
    with SqliteCheckpointer(path, keys=keys_of(key)) as store:
        await run_with_secret(store, "r", token)
    return path, write_key_file(tmp_path / "keys", key), token


async def test_show_list_export_and_fork_work_with_the_key_and_refuse_without_it(tmp_path: Path) -> None:
    path, key_file, token = await _journal(tmp_path)
    runner = CliRunner()
    commands = (["list"], ["show", "r"], ["export", "r"], ["fork", "r", "--at", "t0001.model", "--as", "copy"],
                ["rekey"])
    before = file_digests(sqlite_files(path))
    for argv in commands:
        refused = runner.invoke(app, ["--db", str(path), *argv])
        assert refused.exit_code == 4, (argv, refused.output)
        assert refused.output.startswith("error: ") and "encrypted at rest" in refused.output, refused.output
        assert "Traceback" not in refused.output and token not in refused.output
    assert file_digests(sqlite_files(path)) == before
    listed = runner.invoke(app, ["--db", str(path), "--key-file", str(key_file), "list"])
    assert listed.exit_code == 0 and "r" in listed.output
    shown = runner.invoke(app, ["--db", str(path), "show", "r", "--key-file", str(key_file)])
    assert shown.exit_code == 0 and f"the answer is {token[:16]}" in shown.output  # show cuts long payloads
    exported = runner.invoke(app, ["--db", str(path), "--key-file", str(key_file), "export", "r"])
    assert exported.exit_code == 0 and f"find {token}" in exported.output
    forked = runner.invoke(app, ["--db", str(path), "--key-file", str(key_file), "fork", "r", "--at", "t0001.model",
                                 "--as", "copy"])
    assert forked.exit_code == 0 and "forked from r" in forked.output
    by_env = CliRunner(env={"CUADERNO_KEY": key_text(keys_of(new_key()).current())})
    wrong = by_env.invoke(app, ["--db", str(path), "show", "r"])
    assert wrong.exit_code == 4 and "does not hold" in wrong.output
    with SqliteCheckpointer(path, keys=file_keys(key_file), readonly=True) as store:
        assert f"find {token}" in str(store.load("copy")[0].payload)


async def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path, key_file, _ = await _journal(tmp_path)
    key_file.chmod(0o644)
    done = CliRunner().invoke(app, ["--db", str(path), "--key-file", str(key_file), "show", "r"])
    assert done.exit_code == 4 and "readable by others" in done.output


async def test_rekey_through_the_command_line(tmp_path: Path) -> None:
    path, key_file, token = await _journal(tmp_path)
    old = key_file.read_text().strip()
    new = new_key()
    key_file.write_text(key_text(new) + "\n" + old + "\n")  # the new key first, the old one after
    done = CliRunner().invoke(app, ["--db", str(path), "--key-file", str(key_file), "rekey", "--batch", "1"])
    assert done.exit_code == 0 and f"1 data key(s) re-wrapped under master key {new.key_id}" in done.output
    write_key_file(key_file, new)  # the old key dropped
    shown = CliRunner().invoke(app, ["--db", str(path), "--key-file", str(key_file), "show", "r"])
    assert shown.exit_code == 0 and f"the answer is {token[:16]}" in shown.output  # show cuts long payloads


async def test_the_page_shows_an_encrypted_run_with_the_key_and_is_refused_without(tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from cuaderno.errors import KeyMissing
    from cuaderno.ui.app import create_app

    path, key_file, token = await _journal(tmp_path)
    before = file_digests(sqlite_files(path))
    with pytest.raises(KeyMissing):
        create_app(path, allowed_hosts=["testserver"])
    after = file_digests(sqlite_files(path))
    # Every file that was there is byte-identical; a read-only reader of a WAL journal makes SQLite
    # create an empty -wal and its index beside it (as any reader does), nothing more.
    assert {k: v for k, v in after.items() if before[k] is not None} == {k: v for k, v in before.items() if v}
    assert after[f"{path.name}-wal"] in (None, hashlib.sha256(b"").hexdigest())
    app_ = create_app(path, allowed_hosts=["testserver"], keys=file_keys(key_file))
    with TestClient(app_, headers={"origin": "http://testserver"}) as client:
        listing = client.get("/")
        page = client.get("/run", params={"id": "r"})
    assert listing.status_code == 200 and f"find {token}" in listing.text  # the index opened the task
    assert page.status_code == 200 and token in page.text


async def test_the_worker_command_opens_an_encrypted_journal_with_key_file_and_refuses_without(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    path, key_file, token = await _journal(tmp_path)
    tests = Path(__file__).resolve().parents[1]
    env = {"PYTHONPATH": f"{tests.parent / 'src'}:{tests / 'worker'}", "PATH": "/usr/bin:/bin"}

    def worker(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cuaderno", *options, "worker", "--journal", str(path),
                               "--agent", "worker_agent:agent", "--until-idle"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)

    refused = worker()
    assert refused.returncode == 4 and refused.stderr.startswith("error: ") and "encrypted at rest" in refused.stderr
    done = worker("--key-file", str(key_file))
    assert done.returncode == 0, done.stderr[-2000:]
    assert token not in done.stderr + done.stdout


async def test_backup_and_restore_take_the_key_file_and_refuse_without_a_key(tmp_path: Path) -> None:
    path, key_file, token = await _journal(tmp_path)
    runner = CliRunner(env={"CUADERNO_KEY": None, "CUADERNO_KEY_FILE": None})
    copy = tmp_path / "copy.db"
    refused = runner.invoke(app, ["backup", str(path), str(copy)])
    assert refused.exit_code == 4 and refused.output.startswith("error: ") and "Traceback" not in refused.output
    assert not list(tmp_path.glob("copy.db*"))  # no copy left
    made = runner.invoke(app, ["--key-file", str(key_file), "backup", str(path), str(copy)])
    assert made.exit_code == 0 and "every run's journal verified" in made.output, made.output
    assert sum(grep_files(sqlite_files(copy), token).values()) == 0  # the copy is sealed too
    restored_at = tmp_path / "restored.db"
    before = file_digests(sqlite_files(copy))
    no_key = runner.invoke(app, ["restore", str(copy), str(restored_at), "--runs-after-backup", "accept"])
    assert no_key.exit_code == 4 and not restored_at.exists() and file_digests(sqlite_files(copy)) == before
    done = runner.invoke(app, ["--key-file", str(key_file), "restore", str(copy), str(restored_at),
                               "--runs-after-backup", "accept"])
    assert done.exit_code == 0, done.output
    with SqliteCheckpointer(restored_at, keys=file_keys(key_file)) as store:
        assert f"find {token}" in str(store.load("r")[0].payload)
