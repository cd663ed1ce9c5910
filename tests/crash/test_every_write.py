"""R1 by position: SIGKILL around every journal write a story makes, then let it go on.

``test_crash_sweep`` kills at the named points of each step kind (K0-K8). This sweep kills by
position instead: before, inside and after the n-th append of the process (``append.W0/W1/W2``),
for every n a clean run of the story makes. So it also reaches the writes that have no step point
of their own: re-sends (``intent.2``), classified errors, uncertain effects and their
resolutions, denials, approvals and rejections, the cancellation, compensations, a run's end on
a bound. The stories are in ``stories.py``.

After each kill the story is driven again, in fresh processes, to its end. Checked against the
records cuaderno does not write:

- I1: no effect key has two receipts (``receipts.jsonl``), and the story ends with the same
  effects as its clean run: nothing lost, nothing doubled;
- I2: no process is billed for a model call whose response was journaled before it started
  (``billing.jsonl``, per process);
- the story ends as its clean run does; the journal before the kill is a prefix of the journal
  after (I5); ``PRAGMA integrity_check`` is ok (I7).

``CUADERNO_SOAK=1`` also kills a second time, at every write of the first recovery.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import stories
from _report import record
from _sweep import forked

from cuaderno.journal._compress import CODEC_JSON_ZSTD, stored_payload
from cuaderno.testing.records import read_records

pytestmark = pytest.mark.xdist_group("crash")

STAGES = ("W0", "W1", "W2")


def child(story: str, work: Path, crash_at: str | None, *, count: bool = False) -> tuple[int, dict[str, Any]]:
    """One process driving the story (forked: a real process that SIGKILL really kills)."""
    result_path = work / "result.json"
    result_path.unlink(missing_ok=True)
    rc, pid = forked(stories.main_forked, (story, str(work / "runs.db"), str(work), crash_at, str(result_path), count),
                     f"{story}, crash at {crash_at}")
    if rc == -9:
        return -9, {"pid": pid}
    assert rc == 0, f"{story}: the child failed (rc={rc}, crash at {crash_at})"
    return 0, json.loads(result_path.read_text())


def rows(work: Path) -> list[tuple[str, str, str]]:
    db = work / "runs.db"
    if not db.exists():
        return []
    con = sqlite3.connect(db)
    try:
        if con.execute("SELECT 1 FROM sqlite_master WHERE name='cuaderno_events'").fetchone() is None:
            return []
        return con.execute("SELECT step_id, phase, row_hash FROM cuaderno_events ORDER BY seq").fetchall()
    finally:
        con.close()


def journaled_keys(work: Path) -> set[str]:
    """Idempotency keys of the model calls whose response is journaled."""
    if not rows(work):
        return set()
    con = sqlite3.connect(work / "runs.db")
    try:
        found = con.execute("SELECT codec, payload FROM cuaderno_events WHERE kind='model' AND phase='result'"
                            ).fetchall()
    finally:
        con.close()
    return {stored_payload(*row)["key"] for row in found}


_CLEAN: dict[str, dict[str, Any]] = {}


def clean(story: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The story run once without a kill: its end, its effects and how many writes it makes."""
    if story not in _CLEAN:
        work = tmp_path_factory.mktemp(f"clean-{story}")
        rc, result = child(story, work, None, count=True)
        assert rc == 0
        result["effects"] = stories.effects(work)
        with closing(sqlite3.connect(work / "runs.db")) as con:
            codecs = dict(con.execute("SELECT codec, count(*) FROM cuaderno_events GROUP BY codec").fetchall())
        # The kills below land around commits of compressed rows too, and their resumes read them.
        assert codecs.get(CODEC_JSON_ZSTD, 0) >= 3 and codecs.get("json", 0) >= 5, codecs
        _CLEAN[story] = result
    return _CLEAN[story]


def cases() -> list[tuple[str, str]]:
    return [(story, stage) for story in stories.STORIES for stage in STAGES]


@pytest.mark.parametrize(("story", "stage"), cases())
def test_kill_around_every_write(story: str, stage: str, tmp_path: Path,
                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    reference = clean(story, tmp_path_factory)
    writes = reference["counts"][f"append.{stage}"]
    assert writes >= 5, reference["counts"]  # the count itself works (a story makes at least this many)
    soak = bool(os.environ.get("CUADERNO_SOAK"))
    failures = []
    for n in range(1, writes + 1):
        work = tmp_path / f"n{n}"
        work.mkdir()
        problems = kill_and_finish(story, work, f"append.{stage}:{n}", reference, second_kills=soak)
        record({"test": "R1 kill around every write (SQLite)", "kind": story, "point": f"{stage}:{n}",
                "status": problems["status"], "kills": problems["kills"], "not_reached": 0,
                "duplicated": problems["duplicated"], "rebilled_journaled": problems["rebilled"],
                "rebilled_in_flight": 0, "violations": len(problems["violations"])})
        if problems["violations"]:
            failures.append((n, problems["violations"]))
    assert not failures, f"{story} append.{stage}: {failures}"


def kill_and_finish(story: str, work: Path, crash_at: str, reference: dict[str, Any], *,
                    second_kills: bool) -> dict[str, Any]:
    violations: list[str] = []
    rc, _ = child(story, work, crash_at)
    if rc != -9:
        violations.append(f"{crash_at} was not reached")
    kills = int(rc == -9)
    rebilled = 0
    result: dict[str, Any] = {}
    for attempt in range(4):
        before = rows(work)
        journaled = journaled_keys(work)
        second = f"append.W1:{attempt + 1}" if second_kills and attempt == 0 else None
        rc, result = child(story, work, second)
        pid = result["pid"]
        rebilled += sum(1 for r in read_records(work / "billing.jsonl") if r["pid"] == pid and r["key"] in journaled)
        if rows(work)[: len(before)] != before:
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
    con = sqlite3.connect(work / "runs.db")
    try:
        if (check := con.execute("PRAGMA integrity_check").fetchone()[0]) != "ok":
            violations.append(f"I7: {check}")
    finally:
        con.close()
    return {"violations": violations, "status": str(result.get("status")), "kills": kills,
            "duplicated": int(bool(duplicated)), "rebilled": rebilled}
