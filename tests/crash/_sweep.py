"""Supervisor for the crash tests: kill a child at a named point, resume, check the world.

The invariants (RELIABILITY.md H5) are checked against records cuaderno did not write: the ledger
service's receipts, the fake provider's billing log and the idempotent tool's receipt file. The
journal is used only for what it alone can say (the prefix rule I5, integrity I7).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuaderno import approve, open_journal
from cuaderno.errors import JournalError
from cuaderno.journal._compress import stored_payload
from cuaderno.testing.ledger import read_receipts
from cuaderno.testing.records import read_records

WORKLOAD = str(Path(__file__).resolve().parent / "workload.py")
POINTS = tuple(f"K{i}" for i in range(9))
KINDS_ALL = ("model", "model_dedup", "tool_idem", "tool_dedup", "tool_lookup", "tool_nodedup", "approval", "final")
PREFIX = {"model": "model", "model_dedup": "model", "tool_idem": "tool", "tool_dedup": "tool",
          "tool_lookup": "tool", "tool_nodedup": "tool", "approval": "approval", "final": "final"}


@dataclass
class Case:
    kind: str
    point: str
    seed: int
    turns: int
    hit: int
    second: str | None = None  # a second crash point armed in the first recovery (double fault)
    tag: str = ""  # keeps run ids (and the ledgers' business ids) apart between test families

    @property
    def crash_at(self) -> str:
        return f"{PREFIX[self.kind]}.{self.point}:{self.hit}"

    @property
    def run_id(self) -> str:
        tail = f"-{self.second}" if self.second else ""
        return f"{self.tag}{self.kind}-{self.point}-s{self.seed}{tail}"

    def replay_command(self) -> str:
        second = f" --second {self.second}" if self.second else ""
        return (f"python tests/crash/_sweep.py --kind {self.kind} --point {self.point} --seed {self.seed}{second}")


def journal_url(db: Path) -> str:
    """The journal's URL, as the workload and every recovery open it (an absolute file: four slashes)."""
    return f"sqlite:///{db.resolve()}"


def case_for(kind: str, point: str, seed: int, second: str | None = None) -> Case:
    """The seed chooses the program (how many tool turns) and which occurrence of the point dies."""
    import random

    rng = random.Random(f"{kind}:{point}:{seed}")
    turns = 1 if seed == 0 else rng.randint(1, 3)
    hit = 1 if seed == 0 else rng.randint(1, turns)
    return Case(kind=kind, point=point, seed=seed, turns=turns, hit=hit, second=second)


@dataclass
class Outcome:
    case: Case
    crashed: bool
    second_crashed: bool = False
    status: str = ""
    passes: int = 0
    ledger_receipts: int = 0
    ledger_keys: int = 0
    tool_calls: int = 0
    billed: Counter[str] = field(default_factory=Counter)
    rebilled_journaled: int = 0
    rebilled_unjournaled: int = 0
    approvals_written: int = 0
    evidence: dict[str, Any] | None = None
    violations: list[str] = field(default_factory=list)


def _child(case: Case, work: Path, ledger: str | None, crash_at: str | None,
           cancel_at: str | None = None, journal: str | None = None) -> tuple[int, int, dict[str, Any]]:
    """Run the workload in a forked child (a real process: SIGKILL really kills it).

    Forking an already-imported interpreter costs milliseconds where a fresh ``python`` costs
    half a second, which is what keeps hundreds of kills inside the default test run.
    ``CUADERNO_CRASH_SUBPROCESS=1`` runs fresh interpreters instead.
    """
    argv = ["--db", journal or journal_url(work / "runs.db"), "--run", case.run_id, "--kind", case.kind, "--turns", str(case.turns),
            "--work", str(work)]
    if ledger:
        argv += ["--ledger", ledger]
    if os.environ.get("CUADERNO_CRASH_SUBPROCESS"):
        return _subprocess_child(case, argv, crash_at)
    import workload

    result_path = work / "result.json"
    result_path.unlink(missing_ok=True)
    rc, pid = forked(workload.run_forked, (argv, crash_at, str(result_path), cancel_at), f"{case}")
    if rc == 0:
        result = json.loads(result_path.read_text())
        return 0, int(result["pid"]), result
    if rc == -9:
        return -9, pid, {}
    raise AssertionError(f"child failed (rc={rc}) for {case}")


