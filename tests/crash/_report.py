"""Where the crash tests leave their figures for the end-of-run summary (tests/conftest.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

REPORT = Path(os.environ.get("CUADERNO_REPORT_DIR", Path(__file__).resolve().parents[2] / ".pytest_cache")) / \
    "cuaderno-crash-report.jsonl"


def record(figures: dict[str, Any]) -> None:
    """Append one case's figures (safe from several xdist workers: one short line per write)."""
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    with REPORT.open("a") as f:
        f.write(json.dumps(figures) + "\n")
