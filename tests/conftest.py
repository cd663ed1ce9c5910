"""Root test configuration: the end-of-run summary of the crash tests' figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "crash"))

from _report import REPORT


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # the controller (or a run without xdist)
        REPORT.parent.mkdir(parents=True, exist_ok=True)
        REPORT.unlink(missing_ok=True)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not REPORT.exists():
        return
    rows = [json.loads(line) for line in REPORT.read_text().splitlines() if line.strip()]
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["test"], []).append(r)
    terminalreporter.section("cuaderno crash figures")
    for test, rs in sorted(by.items()):
        uncertain = [r for r in rs if r["status"] == "needs_human"]
        terminalreporter.write_line(
            f"{test}: {len(rs)} cases, {sum(r['kills'] for r in rs)} SIGKILLs, "
            f"{sum(r['duplicated'] for r in rs)} duplicated effects, "
            f"{sum(r['rebilled_journaled'] for r in rs)} re-billed journaled calls, "
            f"{sum(r['rebilled_in_flight'] for r in rs)} re-billed in-flight calls, "
            f"{len(uncertain)} uncertain (points {sorted({r['point'] for r in uncertain})}, "
            f"kinds {sorted({r['kind'] for r in uncertain})}), "
            f"{sum(r['not_reached'] for r in rs)} points not on this kind's path, "
            f"{sum(r['violations'] for r in rs)} violations")
