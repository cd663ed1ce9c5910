"""A damaged or edited run summary (the checkpoint row) or schema record is a typed error, and
nothing is written because of it.

The summary is a projection kept beside the journal, outside its hash chain. What a person
decides from it (``approve``, ``deny``, ``resolve``, ``cancel``) must come from the journal, and a
summary that disagrees with the journal must never number a new row or bind a decision.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cuaderno import Agent, BudgetExceeded, Budgets, Policy, ScriptedGateway, Session, harness, tool
from cuaderno.cancellation import cancel
from cuaderno.checkpoint import rebuild, verified
from cuaderno.cli import app
from cuaderno.errors import JournalCorrupt, RunNotFound, UsageError
from cuaderno.events import StepEvent
from cuaderno.journal import JournalRolledBack, SqliteCheckpointer

RUN = "r-pay"
APPROVAL = "t0000.tool00.approval"
ARGS = {"amount": 100, "to": "acct-9"}


def _suspended(path: Path) -> None:
    """A run waiting for approval of a transfer of 100."""
    with SqliteCheckpointer(path) as store:
        store.append([StepEvent(run_id=RUN, step_id="run", phase="start", kind="run", fingerprint="f",
                                payload={"task": "t", "versions": {}})])
        store.append([StepEvent(run_id=RUN, step_id=APPROVAL, phase="request", kind="approval", name="transfer",
                                decision="require_approval", fingerprint="fp-100",
                                payload={"tool_step": "t0000.tool00", "arguments": ARGS})])


def _edit_summary(path: Path, change: Callable[[dict[str, Any]], object]) -> None:
    with closing(sqlite3.connect(path)) as db, db:
        data = json.loads(db.execute("SELECT checkpoint FROM cuaderno_runs WHERE run_id=?", (RUN,)).fetchone()[0])
        change(data)
        db.execute("UPDATE cuaderno_runs SET checkpoint=? WHERE run_id=?", (json.dumps(data), RUN))


def _state(path: Path) -> tuple[Any, ...]:
    """Every row of both tables (the lease columns included), text as bytes (it may not be UTF-8)."""
    with closing(sqlite3.connect(path)) as db:
        db.text_factory = bytes
        return (db.execute("SELECT * FROM cuaderno_events ORDER BY rowid").fetchall(),
                db.execute("SELECT * FROM cuaderno_runs").fetchall(),
                db.execute("SELECT * FROM cuaderno_meta").fetchall())


def _refused_everywhere(path: Path, match: str) -> None:
    """Every decision a person can take on the run is refused with ``match``, and nothing changes."""
    before = _state(path)
    with SqliteCheckpointer(path) as store:
        for decide in (lambda: harness.approve(store, RUN, APPROVAL),
                       lambda: harness.deny(store, RUN, APPROVAL),
                       lambda: harness.pending_approvals(store, RUN),
                       lambda: cancel(store, RUN, "stop"),
                       lambda: verified(store, RUN)):
            with pytest.raises(JournalCorrupt, match=match):
                decide()
    assert _state(path) == before


def test_a_summary_that_counts_fewer_events_than_the_journal_numbers_no_new_row(tmp_path: Path) -> None:
    """Before, ``approve`` wrote a second row numbered 2 and broke the journal it extended."""
    path = tmp_path / "j.db"
    _suspended(path)
    _edit_summary(path, lambda d: d.update(last_seq=1))
    with SqliteCheckpointer(path) as store, pytest.raises(JournalCorrupt, match="says 1 events, the journal holds 2"):
        store.load(RUN)
    _refused_everywhere(path, "says 1 events")


def test_a_summary_showing_other_arguments_than_the_journal_binds_no_decision(tmp_path: Path) -> None:
    """Before, ``approve`` showed a transfer of 5 from the summary and bound the journaled 100."""
    path = tmp_path / "j.db"
    _suspended(path)
    _edit_summary(path, lambda d: d["pending"][APPROVAL]["arguments"].update(amount=5))
    _refused_everywhere(path, r"does not match its journal \(pending differ\)")


@pytest.mark.parametrize(("field", "value", "match"), [
    ("counters", "lots", "'counters' = 'lots', which is not an object of integers"),
    ("counters", {"retries": "2"}, "not an object of integers"),
    ("pending", [], "'pending' = \\[\\], which is not an object of objects"),
    ("cost_usd", "0.1", "'cost_usd' = '0.1', which is not a number"),
    ("last_seq", True, "'last_seq' = True, which is not a count"),
    ("last_hash", None, "'last_hash' = None, which is not a string"),
])
def test_a_malformed_summary_is_journal_corrupt_for_every_reader(tmp_path: Path, field: str, value: Any,
                                                                  match: str) -> None:
    """Before, ``list`` and ``show`` failed with AttributeError or TypeError tracebacks."""
    path = tmp_path / "j.db"
    _suspended(path)
    _edit_summary(path, lambda d: d.update({field: value}))
    before = _state(path)
    with SqliteCheckpointer(path) as store:
        for read in (lambda: store.checkpoint(RUN), lambda: store.list_runs(), lambda: store.load(RUN)):
            with pytest.raises(JournalCorrupt, match=match):
                read()
    with SqliteCheckpointer(path, readonly=True) as store, pytest.raises(JournalCorrupt, match=match):
        store.list_runs()
    assert _state(path) == before


def test_a_summary_that_is_not_json_is_journal_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    _suspended(path)
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE cuaderno_runs SET checkpoint='{\"run_id\": ' WHERE run_id=?", (RUN,))
    with SqliteCheckpointer(path) as store, pytest.raises(JournalCorrupt, match="is not JSON"):
        store.checkpoint(RUN)


@pytest.mark.parametrize("version", ["-1", "0"])
@pytest.mark.parametrize("readonly", [False, True])
def test_a_schema_version_below_1_is_refused_and_the_file_left_as_it_was(tmp_path: Path, version: str,
                                                                         readonly: bool) -> None:
    """Before, -1 sent the migration to the last step and the file was rewritten as schema 1
    (holding compressed rows), and 0 advised migrating a file whose tables already exist."""
    path = tmp_path / "j.db"
    _suspended(path)
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE cuaderno_meta SET value=? WHERE key='schema_version'", (version,))
    before = _state(path)
    with pytest.raises(JournalCorrupt, match=f"schema version {version} is not one any cuaderno writes"):
        SqliteCheckpointer(path, readonly=readonly)
    assert _state(path) == before


def test_an_untouched_journal_verifies(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    _suspended(path)
    with SqliteCheckpointer(path) as store:
        cp, events = verified(store, RUN)
        assert cp.pending[APPROVAL]["arguments"] == ARGS and len(events) == cp.last_seq == 2
        harness.approve(store, RUN, APPROVAL)
        assert verified(store, RUN)[0].last_seq == 3


def test_an_uncertain_step_whose_summary_was_edited_is_not_settled_from_it(tmp_path: Path) -> None:
    """``resolve`` records the effect key a person checked: it must be the journal's."""
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path) as store:
        store.append([StepEvent(run_id=RUN, step_id="run", phase="start", kind="run", fingerprint="f",
                                payload={"task": "t", "versions": {}})])
        store.append([StepEvent(run_id=RUN, step_id="t0000.tool00", phase="intent", kind="tool", name="transfer",
                                decision="allow", fingerprint="fp-100", payload={"effect_key": "eff-1"})])
        store.append([StepEvent(run_id=RUN, step_id="t0000.tool00", phase="uncertain", kind="tool", name="transfer",
                                fingerprint="fp-100", payload={"tool": "transfer", "effect_key": "eff-1"})])
        assert store.checkpoint(RUN).uncertain["t0000.tool00"]["effect_key"] == "eff-1"
    _edit_summary(path, lambda d: d["uncertain"]["t0000.tool00"].update(effect_key="eff-2"))
    before = _state(path)
    with SqliteCheckpointer(path) as store:
        for happened in (True, False):
            with pytest.raises(JournalCorrupt, match=r"\(uncertain differ\)"):
                harness.resolve(store, RUN, "t0000.tool00", happened=happened)
    assert _state(path) == before


