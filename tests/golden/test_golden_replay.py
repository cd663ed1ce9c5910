"""R13 (old-schema journals) and R14 (replay determinism) against committed golden histories.

The histories in ``journals/`` were recorded by ``make_golden.py`` from the programs in
``golden_programs.py``. Here they are resumed by the *current* code, Temporal-``Replayer`` style:

- R14 replay: every ``<program>.v<N>.jsonl`` is imported into a fresh journal (same hash chain,
  same checkpoint), then resumed with the program as it is defined now and a fresh scripted
  model: a closed run answers from the journal; a history cut before its final answer replays
  every recorded step (0 model calls, 0 tool executions) and writes the same final answer; a
  history cut after any model result executes exactly the steps that are missing.
- R14 mutations: the agent changed in code (tools reordered, inserted, removed, a parameter added,
  instructions or policy version changed) never silently re-executes a recorded step.
- R13: every committed ``schema_v<N>.sqlite`` (a whole journal file as release N wrote it) opens
  with the current ``SqliteCheckpointer`` and its runs resume with 0 re-executed journaled steps; a
  journal from a newer schema is refused and left byte-identical; a process SIGKILLed while it
  creates a fresh journal leaves no journal or a complete one, never half a schema.

When ``SCHEMA_VERSION`` is bumped, the new migration step plugs in here: the committed
``schema_v1.sqlite`` must then be migrated on open and still resume, and ``make_golden.py``
records ``schema_v2.sqlite`` and ``*.v2.jsonl`` beside the old files (never over them).
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, closing
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import IO, Any

import pytest
from golden_programs import (
    MUTATIONS,
    PROGRAM_BY_RUN_ID,
    PROGRAMS,
    REQUEST_CHANGING,
    Mutation,
    Program,
    World,
    checkpoint_json,
    drive,
    model_calls_made,
    resume_choice,
    tool_steps_executed,
)
from make_golden import JOURNALS, event_from_record, jsonl_name, read_jsonl, sqlite_name

from cuaderno import (
    Agent,
    Checkpointer,
    FinalStep,
    MemoryCheckpointer,
    ReplayDivergence,
    SchemaTooNew,
    ScriptedGateway,
    SqliteCheckpointer,
    StepEvent,
    VersionMismatch,
)
from cuaderno.checkpoint import rebuild
from cuaderno.journal._sqlite_file import _BLAKE_KEYED_SINCE, _KEYED_SINCE
from cuaderno.journal.base import SCHEMA_VERSION

GOLDEN_FILES = sorted(JOURNALS.glob("*.v*.jsonl"))
SCHEMA_FILES = sorted(JOURNALS.glob("schema_v*.sqlite"), key=lambda p: int(p.stem.removeprefix("schema_v")))
REQUIRED_COVERAGE = {"multi-turn tool run", "parallel tool calls in one turn", "denied call", "approval approved",
                     "invalid-arguments repair", "empty generation rejected, then an answer",
                     "transient model error retried"}


@dataclass(frozen=True)
class Golden:
    """One committed history: its header line and its event records, in ``seq`` order."""

    path: Path

    @cached_property
    def _parsed(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return read_jsonl(self.path)

    @property
    def header(self) -> dict[str, Any]:
        return self._parsed[0]

    @property
    def records(self) -> list[dict[str, Any]]:
        return self._parsed[1]

    @property
    def program(self) -> Program:
        return PROGRAM_BY_RUN_ID[self.header["run_id"]]

    def end_of(self, step_id: str, phase: str = "result") -> int:
        """How many records there are up to and including ``step_id``'s ``phase`` event."""
        return 1 + next(i for i, r in enumerate(self.records) if (r["step_id"], r["phase"]) == (step_id, phase))

    def model_results(self) -> list[str]:
        return [r["step_id"] for r in self.records if r["kind"] == "model" and r["phase"] == "result"]

    def events(self, start: int = 0, stop: int | None = None) -> list[StepEvent]:
        """The records as stored events (seq and row hash included), for the journal helpers."""
        return [StepEvent(run_id=r["run_id"], step_id=r["step_id"], phase=r["phase"], kind=r["kind"], name=r["name"],
                          decision=r["decision"], fingerprint=r["fingerprint"], payload=r["payload"], codec=r["codec"],
                          seq=r["seq"], row_hash=r["row_hash"]) for r in self.records[start:stop]]


