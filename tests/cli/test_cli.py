"""The ``cuaderno`` command line, on journals built event by event in a temporary SQLite file."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from cuaderno.checkpoint import COUNTERS, Checkpoint
from cuaderno.cli import ERROR_EXIT, NOT_FOUND_EXIT, USAGE_EXIT, app
from cuaderno.events import StepEvent
from cuaderno.journal.sqlite import SqliteCheckpointer

FP = "fp-3f9a0c1d2e4b5a6c"
ARGS = {"amount": 100, "to": "acct-9", "memo": "rent"}
APPROVAL = "t0000.tool00.approval"
VERSIONS = {"schema": 1, "loop": "loop-2", "policy": "policy-7"}


# -- building journals ------------------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "runs.db"


@pytest.fixture
def store(db: Path) -> Iterator[SqliteCheckpointer]:
    s = SqliteCheckpointer(db)
    yield s
    s.close()


def start(run_id: str, versions: dict[str, Any] | None = None) -> StepEvent:
    return StepEvent(run_id=run_id, step_id="run", phase="start", kind="run", fingerprint="f",
                     payload={"task": "t", "versions": VERSIONS if versions is None else versions})


def model_result(run_id: str, turn: int, *, cost: float | None, counters: dict[str, int] | None = None) -> StepEvent:
    payload: dict[str, Any] = {"response": {"usage": {"input_tokens": 11, "output_tokens": 7}, "cost": cost}}
    if counters:
        payload["counters"] = counters
    return StepEvent(run_id=run_id, step_id=f"t{turn:04d}.model", phase="result", kind="model",
                     fingerprint=f"m{turn}", payload=payload)


def approval_request(run_id: str, *, step: str = APPROVAL, fingerprint: str = FP,
                     arguments: dict[str, Any] | None = None, tool: str = "transfer") -> StepEvent:
    return StepEvent(run_id=run_id, step_id=step, phase="request", kind="approval", name=tool,
                     decision="require_approval", fingerprint=fingerprint,
                     payload={"tool_step": step.removesuffix(".approval"),
                              "arguments": ARGS if arguments is None else arguments})


def final(run_id: str) -> StepEvent:
    return StepEvent(run_id=run_id, step_id="final", phase="result", kind="final", payload={"answer": "paid"})


def suspended_run(store: SqliteCheckpointer, run_id: str = "r-pay") -> str:
    """A run with one unpriced and one priced model call, recovery counters, and one pending approval."""
    store.append([start(run_id)])
    store.append([model_result(run_id, 0, cost=None,
                               counters={"retries": 1, "repairs": 2, "replans": 3, "reflects": 4})])
    store.append([model_result(run_id, 1, cost=0.0042)])
    store.append([StepEvent(run_id=run_id, step_id="run", phase="counters", kind="run",
                            payload={"counters": {"escalations": 5}})])
    store.append([approval_request(run_id)])
    return run_id


def journal(db: Path, run_id: str) -> tuple[list[StepEvent], Checkpoint]:
    """The run's events and checkpoint, read through a fresh connection."""
    with SqliteCheckpointer(db) as s:
        events = s.load(run_id)
        cp = s.checkpoint(run_id)
    assert cp is not None
    return events, cp


# -- running the command line -----------------------------------------------------------------------


def cli(db: Path | None, *args: str, env: dict[str, str] | None = None) -> Result:
    argv = (["--db", str(db)] if db is not None else []) + list(args)
    result = CliRunner(env={"COLUMNS": "160", **(env or {})}).invoke(app, argv, prog_name="cuaderno")
    # Every outcome is a clean exit: no exception escapes, never a traceback.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result


def refused(result: Result, *needles: str, code: int = ERROR_EXIT) -> None:
    """Exit status ``code`` with exactly one ``error:`` line on stderr."""
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


# -- list ---------------------------------------------------------------------------------------------


def test_list_shows_runs_newest_first(db: Path, store: SqliteCheckpointer) -> None:
    suspended_run(store, "r-old")
    store.append([start("r-new"), model_result("r-new", 0, cost=0.25), final("r-new")])

    result = cli(db, "list")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith("r-")]
    assert [line.split()[0] for line in lines] == ["r-new", "r-old"]
    new, old = (line.split() for line in lines)
    # The last two columns: PENDING, UNCERTAIN.
    assert new[1:4] == ["completed", "1", "0"] and "$0.250000" in lines[0] and new[-2:] == ["0", "0"]
    assert old[1:4] == ["suspended", "2", "0"] and old[-2:] == ["1", "0"]
    # One call had no price: the cost says so instead of showing only the priced part.
    assert ">= $0.004200, unpriced: 1" in lines[1]


