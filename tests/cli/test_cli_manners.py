"""The command line's usual manners (issue 22 part 5), run as a person runs it: a subprocess."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from cuaderno import Agent, ScriptedGateway, Session, SqliteCheckpointer, tool
from cuaderno.cli import ERROR_EXIT, NOT_FOUND_EXIT, USAGE_EXIT
from cuaderno.tools import Policy


def cuaderno(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "CUADERNO_DB"} | env
    return subprocess.run([sys.executable, "-m", "cuaderno", *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd, env=full)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    @tool
    def transfer(to: str, amount: int) -> dict[str, object]:
        """Move money."""
        return {"paid": amount}

    agent = Agent(instructions="Pay.", tools=[transfer], policy=Policy({"transfer": "require_approval"}))
    path = tmp_path / "runs.db"

    async def main() -> None:
        with SqliteCheckpointer(path) as store:
            gw = ScriptedGateway([ScriptedGateway.call("transfer", to="ana", amount=5), ScriptedGateway.text("ok")])
            async for _ in agent.run("pay", session=Session("r-1", gw, store)):
                pass

    import asyncio
    asyncio.run(main())
    return path


def test_version() -> None:
    done = cuaderno("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"cuaderno {version('cuaderno')}"


def test_db_after_the_command_and_from_the_environment(db: Path, tmp_path: Path) -> None:
    before = cuaderno("--db", str(db), "list", "--json")
    after = cuaderno("list", "--json", "--db", str(db))
    equals = cuaderno("show", "r-1", f"--db={db}", "--json")
    from_env = cuaderno("list", "--json", cwd=tmp_path.parent, CUADERNO_DB=str(db))
    assert [p.returncode for p in (before, after, equals, from_env)] == [0, 0, 0, 0], after.stderr
    assert json.loads(after.stdout) == json.loads(before.stdout) == json.loads(from_env.stdout)
    assert json.loads(equals.stdout)["run_id"] == "r-1"


def test_usage_not_found_and_refused_have_their_own_exit_status(db: Path, tmp_path: Path) -> None:
    usage = cuaderno("--db", str(db), "lst")
    missing_journal = cuaderno("--db", str(tmp_path / "absent.db"), "list")
    missing_run = cuaderno("--db", str(db), "show", "r-nope")
    refused = cuaderno("--db", str(db), "approve", "r-1", "t0000.tool00", "--fingerprint", "0" * 64)
    assert (usage.returncode, missing_journal.returncode, missing_run.returncode, refused.returncode) == (
        USAGE_EXIT, NOT_FOUND_EXIT, NOT_FOUND_EXIT, ERROR_EXIT)
    assert len({USAGE_EXIT, NOT_FOUND_EXIT, ERROR_EXIT}) == 3
    for done in (usage, missing_journal, missing_run, refused):
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr


def test_json_dates_are_iso_8601(db: Path) -> None:
    shown = json.loads(cuaderno("--db", str(db), "show", "r-1", "--json").stdout)
    stamps = [ev["created_at"] for ev in shown["timeline"]]
    assert stamps and all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", s) for s in stamps), stamps


def test_every_command_show_suggests_pastes_as_is(db: Path) -> None:
    out = cuaderno("--db", str(db), "show", "r-1").stdout
    approve = next(line.split("decide with", 1)[1].strip() for line in out.splitlines() if "decide with" in line)
    assert approve.startswith(f"cuaderno --db {db} approve r-1 t0000.tool00.approval --fingerprint ")
    done = cuaderno(*shlex.split(approve)[1:], "--by", "ana")
    assert done.returncode == 0, done.stderr


def test_show_gives_each_step_its_time_duration_cost_and_payload(db: Path) -> None:
    out = cuaderno("--db", str(db), "show", "r-1", COLUMNS="250").stdout
    header = next(line for line in out.splitlines() if line.lstrip().startswith("SEQ"))
    assert header.split() == ["SEQ", "TIME", "+MS", "STEP", "PHASE", "KIND", "NAME", "DECISION", "COST", "PAYLOAD"]
    model = next(line for line in out.splitlines() if " t0000.model " in line and " result " in line)
    assert "unpriced" in model or "$" in model
    assert '{"counters": {}, "key": ' in model  # the payload's start
