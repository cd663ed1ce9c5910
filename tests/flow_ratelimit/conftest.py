"""The rate-limit tests: PostgreSQL schemas from the crash tests' helper (``_pg``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "crash"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _pg import pg_schemas  # noqa: F401  (a fixture)