def test_list_json_shape_status_and_limit(db: Path, store: SqliteCheckpointer) -> None:
    suspended_run(store, "r-a")
    store.append([start("r-b"), model_result("r-b", 0, cost=None), final("r-b")])

    rows = json.loads(cli(db, "list", "--json").stdout)
    assert [r["run_id"] for r in rows] == ["r-b", "r-a"]
    assert set(rows[0]) == {"run_id", "status", "state", "waiting_for", "held_by", "next_step", "model_calls",
                            "tool_calls", "cost", "pending_approvals", "uncertain"}
    assert rows[0]["cost"] == {"usd": 0.0, "calls_paid": 0, "unpriced_calls": 1, "complete": False}
    assert rows[1]["pending_approvals"] == 1 and rows[1]["status"] == "suspended"
    assert rows[1]["cost"] == {"usd": 0.0042, "calls_paid": 1, "unpriced_calls": 1, "complete": False}

    only = json.loads(cli(db, "list", "--status", "suspended", "--json").stdout)
    assert [r["run_id"] for r in only] == ["r-a"]
    assert len(json.loads(cli(db, "list", "--limit", "1", "--json").stdout)) == 1
    assert json.loads(cli(db, "list", "--status", "failed", "--json").stdout) == []
    assert "no runs with status 'failed'" in cli(db, "list", "--status", "failed").stdout


def test_unpriced_only_is_never_shown_as_zero_cost(db: Path, store: SqliteCheckpointer) -> None:
    store.append([start("r-free"), model_result("r-free", 0, cost=None)])
    listed = cli(db, "list").stdout
    assert "unpriced: 1" in listed and "$0.000000" not in listed
    shown = cli(db, "show", "r-free").stdout
    cost_line = next(line for line in shown.splitlines() if line.strip().startswith("cost"))
    assert "unpriced: 1" in cost_line and "$0" in cost_line and "not $0" in cost_line


def test_narrow_terminal_never_crops(db: Path, store: SqliteCheckpointer) -> None:
    run = "run-" + "x" * 60
    store.append([start(run), model_result(run, 0, cost=0.123456), approval_request(run)])
    for args in (("list",), ("show", run)):
        out = cli(db, *args, env={"COLUMNS": "40"}).stdout
        assert run in out and "$0.123456" in out
    row = next(line for line in out.splitlines() if line.startswith("seq=3 "))
    assert f"step={APPROVAL} phase=request kind=approval name=transfer decision=require_approval" in row
    assert " time=" in row and " +ms=" in row and ' payload={"arguments"' in row


# -- show ---------------------------------------------------------------------------------------------


def test_show_human(db: Path, store: SqliteCheckpointer) -> None:
    run = suspended_run(store)
    result = cli(db, "show", run)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "suspended" in out
    assert "schema=1, loop=loop-2, policy=policy-7" in out
    # Each recovery counter on its own, never lumped together.
    for label in ("retries 1", "repairs 2", "replans 3", "reflects 4", "escalations 5"):
        assert label in out
    for label in ("calls 2", "possibly billed twice 0", "calls paid 1", "unpriced 1", "input 22", "output 14"):
        assert label in out
    assert "at least $0.004200 for 1 priced call(s), unpriced: 1 call(s) not included" in out
    # The pending approval: tool, exact arguments and the fingerprint they are bound to.
    assert APPROVAL in out and "tool transfer" in out
    assert json.dumps(ARGS) in out and FP in out
    # Each suggested command pastes as is: it names the journal and quotes what needs quoting.
    assert f"cuaderno --db {db} approve {run} {APPROVAL} --fingerprint {FP}" in out
    assert f"cuaderno --db {db} deny {run} {APPROVAL} --fingerprint {FP}" in out
    # The timeline: seq, step, phase, kind, name, decision.
    assert "Timeline: 5 event(s)" in out
    row = next(line for line in out.splitlines() if line.split()[:1] == ["5"])
    words = row.split()
    # seq, time (UTC), ms since the event before, step, phase, kind, name, decision, then the payload's start
    assert words[0] == "5" and len(words[1]) == 12 and words[2].isdigit()
    assert words[3:8] == [APPROVAL, "request", "approval", "transfer", "require_approval"]
    assert words[8].startswith('{"arguments":')

    hidden = cli(db, "show", run, "--no-timeline").stdout
    assert "Timeline" not in hidden and "require_approval" not in hidden and FP in hidden