def forked(target: Any, args: tuple[Any, ...], what: str, timeout: float = 60) -> tuple[int, int]:
    """Run ``target(*args)`` in a forked child and wait for it: ``(exit code, pid)``; -9 is a
    SIGKILL. A child that hangs is killed and fails the test."""
    import multiprocessing

    proc = multiprocessing.get_context("fork").Process(target=target, args=args)
    proc.start()
    proc.join(timeout)
    if proc.exitcode is None:
        proc.kill()
        proc.join()
        raise AssertionError(f"child hung: {what}")
    return proc.exitcode, int(proc.pid or -1)


def _subprocess_child(case: Case, argv: list[str], crash_at: str | None) -> tuple[int, int, dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    if crash_at:
        env["CUADERNO_CRASH_AT"] = crash_at
    proc = subprocess.run([sys.executable, WORKLOAD, *argv], env=env, capture_output=True, text=True, timeout=60)
    lines = proc.stdout.strip().splitlines()
    pid = int(lines[0].split("=")[1]) if lines and lines[0].startswith("pid=") else -1
    result: dict[str, Any] = {}
    if proc.returncode == 0:
        result = json.loads(lines[-1])
    elif proc.returncode != -9:
        raise AssertionError(f"child failed (rc={proc.returncode}) for {case}:\n{proc.stdout}\n{proc.stderr}")
    return proc.returncode, pid, result


def _stored_events(url: str, run_id: str) -> list[Any]:
    """A run's events in a journal named by URL (PostgreSQL), read through the protocol: ``load``
    checks the hash chain; a journal or run the crash left uncreated has none."""
    from cuaderno.errors import RunNotFound

    try:
        store = open_journal(url, create=False, readonly=True)
    except JournalError as exc:
        if "not a cuaderno journal" in str(exc):
            return []
        raise
    with closing(store):
        try:
            return store.load(run_id)
        except RunNotFound:
            return []


def _journal_rows(db: Path | str, run_id: str) -> list[tuple[str, str, str]]:
    if isinstance(db, str):
        return [(e.step_id, e.phase, e.row_hash) for e in _stored_events(db, run_id)]
    if not db.exists():
        return []
    con = sqlite3.connect(db)
    try:
        has = con.execute("SELECT 1 FROM sqlite_master WHERE name='cuaderno_events'").fetchone()
        if not has:
            return []
        rows = con.execute("SELECT step_id, phase, row_hash FROM cuaderno_events WHERE run_id=? ORDER BY seq",
                           (run_id,)).fetchall()
    finally:
        con.close()
    return [(r[0], r[1], r[2]) for r in rows]


def _journaled_keys(db: Path | str, run_id: str) -> set[str]:
    if isinstance(db, str):
        return {e.payload["key"] for e in _stored_events(db, run_id) if e.kind == "model" and e.phase == "result"}
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT codec, payload FROM cuaderno_events WHERE run_id=? AND kind='model' "
                           "AND phase='result'", (run_id,)).fetchall()
    finally:
        con.close()
    return {stored_payload(*r)["key"] for r in rows}


