"""R24 ``open_after_any_kill`` (issue 32, part 1): SIGKILL real runs at random moments; after every
kill the journal is opened read-only, shown by ``cuaderno show``, and the run resumed (by the next
child, itself killed at a random moment, until one finishes the run).

The runs are the crash workload's (``workload.py``), on one journal shared by all of them, so the
kills land in every part of a journal's life: a new ``-wal`` started after the last process closed
the file, commits, checkpoints on close. Each kill falls at a moment drawn from the whole length of
a child, except that half of the runs' first children, which start a new ``-wal`` (the run before
closed the journal last), are killed the moment that ``-wal`` is seen holding its header alone: a
kill between the header (written and synced first) and the first frame left the journals cuaderno
could not open before (``test_stale_shm``), and a window of about a millisecond is rarely hit by a
random moment (11 to 29 kills in 1,000 here).

Truth comes from records cuaderno does not write: the ledger service's receipts (transfers,
``tool_lookup`` through a ledger that does not deduplicate: a transfer applied twice is two
receipts; ``tool_dedup``) and the idempotent tool's receipt file (``model``).

Default: a few dozen kills (seconds). ``CUADERNO_SOAK=1``: 1,000 kills (``CUADERNO_SOAK_KILLS=N``
sets another count); the figures are printed and go to the crash report.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import workload
from _report import record
from typer.testing import CliRunner

from cuaderno.cli import app
from cuaderno.journal import SqliteCheckpointer
from cuaderno.testing.ledger import LedgerProcess, read_receipts
from cuaderno.testing.records import read_records

SOAK = bool(os.environ.get("CUADERNO_SOAK"))
KILLS = int(os.environ.get("CUADERNO_SOAK_KILLS", "1000")) if SOAK else 60
KINDS = ("tool_lookup", "model", "tool_dedup")
LEDGER_OF = {"tool_lookup": "nodedup", "tool_dedup": "dedup"}
PASSES = 40
"""Children killed on one run at most; then one runs it to its end unkilled."""


@dataclass
class Tally:
    kills: int = 0
    runs: int = 0
    passes: int = 0
    header_only_wal: int = 0
    """Kills after which the -wal held its header alone (the shape cuaderno could not open)."""
    hot_wal: int = 0
    """Kills after which the -wal held frames."""
    aimed_at_header: int = 0
    """Children killed when their new -wal was seen holding its header alone."""
    failed_opens: int = 0
    failed_shows: int = 0
    failed_resumes: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    duplicated_receipts: int = 0
    missing_receipts: int = 0
    errors: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        return {"kills": self.kills, "runs": self.runs, "children": self.passes,
                "aimed_at_header": self.aimed_at_header,
                "header_only_wal_after_kill": self.header_only_wal, "hot_wal_after_kill": self.hot_wal,
                "failed_opens": self.failed_opens, "failed_shows": self.failed_shows,
                "failed_resumes": self.failed_resumes, "statuses": dict(self.statuses),
                "duplicated_receipts": self.duplicated_receipts, "missing_receipts": self.missing_receipts}


def _child(argv: list[str], result: Path, delay: float | None, wal: Path | None = None) -> int:
    """One pass on the run in a forked child, SIGKILLed after ``delay`` seconds (``None``: not
    killed), or, with ``wal``, as soon as that -wal is seen holding its header alone (SQLite
    writes and syncs a new -wal's header before its first frame: about a millisecond here); its
    exit code (-9: killed). A child that hangs fails the test."""
    result.unlink(missing_ok=True)
    proc = multiprocessing.get_context("fork").Process(target=workload.run_forked, args=(argv, None, str(result)))
    proc.start()
    if wal is not None:
        _kill_at_header(proc, wal)
    elif delay is not None:
        proc.join(delay)
        if proc.exitcode is None:
            os.kill(int(proc.pid or 0), signal.SIGKILL)
    proc.join(60)
    if proc.exitcode is None:
        proc.kill()
        proc.join()
        raise AssertionError(f"a child hung: {argv}")
    return int(proc.exitcode)


def _kill_at_header(proc: Any, wal: Path) -> None:
    """SIGKILL ``proc`` the moment ``wal`` is 32 bytes long (polled without sleeping: the window
    is short), or leave it when it ends first or 10 s pass."""
    deadline = time.monotonic() + 10
    polls = 0
    while time.monotonic() < deadline:
        try:
            size = os.stat(wal).st_size
        except FileNotFoundError:
            size = -1
        if size == 32:
            os.kill(int(proc.pid or 0), signal.SIGKILL)
            return
        polls += 1
        if polls % 64 == 0 and proc.exitcode is not None:
            return


def _check_open(db: Path, run_id: str, tally: Tally, what: str) -> bool:
    """Open the journal read-only and read the run (if it was started); whether it has the run."""
    try:
        with closing(SqliteCheckpointer(db, readonly=True)) as store:
            store.list_runs(limit=1_000_000)
            if store.checkpoint(run_id) is None:
                return False
            store.load(run_id)
            return True
    except Exception as exc:  # every failure to open is counted and shown
        tally.failed_opens += 1
        tally.errors.append(f"{what}: read-only open: {type(exc).__name__}: {exc}")
        return False


def _check_show(db: Path, run_id: str, started: bool, tally: Tally, what: str) -> None:
    """``cuaderno show RUN`` (``list`` while the run is not in the journal yet) exits 0."""
    argv = ["--db", str(db), *(["show", run_id, "--json"] if started else ["list"])]
    done = CliRunner().invoke(app, argv, prog_name="cuaderno")
    if done.exit_code != 0 or (started and json.loads(done.stdout)["run_id"] != run_id):
        tally.failed_shows += 1
        tally.errors.append(f"{what}: cuaderno {' '.join(argv[2:])}: exit {done.exit_code}: {done.output.strip()[:300]}")


def _check_world(kind: str, run_id: str, turns: int, status: str, work: Path, ledgers: dict[str, Any],
                 tally: Tally) -> None:
    if kind in LEDGER_OF:
        keys = Counter(r["key"] for r in read_receipts(ledgers[LEDGER_OF[kind]].db_path, business_id=run_id))
        tally.duplicated_receipts += sum(n - 1 for n in keys.values())
        if status == "completed" and len(keys) != turns:
            tally.missing_receipts += 1
            tally.errors.append(f"{run_id}: completed with {len(keys)} transfers for {turns}")
    elif status == "completed":
        notes = {r["text"] for r in read_records(work / "tool.jsonl") if r.get("run") == run_id}
        if len(notes) != turns:  # an idempotent note may run again; each must have run
            tally.missing_receipts += 1
            tally.errors.append(f"{run_id}: completed with {len(notes)} notes for {turns}")


def kill_loop(work: Path, ledgers: dict[str, Any], kills: int, seed: int) -> Tally:
    """Run and kill until ``kills`` SIGKILLs landed; every run is then finished and checked. Stops
    at the first failure: a journal that cannot be opened fails every later open and resume too
    (each after SQLite's 10 s of retries), so later counts would say nothing more."""
    rng = random.Random(seed)
    db = work / "runs.db"
    with SqliteCheckpointer(db):  # the journal exists from the start: a read-only open needs it
        pass
    tally = Tally()
    length = 0.15  # how long a child runs unkilled, learnt as children finish
    # Until the kills are in, and one of them left the shape this test is about (at most 3x the kills).
    while (tally.kills < kills or (tally.header_only_wal == 0 and tally.kills < 3 * kills)) and not tally.errors:
        kind = KINDS[tally.runs % len(KINDS)]
        run_id, turns = f"k{tally.runs:05d}-{kind}", rng.randint(1, 3)
        tally.runs += 1
        argv = ["--db", f"sqlite:///{db}", "--run", run_id, "--kind", kind, "--turns", str(turns), "--work",
                str(work)]
        if kind in LEDGER_OF:
            argv += ["--ledger", ledgers[LEDGER_OF[kind]].url]
        status = ""
        for n in range(PASSES + 1):
            delay = None if n == PASSES else rng.uniform(0, length * 1.2)
            started = time.monotonic()
            # Every other run's first child, when it starts a new -wal, is killed the moment that
            # -wal holds its header alone (the shape no open could read before), if it is seen.
            target = n == 0 and not Path(f"{db}-wal").exists() and rng.random() < 1 / 2
            tally.aimed_at_header += target
            rc = _child(argv, work / "result.json", delay, wal=Path(f"{db}-wal") if target else None)
            tally.passes += 1
            what = f"kill {tally.kills + 1} ({run_id}, pass {n + 1})"
            if rc == -signal.SIGKILL:
                tally.kills += 1
                wal = Path(f"{db}-wal")
                size = wal.stat().st_size if wal.exists() else 0
                tally.header_only_wal += size == 32
                tally.hot_wal += size > 32
                has_run = _check_open(db, run_id, tally, what)
                _check_show(db, run_id, has_run, tally, what)
                if tally.errors:
                    return tally
                continue
            if rc != 0:
                tally.failed_resumes += 1
                tally.errors.append(f"{what}: the child exited {rc}")
                break
            length = 0.8 * length + 0.2 * (time.monotonic() - started)
            status = json.loads((work / "result.json").read_text())["status"]
            break
        tally.statuses[status or "unfinished"] += 1
        if status != "completed":
            tally.failed_resumes += status != ""
            tally.errors.append(f"{run_id}: ended {status or 'unfinished'}")
        _check_world(kind, run_id, turns, status, work, ledgers, tally)
    return tally


@pytest.fixture(scope="module")
def ledgers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("ledgers")
    with LedgerProcess(d / "dedup.db", mode="dedup") as dedup, LedgerProcess(d / "nodedup.db", mode="nodedup") as nd:
        yield {"dedup": dedup, "nodedup": nd}


def _run(tmp_path: Path, ledgers: dict[str, Any], kills: int) -> None:
    tally = kill_loop(tmp_path, ledgers, kills, seed=int(os.environ.get("CUADERNO_SOAK_SEED", "32")))
    figures = tally.figures()
    print(json.dumps(figures), file=sys.stderr)
    record({"test": "open_after_kill", "kind": "mixed", "point": "random", "status": "completed",
            "kills": tally.kills, "not_reached": 0, "duplicated": tally.duplicated_receipts,
            "rebilled_journaled": 0, "rebilled_in_flight": 0,
            "violations": tally.failed_opens + tally.failed_shows + tally.failed_resumes + tally.missing_receipts})
    assert tally.errors == [], "\n".join(tally.errors[:20])
    assert tally.kills >= kills
    assert tally.header_only_wal >= 1  # the loop met the shape journals could not be opened in
    assert tally.failed_opens == tally.failed_shows == tally.failed_resumes == 0
    assert tally.duplicated_receipts == 0 and tally.missing_receipts == 0
    assert tally.statuses == {"completed": tally.runs}


@pytest.mark.timeout(300)
def test_every_journal_a_random_kill_leaves_opens_shows_and_resumes(tmp_path: Path, ledgers: dict[str, Any]) -> None:
    if SOAK:
        pytest.skip("CUADERNO_SOAK=1 runs the 1,000-kill loop instead")
    _run(tmp_path, ledgers, KILLS)


@pytest.mark.soak
@pytest.mark.timeout(7200)
@pytest.mark.skipif(not SOAK, reason="the 1,000-kill loop runs with CUADERNO_SOAK=1")
def test_soak_1000_kills_every_journal_opens_shows_and_resumes(tmp_path: Path, ledgers: dict[str, Any]) -> None:
    _run(tmp_path, ledgers, KILLS)