def test_show_json_shape(db: Path, store: SqliteCheckpointer) -> None:
    run = suspended_run(store)
    data = json.loads(cli(db, "show", run, "--json").stdout)
    assert set(data) == {"run_id", "status", "state", "waiting_for", "held_by", "open", "next_step", "last_seq",
                         "epoch", "versions", "task_fingerprint", "counters", "cost", "pending_approvals", "uncertain", "outcome",
                         "compensations", "timeline", "offloaded"}
    assert data["offloaded"] == {"payloads": 0, "bytes": 0, "each": []}
    assert data["status"] == "suspended" and data["open"] is True and data["versions"] == VERSIONS
    assert (data["state"], data["held_by"]) == ("waiting", None)
    assert data["waiting_for"].startswith("approval of ")
    assert set(COUNTERS) <= set(data["counters"])
    assert {k: data["counters"][k] for k in ("retries", "repairs", "replans", "reflects", "escalations")} == \
        {"retries": 1, "repairs": 2, "replans": 3, "reflects": 4, "escalations": 5}
    assert data["cost"] == {"usd": 0.0042, "calls_paid": 1, "unpriced_calls": 1, "complete": False, "upper_usd": 0.0042}
    assert data["pending_approvals"] == [{"step_id": APPROVAL, "tool": "transfer", "fingerprint": FP,
                                          "tool_step": "t0000.tool00", "arguments": ARGS}]
    assert [e["seq"] for e in data["timeline"]] == [1, 2, 3, 4, 5]
    assert data["timeline"][-1] | {"created_at": 0} == {
        "seq": 5, "step_id": APPROVAL, "phase": "request", "kind": "approval", "name": "transfer",
        "decision": "require_approval", "fingerprint": FP, "created_at": 0}

    assert "timeline" not in json.loads(cli(db, "show", run, "--json", "--no-timeline").stdout)


def test_show_uncertain_evidence_and_outcome(db: Path, store: SqliteCheckpointer) -> None:
    evidence = {"tool": "transfer", "effect_key": "ek-77", "last_receipt": None}
    store.append([start("r-u"), StepEvent(run_id="r-u", step_id="t0000.tool00", phase="uncertain", kind="tool",
                                          name="transfer", payload=evidence)])
    out = cli(db, "show", "r-u").stdout
    assert "needs_human" in out and "Uncertain effects: 1" in out
    assert "t0000.tool00  tool transfer" in out and json.dumps(evidence) in out
    assert json.loads(cli(db, "show", "r-u", "--json").stdout)["uncertain"] == {"t0000.tool00": evidence}

    store.append([start("r-done"), final("r-done")])
    done = cli(db, "show", "r-done").stdout
    assert "completed" in done and '"answer": "paid"' in done


def test_journal_text_cannot_drive_the_terminal(db: Path, store: SqliteCheckpointer) -> None:
    hostile = {"to": "acct\u202e9", "memo": "[bold red]ok[/] :warning: \x1b[2J\rdone", "who": "José"}
    store.append([start("r-h"), approval_request("r-h", arguments=hostile)])
    for args in (("show", "r-h"), ("approve", "r-h", APPROVAL)):
        out = cli(db, *args).stdout
        assert "\x1b" not in out and "\r" not in out and "\u202e" not in out
        assert "\\u001b[2J\\rdone" in out and "acct\\u202e9" in out
        assert "[bold red]ok[/] :warning:" in out and "José" in out
    # Non-ASCII arguments are also shown escaped, so look-alike letters cannot pass for others.
    assert "Jos\\u00e9" in out


def test_show_corrupt_journal_and_newer_schema(db: Path, store: SqliteCheckpointer) -> None:
    run = suspended_run(store)
    store.close()
    with closing(sqlite3.connect(db)) as raw, raw:
        raw.execute("UPDATE cuaderno_events SET payload=? WHERE run_id=? AND seq=2", (b'{"response":null}', run))
    refused(cli(db, "show", run), "altered")
    assert cli(db, "show", run, "--no-timeline").exit_code == 0  # the checkpoint is still readable

    with closing(sqlite3.connect(db)) as raw, raw:
        raw.execute("UPDATE cuaderno_meta SET value='99' WHERE key='schema_version'")
    refused(cli(db, "list"), "schema version 99")


# -- approve / deny -----------------------------------------------------------------------------------


