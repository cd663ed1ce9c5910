"""Issue 35, part 4: a 50 MB tool result does not take a worker's memory past a stated bound, on
record or on resume (both backends).

A real run in a child process records the result (offloaded) and is SIGKILLed at ``tool.K7``,
right after the commit that holds it; another child resumes the run to its end. Each child's
peak RSS is the kernel's (``os.wait4``), compared with a floor child that imports the same and
builds the same 50 MB string. The bound, stated in docs/guide/retention-and-backups.md ("Large
payloads"): record <= floor + 3 x payload + 32 MB, resume <= floor + 4 x payload + 32 MB
(measured: SQLite +2.5 x / +3.5 x, PostgreSQL +2.8 x / +3.8 x). The same bound holds with
encryption at rest on (``CUADERNO_KEY`` set: the blob is the run's, each chunk sealed; measured
in the figures this test prints). A bound on memory, which is deterministic enough under load,
not a timing."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SIZE = 50_000_000
MB = 1_000_000
RECORD_K, RESUME_K, SLACK = 3, 4, 32 * MB


def _child(mode: str, url: str, crash: str | None = None, key: str | None = None) -> tuple[int, int, str]:
    """The child's peak RSS in bytes, its wait status and its output (``key``: the journal's
    master key, for a journal encrypted at rest)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    for name in ("CUADERNO_CRASH_AT", "CUADERNO_KEY", "CUADERNO_KEY_FILE", "CUADERNO_OLD_KEYS"):
        env.pop(name, None)
    if key is not None:
        env["CUADERNO_KEY"] = key
    if crash is not None:
        env["CUADERNO_CRASH_AT"] = crash
    proc = subprocess.Popen([sys.executable, str(HERE / "_offload_mem_child.py"), mode, url, str(SIZE)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    out = proc.stdout.read().decode()  # read to its end first: a full pipe would block the child
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = -1  # reaped here: Popen must not wait for it again
    return usage.ru_maxrss * 1024, status, out  # ru_maxrss is in KiB on Linux


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_a_50_mb_tool_result_stays_within_the_bound_on_record_and_on_resume(journal_url: str, encrypted: bool) -> None:
    from cuaderno.journal.keys import StaticKeys, master_key

    master = master_key(os.urandom(32)) if encrypted else None
    key = None if master is None else base64.b64encode(master.secret).decode()
    floor, status, out = _child("floor", journal_url, key=key)
    assert status == 0 and f"FLOOR {SIZE}" in out, out
    record, status, out = _child("record", journal_url, crash="tool.K7:1", key=key)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9, (status, out[-2000:])  # killed at the point
    assert out.count("TOOL CALLED") == 1
    resume, status, out = _child("resume", journal_url, key=key)
    assert status == 0 and "STATUS completed" in out, out[-2000:]
    assert "TOOL CALLED" not in out  # the result came from the journal, the tool never ran again
    figures = (f"{'encrypted' if encrypted else 'plain'}: floor {floor / MB:.1f} MB, record {record / MB:.1f} MB (+{(record - floor) / SIZE:.2f} x), "
               f"resume {resume / MB:.1f} MB (+{(resume - floor) / SIZE:.2f} x) for a {SIZE / MB:.0f} MB result")
    print(figures)
    assert record <= floor + RECORD_K * SIZE + SLACK, figures
    assert resume <= floor + RESUME_K * SIZE + SLACK, figures
    from cuaderno import open_journal

    store = open_journal(journal_url, keys=None if master is None else StaticKeys(master))
    try:  # the result is offloaded, once
        from cuaderno.journal import offloaded_payloads

        assert [(o.step_id, o.phase) for o in offloaded_payloads(store, "mem-1")] == [("t0000.tool00", "result")]
    finally:
        store.close()
