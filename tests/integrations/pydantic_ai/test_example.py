"""The example runs, is killed mid-payment, resumes, and proves its outcome from the services' logs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "pydantic_ai_transfer.py"


def test_the_example_pays_each_transfer_once_across_a_kill() -> None:
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    proc = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "killed at tool.K4:2: exit -9" in proc.stdout
    assert "[payments] 2 transfers: [('ana', 10), ('bob', 20)]" in proc.stdout
    assert "OK: each transfer made once, each request billed once" in proc.stdout
