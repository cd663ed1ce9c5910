"""How the ``cuaderno`` command line fails (issue 19 item 7), as a user's shell sees it: a real process.

Every refusal is one ``error:`` line on stderr and status 2, bounded in length, and nothing a
terminal's encoding cannot show ends in a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cuaderno.cli import ERROR_EXIT, NOT_FOUND_EXIT, USAGE_EXIT, app
from cuaderno.events import StepEvent
from cuaderno.journal.sqlite import SqliteCheckpointer

RUN = "café-ñ"
"""A run id with letters outside ASCII."""
APPROVAL = "t0000.tool00.approval"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "runs.db"
    with SqliteCheckpointer(path) as store:
        store.append([StepEvent(run_id=RUN, step_id="run", phase="start", kind="run", fingerprint="f",
                                payload={"task": "t", "versions": {"schema": 1}})])
        store.append([StepEvent(run_id=RUN, step_id=APPROVAL, phase="request", kind="approval", name="transfer",
                                decision="require_approval", fingerprint="fp-1",
                                payload={"tool_step": "t0000.tool00", "arguments": {"to": "José"}})])
    return path


def cuaderno(*args: str, encoding: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CUADERNO_DB", "PYTHONIOENCODING")}
    if encoding is not None:
        env["PYTHONIOENCODING"] = encoding
    # Read back as UTF-8 with escapes kept visible: what the process wrote, byte for byte.
    return subprocess.run([sys.executable, "-m", "cuaderno", *args], capture_output=True, env=env, timeout=60,
                          check=False, encoding="utf-8", errors="backslashreplace")


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    # A usage error (2), a journal or run that does not exist (3), a refusal (4): one line each.
    assert done.returncode in (USAGE_EXIT, NOT_FOUND_EXIT, ERROR_EXIT), (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


# -- 7e: a usage error is one line --------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "needle"), [
    (("list", "--bogus"), "No such option: --bogus"),
    (("--bogus", "list"), "No such option: --bogus"),
    (("show",), "Missing argument 'RUN'"),
    (("approve", "r"), "Missing argument 'STEP'"),
    (("lsit",), "No such command 'lsit'"),
    (("list", "--limit", "abc"), "--limit"),
    (("list", "--limit", "0"), "--limit"),
    (("resolve", "r", "s"), "--happened"),
], ids=["unknown-option", "unknown-root-option", "missing-argument", "missing-second-argument",
        "mistyped-command", "not-an-int", "out-of-range", "missing-option"])
def test_a_usage_error_is_one_error_line_and_status_2(db: Path, args: tuple[str, ...], needle: str) -> None:
    done = cuaderno("--db", str(db), *args)
    line = one_error_line(done)
    assert done.returncode == USAGE_EXIT
    assert needle in line and "--help" in line  # where to look, on the same line


def test_a_usage_error_is_one_line_in_process_too(db: Path) -> None:
    result = CliRunner().invoke(app, ["--db", str(db), "show"], prog_name="cuaderno")
    assert result.exit_code == 2 and result.stderr.splitlines() == [
        "error: Missing argument 'RUN'. (see `cuaderno show --help`)"]


def test_help_and_no_arguments_still_print_the_help(db: Path) -> None:
    assert cuaderno("--help").returncode == 0 and "Usage: cuaderno" in cuaderno("--help").stdout
    alone = cuaderno()
    assert "Usage: cuaderno" in alone.stderr + alone.stdout and "Traceback" not in alone.stderr
    assert cuaderno("show", "--help").returncode == 0


# -- 7d: a terminal that cannot show a letter gets an escape, not a traceback ----------------------------------


@pytest.mark.parametrize("args", [("list",), ("show", RUN), ("approve", RUN, APPROVAL, "--by", "ana")],
                         ids=["list", "show", "approve"])
def test_ascii_output_escapes_what_it_cannot_encode(db: Path, args: tuple[str, ...]) -> None:
    done = cuaderno("--db", str(db), *args, encoding="ascii")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and done.stderr == ""
    assert done.stdout.isascii() and "caf\\xe9-\\xf1" in done.stdout
    if args[0] == "approve":
        with SqliteCheckpointer(db) as store:
            assert store.load(RUN)[-1].decision == "approved"


def test_an_ascii_error_line_is_escaped_too(db: Path) -> None:
    line = one_error_line(cuaderno("--db", str(db), "show", "ñandú", encoding="ascii"))
    assert "\\xf1and\\xfa" in line


# -- 7b: a long input is cut in the error line, with its length ----------------------------------------------


LONG = 120_000
"""Just under Linux's limit for one argument (128 KiB)."""


@pytest.mark.parametrize("args", [
    ("show", "r" * LONG), ("approve", "r" * LONG, APPROVAL), ("approve", RUN, "s" * LONG),
    ("resolve", RUN, "s" * LONG, "--not-happened"), ("cancel", "r" * LONG),
    ("list", "--status", "s" * LONG), ("list", "--" + "o" * LONG), ("x" * LONG,),
], ids=["show", "approve-run", "approve-step", "resolve-step", "cancel", "status", "option", "command"])
def test_a_long_argument_is_cut_in_the_error_line(db: Path, args: tuple[str, ...]) -> None:
    before = db.read_bytes()
    line = one_error_line(cuaderno("--db", str(db), *args))
    assert len(line) < 3_000, line[:300]
    if args[0] != "cancel":  # cancel's id check cuts it at 80 characters without a length (journal/base.py)
        assert "chars)" in line, line[:300]
    assert db.read_bytes() == before


def test_a_long_journal_path_is_cut(tmp_path: Path) -> None:
    line = one_error_line(cuaderno("--db", str(tmp_path / ("d" * 4000)), "list"))
    assert len(line) < 3_000 and "chars)" in line
