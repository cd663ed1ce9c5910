"""Issue 23 (5): the developer agent runs with the scripted model and prints what it counted.

The example itself exits 1 when a count is off (its ``check`` calls); this test also reads the
printed figures, so the output a person sees is the one that was checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("crash")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "episodes" / "developer_agent.py"


def test_the_scripted_developer_agent_prints_its_counts() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("CUADERNO_CRASH_AT", "CUADERNO_KEEP")}
    proc = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    # Killed in pass 2 after 5 generations; the resume pays only the 3 it had not; closed: 0.
    assert "fix, process 1: model ×5 · apply ×0" in out and "[killed (SIGKILL)]" in out
    assert "fix, process 2: model ×3 · apply ×1" in out
    assert "fix, process 3: model ×0 · apply ×0" in out
    assert ("fix: applied (test_calc.py passes on a copy) · passes 3 · turns 8 · rejected responses 1 · "
            "cost $0.0080") in out
    assert "pass 1: rejected turns 3 rejected 1 -> another_pass" in out
    assert "pass 2: proposal turns 3 (1 read refused) rejected 0 -> another_pass: test_calc.py fails" in out
    assert "AssertionError: add(2, 3) == 6, expected 5" in out
    assert "loop: exhausted (turns_per_pass) · passes 1 · turns 4 · rejected responses 0" in out
    assert "billing log: 12 generations billed, 0 billed twice; apply receipts: 1" in out
    assert "calc.py now returns 'return a + b'" in out
