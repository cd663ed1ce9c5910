"""R1 by position on PostgreSQL: SIGKILL around every journal write the stories make.

``test_crash_sweep_postgres.py`` kills at the named step points (K0-K8) of each step kind; this
module reaches the writes that have no step point of their own (re-sends, classified errors,
uncertain effects and their resolutions, approvals, denials, the cancellation, compensations, a
run's end on a bound), as ``test_every_write.py`` does on SQLite: the stories of ``stories.py``,
each with its journal in a PostgreSQL schema of its own, killed at the n-th ``append.W*`` of the
process for every n a clean run makes, then driven to their end in fresh processes.

Checked against the records cuaderno does not write, as on SQLite: no effect key with two receipts
and the clean run's effects (I1), no model call billed by a process after its response was
journaled (I2), the clean run's end, the journal before the kill a prefix of the journal after
(I5), and every run's hash chain checks out on load (I7's counterpart).

Default: inside the transaction (``W1``) at every write. ``CUADERNO_SOAK=1``: before, inside and
after (``W0``/``W1``/``W2``), and a second kill in the first recovery.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
import stories
from _pg import PG_URL, new_schema, pg_schemas, schema_url  # noqa: F401 - the fixture
from _report import record
from _sweep import forked
from psycopg import sql

from cuaderno import open_journal
from cuaderno.journal._compress import stored_payload
from cuaderno.testing.records import read_records

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("crash")]

SOAK = bool(os.environ.get("CUADERNO_SOAK"))
STAGES = ("W0", "W1", "W2") if SOAK else ("W1",)


@pytest.fixture(autouse=True)
def stories_on_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stories open their journal by URL (the forked children inherit the patch)."""
    monkeypatch.setattr(stories, "SqliteCheckpointer", open_journal)


def child(story: str, url: str, work: Path, crash_at: str | None, *, count: bool = False) -> tuple[int, dict[str, Any]]:
    result_path = work / "result.json"
    result_path.unlink(missing_ok=True)
    rc, pid = forked(stories.main_forked, (story, url, str(work), crash_at, str(result_path), count),
                     f"{story}, crash at {crash_at}")
    if rc == -9:
        return -9, {"pid": pid}
    assert rc == 0, f"{story}: the child failed (rc={rc}, crash at {crash_at})"
    return 0, json.loads(result_path.read_text())


def rows(schema: str) -> list[tuple[str, str, str, str]]:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass(%s)", (f"{schema}.cuaderno_events",)).fetchone() == (None,):
            return []
        query = sql.SQL("SELECT run_id, step_id, phase, row_hash FROM {}.cuaderno_events ORDER BY run_id, seq")
        return [tuple(r) for r in conn.execute(query.format(sql.Identifier(schema))).fetchall()]


def journaled_keys(schema: str) -> set[str]:
    """Idempotency keys of the model calls whose response is journaled."""
    if not rows(schema):
        return set()
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        query = sql.SQL("SELECT codec, payload FROM {}.cuaderno_events WHERE kind='model' AND phase='result'")
        found = conn.execute(query.format(sql.Identifier(schema))).fetchall()
    return {stored_payload(codec, bytes(payload))["key"] for codec, payload in found}


def chains_check_out(url: str) -> list[str]:
    store = open_journal(url)
    try:
        problems = []
        for cp in store.list_runs(limit=1000):
            try:
                store.load(cp.run_id)  # checks the hash chain against the summary
            except Exception as exc:
                problems.append(f"I7: run {cp.run_id}: {type(exc).__name__}: {exc}")
        return problems
    finally:
        store.close()


_CLEAN: dict[str, dict[str, Any]] = {}


def clean(story: str, tmp_path_factory: pytest.TempPathFactory, schemas: list[str]) -> dict[str, Any]:
    """The story run once without a kill: its end, its effects and how many writes it makes."""
    if story not in _CLEAN:
        work = tmp_path_factory.mktemp(f"pg-clean-{story}")
        schemas.append(new_schema())
        rc, result = child(story, schema_url(schemas[-1]), work, None, count=True)
        assert rc == 0
        result["effects"] = stories.effects(work)
        _CLEAN[story] = result
    return _CLEAN[story]


@pytest.mark.parametrize(("story", "stage"), [(s, st) for s in stories.STORIES for st in STAGES])
def test_kill_around_every_write_postgres(story: str, stage: str, tmp_path: Path,
                                          tmp_path_factory: pytest.TempPathFactory,
                                          pg_schemas: list[str]) -> None:  # noqa: F811
    reference = clean(story, tmp_path_factory, pg_schemas)
    writes = reference["counts"][f"append.{stage}"]
    assert writes >= 5, reference["counts"]
    failures = []
    for n in range(1, writes + 1):
        work = tmp_path / f"n{n}"
        work.mkdir()
        pg_schemas.append(new_schema())
        problems = kill_and_finish(story, pg_schemas[-1], work, f"append.{stage}:{n}", reference, second_kills=SOAK)
        record({"test": "R1 kill around every write (PostgreSQL)", "kind": story, "point": f"{stage}:{n}",
                "status": problems["status"], "kills": problems["kills"], "not_reached": 0,
                "duplicated": problems["duplicated"], "rebilled_journaled": problems["rebilled"],
                "rebilled_in_flight": 0, "violations": len(problems["violations"])})
        if problems["violations"]:
            failures.append((n, problems["violations"]))
    assert not failures, f"{story} append.{stage}: {failures}"


def kill_and_finish(story: str, schema: str, work: Path, crash_at: str, reference: dict[str, Any], *,
                    second_kills: bool) -> dict[str, Any]:
    url = schema_url(schema)
    violations: list[str] = []
    rc, _ = child(story, url, work, crash_at)
    if rc != -9:
        violations.append(f"{crash_at} was not reached")
    kills = int(rc == -9)
    rebilled = 0
    result: dict[str, Any] = {}
    for attempt in range(4):
        before = rows(schema)
        journaled = journaled_keys(schema)
        second = f"append.W1:{attempt + 1}" if second_kills and attempt == 0 else None
        rc, result = child(story, url, work, second)
        pid = result["pid"]
        rebilled += sum(1 for r in read_records(work / "billing.jsonl") if r["pid"] == pid and r["key"] in journaled)
        after = rows(schema)
        if [r for r in after if r in set(before)] != before or not set(before) <= set(after):
            violations.append("I5: the journal after a recovery does not extend the journal before it")
        kills += int(rc == -9)
        if rc == 0:
            break
    else:
        violations.append("the story did not end after 4 recoveries")
    if rebilled:
        violations.append(f"I2: {rebilled} model calls with a journaled response were billed again")
    receipts = Counter(r["key"] for r in read_records(work / "receipts.jsonl"))
    duplicated = sum(1 for n in receipts.values() if n > 1)
    if duplicated:
        violations.append(f"I1: effects applied twice: {[k for k, n in receipts.items() if n > 1]}")
    if stories.effects(work) != reference["effects"]:
        violations.append(f"effects {stories.effects(work)} differ from the clean run's {reference['effects']}")
    if result.get("status") != reference["status"] or result.get("cleanup") != reference.get("cleanup"):
        violations.append(f"ended {result} where the clean run ended {reference['status']}")
    violations += chains_check_out(url)
    return {"violations": violations, "status": str(result.get("status")), "kills": kills,
            "duplicated": int(bool(duplicated)), "rebilled": rebilled}
