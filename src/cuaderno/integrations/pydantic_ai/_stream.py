"""``DurableAgent.run_stream`` and ``DurableAgent.iter``: Pydantic AI's streaming shapes, durable.

Both hand the caller the framework's own object (a ``StreamedRunResult``, an ``AgentRun``) from
an agent run that carries the per-run capability, so every model request goes through the
model-call protocol and every tool call through the effect protocol exactly as under
:meth:`DurableAgent.run`: a journaled step is replayed without a request, a step in flight at a
crash is sent again with its key (counted, ``possibly_billed_twice``), a tool's effect runs at most
once or the run stops ``needs_human``. A streamed model step is read whole and journaled before the
caller sees its first chunk (what is shown was paid for and is on disk); the caller then streams it
from memory.

The run's end is journaled when the caller has read it whole: for ``run_stream`` when the stream is
complete (``stream_output``/``stream_text``/``get_output`` ran to the end) as the context exits;
for ``iter`` when the graph reached its ``End`` (``agent_run.result`` is set). A caller that leaves
earlier (or is killed) leaves the run open: the next call of the same run id (``run``,
``run_stream`` or ``iter``) replays what was journaled and goes on. What the caller does with the
nodes of ``iter`` must be deterministic: a resumed run checks each request against the journal
(:class:`~cuaderno.errors.ReplayDivergence`).

An ended run: ``run_stream`` gives a ``StreamedRunResult`` holding the journaled output and
conversation (nothing is sent, nothing runs); ``iter`` cannot rebuild the framework's graph run
from a journal and raises :class:`~cuaderno.errors.RunClosed` (``run`` or ``run_stream`` answer an
ended run). A stream that ends in approvals (``DeferredToolRequests``) journals each request, bound
to its arguments' fingerprint, as ``run`` does; once decided, the run goes on with ``run`` (one
framework stream cannot hold the agent run the decisions start).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cuaderno.durable.opening import Opened
from cuaderno.errors import BudgetExceeded, RunCancelled, RunClosed, UncertainEffect
from cuaderno.integrations._budget import ended_fields
from cuaderno.integrations._compensate import close_cancelled
from cuaderno.integrations.pydantic_ai._toolset import ToolBug

__all__ = ["cancelled_closes", "ended_on_failure", "iter_refused"]


@contextmanager
def cancelled_closes(opened: Opened) -> Iterator[None]:
    """Around driving a held run: a cancellation asked while nobody held it, or one the journal
    met at a step's intent, closes the run with its record (what happened, what is uncertain, what
    cleanup is scheduled) and raises :class:`~cuaderno.errors.RunCancelled`."""
    if opened.checkpoint.cancel_requested is not None:
        close_cancelled(opened)  # asked while nobody held it: closed now, nothing more runs
    try:
        yield
    except RunCancelled:
        close_cancelled(opened)  # the cancellation committed while the run ran


@contextmanager
def ended_on_failure(opened: Opened) -> Iterator[None]:
    """Around one agent run of the framework: the failures that end the run are journaled as
    cuaderno's runner journals them, so every later call answers them from the journal."""
    try:
        try:
            yield
        except BaseExceptionGroup as group:  # tools run concurrently: surface the one that says why
            raise _first(group) from group
    except BudgetExceeded as exc:
        opened.fail("budget", **ended_fields(exc))
        raise
    except ToolBug as bug:
        # A bug is not retried and not guessed around: the run ends failed, with the step that raised.
        opened.fail(str(bug), step=bug.step_id, tool=bug.tool)
        raise bug.cause from bug


def iter_refused(run_id: str, status: str) -> RunClosed:
    """What ``iter`` raises for an ended run: the framework's ``AgentRun`` is a live graph run and
    cannot be rebuilt from a journal, so nothing is handed out; the note says what answers instead."""
    exc = RunClosed(run_id, status)
    exc.add_note("DurableAgent.iter drives a live agent run; an ended run is answered from its journal by "
                 "DurableAgent.run or DurableAgent.run_stream (nothing is sent)")
    return exc


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    for exc in group.exceptions:
        found = _first(exc) if isinstance(exc, BaseExceptionGroup) else exc
        if isinstance(found, (UncertainEffect, ToolBug, BudgetExceeded, RunCancelled)):
            return found
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first