@pytest.mark.parametrize("step", [APPROVAL, "t0000.tool00"])
def test_approve_writes_one_decision(db: Path, store: SqliteCheckpointer, step: str) -> None:
    run = suspended_run(store)
    before, _ = journal(db, run)

    result = cli(db, "approve", run, step, "--by", "alice", "--reason", "invoice 12")
    assert result.exit_code == 0, result.output
    # What is approved is printed first: the tool, its exact arguments and their fingerprint.
    out = result.stdout
    assert out.index("transfer") < out.index('"amount": 100') < out.index(FP) < out.index("approved by alice")

    after, cp = journal(db, run)
    assert len(after) == len(before) + 1
    ev = after[-1]
    assert (ev.step_id, ev.phase, ev.kind, ev.name, ev.decision, ev.fingerprint) == \
        (APPROVAL, "decision", "approval", "transfer", "approved", FP)
    assert ev.payload == {"approver": "alice", "reason": "invoice 12", "tool_step": "t0000.tool00"}
    assert cp.pending == {} and cp.status == "running"
    assert json.loads(cli(db, "show", run, "--json").stdout)["pending_approvals"] == []

    # Deciding again is refused and writes nothing.
    refused(cli(db, "approve", run, step), "not waiting")
    assert len(journal(db, run)[0]) == len(after)


def test_approve_with_matching_fingerprint(db: Path, store: SqliteCheckpointer) -> None:
    run = suspended_run(store)
    assert cli(db, "approve", run, APPROVAL, "--fingerprint", FP).exit_code == 0
    assert journal(db, run)[0][-1].decision == "approved"


def test_deny_writes_rejected(db: Path, store: SqliteCheckpointer) -> None:
    run = suspended_run(store)
    result = cli(db, "deny", run, APPROVAL, "--by", "bob", "--reason", "wrong account")
    assert result.exit_code == 0, result.output
    assert "denying" in result.stdout and "rejected by bob" in result.stdout
    events, cp = journal(db, run)
    assert events[-1].decision == "rejected" and events[-1].phase == "decision"
    assert events[-1].payload["reason"] == "wrong account"
    assert cp.pending == {}


def test_wrong_fingerprint_writes_nothing(db: Path, store: SqliteCheckpointer) -> None:
    run = suspended_run(store)
    before, _ = journal(db, run)
    for verb in ("approve", "deny"):
        refused(cli(db, verb, run, APPROVAL, "--fingerprint", "fp-other"), "fp-other")
    after, cp = journal(db, run)
    assert len(after) == len(before) and APPROVAL in cp.pending and cp.status == "suspended"


def test_refusals_write_nothing(db: Path, store: SqliteCheckpointer) -> None:
    run = suspended_run(store)
    store.append([start("r-closed"), approval_request("r-closed"), final("r-closed")])
    counts = {r: len(journal(db, r)[0]) for r in (run, "r-closed")}

    refused(cli(db, "approve", run, "t0001.tool00"), "not waiting", APPROVAL)  # a step not waiting
    refused(cli(db, "deny", run, "t0000.model"), "not waiting")
    refused(cli(db, "approve", "r-nope", APPROVAL), "no run 'r-nope'", code=NOT_FOUND_EXIT)  # an unknown run
    refused(cli(db, "show", "r-nope"), "no run 'r-nope'", code=NOT_FOUND_EXIT)
    refused(cli(db, "approve", "r-closed", APPROVAL), "already ended (completed)")  # a closed run
    refused(cli(db, "deny", "r-closed", APPROVAL), "already ended")

    assert {r: len(journal(db, r)[0]) for r in counts} == counts
    with SqliteCheckpointer(db) as s:
        assert [cp.run_id for cp in s.list_runs()] == ["r-closed", run]


# -- the journal file ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [("list",), ("show", "r"), ("approve", "r", APPROVAL), ("deny", "r", APPROVAL)])
def test_missing_journal_is_not_created(tmp_path: Path, args: tuple[str, ...]) -> None:
    missing = tmp_path / "nope.db"
    refused(cli(missing, *args), "does not exist", "nope.db", code=NOT_FOUND_EXIT)
    assert list(tmp_path.iterdir()) == []


def test_default_and_env_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    refused(cli(None, "list"), "'runs.db'", code=NOT_FOUND_EXIT)  # the default path, relative to the working directory
    assert list(tmp_path.iterdir()) == []

    other = tmp_path / "other.db"
    with SqliteCheckpointer(other) as s:
        suspended_run(s, "r-env")
    rows = json.loads(cli(None, "list", "--json", env={"CUADERNO_DB": str(other)}).stdout)
    assert [r["run_id"] for r in rows] == ["r-env"]


