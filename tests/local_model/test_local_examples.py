"""The local-model examples run as a person runs them, and pass their own checks.

``durable_local.py`` kills a real run on a real local model, resumes it twice, and exits 1 when
any count it checks (client-side and server-side HTTP logs, tool receipts, the checkpoint) is off.
It starts its own llama.cpp server, so it needs what the ``llama_server`` fixture needs: the test
skips without it, except under ``CI=true`` where it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuaderno.testing.llama_server import local_model_available

pytestmark = pytest.mark.local_model

ROOT = Path(__file__).resolve().parents[2]


def test_the_durable_local_example_passes_its_own_checks() -> None:
    missing = local_model_available()
    if missing is not None:
        if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
            pytest.fail(f"the local example cannot run under CI=true: {missing}", pytrace=False)
        pytest.skip(missing)
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "local" / "durable_local.py")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "killed" in done.stdout.lower() or "SIGKILL" in done.stdout
