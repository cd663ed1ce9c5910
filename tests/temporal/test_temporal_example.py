"""The worked example runs against the dev server and proves what it prints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from temporal_app import temporal_cli

ROOT = Path(__file__).resolve().parents[2]


def test_the_worked_example_runs() -> None:
    assert temporal_cli() is not None or os.environ.get("CI") != "true", "the temporal CLI must exist under CI"
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "temporal" / "run_on_temporal.py")],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "activities: cuaderno.model_turn, cuaderno.tool_call, cuaderno.model_turn, cuaderno.tool_call, " \
           "cuaderno.model_turn, cuaderno.record" in proc.stdout
    assert "journal: 3 model calls, 2 tool calls" in proc.stdout
