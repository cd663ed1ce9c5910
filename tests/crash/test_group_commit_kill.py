"""Group commit under SIGKILL: nothing acts before its own intent is durable, nothing acts twice.

A worker process drives several runs as tasks of one event loop through one
:class:`~cuaderno.journal._group.GroupCommit` journal, or (``default``) on the store as
:func:`~cuaderno.open_journal` returns it, whose runs share commits through the store's own
group (:func:`cuaderno.journal.shared_group`) by default; every turn of every run moves money through
the ledger service (non-idempotent, no deduplication, with a lookup by effect key). The worker
is SIGKILLed at a group's crash point:

- ``group.G1``: inside the group's transaction, every append of the group written, before COMMIT;
- ``group.G2``: after the commit, before any run of the group is woken.

Then, from the ledger's receipts (its own process and SQLite file) and the journal as the disk has
it: every receipt's effect key is a tool intent the journal holds (no effect ran without a durable
intent), and no key has two receipts. A second worker process then resumes every run through a
group too: every run completes, with exactly one receipt per transfer (an intent the kill left
without a result is looked up, found absent, and sent once).

Run as a script (``python test_group_commit_kill.py --db URL --ledger URL --runs N --turns T``) it
is the worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _pg import new_schema, pg_schemas, schema_url  # noqa: F401 - the fixture
from _report import record
from workload import transfer_tool

from cuaderno import Agent, ScriptedGateway, Session, open_journal
from cuaderno.journal import shared_group
from cuaderno.journal._group import GroupCommit
from cuaderno.testing import crash
from cuaderno.testing.ledger import LedgerProcess, read_receipts

RUNS, TURNS = 6, 4
DWELL_S = 0.05
HITS = (1, 4, 9) if not os.environ.get("CUADERNO_SOAK") else tuple(range(1, 30, 2))


def _dwell(seconds: float) -> None:
    """Every group stays ``seconds`` inside its transaction before COMMIT (at ``group.G1``, before
    the armed kill): a run that acted before its intent were durable would have its receipt in
    the ledger by then, so the kill cannot win that race by chance."""
    def hook() -> None:
        time.sleep(seconds)
        crash.on("group.G1", hook)  # a hook runs once: set again for the next group

    crash.on("group.G1", hook)


async def _worker(db: str, ledger: str, runs: int, turns: int, dwell: float, plain: bool = False) -> dict[str, str]:
    if dwell:
        _dwell(dwell)
    group = open_journal(db) if plain else GroupCommit(open_journal(db))

    async def one(run_id: str) -> str:
        transfer = transfer_tool(ledger, run_id, idempotent=False, with_lookup=True)
        gateway = ScriptedGateway([*(ScriptedGateway.call("transfer", to=f"acct{i}", amount=10 + i)
                                     for i in range(turns)), ScriptedGateway.text("done")])
        agent = Agent(instructions="group commit kill", tools=[transfer], max_turns=turns + 1)
        async for _ in agent.run(f"pay {run_id}", session=Session(run_id, gateway, group)):
            pass
        cp = group.checkpoint(run_id)
        return cp.status if cp is not None else "missing"

    try:
        names = [f"run-{i}" for i in range(runs)]
        statuses = dict(zip(names, await asyncio.gather(*(one(n) for n in names)), strict=True))
        shared = shared_group(group)
        assert shared is not None and shared.appends > 0, "the runs did not commit through a group"
        return statuses
    finally:
        group.close()


def _run_worker(db: str, ledger: str, crash_at: str | None, *, runs: int = RUNS, turns: int = TURNS,
                dwell: float = DWELL_S, plain: bool = False) -> tuple[int, dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k != crash.ENV_VAR}
    if crash_at:
        env[crash.ENV_VAR] = crash_at
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, __file__, "--db", db, "--ledger", ledger, "--runs", str(runs),
                           "--turns", str(turns), "--dwell", str(dwell), *(["--plain"] if plain else [])], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    if done.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"worker failed ({done.returncode}): {done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}
    return done.returncode, out


def _durable_intents(db: str) -> tuple[set[str], Counter[str]]:
    """The effect keys of every tool intent the journal holds, and the tool results per key."""
    store = open_journal(db)
    try:
        keys: set[str] = set()
        results: Counter[str] = Counter()
        for cp in store.list_runs(limit=1000):
            for ev in store.load(cp.run_id):
                if ev.kind == "tool" and ev.phase.startswith("intent"):
                    keys.add(str(ev.payload["effect_key"]))
                elif ev.kind == "tool" and ev.phase == "result":
                    results[str(ev.payload.get("effect_key"))] += 1
        return keys, results
    finally:
        store.close()


def _journal_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A new journal: a SQLite file, or a PostgreSQL schema dropped after the test."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'runs.db'}"
    names = request.getfixturevalue("pg_schemas")
    names.append(new_schema())
    return schema_url(names[-1])


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[LedgerProcess]:
    with LedgerProcess(tmp_path / "ledger.db", mode="nodedup") as process:
        yield process


@pytest.mark.parametrize("hit", HITS)
@pytest.mark.parametrize("point", ["group.G1", "group.G2"])
@pytest.mark.parametrize("store", ["GroupCommit", "default"])
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_kill_in_a_group(backend: str, store: str, point: str, hit: int, ledger: LedgerProcess, tmp_path: Path,
                         request: pytest.FixtureRequest) -> None:
    db = _journal_url(backend, tmp_path, request)
    plain = store == "default"
    code, _ = _run_worker(db, ledger.url, f"{point}:{hit}", plain=plain)
    assert code == -signal.SIGKILL, f"{point}:{hit} was not reached"

    receipts = read_receipts(ledger.db_path)
    intents, _ = _durable_intents(db)
    per_key = Counter(str(r["key"]) for r in receipts)
    without_intent = [k for k in per_key if k not in intents]
    assert without_intent == [], "an effect ran without a durable intent"
    assert max(per_key.values(), default=0) <= 1, "an effect ran twice"
    before = len(receipts)

    code, statuses = _run_worker(db, ledger.url, None, plain=plain)
    assert code == 0
    assert statuses == {f"run-{i}": "completed" for i in range(RUNS)}
    receipts = read_receipts(ledger.db_path)
    intents, results = _durable_intents(db)
    per_key = Counter(str(r["key"]) for r in receipts)
    assert len(per_key) == RUNS * TURNS and set(per_key.values()) == {1}, "each transfer happened exactly once"
    assert set(per_key) <= intents and all(results[k] == 1 for k in per_key)
    record({"test": f"group commit kill ({backend}{', by default' if plain else ''})", "kind": "tool_lookup", "point": f"{point}:{hit}",
            "status": "completed", "kills": 1, "not_reached": 0, "duplicated": 0, "rebilled_journaled": 0,
            "rebilled_in_flight": 0, "violations": 0, "receipts_at_kill": before, "receipts": len(receipts)})


SNAP_RUNS, SNAP_TURNS = 2, 70
"""Each run writes one snapshot (about 4 rows a turn; one snapshot every 256 rows)."""


@pytest.mark.parametrize("point", ["snapshot.K6:2", "snapshot.K7:2"])
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_kill_at_a_snapshot_of_grouped_runs(backend: str, point: str, ledger: LedgerProcess, tmp_path: Path,
                                            request: pytest.FixtureRequest) -> None:
    """A worker's runs share commits and write snapshots through the group (they need the store's
    tail reads). Killed while the second run's snapshot commits, or right after it, the runs resume
    through a group from what the journal holds: every transfer happens once, and each run keeps
    exactly one snapshot, the killed one written again, not twice."""
    db = _journal_url(backend, tmp_path, request)
    code, _ = _run_worker(db, ledger.url, point, runs=SNAP_RUNS, turns=SNAP_TURNS, dwell=0)
    assert code == -signal.SIGKILL, f"{point} was not reached"
    assert max(Counter(str(r["key"]) for r in read_receipts(ledger.db_path)).values()) == 1

    code, statuses = _run_worker(db, ledger.url, None, runs=SNAP_RUNS, turns=SNAP_TURNS, dwell=0)
    assert code == 0
    assert statuses == {f"run-{i}": "completed" for i in range(SNAP_RUNS)}
    per_key = Counter(str(r["key"]) for r in read_receipts(ledger.db_path))
    assert len(per_key) == SNAP_RUNS * SNAP_TURNS and set(per_key.values()) == {1}, "each transfer exactly once"
    store = open_journal(db)
    try:
        snapshots = {f"run-{i}": sum(ev.kind == "snapshot" for ev in store.load(f"run-{i}")) for i in range(SNAP_RUNS)}
    finally:
        store.close()
    assert snapshots == {f"run-{i}": 1 for i in range(SNAP_RUNS)}
    record({"test": f"group commit snapshot kill ({backend})", "kind": "tool_lookup", "point": point,
            "status": "completed", "kills": 1, "not_reached": 0, "duplicated": 0, "rebilled_journaled": 0,
            "rebilled_in_flight": 0, "violations": 0, "receipts": sum(per_key.values())})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--runs", type=int, default=RUNS)
    ap.add_argument("--turns", type=int, default=TURNS)
    ap.add_argument("--dwell", type=float, default=DWELL_S)
    ap.add_argument("--plain", action="store_true", help="the store as open_journal returns it (its default group)")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(_worker(args.db, args.ledger, args.runs, args.turns, args.dwell, args.plain))),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
