"""``cuaderno ui`` on the command line: what it refuses before serving anything."""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from cuaderno.cli import ERROR_EXIT, NOT_FOUND_EXIT, USAGE_EXIT, app
from cuaderno.cli._ui import allowed_hosts, is_loopback
from cuaderno.errors import UsageError


def cli(*args: str, input: str | None = None) -> Result:
    result = CliRunner().invoke(app, list(args), prog_name="cuaderno", input=input)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result


def refused(result: Result, needle: str) -> None:
    # A refusal, or a journal that does not exist: one error line either way.
    assert result.exit_code in (NOT_FOUND_EXIT, ERROR_EXIT, USAGE_EXIT), result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and needle in errors[0], result.stderr


def test_a_missing_journal_is_refused_and_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nope.db"
    refused(cli("ui", "--journal", str(missing)), "does not exist")
    refused(cli("--db", str(missing), "ui"), "does not exist")
    refused(cli("ui", "--journal", f"sqlite:///{missing}"), "does not exist")
    assert not missing.exists()


def test_other_journals_are_refused(tmp_path: Path) -> None:
    refused(cli("ui", "--journal", "postgresql://127.0.0.1/test"), "only SQLite journals")
    refused(cli("ui", "--journal", str(tmp_path)), "is a directory")
    (tmp_path / "empty.db").touch()
    refused(cli("ui", "--journal", str(tmp_path / "empty.db")), "empty file")
    not_db = tmp_path / "notes.db"
    not_db.write_bytes(b"these are notes, not a journal" * 100)
    refused(cli("ui", "--journal", str(not_db)), "is not a readable cuaderno journal")
    assert not_db.read_bytes() == b"these are notes, not a journal" * 100


def test_a_port_in_use_is_one_error_line(db: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        refused(cli("--db", str(db), "ui", "--port", str(port)), f"cannot listen on 127.0.0.1:{port}")


def test_another_host_is_warned_about(db: Path, tmp_path: Path) -> None:
    # 192.0.2.1 (TEST-NET-1) is on no interface: the bind fails after the warning, so nothing
    # ever listens beyond loopback in this test.
    result = cli("--db", str(db), "ui", "--host", "192.0.2.1", "--port", "0")
    assert "warning: listening on 192.0.2.1, not loopback" in result.stderr
    refused(result, "cannot listen on 192.0.2.1")
    users = tmp_path / "users"
    assert cli("ui-passwd", str(users), "ana", input="pw\n").exit_code == 0
    result = cli("--db", str(db), "ui", "--host", "192.0.2.1", "--port", "0", "--allow-decisions",
                 "--auth-file", str(users))
    assert "can decide its approvals" in result.stderr
    refused(result, "cannot listen on 192.0.2.1")


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                                ("[::1]", True), ("127.0.0.2", True), ("0.0.0.0", False),
                                                ("192.168.1.5", False), ("example.com", False)])
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_allowed_hosts() -> None:
    assert "evil.example" not in allowed_hosts("127.0.0.1") and "localhost" in allowed_hosts("127.0.0.1")
    assert "192.168.1.5" in allowed_hosts("192.168.1.5")
    assert "*" not in allowed_hosts("0.0.0.0", ["ops.example.com"])
    assert "ops.example.com" in allowed_hosts("0.0.0.0", ["ops.example.com"])
    for bad in (("0.0.0.0", []), ("::", []), ("127.0.0.1", ["*"]), ("127.0.0.1", ["http://ops.example.com"]),
                ("127.0.0.1", ["ops.example.com:8765"])):
        with pytest.raises(UsageError):
            allowed_hosts(*bad)


def test_a_damaged_summary_is_a_clear_page(db: Path) -> None:
    from starlette.testclient import TestClient

    from cuaderno.ui.app import create_app

    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE cuaderno_runs SET checkpoint = replace(checkpoint, '\"amount\": 100', '\"amount\": 999') "
                    "WHERE run_id = 'pay-1'")
        raw.execute("UPDATE cuaderno_runs SET checkpoint = replace(checkpoint, '\"amount\":100', '\"amount\":999') "
                    "WHERE run_id = 'pay-1'")
    with TestClient(create_app(db, allow_decisions=True, allowed_hosts=["testserver"])) as client:
        reply = client.get("/run", params={"id": "pay-1"})
        assert reply.status_code == 500 and "does not match its journal" in reply.text
        assert "999" not in reply.text  # the altered arguments are never offered for a decision


def test_an_unreadable_summary_is_one_row_of_the_list(db: Path) -> None:
    from starlette.testclient import TestClient

    from cuaderno.ui.app import create_app

    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE cuaderno_runs SET checkpoint = '{not json' WHERE run_id = 'pay-2'")
    with TestClient(create_app(db, allowed_hosts=["testserver"])) as client:
        reply = client.get("/")
        assert reply.status_code == 200 and "damaged" in reply.text and "is not JSON" in reply.text
        assert "pay-1" in reply.text and "r-uncertain" in reply.text
        assert client.get("/run", params={"id": "pay-2"}).status_code == 500


@pytest.mark.parametrize(("bound", "host", "code"), [
    ("127.0.0.1", "127.0.0.1:8765", 200), ("127.0.0.1", "localhost:8765", 200), ("::1", "[::1]:8765", 200),
    ("127.0.0.1", "attacker.example:8765", 400), ("127.0.0.1", "127.0.0.1.attacker.example", 400),
])
def test_the_host_header_must_name_where_the_server_was_bound(db: Path, bound: str, host: str, code: int) -> None:
    from starlette.testclient import TestClient

    from cuaderno.ui.app import create_app

    with TestClient(create_app(db, allowed_hosts=allowed_hosts(bound))) as client:
        assert client.get("/", headers={"host": host}).status_code == code
