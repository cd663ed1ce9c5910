"""The developer agent under Temporal (``examples/episodes/developer_temporal.py``) runs against
its own dev server, a worker SIGKILLed inside pass 2, and prints the counts it checked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from temporal_app import temporal_cli

ROOT = Path(__file__).resolve().parents[2]


def test_the_developer_agent_under_temporal_prints_its_counts() -> None:
    assert temporal_cli() is not None or os.environ.get("CI") != "true", "the temporal CLI must exist under CI"
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "episodes" / "developer_temporal.py")],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "worker 1: model ×5 · apply ×0" in out and "[killed (SIGKILL)]" in out
    assert "worker 2: model ×3 · apply ×1" in out
    assert ("fix: applied (test_calc.py passes on a copy) · passes 3 · turns 8 · rejected responses 1 · "
            "cost $0.0080") in out
    assert "pass 2: proposal turns 3 (1 read refused) rejected 0 -> another_pass" in out
    assert "child workflows: dev-fix/fix.pass01, dev-fix/fix.pass02, dev-fix/fix.pass03" in out
    assert "billing log: 8 generations billed, 0 billed twice; apply receipts: 1" in out