GOLDEN = [Golden(p) for p in GOLDEN_FILES]


def _golden_id(g: Golden) -> str:
    return g.path.name.removesuffix(".jsonl")


# -- helpers --------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "memory"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Checkpointer]:
    store: Checkpointer = SqliteCheckpointer(tmp_path / "j.sqlite") if request.param == "sqlite" \
        else MemoryCheckpointer()
    yield store
    store.close()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SqliteCheckpointer]:
    with SqliteCheckpointer(tmp_path / "j.sqlite") as store:
        yield store


def import_history(store: Checkpointer, records: list[dict[str, Any]]) -> list[StepEvent]:
    """Append recorded events one by one, in order, as a harness write (``epoch=None``)."""
    stored: list[StepEvent] = []
    for rec in records:
        stored += store.append([event_from_record(rec)], epoch=None)
    return stored


def shape(ev: StepEvent | dict[str, Any]) -> tuple[Any, ...]:
    """What a step is, without its data: position, phase, kind, tool name, decision."""
    if isinstance(ev, StepEvent):
        return (ev.step_id, ev.phase, ev.kind, ev.name, ev.decision)
    return (ev["step_id"], ev["phase"], ev["kind"], ev["name"], ev["decision"])


def _headless(cp: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's JSON without its chain head's hash (random where rows are keyed)."""
    return {k: v for k, v in cp.items() if k != "last_hash"}


def is_migration(ev: StepEvent) -> bool:
    """A ``migrate.N`` record, written when a history recorded under an older schema is resumed."""
    return ev.kind == "run" and ev.phase.startswith("migrate")


def model_keys(events: list[StepEvent]) -> set[str]:
    """Idempotency keys of the model calls whose response is journaled."""
    return {str(e.payload.get("key")) for e in events if e.kind == "model" and e.phase == "result"}


def finished_tool_steps(events: list[StepEvent]) -> set[str]:
    return {e.step_id for e in events if e.kind == "tool" and e.phase == "result"}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def schema_of(path: Path) -> int:
    """The ``cuaderno_meta`` schema version of a journal file (read-only, ``-wal`` included)."""
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        row = db.execute("SELECT value FROM cuaderno_meta WHERE key='schema_version'").fetchone()
    return int(row[0])


def cuaderno_objects(db: sqlite3.Connection) -> set[tuple[str, str]]:
    return {(t, n) for t, n in db.execute("SELECT type, name FROM sqlite_master WHERE name LIKE 'cuaderno%'")}


# -- the fixture set --------------------------------------------------------------------------------


def test_fixture_set_is_complete() -> None:
    """Every released schema has its journal file, every program its history; the programs cover R14's cases."""
    assert [p.name for p in SCHEMA_FILES] == [sqlite_name(v) for v in range(1, SCHEMA_VERSION + 1)]
    for program in PROGRAMS:
        assert (JOURNALS / jsonl_name(program)).exists(), f"no golden history of {program.name} for this schema"
    covered = {c for g in GOLDEN for c in g.header["covers"]}
    assert REQUIRED_COVERAGE <= covered, REQUIRED_COVERAGE - covered
    for g in GOLDEN:
        assert g.header["schema_version"] <= SCHEMA_VERSION
        assert f".v{g.header['schema_version']}." in g.path.name
        assert [r["seq"] for r in g.records] == list(range(1, len(g.records) + 1))
        assert g.records[-1]["kind"] == "final" and g.header["checkpoint"]["status"] == "completed"


# -- R14: replay --------------------------------------------------------------------------------------


@pytest.mark.parametrize("golden", GOLDEN, ids=_golden_id)
def test_import_rebuilds_the_same_hash_chain_and_checkpoint(golden: Golden, any_store: Checkpointer) -> None:
    stored = import_history(any_store, golden.records)
    assert [e.row_hash for e in stored] == [r["row_hash"] for r in golden.records]
    loaded = any_store.load(golden.program.run_id)  # checks the chain and its head
    assert [(e.seq, e.row_hash) for e in loaded] == [(r["seq"], r["row_hash"]) for r in golden.records]
    assert [e.payload for e in loaded] == [r["payload"] for r in golden.records]
    assert checkpoint_json(any_store.checkpoint(golden.program.run_id)) == golden.header["checkpoint"]
    assert checkpoint_json(rebuild(golden.program.run_id, loaded)) == golden.header["checkpoint"]


@pytest.mark.parametrize("golden", GOLDEN, ids=_golden_id)
async def test_closed_history_answers_from_the_journal(golden: Golden, sqlite_store: SqliteCheckpointer) -> None:
    program = golden.program
    import_history(sqlite_store, golden.records)
    world, gateway = World(), program.gateway()
    steps = await drive(program, program.agent(world), sqlite_store, gateway)
    assert len(steps) == 1 and isinstance(steps[0], FinalStep) and steps[0].replayed
    assert steps[0].output == golden.header["final_output"] == program.final_text
    assert gateway.calls == 0 and world.executions == []
    assert len(sqlite_store.load(program.run_id)) == len(golden.records)


@pytest.mark.parametrize("verify_replay", [False, True], ids=["adopt-chain", "verify-every-turn"])
@pytest.mark.parametrize("golden", GOLDEN, ids=_golden_id)
async def test_whole_history_replays_to_the_same_final_answer(golden: Golden, any_store: Checkpointer,
                                                              verify_replay: bool) -> None:
    """Everything but the final answer is journaled: every recorded step is replayed, none re-run."""
    program = golden.program
    import_history(any_store, golden.records[:-1])
    world, gateway = World(), program.gateway()
    agent = program.agent(world)
    steps = await drive(program, agent, any_store, gateway, verify_replay=verify_replay,
                        on_version_mismatch=resume_choice(golden.header["versions"], agent.versions()))
    assert gateway.calls == 0 and world.executions == []
    assert len(steps) == 1 and isinstance(steps[0], FinalStep) and not steps[0].replayed
    assert steps[0].output == golden.header["final_output"]
    events = any_store.load(program.run_id)
    assert [shape(e) for e in events if not is_migration(e)] == [shape(r) for r in golden.records]
    assert events[-1].same_as(event_from_record(golden.records[-1]))
    if golden.header["versions"] == agent.versions():
        # Same events, same chain: the only new row is the recorded final answer; byte-identical
        # where it was stamped as recorded (a store that keys rows draws a new key for it, so its
        # link differs, and the summary's head with it; load checked the chain above).
        if events[-1].salt is None and golden.records[-1].get("salt") is None:
            assert events[-1].row_hash == golden.records[-1]["row_hash"]
            assert checkpoint_json(any_store.checkpoint(program.run_id)) == golden.header["checkpoint"]
        else:
            assert _headless(checkpoint_json(any_store.checkpoint(program.run_id))) == \
                _headless(golden.header["checkpoint"])


CUTS = [pytest.param(g, step, id=f"{_golden_id(g)}-after-{step}") for g in GOLDEN for step in g.model_results()]


@pytest.mark.parametrize(("golden", "cut"), CUTS)
async def test_truncated_history_runs_exactly_the_missing_steps(golden: Golden, cut: str,
                                                                sqlite_store: SqliteCheckpointer) -> None:
    program = golden.program
    n = golden.end_of(cut)
    recorded, missing = golden.events(0, n), golden.events(n)
    import_history(sqlite_store, golden.records[:n])
    rejected_before = any(e.kind == "model" and e.phase == "result"
                          and (e.payload.get("verdict") or {}).get("outcome", "ok") != "ok" for e in recorded)
    world, gateway = World(), program.gateway(empty_already_returned=rejected_before)
    agent = program.agent(world)
    steps = await drive(program, agent, sqlite_store, gateway,
                        on_version_mismatch=resume_choice(golden.header["versions"], agent.versions()))
    final = steps[-1]
    assert isinstance(final, FinalStep) and final.output == golden.header["final_output"]
    events = sqlite_store.load(program.run_id)
    assert [shape(e) for e in events if not is_migration(e)] == [shape(r) for r in golden.records]
    assert [e.row_hash for e in events[:n]] == [r["row_hash"] for r in golden.records[:n]]
    # Exactly the missing steps ran, in order; no recorded one ran again.
    assert world.steps == tool_steps_executed(missing)
    assert not set(world.steps) & finished_tool_steps(recorded)
    assert gateway.calls == model_calls_made(missing)
    assert not set(gateway.keys) & model_keys(recorded)


# -- R14: mutations -------------------------------------------------------------------------------------

EXPECTED_VERSION_DIFF: dict[Mutation, set[str]] = {
    "reorder_tools": {"agent"},  # the capability version is over the sorted tool contracts
    "insert_tool": {"agent", "capabilities"},
    "remove_tool": {"agent", "capabilities"},
    "change_instructions": {"agent"},
    "add_tool_parameter": {"agent", "capabilities"},
    "bump_policy_version": {"policy"},
}

MUTATION_CASES = [pytest.param(g, m, id=f"{g.program.name}-{m}") for g in GOLDEN
                  if g.header["schema_version"] == SCHEMA_VERSION for m in MUTATIONS]


@pytest.mark.parametrize(("golden", "mutation"), MUTATION_CASES)
async def test_mutated_agent_is_refused_by_default(golden: Golden, mutation: Mutation,
                                                   sqlite_store: SqliteCheckpointer) -> None:
    program = golden.program
    n = golden.end_of(program.cut_after)
    import_history(sqlite_store, golden.records[:n])
    before = sqlite_store.checkpoint(program.run_id)
    assert before is not None
    world, gateway = World(), program.gateway()
    agent = program.agent(world, mutation)
    with pytest.raises(VersionMismatch) as info:
        await drive(program, agent, sqlite_store, gateway)
    assert type(info.value) is VersionMismatch
    diff = {k for k in info.value.recorded.keys() | info.value.current.keys()
            if info.value.recorded.get(k) != info.value.current.get(k)}
    assert diff == EXPECTED_VERSION_DIFF[mutation]
    assert info.value.recorded == golden.header["versions"] and info.value.current == agent.versions()
    # Nothing ran and nothing was written, not even a takeover.
    assert gateway.calls == 0 and world.executions == []
    assert len(sqlite_store.load(program.run_id)) == n
    after = sqlite_store.checkpoint(program.run_id)
    assert after is not None and after.to_json() == before.to_json()


@pytest.mark.parametrize(("golden", "mutation"), MUTATION_CASES)
async def test_mutated_agent_resumed_anyway_diverges_or_is_documented(
        golden: Golden, mutation: Mutation, sqlite_store: SqliteCheckpointer) -> None:
    """``on_version_mismatch="resume"``: every mutation that changes a recorded request raises
    ``ReplayDivergence`` at turn 0, before anything runs. A policy-version bump changes no request:
    see ``_policy_bump_resumed`` for exactly what happens then."""
    program = golden.program
    n = golden.end_of(program.cut_after)
    import_history(sqlite_store, golden.records[:n])
    world, gateway = World(), program.gateway()
    agent = program.agent(world, mutation)
    if mutation in REQUEST_CHANGING:
        with pytest.raises(ReplayDivergence) as info:
            await drive(program, agent, sqlite_store, gateway, on_version_mismatch="resume")
        assert info.value.step_id == "t0000.model" and info.value.expected.startswith("model request")
        assert gateway.calls == 0 and world.executions == []
        assert len(sqlite_store.load(program.run_id)) == n
        assert checkpoint_json(sqlite_store.checkpoint(program.run_id)) == \
            checkpoint_json(rebuild(program.run_id, golden.events(0, n)))
    else:
        await _policy_bump_resumed(golden, n, agent, world, gateway, sqlite_store)


async def _policy_bump_resumed(golden: Golden, n: int, agent: Agent, world: World, gateway: ScriptedGateway,
                               store: SqliteCheckpointer) -> None:
    """What resuming under a bumped policy version does, precisely.

    The policy version is in the run's versions (so the default refuses, above), in every tool
    decision and intent payload, and in every effect key, but in no model request. So with
    ``"resume"``: the recorded steps replay unchanged (0 re-executions, no divergence); the
    missing steps run under the new policy version, with effect keys that differ from the ones
    the original run used for the same steps; and the run's recorded versions are not updated
    (only a ``Migration`` journals new versions).
    """
    program = golden.program
    new_version = agent.policy.version
    steps = await drive(program, agent, store, gateway, on_version_mismatch="resume")
    final = steps[-1]
    assert isinstance(final, FinalStep) and final.output == golden.header["final_output"]
    recorded, missing = golden.events(0, n), golden.events(n)
    events = store.load(program.run_id)
    assert [shape(e) for e in events] == [shape(r) for r in golden.records]
    assert world.steps == tool_steps_executed(missing) and not set(world.steps) & finished_tool_steps(recorded)
    assert gateway.calls == model_calls_made(missing) and not set(gateway.keys) & model_keys(recorded)
    golden_by_key = {(e.step_id, e.phase): e for e in missing}
    new_tool_events = [e for e in events[n:] if e.kind == "tool" and "policy_version" in e.payload]
    assert new_tool_events, "the tail has tool decisions or intents"
    for ev in new_tool_events:
        assert ev.payload["policy_version"] == new_version != golden_by_key[(ev.step_id, ev.phase)].payload[
            "policy_version"]
    for ev in (e for e in events[n:] if e.kind == "tool" and e.phase == "intent"):
        assert ev.payload["effect_key"] != golden_by_key[(ev.step_id, ev.phase)].payload["effect_key"]
    cp = store.checkpoint(program.run_id)
    assert cp is not None and cp.versions == golden.header["versions"] and cp.status == "completed"


# -- R13: journal files of every schema version -------------------------------------------------------


def _schema_id(path: Path) -> str:
    return path.stem


@pytest.mark.parametrize("fixture", SCHEMA_FILES, ids=_schema_id)
async def test_committed_schema_journal_resumes_without_re_execution(fixture: Path, tmp_path: Path) -> None:
    committed = sha256(fixture)
    file_version = int(re.fullmatch(r"schema_v(\d+)\.sqlite", fixture.name).group(1))  # type: ignore[union-attr]
    path = tmp_path / fixture.name
    shutil.copyfile(fixture, path)
    assert schema_of(path) == file_version
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        rows_before = set(db.execute("SELECT run_id, step_id, phase FROM cuaderno_events").fetchall())
    reexecuted = resumed = 0
    with SqliteCheckpointer(path) as store:  # migrates an older schema's tables, or opens the current one
        # Schema 4 added the rows' digest keys (a column): an open for writing migrates to it.
        assert schema_of(path) == max(file_version, 4)
        runs = store.list_runs()
        assert {cp.run_id for cp in runs} <= set(PROGRAM_BY_RUN_ID) and runs
        for cp in sorted(runs, key=lambda c: c.run_id):
            program = PROGRAM_BY_RUN_ID[cp.run_id]
            recorded = store.load(cp.run_id)
            assert {(e.run_id, e.step_id, e.phase) for e in recorded} == \
                {r for r in rows_before if r[0] == cp.run_id}, "a migration lost or invented events"
            world, gateway = World(), program.gateway()
            agent = program.agent(world)
            steps = await drive(program, agent, store, gateway,
                                on_version_mismatch=resume_choice(cp.versions, agent.versions()))
            final = steps[-1]
            assert isinstance(final, FinalStep) and final.output == program.final_text
            assert final.replayed == (cp.status == "completed")
            new = store.load(cp.run_id)[len(recorded):]
            reexecuted += len(set(world.steps) & finished_tool_steps(recorded))
            reexecuted += len(set(gateway.keys) & model_keys(recorded))
            assert world.steps == tool_steps_executed(new)
            assert gateway.calls == model_calls_made(new)
            after = store.checkpoint(cp.run_id)
            assert after is not None and after.status == "completed" and after.count("possibly_billed_twice") == 0
            resumed += 1
    assert reexecuted == 0
    assert resumed == len(runs)
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        compressed = db.execute("SELECT count(*) FROM cuaderno_events WHERE codec='json+zstd'").fetchone()[0]
    # The resumes wrote compressed rows (schema 2 and 4 are taken) with keyed BLAKE2b digests, so
    # schema 8 is taken by the first of them (a cuaderno of schema 7 would take their longer key for
    # damage). Schemas 5 to 7 are about encryption and large payloads, which nothing here writes.
    assert compressed > 0 and schema_of(path) == max(file_version, _KEYED_SINCE, _BLAKE_KEYED_SINCE)
    assert sha256(fixture) == committed, "the committed journal file was modified"


@pytest.mark.parametrize("fixture", SCHEMA_FILES, ids=_schema_id)
def test_committed_schema_journal_is_read_as_it_is_and_its_runs_need_no_version_choice(fixture: Path,
                                                                                     tmp_path: Path) -> None:
    """A read-only store (``cuaderno list``/``show``) reads every schema whose tables are unchanged
    without migrating it, and a run recorded under an older file schema carries the same versions
    as this code: how rows are stored is not a reason to stop a run (schema 2 only added a codec)."""
    path = tmp_path / fixture.name
    shutil.copyfile(fixture, path)
    before = sha256(path)
    with SqliteCheckpointer(path, readonly=True) as store:
        runs = store.list_runs()
        assert runs
        for cp in runs:
            assert store.load(cp.run_id)[-1].seq == cp.last_seq
            assert cp.versions == PROGRAM_BY_RUN_ID[cp.run_id].agent(World()).versions(), cp.run_id
    assert sha256(path) == before and sorted(p.name for p in tmp_path.iterdir()) in (
        [fixture.name], sorted([fixture.name, f"{fixture.name}-shm", f"{fixture.name}-wal"]))


def _bump_schema(path: Path, version: int) -> None:
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE cuaderno_meta SET value=? WHERE key='schema_version'", (str(version),))


def _snapshot(directory: Path) -> dict[str, str]:
    return {p.name: sha256(p) for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("fixture", SCHEMA_FILES, ids=_schema_id)
def test_newer_schema_is_refused_and_left_byte_identical(fixture: Path, tmp_path: Path) -> None:
    """A journal written by a newer cuaderno (left in WAL mode, as cuaderno leaves every journal)."""
    committed = sha256(fixture)
    d = tmp_path / "j"
    d.mkdir()
    path = d / "journal.sqlite"
    shutil.copyfile(fixture, path)
    SqliteCheckpointer(path).close()  # as a cuaderno journal is on disk: WAL mode, checkpointed
    _bump_schema(path, SCHEMA_VERSION + 1)
    before = _snapshot(d)
    assert list(before) == ["journal.sqlite"]
    with pytest.raises(SchemaTooNew) as info:
        SqliteCheckpointer(path)
    assert (info.value.found, info.value.supported) == (SCHEMA_VERSION + 1, SCHEMA_VERSION)
    assert _snapshot(d) == before
    assert sha256(fixture) == committed


def test_newer_schema_in_rollback_mode_is_refused_and_left_byte_identical(tmp_path: Path) -> None:
    """The committed fixture is in rollback (DELETE) mode, as a backup or a copy may be; a newer
    cuaderno may also choose another mode. SchemaTooNew says "Nothing was changed": the schema is
    checked before the WAL switch, so not even the header is rewritten."""
    d = tmp_path / "j"
    d.mkdir()
    path = d / "journal.sqlite"
    shutil.copyfile(SCHEMA_FILES[-1], path)
    _bump_schema(path, SCHEMA_VERSION + 1)
    before, header = _snapshot(d), path.read_bytes()[:100]
    with pytest.raises(SchemaTooNew):
        SqliteCheckpointer(path)
    assert path.read_bytes()[18:20] == header[18:20], "the refused journal was switched to WAL mode"
    assert _snapshot(d) == before


_OPEN_CHILD = """\
import sys
from cuaderno.journal.sqlite import SqliteCheckpointer
print("ready", flush=True)
sys.stdin.readline()
SqliteCheckpointer(sys.argv[1]).close()
print("opened", flush=True)
"""
KILL_TRIALS = 20
KILL_SEED = 20260
KILL_WINDOW_S = 0.010
"""Kill delays are uniform in [0, window): creating a journal takes ~3-7 ms here."""


def _journal_state(path: Path, full: set[tuple[str, str]]) -> str:
    """``absent`` (no file), ``empty`` (a file with no cuaderno schema), ``complete``, or what is half."""
    if not path.exists():
        return "absent"
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        objects = cuaderno_objects(db)
        version = db.execute("SELECT value FROM cuaderno_meta WHERE key='schema_version'").fetchone() \
            if ("table", "cuaderno_meta") in objects else None
    if not objects:
        return "empty"
    if objects == full and version == (str(SCHEMA_VERSION),):
        return "complete"
    return f"half: {sorted(objects)} schema_version={version}"


def test_sigkill_while_creating_a_journal_never_leaves_half_a_schema(tmp_path: Path) -> None:
    reference = tmp_path / "reference.sqlite"
    SqliteCheckpointer(reference).close()
    with closing(sqlite3.connect(reference)) as db:
        full = cuaderno_objects(db)
    assert {n for _, n in full} >= {"cuaderno_meta", "cuaderno_events", "cuaderno_runs"}
    rng = random.Random(KILL_SEED)
    states: Counter[str] = Counter()
    killed = 0
    with ExitStack() as stack:
        # Children import cuaderno in parallel and wait; each is then told to open and killed.
        children = [(tmp_path / f"fresh-{i}.sqlite", stack.enter_context(subprocess.Popen(
            [sys.executable, "-c", _OPEN_CHILD, str(tmp_path / f"fresh-{i}.sqlite")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))) for i in range(KILL_TRIALS)]
        for path, proc in children:
            stdin, stdout = _pipes(proc)
            assert stdout.readline() == "ready\n"
            delay = rng.uniform(0, KILL_WINDOW_S)
            stdin.write("go\n")
            stdin.flush()
            time.sleep(delay)
            os.kill(proc.pid, signal.SIGKILL)
            killed += proc.wait() == -signal.SIGKILL
            state = _journal_state(path, full)
            states[state] += 1
            assert not state.startswith("half"), f"trial {path.name} (delay {delay * 1000:.2f} ms): {state}"
            SqliteCheckpointer(path).close()  # no journal yet, or a complete one: both open cleanly
            assert _journal_state(path, full) == "complete"
    assert sum(states.values()) == KILL_TRIALS and killed > 0
    print(f"\n{KILL_TRIALS} kill-during-open trials ({killed} killed before the open returned): {dict(states)}; "
          "0 half-created schemas")


def _pipes(proc: subprocess.Popen[str]) -> tuple[IO[str], IO[str]]:
    assert proc.stdin is not None and proc.stdout is not None
    return proc.stdin, proc.stdout