def test_db_takes_a_journal_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "runs.db"
    with SqliteCheckpointer(path) as s:
        suspended_run(s, "r-url")
    for url in (f"sqlite:///{path}", f"sqlite:///{path}?mode=ro"):
        rows = json.loads(cli(None, "--db", url, "list", "--json").stdout)
        assert [r["run_id"] for r in rows] == ["r-url"]
    monkeypatch.chdir(tmp_path)
    rows = json.loads(cli(None, "list", "--json", env={"CUADERNO_DB": "sqlite:///runs.db"}).stdout)
    assert [r["run_id"] for r in rows] == ["r-url"]
    result = cli(None, "--db", "sqlite:///runs.db", "approve", "r-url", APPROVAL, "--fingerprint", FP, "--by", "ana")
    assert result.exit_code == 0, result.output
    assert journal(path, "r-url")[1].pending == {}


@pytest.mark.parametrize(("url", "needle", "code"), [
    ("mysql://127.0.0.1/runs", "unknown scheme", USAGE_EXIT),
    ("sqlite://", "names no file", USAGE_EXIT),
    ("sqlite:///runs.db?timeout=5", "unknown parameter 'timeout'", USAGE_EXIT),
    ("postgresql://ana:s3cret@127.0.0.1:1/test", "cannot open it", ERROR_EXIT),
    ("memory://", "no existing journal", ERROR_EXIT),
    ("sqlite:///nope.db", "does not exist", NOT_FOUND_EXIT),
])
def test_bad_journal_urls_are_refused_and_create_nothing(url: str, needle: str, code: int, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for args in (("list",), ("approve", "r", APPROVAL)):
        result = cli(None, "--db", url, *args)
        refused(result, needle, code=code)
        assert "s3cret" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_files_that_are_not_journals(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    refused(cli(empty, "list"), "empty")
    assert empty.stat().st_size == 0
    text = tmp_path / "notes.txt"
    text.write_text("not a database, not at all\n" * 100)
    refused(cli(text, "list"), "not a readable cuaderno journal")
    refused(cli(tmp_path, "list"), "directory")


def test_resolve_not_happened_with_a_receipt_is_refused(db: Path, store: SqliteCheckpointer) -> None:
    """--result says the effect exists; with --not-happened the next resume would send it again."""
    suspended_run(store)
    before = db.read_bytes()
    refused(cli(db, "resolve", "r-pay", "t0000.tool00", "--not-happened", "--result", '{"receipt": "r-17"}'),
            "--result goes only with --happened", code=USAGE_EXIT)
    assert db.read_bytes() == before


def test_show_says_where_each_compensation_stands(db: Path, store: SqliteCheckpointer) -> None:
    """The cancellation record says what was scheduled when the run closed; show says what
    happened since, and how to settle an uncertain effect of the cancelled run."""
    import asyncio

    from cuaderno import Agent, Compensation, RunCancelled, ScriptedGateway, Session, cancel, compensate, tool

    @tool(compensation=Compensation("refund", lambda args, result: {"to": args["to"], "amount": args["amount"]}))
    def transfer(to: str, amount: int) -> str:
        """Move money."""
        return "moved"

    @tool
    def refund(to: str, amount: int) -> str:
        """Give money back."""
        return "refunded"

    agent = Agent(instructions="i", tools=[transfer, refund])

    async def cancelled() -> None:
        with pytest.raises(RunCancelled):
            async for step in agent.run("t", session=Session("comp", ScriptedGateway(
                    [ScriptedGateway.call("transfer", to="c", amount=5), ScriptedGateway.text("x")]), store)):
                if getattr(step, "tool", None) == "transfer":
                    cancel(store, "comp", "abort")

    asyncio.run(cancelled())
    shown = cli(db, "show", "comp")
    assert "Compensations: 1" in shown.stdout and "not run yet: run compensate()" in shown.stdout
    asyncio.run(compensate(agent, store, "comp"))
    assert "done: ok" in cli(db, "show", "comp").stdout
    detail = json.loads(cli(db, "show", "comp", "--json").stdout)
    assert [c["state"] for c in detail["compensations"]] == ["done: ok"]


def test_reading_commands_never_change_the_file(db: Path, store: SqliteCheckpointer) -> None:
    """list and show open the journal read-only: a journal someone put in rollback (DELETE) mode,
    say to copy it as one file, stays byte-identical and in that mode."""
    suspended_run(store)
    store.close()
    with closing(sqlite3.connect(db)) as raw:
        assert raw.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete"
    before = db.read_bytes()
    assert cli(db, "list").exit_code == 0
    assert cli(db, "show", "r-pay").exit_code == 0
    assert cli(db, "show", "r-pay", "--json").exit_code == 0
    refused(cli(db, "show", "nope"), "no run", code=NOT_FOUND_EXIT)
    assert db.read_bytes() == before
    with closing(sqlite3.connect(db)) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


# -- a real process -----------------------------------------------------------------------------------


def run_process(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_DB"}
    return subprocess.run([sys.executable, "-m", "cuaderno.cli", *args], capture_output=True, text=True,
                          env=env, timeout=60, check=False)


def test_subprocess_show_approve_and_errors(db: Path, store: SqliteCheckpointer, tmp_path: Path) -> None:
    run = suspended_run(store)
    store.close()

    shown = run_process("--db", str(db), "show", run, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["pending_approvals"][0]["fingerprint"] == FP

    wrong = run_process("--db", str(db), "approve", run, APPROVAL, "--fingerprint", "nope")
    assert wrong.returncode == ERROR_EXIT and "Traceback" not in wrong.stderr
    assert wrong.stderr.count("\n") == 1 and wrong.stderr.startswith("error: ")
    assert len(journal(db, run)[0]) == 5

    ok = run_process("--db", str(db), "approve", run, APPROVAL, "--by", "carol")
    assert ok.returncode == 0, ok.stderr
    assert FP in ok.stdout and "approved by carol" in ok.stdout
    events, cp = journal(db, run)
    assert len(events) == 6 and events[-1].decision == "approved" and cp.pending == {}

    missing = run_process("--db", str(tmp_path / "absent.db"), "list")
    assert missing.returncode == NOT_FOUND_EXIT and missing.stderr.startswith("error: ") and "Traceback" not in missing.stderr
    assert not (tmp_path / "absent.db").exists()

    unknown = run_process("--db", str(db), "deny", "r-missing", APPROVAL)
    assert unknown.returncode == NOT_FOUND_EXIT and "no run 'r-missing'" in unknown.stderr


# -- what a person reads (review of a fresh clone) -----------------------------------------------------


FP64 = hashlib.sha256(b"the arguments shown").hexdigest()


def test_fingerprint_prefix_is_refused_and_says_why(db: Path, store: SqliteCheckpointer) -> None:
    """A 12-character prefix used to be refused with both values cut to 12 characters: identical."""
    store.append([start("r-fp"), approval_request("r-fp", fingerprint=FP64)])
    before = len(journal(db, "r-fp")[0])
    result = cli(db, "approve", "r-fp", APPROVAL, "--fingerprint", FP64[:12])
    refused(result, "expected the full 64-character fingerprint shown by `cuaderno show`", "got 12 characters")
    # Same length, different value: both are shown past the first difference, so they differ on screen.
    other = FP64[:30] + ("0" if FP64[30] != "0" else "1") + FP64[31:]
    refused(cli(db, "deny", "r-fp", APPROVAL, "--fingerprint", other), other[:34], FP64[:34])
    assert len(journal(db, "r-fp")[0]) == before

    # Spaces around it and upper-case hex are the same fingerprint; the decision binds the journal's.
    ok = cli(db, "approve", "r-fp", APPROVAL, "--fingerprint", f"  {FP64.upper()}\n")
    assert ok.exit_code == 0, ok.output
    assert journal(db, "r-fp")[0][-1].fingerprint == FP64


def test_an_empty_fingerprint_is_called_empty(db: Path, store: SqliteCheckpointer) -> None:
    """It was refused as "got 0 characters (); a prefix does not bind the arguments"."""
    store.append([start("r-fp"), approval_request("r-fp", fingerprint=FP64)])
    before = len(journal(db, "r-fp")[0])
    for empty in ("", "  \n"):
        result = cli(db, "approve", "r-fp", APPROVAL, "--fingerprint", empty)
        refused(result, "--fingerprint is empty", "nothing was written", code=USAGE_EXIT)
        assert "prefix" not in result.stderr
    assert len(journal(db, "r-fp")[0]) == before


def uncertain_run(store: SqliteCheckpointer, run_id: str = "r-u") -> str:
    """A run waiting for a person to settle the uncertain effect at t0000.tool00 (needs_human)."""
    store.append([start(run_id), StepEvent(run_id=run_id, step_id="t0000.tool00", phase="uncertain", kind="tool",
                                           name="transfer", payload={"tool": "transfer", "effect_key": "ek-77"})])
    return run_id


def test_approving_a_run_that_waits_for_a_person_does_not_say_it_ended(db: Path, store: SqliteCheckpointer) -> None:
    """needs_human goes on after `cuaderno resolve`; it was refused as "already ended (needs_human)"."""
    run = uncertain_run(store)
    result = cli(db, "approve", run, "t0000.tool00")
    refused(result, "has not ended", "settle an uncertain effect", "cuaderno resolve")
    assert "already ended" not in result.stderr


def test_a_receipt_too_deep_or_too_long_to_read_is_one_error_line(db: Path, store: SqliteCheckpointer) -> None:
    """They ended in a RecursionError and a ValueError traceback (only JSONDecodeError was caught)."""
    run = uncertain_run(store)
    size = len(journal(db, run)[0])
    for receipt, needle in (("[" * 50_000 + "]" * 50_000, "nested too deeply"),
                            ("9" * 5000, "integer too long"),
                            ('{"receipt": ' + "[" * 300 + "]" * 300 + "}", "not plain JSON"),
                            ('{"receipt": ' + "9" * 4250 + "}", "not plain JSON")):
        refused(cli(db, "resolve", run, "t0000.tool00", "--happened", "--result", receipt), needle, code=USAGE_EXIT)
    events, cp = journal(db, run)
    assert len(events) == size and cp.status == "needs_human"
    ok = cli(db, "resolve", run, "t0000.tool00", "--happened", "--result", '{"receipt": "r-17"}')
    assert ok.exit_code == 0, ok.output
    assert journal(db, run)[0][-1].payload["value"] == {"receipt": "r-17"}


def test_output_that_cannot_be_written_is_one_error_line(db: Path, store: SqliteCheckpointer) -> None:
    """A full disk printed a traceback (OSError 28, status 1). A reader that went away ends the
    command quietly with status 1 (Python's advice for a broken pipe), never a traceback."""
    suspended_run(store)
    store.close()
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_DB"}
    argv = [sys.executable, "-m", "cuaderno.cli", "--db", str(db)]
    for args in (("list",), ("list", "--json"), ("show", "r-pay")):
        if os.path.exists("/dev/full"):
            with open("/dev/full", "w") as full:
                done = subprocess.run([*argv, *args], stdout=full, stderr=subprocess.PIPE, text=True, env=env,
                                      timeout=60, check=False)
            assert done.returncode == ERROR_EXIT, done.stderr
            assert done.stderr == "error: could not write the output: [Errno 28] No space left on device\n"
        read, write = os.pipe()
        os.close(read)  # the reader is gone before anything is written
        try:
            done = subprocess.run([*argv, *args], stdout=write, stderr=subprocess.PIPE, text=True, env=env,
                                  timeout=60, check=False)
        finally:
            os.close(write)
        assert done.returncode == 1 and done.stderr == "", done.stderr


def test_an_ended_run_has_no_pending_approval(db: Path, store: SqliteCheckpointer) -> None:
    """Its approval is still requested in the journal, but no decision is accepted any more."""
    store.append([start("r-done"), approval_request("r-done"), final("r-done")])
    store.append([start("r-cancel"), approval_request("r-cancel")])
    assert cli(db, "cancel", "r-cancel").exit_code == 0

    rows = {r["run_id"]: r for r in json.loads(cli(db, "list", "--json").stdout)}
    assert rows["r-done"]["pending_approvals"] == 0 and rows["r-cancel"]["pending_approvals"] == 0
    table = cli(db, "list").stdout.splitlines()
    assert table[1].split()[-2:] == ["PENDING", "UNCERTAIN"]
    for line in table[3:]:
        assert line.split()[-2] == "0", line
    for run, status in (("r-done", "completed"), ("r-cancel", "cancelled")):
        out = cli(db, "show", run).stdout
        assert "Pending approvals: 0" in out and "decide with" not in out and "cuaderno approve" not in out
        assert f"Approvals that will not run: 1 (the run ended {status})" in out and FP in out
        assert json.loads(cli(db, "show", run, "--json").stdout)["pending_approvals"] == []
    # A run still open keeps its approval pending, with the command to decide it.
    suspended_run(store, "r-open")
    assert json.loads(cli(db, "list", "--status", "suspended", "--json").stdout)[0]["pending_approvals"] == 1


def test_list_refuses_an_unknown_status(db: Path, store: SqliteCheckpointer) -> None:
    suspended_run(store)
    refused(cli(db, "list", "--status", "bogus"), "'bogus'",
            "running, suspended, completed, failed, cancelled, needs_human", code=USAGE_EXIT)
    refused(cli(db, "list", "--status", "bogus", "--json"), "'bogus'", code=USAGE_EXIT)


def test_needs_human_says_how_to_settle(db: Path, store: SqliteCheckpointer) -> None:
    evidence = {"tool": "transfer", "effect_key": "ek-77"}
    store.append([start("r-u"), StepEvent(run_id="r-u", step_id="t0000.tool00", phase="uncertain", kind="tool",
                                          name="transfer", payload=evidence)])
    out = cli(db, "show", "r-u").stdout
    assert f"cuaderno --db {db} resolve r-u t0000.tool00 --happened" in out
    assert f"cuaderno --db {db} resolve r-u t0000.tool00 --not-happened" in out
    table = cli(db, "list").stdout.splitlines()
    assert table[1].split()[-1] == "UNCERTAIN"
    assert table[3].split()[0] == "r-u" and table[3].split()[-2:] == ["0", "1"]
    # At 80 columns the table fits; narrower, one line per run. Never a cropped column: rich used to
    # lay this row out one character too wide at 80, and the terminal cut the UNCERTAIN cell off.
    at_80 = cli(db, "list", env={"COLUMNS": "80"}).stdout
    assert all(len(line) <= 80 for line in at_80.splitlines()), at_80
    assert next(line for line in at_80.splitlines() if "r-u" in line).split()[-2:] == ["0", "1"], at_80
    assert cli(db, "list", env={"COLUMNS": "60"}).stdout.strip().endswith("pending=0 uncertain=1")

    # Cancelled, the run will not go on, but settling the effect still decides its compensation;
    # the hint says what each answer does now (nothing is sent for the closed run's own step).
    assert cli(db, "cancel", "r-u").exit_code == 0
    closed = cli(db, "show", "r-u").stdout
    assert "cancelled" in closed and "Uncertain effects: 1" in closed
    assert "compensate() then schedules or records its compensation" in closed and "nothing is sent" in closed


def tool_step(run_id: str, step: str = "t0000.tool00") -> list[StepEvent]:
    return [StepEvent(run_id=run_id, step_id=step, phase="intent", kind="tool", name="transfer",
                      payload={"effect_key": "ek-1", "arguments": ARGS}),
            StepEvent(run_id=run_id, step_id=step, phase="result", kind="tool", name="transfer",
                      payload={"outcome": "ok", "value": {"paid": 100}})]


def test_cancel_twice_says_already_cancelled(db: Path, store: SqliteCheckpointer) -> None:
    store.append([start("r-c"), *tool_step("r-c"), approval_request("r-c", step="t0001.tool00.approval")])
    first = cli(db, "cancel", "r-c", "--reason", "changed mind")
    assert first.exit_code == 0, first.output
    # One of each, in the singular.
    assert first.stdout.strip() == ("run r-c cancelled: 1 effect completed, 0 uncertain, "
                                    "0 cleanup actions scheduled")
    size = len(journal(db, "r-c")[0])
    second = cli(db, "cancel", "r-c")
    assert second.exit_code == 0, second.output
    assert second.stdout.startswith("run r-c was already cancelled (nothing was written): 1 effect completed")
    assert len(journal(db, "r-c")[0]) == size


def test_a_table_rich_would_crop_is_printed_one_line_per_row() -> None:
    """rich's measured minimum said this table fits 77..86 columns, but its layout came out one
    character too wide and the terminal cut the last column off: the value vanished."""
    from io import StringIO

    from rich import box
    from rich.console import Console
    from rich.table import Table

    from cuaderno import render

    for width in (77, 80, 86):
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        table.add_column("RUN", overflow="fold", min_width=12)
        table.add_column("STATUS", overflow="fold", min_width=9)
        for title in ("MODEL CALLS", "TOOL CALLS"):
            table.add_column(title, justify="right")
        table.add_column("COST", overflow="fold", min_width=10)
        table.add_column("PENDING", justify="right")
        table.add_column("UNCERTAIN", justify="right")
        table.add_row("nodedup", "needs_human", "0", "0", "$0.000000", "0", "7")
        out = StringIO()
        render._print_table(Console(file=out, width=width), table)
        assert out.getvalue().strip().endswith("pending=0 uncertain=7"), out.getvalue()