def test_show_refuses_a_summary_that_does_not_match_its_journal(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    _suspended(path)
    _edit_summary(path, lambda d: d["pending"][APPROVAL]["arguments"].update(amount=5))
    before = _state(path)
    shown = CliRunner().invoke(app, ["--db", str(path), "show", RUN])
    assert shown.exit_code == 4 and "does not match its journal (pending differ)" in shown.output
    assert '"amount": 5' not in shown.output and _state(path) == before


async def test_a_closed_run_answers_from_its_journal_not_from_an_edited_summary(tmp_path: Path) -> None:
    """Before, asking a completed run again returned whatever answer its summary held."""
    path = tmp_path / "j.db"
    agent = Agent(instructions="i")
    with SqliteCheckpointer(path) as store:
        async for _ in agent.run("t", session=Session(RUN, ScriptedGateway([ScriptedGateway.text("paid 100")]),
                                                      store)):
            pass
    _edit_summary(path, lambda d: d["outcome"].update(output="paid 5"))
    before = _state(path)
    gw = ScriptedGateway([])
    with SqliteCheckpointer(path) as store, pytest.raises(JournalCorrupt, match=r"\(outcome differ\)"):
        async for _ in agent.run("t", session=Session(RUN, gw, store)):
            pass
    assert gw.calls == 0 and _state(path) == before


async def test_a_live_run_whose_summary_forgets_the_budget_it_spent_is_refused_before_any_call(
        tmp_path: Path) -> None:
    """A resumed run charges the budgets already spent from its summary. Before, an edited summary
    (one repair instead of two) gave the run its bound back; now the summary must be the
    journal's projection, checked before the run is taken over."""
    @tool
    def transfer(to: str, amount: int) -> str:
        """Move money."""
        return "sent"

    path = tmp_path / "j.db"
    agent = Agent(instructions="i", tools=[transfer], budgets=Budgets(repairs=1),
                  policy=Policy({"transfer": "require_approval"}))
    script = [ScriptedGateway.call("transfer", to="x", amount="many"), ScriptedGateway.call("transfer", to="x", amount=1),
              ScriptedGateway.call("transfer", to="x", amount="again"), ScriptedGateway.text("done")]
    with SqliteCheckpointer(path) as store:
        async for _ in agent.run("t", session=Session(RUN, ScriptedGateway(script), store)):
            pass  # one repair (the bound), then it waits for the approval
        assert store.checkpoint(RUN).count("repairs") == 1
        harness.approve(store, RUN, "t0001.tool00")
    _edit_summary(path, lambda d: d["counters"].pop("repairs"))
    before = _state(path)
    gw = ScriptedGateway(script)
    with SqliteCheckpointer(path) as store, pytest.raises(JournalCorrupt, match=r"\(counters differ\)"):
        async for _ in agent.run("t", session=Session(RUN, gw, store)):
            pass
    assert gw.calls == 0 and _state(path) == before  # not taken over either: the epoch is as it was
    with SqliteCheckpointer(path) as store:
        assert harness.rebuild_summary(store, RUN).differed == ["counters"]
        with pytest.raises(BudgetExceeded):  # its true budget: the next repair is one too many
            async for _ in agent.run("t", session=Session(RUN, gw, store)):
                pass
    assert gw.calls == 1


# -- rebuilding a summary from its journal ------------------------------------------------------


def test_a_summary_behind_or_edited_is_rebuilt_from_the_journal_and_nothing_else_changes(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    _suspended(path)
    with SqliteCheckpointer(path) as store:
        good = store.checkpoint(RUN)
        store.acquire(RUN, "someone")  # the epoch and holder must survive the rebuild
    held = _state(path)[1]
    for damage, differed in ((lambda d: d.update(last_seq=1), ["last_seq"]),
                             (lambda d: d["pending"][APPROVAL]["arguments"].update(amount=5), ["pending"]),
                             (lambda d: d.update(status="completed", pending={}), ["pending", "status"])):
        _edit_summary(path, damage)
        events = _state(path)[0]
        with SqliteCheckpointer(path) as store:
            rebuilt = harness.rebuild_summary(store, RUN)
            assert rebuilt.differed == differed
            assert rebuilt.checkpoint.to_json() == {**good.to_json(), "epoch": good.epoch + 1}
            assert verified(store, RUN)[0].pending[APPROVAL]["arguments"] == ARGS
        state = _state(path)
        assert state[0] == events  # not one event row written or changed
        assert [r[:4] for r in state[1]] == [r[:4] for r in held]  # run, status, epoch, holder
    with SqliteCheckpointer(path) as store:
        assert harness.rebuild_summary(store, RUN).differed == []  # matches now: nothing is written
        before = _state(path)
        harness.rebuild_summary(store, RUN)
        assert _state(path) == before
        harness.approve(store, RUN, APPROVAL)  # and the run goes on
        assert verified(store, RUN)[0].last_seq == 3


def _damaged(path: Path, statements: str) -> tuple[Any, ...]:
    """A suspended run damaged by SQL statements; returns the state it leaves."""
    _suspended(path)
    with closing(sqlite3.connect(path)) as db, db:
        db.executescript(statements)
    return _state(path)


_REMOVED = "rows may have been removed from its end; nothing was written"
_UNREADABLE = "cannot be read .* whether rows were removed"


@pytest.mark.parametrize(("damage", "refusal", "differed"), [
    ("DELETE FROM cuaderno_events WHERE seq=2", _REMOVED,
     ["counters", "last_hash", "last_seq", "next_step", "pending", "status", "status column"]),
    # The head edited to name the row that is left, its count not: the count says rows are gone.
    ("DELETE FROM cuaderno_events WHERE seq=2; UPDATE cuaderno_runs SET checkpoint=json_set(checkpoint, "
     "'$.last_hash', (SELECT row_hash FROM cuaderno_events WHERE seq=1))", _REMOVED,
     ["counters", "last_seq", "next_step", "pending", "status", "status column"]),
    # Ending at row 1 of 2: nothing proves who wrote row 2.
    ("UPDATE cuaderno_runs SET checkpoint=json_set(checkpoint, '$.last_seq', 1, '$.last_hash', "
     "(SELECT row_hash FROM cuaderno_events WHERE seq=1))", "ends at event 1, the journal holds 2: 1 row past",
     ["last_hash", "last_seq"]),
    ("UPDATE cuaderno_runs SET checkpoint=5", _UNREADABLE, ["the whole summary (unreadable)"]),
    ("UPDATE cuaderno_runs SET checkpoint=CAST(x'7bff7d' AS TEXT)", _UNREADABLE, ["the whole summary (unreadable)"]),
    ("UPDATE cuaderno_runs SET checkpoint=replace(hex(zeroblob(50000)), '00', '[')", _UNREADABLE,
     ["the whole summary (unreadable)"]),
], ids=["rows removed from the end", "head moved to the rows left", "ends early with later facts", "not JSON",
        "not UTF-8", "nested 50,000 deep"])
def test_a_summary_that_may_hide_removed_rows_is_rebuilt_only_when_told_the_journal_is_complete(
        tmp_path: Path, damage: str, refusal: str, differed: list[str]) -> None:
    """Rows removed from the journal's end leave a summary that names an event the journal no
    longer holds (and an unreadable one cannot say): rebuilding from what is left would hide the
    loss, unless a person says the journal is complete."""
    path = tmp_path / "j.db"
    before = _damaged(path, damage)
    removed = "DELETE" in damage
    if removed:  # this machine saw row 2 committed: the journal is refused at open, before anything else
        with pytest.raises(JournalRolledBack, match="older than the last one this machine saw"):
            SqliteCheckpointer(path)
        assert _state(path) == before
    with SqliteCheckpointer(path, accept_rollback=removed) as store:
        with pytest.raises(JournalCorrupt, match=refusal):
            harness.rebuild_summary(store, RUN)
        assert _state(path) == before
        rebuilt = harness.rebuild_summary(store, RUN, trust_journal=True)
        assert rebuilt.differed == differed
        cp, events = verified(store, RUN)
        assert cp.to_json() == rebuilt.checkpoint.to_json() and cp.last_seq == len(events) == len(before[0])


def test_an_older_summary_of_the_same_journal_is_replaced_only_when_told(tmp_path: Path) -> None:
    """A copy of the runs table restored from before the last event (a backup): its head is a row
    the journal holds, and it is exactly the summary of the rows up to there. That is also what a
    row appended by something else looks like (the chain is not a signature), so the rows past
    its head count only once a person says they are the run's own."""
    path = tmp_path / "j.db"
    _suspended(path)
    with SqliteCheckpointer(path) as store:
        events = store.load(RUN)
    older = rebuild(RUN, events[:1], epoch=0).dumps()  # the summary as it was after the first event
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE cuaderno_runs SET checkpoint=?", (older,))
    with SqliteCheckpointer(path) as store:
        with pytest.raises(JournalCorrupt, match="ends at event 1, the journal holds 2.*rebuild-summary RUN --trust"):
            store.load(RUN)
        with pytest.raises(JournalCorrupt, match="1 row past the end of its summary"):
            harness.rebuild_summary(store, RUN)
        rebuilt = harness.rebuild_summary(store, RUN, trust_journal=True)
        assert rebuilt.differed == ["counters", "last_hash", "last_seq", "next_step", "pending", "status"]
        assert verified(store, RUN)[0].status == "suspended"


@pytest.mark.parametrize(("damage", "refusal"), [
    ("UPDATE cuaderno_runs SET epoch=-5", "its epoch is -5, not a count"),
    ("UPDATE cuaderno_runs SET epoch='two'", "its epoch is 'two', not a count"),
    ("DELETE FROM cuaderno_runs", "has 2 journaled events but no summary row"),
], ids=["negative epoch", "text epoch", "summary row deleted"])
def test_a_damaged_run_record_is_refused_not_rebuilt(tmp_path: Path, damage: str, refusal: str) -> None:
    """What the summary row holds besides the summary (the fencing epoch) cannot be rebuilt from
    the events: a typed refusal, never a rebuild the store's own reader would then refuse."""
    path = tmp_path / "j.db"
    before = _damaged(path, damage)
    with SqliteCheckpointer(path) as store:
        for trust in (False, True):
            with pytest.raises(JournalCorrupt, match=refusal):
                harness.rebuild_summary(store, RUN, trust_journal=trust)
        if "epoch" in damage:  # before, approve wrote its decision with the epoch copied into the summary
            with pytest.raises(JournalCorrupt, match=refusal):
                harness.approve(store, RUN, APPROVAL)
            with pytest.raises(JournalCorrupt, match=refusal):
                store.append([StepEvent(run_id=RUN, step_id="x", phase="request", kind="cancel", payload={})])
    assert _state(path) == before


def test_a_wrong_status_column_is_rebuilt_too(tmp_path: Path) -> None:
    """The status column is the copy ``list --status`` filters on."""
    path = tmp_path / "j.db"
    _damaged(path, "UPDATE cuaderno_runs SET status='completed'")
    with SqliteCheckpointer(path) as store:
        assert [cp.run_id for cp in store.list_runs(status="suspended")] == []
        assert harness.rebuild_summary(store, RUN).differed == ["status column"]
        assert [cp.run_id for cp in store.list_runs(status="suspended")] == [RUN]


async def test_an_epoch_a_takeover_cannot_follow_is_refused_before_the_takeover(tmp_path: Path) -> None:
    """Before, the next epoch overflowed SQLite's integers: an OverflowError traceback."""
    path = tmp_path / "j.db"
    before = _damaged(path, "UPDATE cuaderno_runs SET epoch=9223372036854775807")  # 2**63 - 1
    with SqliteCheckpointer(path) as store:
        with pytest.raises(JournalCorrupt, match="not one a takeover can follow"):
            store.acquire(RUN, "me")
        with pytest.raises(JournalCorrupt, match="not one a takeover can follow"):
            cancel(store, RUN, "stop")
    assert _state(path) == before


def test_a_journal_whose_rows_do_not_chain_is_never_summarised(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    before = _damaged(path, "UPDATE cuaderno_events SET name='refund' WHERE seq=2")
    with SqliteCheckpointer(path) as store:
        for trust in (False, True):
            with pytest.raises(JournalCorrupt, match=r"journal row 2 .* was altered"):
                harness.rebuild_summary(store, RUN, trust_journal=trust)
    assert _state(path) == before


def test_rebuild_summary_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    _suspended(path)
    with SqliteCheckpointer(path) as store:
        with pytest.raises(RunNotFound):
            harness.rebuild_summary(store, "nope")
        with pytest.raises(UsageError, match="trust_journal must be True or False"):
            harness.rebuild_summary(store, RUN, trust_journal="yes")  # type: ignore[arg-type]
        with pytest.raises(UsageError, match="store must be a Checkpointer"):
            harness.rebuild_summary(None, RUN)  # type: ignore[arg-type]

    class Plain:  # a custom Checkpointer that cannot rebuild a summary
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            if name == "rebuild_checkpoint":
                raise AttributeError(name)
            return getattr(self.inner, name)

        def append(self, *a: Any, **k: Any) -> Any: ...
        def load(self, run_id: str) -> Any: ...
        def checkpoint(self, run_id: str) -> Any: ...
        def list_runs(self, **k: Any) -> Any: ...
        def acquire(self, *a: Any, **k: Any) -> Any: ...
        def release(self, *a: Any) -> Any: ...
        def close(self) -> Any: ...

    with pytest.raises(UsageError, match="Plain cannot rebuild a run's summary"):
        harness.rebuild_summary(Plain(None), RUN)


def test_the_cli_rebuilds_a_summary_and_says_what_differed(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    _suspended(path)
    _edit_summary(path, lambda d: d["pending"][APPROVAL]["arguments"].update(amount=5))
    shown = CliRunner().invoke(app, ["--db", str(path), "show", RUN])
    assert shown.exit_code == 4 and "`cuaderno rebuild-summary RUN` rebuilds it from the journal" in shown.output
    done = CliRunner().invoke(app, ["--db", str(path), "rebuild-summary", RUN])
    assert done.exit_code == 0, done.output
    assert done.output.strip() == f"run {RUN}: summary rebuilt from its 2 journaled events (pending differed); " \
        "status suspended"
    again = CliRunner().invoke(app, ["--db", str(path), "rebuild-summary", RUN])
    assert again.exit_code == 0 and "its summary matches its journal (2 events); nothing was written" in again.output
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("DELETE FROM cuaderno_events WHERE seq=2")
    rolled_back = CliRunner().invoke(app, ["--db", str(path), "rebuild-summary", RUN])
    assert rolled_back.exit_code == 4 and "older than the last one this machine saw" in rolled_back.output
    Path(f"{path}-anchor").unlink()  # how the refusal says a person accepts it from the command line
    refused = CliRunner().invoke(app, ["--db", str(path), "rebuild-summary", RUN])
    assert refused.exit_code == 4 and "--trust-journal" in refused.output
    trusted = CliRunner().invoke(app, ["--db", str(path), "rebuild-summary", RUN, "--trust-journal"])
    assert trusted.exit_code == 0 and "status running" in trusted.output


@pytest.mark.parametrize("point", ["rebuild.B1", "rebuild.B2"])
def test_a_rebuild_killed_leaves_the_old_summary_or_the_new_one(tmp_path: Path, point: str) -> None:
    """SIGKILLed inside its transaction, a rebuild leaves the damaged summary as it was (and can be
    run again); after its commit, the rebuilt one. Never half of one, and never an event."""
    path = tmp_path / "j.db"
    before = _damaged(path, "UPDATE cuaderno_runs SET checkpoint=json_set(checkpoint, '$.counters.tool_calls', 7)")
    code = ("from cuaderno import SqliteCheckpointer, rebuild_summary\n"
            f"rebuild_summary(SqliteCheckpointer({str(path)!r}), {RUN!r})\n")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "CUADERNO_CRASH_AT": f"{point}:1"},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    with SqliteCheckpointer(path) as store:
        if point == "rebuild.B1":
            assert _state(path)[:2] == before[:2]  # every event and the summary row as they were
            with pytest.raises(JournalCorrupt, match=r"\(counters differ\)"):
                verified(store, RUN)
            assert harness.rebuild_summary(store, RUN).differed == ["counters"]
        else:
            assert _state(path)[0] == before[0]
        assert verified(store, RUN)[0].count("tool_calls") == 0
