"""R1 (SQLite half) and R3: SIGKILL at every named point of every step kind, then recover.

Default: every kind x K0-K8 with seed 0 (the PR tier), plus double faults on three kinds.
``CUADERNO_SOAK=1`` runs 20 seeds per case (the seed picks the program and which occurrence of
the point dies); ``CUADERNO_SOAK_SEEDS=N`` sets another count. Each failure names its seed and a
command that replays it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _report import record
from _sweep import KINDS_ALL, POINTS, Outcome, case_for, run_cancel_case, run_case

from cuaderno.testing.ledger import LedgerProcess

SEEDS = range(int(os.environ.get("CUADERNO_SOAK_SEEDS", "20")) if os.environ.get("CUADERNO_SOAK") else 1)


def report(test: str, o: Outcome) -> None:
    record({"test": test, "kind": o.case.kind, "point": o.case.point, "status": o.status,
            "kills": int(o.crashed) + int(o.second_crashed), "not_reached": int(not o.crashed),
            "duplicated": int(any("I1" in v for v in o.violations)), "rebilled_journaled": o.rebilled_journaled,
            "rebilled_in_flight": o.rebilled_unjournaled, "violations": len(o.violations)})


@pytest.fixture(scope="module")
def ledgers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("ledgers")
    with LedgerProcess(d / "dedup.db", mode="dedup") as dedup, LedgerProcess(d / "nodedup.db", mode="nodedup") as nd:
        yield {"dedup": dedup, "nodedup": nd}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("kind", KINDS_ALL)
def test_kill_at_every_point(kind: str, point: str, seed: int, ledgers: dict[str, Any], tmp_path: Path) -> None:
    case = case_for(kind, point, seed)
    outcome = run_case(case, tmp_path, ledgers)
    report("R1 kill at every point (SQLite)", outcome)
    assert not outcome.violations, f"{outcome.violations}\nreplay: {case.replay_command()}"
    # A point a kind's path never passes is known and pinned: a point that silently stops being
    # passed (moved, removed) fails here instead of passing as "not reached". (A later hit may
    # legitimately never come: an approval or a final answer stops its process.)
    if case.hit == 1:
        assert outcome.crashed == ((kind, point) not in NOT_ON_THE_PATH), (kind, point, outcome.crashed)
    if kind == "tool_nodedup" and outcome.status == "needs_human":
        # At most one receipt per intent (I1 checks per key); the uncertain one may or may not exist.
        assert outcome.ledger_receipts <= case.turns
    if kind != "tool_nodedup":
        assert outcome.status == "completed", f"replay: {case.replay_command()}"


NOT_ON_THE_PATH = {(k, p) for k in ("approval", "final") for p in ("K2", "K3", "K4", "K5", "K6")} | {
    ("tool_idem", "K3"), ("tool_idem", "K4")}
"""Points a kind never passes: an approval and a final answer send nothing (K2-K6 belong to a
send); the idempotent note tool talks to no service (K3/K4 are the ledger client's)."""


DOUBLE = [(k, p, s) for k in ("model", "tool_lookup", "tool_dedup") for p in ("K2", "K4", "K5")
          for s in ("R0", "R1", "R2", "R3", p)]


@pytest.mark.parametrize(("kind", "point", "second"), DOUBLE)
def test_double_fault_during_recovery(kind: str, point: str, second: str, ledgers: dict[str, Any],
                                      tmp_path: Path) -> None:
    case = case_for(kind, point, 0, second)
    outcome = run_case(case, tmp_path, ledgers)
    report("R3 double fault during recovery (SQLite)", outcome)
    assert outcome.crashed
    assert not outcome.violations, f"{outcome.violations}\nreplay: {case.replay_command()}"
    assert outcome.status == "completed"




@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("kind", ("model", "tool_dedup", "tool_nodedup", "approval", "final"))
def test_cancel_at_every_point(kind: str, point: str, ledgers: dict[str, Any], tmp_path: Path) -> None:
    """R16: a cancellation committed at K0-K8 admits no new step; in-flight effects end journaled
    or uncertain; cancelling again changes nothing."""
    out = run_cancel_case(kind, point, tmp_path, ledgers)
    record({"test": "R16 cancel at every point (SQLite)", "kind": kind, "point": point, "status": out["status"],
            "kills": 0, "not_reached": int(not out["cancelled"]), "duplicated": 0, "rebilled_journaled": 0,
            "rebilled_in_flight": out["sent_after"], "violations": len(out["violations"])})
    assert not out["violations"], out