def _integrity(db: Path | str) -> str:
    if isinstance(db, str):
        try:
            with closing(open_journal(db, create=False, readonly=True)) as store:
                for cp in store.list_runs(limit=1_000_000):
                    store.load(cp.run_id)  # every run's chain and head
        except JournalError as exc:
            return str(exc)
        return "ok"
    con = sqlite3.connect(db)
    try:
        return str(con.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        con.close()


def run_case(case: Case, work: Path, ledgers: dict[str, Any], journal: str | None = None) -> Outcome:
    """Kill, recover (approving when asked), then check every invariant. ``journal``: the journal's
    URL when it is not the SQLite file in ``work`` (a PostgreSQL schema of the case's own)."""
    work.mkdir(parents=True, exist_ok=True)
    db: Path | str = journal or work / "runs.db"
    ledger = ledgers.get({"tool_dedup": "dedup", "approval": "dedup", "tool_lookup": "nodedup",
                          "tool_nodedup": "nodedup"}.get(case.kind, ""), None)
    url = ledger.url if ledger is not None else None
    rc, _, result = _child(case, work, url, case.crash_at, journal=journal)
    out = Outcome(case=case, crashed=rc == -9)
    before = _journal_rows(db, case.run_id)
    passes = _recover(case, work, url, db, result, out)
    after = _journal_rows(db, case.run_id)
    if after[: len(before)] != before:  # I5: the journal only grows
        out.violations.append("I5: the journal after recovery does not extend the journal before it")
    if (check := _integrity(db)) != "ok":  # I7
        out.violations.append(f"I7: integrity_check: {check}")
    if ledger is not None:
        _check_effects(case, ledger.db_path, out)
    elif out.status != "completed":
        out.violations.append(f"run ended {out.status}")
    notes = [r for r in read_records(work / "tool.jsonl") if r.get("run") == case.run_id]
    out.tool_calls = len(notes)
    if case.kind in ("model", "model_dedup", "tool_idem") and len(notes) > case.turns + 1:
        out.violations.append(f"idempotent tool ran {len(notes)} times for {case.turns} calls")
    _check_billing(case, work, passes, out)
    if case.kind == "approval" and out.approvals_written > case.turns:
        out.violations.append("an approval was asked for twice")
    if out.status not in ("completed", "needs_human"):
        out.violations.append(f"did not finish after {out.passes} recoveries: {out.status}")
    return out


def _recover(case: Case, work: Path, url: str | None, db: Path | str, result: dict[str, Any],
             out: Outcome) -> list[tuple[int, set[str]]]:
    """Resume until the run ends, approving pending steps like a person would. Returns each
    recovery process's pid with the model calls whose response was journaled before it started
    (what it must not be billed for)."""
    passes: list[tuple[int, set[str]]] = []
    for attempt in range(8):
        if result.get("status") in ("completed", "needs_human"):
            break
        if result.get("status") == "suspended":
            with closing(open_journal(db if isinstance(db, str) else journal_url(db))) as store:
                for step_id in list((store.checkpoint(case.run_id) or _never()).pending):
                    approve(store, case.run_id, step_id, approver="crash-test")
                    out.approvals_written += 1
        crash_at = None
        if case.second and attempt == 0:
            prefix = PREFIX[case.kind] if case.second.startswith("K") else "recovery"
            crash_at = f"{prefix}.{case.second}:1"
        journaled = _journaled_keys(db, case.run_id) if _journal_rows(db, case.run_id) else set()
        rc, pid, result = _child(case, work, url, crash_at, journal=db if isinstance(db, str) else None)
        passes.append((pid, journaled))
        out.second_crashed = out.second_crashed or (crash_at is not None and rc == -9)
        out.passes += 1
    out.status = str(result.get("status"))
    out.evidence = result.get("evidence")
    return passes


def _check_effects(case: Case, ledger_db: Path, out: Outcome) -> None:
    """I1 and I3, from the ledger's own receipts."""
    receipts = read_receipts(ledger_db, business_id=case.run_id)
    out.ledger_receipts = len(receipts)
    per_key = Counter(r["key"] for r in receipts)
    out.ledger_keys = len(per_key)
    if any(n > 1 for n in per_key.values()):
        out.violations.append(f"I1: an effect was applied twice: {dict(per_key)}")
    if out.status == "completed" and len(per_key) != case.turns:
        out.violations.append(f"completed with {len(per_key)} effects for {case.turns} intents")
    if out.status == "needs_human":
        if case.kind != "tool_nodedup":
            out.violations.append("I3: uncertain although the service deduplicates or offers a lookup")
        if not (out.evidence and out.evidence.get("effect_key")):
            out.violations.append("I3: uncertain without evidence")


def _check_billing(case: Case, work: Path, passes: list[tuple[int, set[str]]], out: Outcome) -> None:
    """I2 and I4, from the provider's billing log: no recovery process is billed for a call whose
    response was journaled before it started (checked per process, so a call journaled by the
    first recovery and billed again by the second counts too)."""
    billing = read_records(work / "billing.jsonl")
    out.billed = Counter(r["key"] for r in billing)
    journaled_before = dict(passes)
    out.rebilled_journaled = sum(1 for r in billing if r["key"] in journaled_before.get(r["pid"], set()))
    out.rebilled_unjournaled = sum(n - 1 for n in out.billed.values() if n > 1)
    if out.rebilled_journaled:
        out.violations.append(f"I2: {out.rebilled_journaled} model calls with a journaled response were billed again")
    if case.kind == "model_dedup" and out.rebilled_unjournaled:
        out.violations.append("I4: a deduplicating provider billed a key twice")


def _never() -> Any:
    raise AssertionError("the run vanished")


def summarize(outcomes: list[Outcome]) -> str:
    crashes = sum(o.crashed for o in outcomes) + sum(o.second_crashed for o in outcomes)
    dup = sum(1 for o in outcomes if any("I1" in v for v in o.violations))
    uncertain = [o for o in outcomes if o.status == "needs_human"]
    at = Counter(o.case.point for o in uncertain)
    rebilled = sum(o.rebilled_unjournaled for o in outcomes)
    return (f"{len(outcomes)} cases, {crashes} SIGKILLs: {dup} duplicated effects, "
            f"{sum(o.rebilled_journaled for o in outcomes)} re-billed journaled calls, "
            f"{rebilled} re-billed unjournaled (in-flight) calls, {len(uncertain)} uncertain "
            f"(at {dict(sorted(at.items()))}, kinds {sorted({o.case.kind for o in uncertain})}), "
            f"{sum(1 for o in outcomes if o.violations)} cases with violations")


if __name__ == "__main__":  # replay one case from its seed
    import argparse
    import tempfile

    from cuaderno.testing.ledger import LedgerProcess

    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", required=True)
    ap.add_argument("--point", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--second", default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, LedgerProcess(Path(d) / "dedup.db", mode="dedup") as ld, \
            LedgerProcess(Path(d) / "nodedup.db", mode="nodedup") as ln:
        o = run_case(case_for(a.kind, a.point, a.seed, a.second), Path(d) / "w", {"dedup": ld, "nodedup": ln})
        print(o)


def run_cancel_case(kind: str, point: str, work: Path, ledgers: dict[str, Any]) -> dict[str, Any]:
    """R16: another connection commits a cancellation at the named point; check what followed."""
    work.mkdir(parents=True, exist_ok=True)
    case = Case(kind=kind, point=point, seed=0, turns=2, hit=1, tag="cancel-")
    db = work / "runs.db"
    ledger = ledgers.get({"tool_dedup": "dedup", "approval": "dedup", "tool_lookup": "nodedup",
                          "tool_nodedup": "nodedup"}.get(kind, ""), None)
    rc, _, result = _child(case, work, ledger.url if ledger else None, None, cancel_at=f"{PREFIX[kind]}.{point}")
    assert rc == 0, f"child died: {case}"
    violations: list[str] = []
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT seq, step_id, phase, kind, payload FROM cuaderno_events WHERE run_id=? ORDER BY seq",
                           (case.run_id,)).fetchall()
    finally:
        con.close()
    cancel_seq = next((r[0] for r in rows if r[1] == "cancel"), None)
    with closing(open_journal(journal_url(db))) as store:
        status = (store.checkpoint(case.run_id) or _never()).status  # the cancellation may land after the child's view
    if cancel_seq is None:
        if status not in ("completed", "suspended"):
            violations.append(f"no cancellation recorded and the run ended {status}")
        return {"case": case, "status": status, "cancelled": False, "violations": violations, "sent_after": 0}
    intents_after = [r for r in rows if r[0] > cancel_seq and r[2].startswith("intent")]
    if intents_after:
        violations.append(f"steps admitted after the cancellation: {[(r[1], r[2]) for r in intents_after]}")
    model_intents_before = sum(1 for r in rows if r[0] < cancel_seq and r[3] == "model" and r[2].startswith("intent"))
    billed = len(read_records(work / "billing.jsonl"))
    sent_after = max(0, billed - model_intents_before)
    if sent_after:
        violations.append(f"{sent_after} model calls billed beyond the intents committed before the cancellation")
    tool_intents = {r[1] for r in rows if r[3] == "tool" and r[2] == "intent" and r[0] < cancel_seq}
    tool_results = {r[1] for r in rows if r[3] == "tool" and r[2] == "result"}
    if ledger is not None:
        receipts = read_receipts(ledger.db_path, business_id=case.run_id)
        if len(receipts) > len(tool_intents):
            violations.append("an effect was applied after the cancellation committed")
    record = result.get("record") or {}
    unsettled = tool_intents - tool_results - {u["step_id"] for u in record.get("uncertain", [])}
    if status == "cancelled" and unsettled:
        violations.append(f"in-flight effects neither journaled nor uncertain: {sorted(unsettled)}")
    if status not in ("cancelled", "completed"):
        violations.append(f"run ended {status}")
    with closing(open_journal(journal_url(db))) as store:
        from cuaderno import cancel

        before = len(store.load(case.run_id))
        if status == "cancelled":
            again = cancel(store, case.run_id, "again")
            if again.status != "cancelled" or len(store.load(case.run_id)) != before:
                violations.append("cancel is not idempotent")
    return {"case": case, "status": status, "cancelled": True, "violations": violations, "sent_after": sent_after}
