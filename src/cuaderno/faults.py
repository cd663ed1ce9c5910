"""Named fault points: make the process SIGKILL itself at a named point.

The bottom floor of the package: it imports nothing of cuaderno, so every layer may name its
points here (tests reach it as :mod:`cuaderno.testing.crash`, the same module).

``CUADERNO_CRASH_AT=<point>:<hit>`` (``hit`` defaults to 1) arms one point: the ``hit``-th time
the runtime passes it, the process sends itself ``SIGKILL``. That is a real process death, not
an exception: no ``finally`` runs, no buffer is flushed, the journal is left exactly as the disk
has it. A supervisor (a test, the examples) then starts another process that resumes the run.

Points are named ``<step kind>.<K>`` after RELIABILITY.md H1, for example ``tool.K2``:

- K0 before the intent transaction        - K5 response read, before the result transaction
- K1 inside the intent transaction         - K6 inside the result transaction
- K2 after the intent commit, before send  - K7 after the result commit
- K3 request written, not yet accepted     - K8 inside a checkpoint write (event in, projection not)
- K4 accepted and applied, reply unread

Step kinds: ``model``, ``tool``, ``approval``, ``final``. Points inside a transaction are named by
the loop (it knows what the transaction holds) and fired by the journal backend.

Every append to the SQLite journal, whoever makes it (the loop, ``approve``, ``resolve``,
``cancel``, ``compensate``), also passes three points named by position rather than by step:
``append.W0`` before its transaction, ``append.W1`` inside it (everything written, before
COMMIT) and ``append.W2`` after the commit. ``append.W1:7`` kills inside the seventh append of
the process: a sweep over ``n`` kills around every journal write a story makes.

Opening a SQLite journal for writing passes ``open.M1`` inside the transaction that creates or
migrates its tables and records its compression setting (before COMMIT) and ``open.M2`` after it.
Rebuilding a run's summary (``rebuild_checkpoint``) passes ``rebuild.B1`` inside its transaction,
the summary rewritten, and ``rebuild.B2`` after the commit.

When the variable is unset every call is one global read and a branch, so the points stay in
production code at no measurable cost.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

__all__ = ["ENV_VAR", "arm", "armed", "in_txn", "on", "point", "set_txn_points"]

ENV_VAR = "CUADERNO_CRASH_AT"


def _parse(spec: str | None) -> tuple[str, int] | None:
    if not spec:
        return None
    name, _, hit = spec.partition(":")
    return name.strip(), int(hit) if hit else 1


_TARGET = _parse(os.environ.get(ENV_VAR))
_hits: dict[str, int] = {}
_txn_points: tuple[str, ...] = ()
_hooks: dict[str, Callable[[], None]] = {}
_ACTIVE = _TARGET is not None


def on(name: str, hook: Callable[[], None] | None) -> None:
    """Run ``hook`` (instead of a kill) the first time the named point is passed; ``None`` removes it.

    For fault injection other than death, e.g. a cancellation committed by "another process" at
    exactly that point.
    """
    global _ACTIVE
    if hook is None:
        _hooks.pop(name, None)
    else:
        _hooks[name] = hook
    _ACTIVE = _TARGET is not None or bool(_hooks)


def arm(spec: str | None) -> None:
    """Arm a point (``"tool.K4:1"``) or disarm (``None``) at run time, e.g. in a forked child."""
    global _TARGET, _ACTIVE
    _TARGET = _parse(spec)
    _hits.clear()
    _ACTIVE = _TARGET is not None or bool(_hooks)


def armed() -> bool:
    """Whether a crash point (or a hook) is armed in this process."""
    return _ACTIVE


def point(name: str) -> None:
    """Pass the named point; SIGKILL this process if it is the armed one at the armed hit."""
    if not _ACTIVE:
        return
    hook = _hooks.pop(name, None)
    if hook is not None:
        hook()
    if _TARGET is None or _TARGET[0] != name:
        return
    count = _hits.get(name, 0) + 1
    _hits[name] = count
    if count == _TARGET[1]:
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def set_txn_points(*names: str) -> None:
    """Name the points that the next journal transaction passes (called by the loop)."""
    global _txn_points
    if _ACTIVE:
        _txn_points = names


def in_txn(stage: str = "") -> None:
    """Called by a journal backend inside its transaction, before COMMIT.

    ``stage`` is ``""`` after the events are written and ``"checkpoint"`` between the events and
    the checkpoint projection (the K8 point).
    """
    if not _ACTIVE:
        return
    for name in _txn_points:
        kind, _, k = name.partition(".")
        if stage == "checkpoint":
            point(f"{kind}.K8")
        else:
            point(name)
