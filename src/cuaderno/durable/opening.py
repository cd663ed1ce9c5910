"""What every loop checks before it goes on with a run it finds journaled, before it writes
anything: the same for the runner and the episode parent (each adds its own checks after)."""

from __future__ import annotations

from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import ReplayDivergence, SchemaTooNew
from cuaderno.journal.base import EVENT_SCHEMA_VERSION

__all__ = ["check_reopened"]


def check_reopened(cp: Checkpoint, run_id: str, *, task_fingerprint: str, tenant: str) -> None:
    """Refuse to go on with a run journaled under a newer event schema (its events may not mean
    what this code reads in them: no version choice may replay them), for another task, or under
    another tenant (every effect key holds the tenant: resumed under another, the run's effects
    would carry two identities; runs journaled before the tenant was recorded are not checked)."""
    recorded = cp.versions.get("schema")
    if type(recorded) is int and recorded > EVENT_SCHEMA_VERSION:
        raise SchemaTooNew(recorded, EVENT_SCHEMA_VERSION, what=f"run {run_id!r}: event schema")
    if cp.task_fingerprint != task_fingerprint:
        raise ReplayDivergence(run_id, "run", f"task {cp.task_fingerprint}", f"task {task_fingerprint}")
    if cp.tenant is not None and cp.tenant != tenant:
        raise ReplayDivergence(run_id, "run", f"tenant {cp.tenant!r}", f"tenant {tenant!r}")
