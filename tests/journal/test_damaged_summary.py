"""A damaged or edited run summary (the checkpoint row) or schema record is a typed error, and
nothing is written because of it.

The summary is a projection kept beside the journal, outside its hash chain. What a person
decides from it (``approve``, ``deny``, ``resolve``, ``cancel``) must come from the journal, and a
summary that disagrees with the journal must never number a new row or bind a decision.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from cuaderno import harness
from cuaderno.cancellation import cancel
from cuaderno.checkpoint import verified
from cuaderno.errors import JournalCorrupt
from cuaderno.events import StepEvent
from cuaderno.journal import SqliteCheckpointer

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
    """Every row of both tables (the lease columns included)."""
    with closing(sqlite3.connect(path)) as db:
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
    from typer.testing import CliRunner

    from cuaderno.cli import app

    path = tmp_path / "j.db"
    _suspended(path)
    _edit_summary(path, lambda d: d["pending"][APPROVAL]["arguments"].update(amount=5))
    before = _state(path)
    shown = CliRunner().invoke(app, ["--db", str(path), "show", RUN])
    assert shown.exit_code == 2 and "does not match its journal (pending differ)" in shown.output
    assert '"amount": 5' not in shown.output and _state(path) == before


async def test_a_closed_run_answers_from_its_journal_not_from_an_edited_summary(tmp_path: Path) -> None:
    """Before, asking a completed run again returned whatever answer its summary held."""
    from cuaderno import Agent, ScriptedGateway, Session

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
    from cuaderno import Agent, Budgets, Policy, ScriptedGateway, Session, tool

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
    gw = ScriptedGateway(script[2:])
    with SqliteCheckpointer(path) as store, pytest.raises(JournalCorrupt, match=r"\(counters differ\)"):
        async for _ in agent.run("t", session=Session(RUN, gw, store)):
            pass
    assert gw.calls == 0 and _state(path) == before  # not taken over either: the epoch is as it was
