"""The commands that read runs: ``list``, ``show``, ``status`` and ``rebuild-summary`` (which
rewrites only a summary, from the journal itself).

::

    cuaderno [--db runs.db] list [--status S] [--limit N] [--json]
    cuaderno [--db runs.db] show RUN [--json] [--no-timeline]
    cuaderno [--db URL] status RUN [--json]
    cuaderno [--db runs.db] rebuild-summary RUN [--trust-journal]
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from cuaderno import operations, render
from cuaderno.cli._common import USAGE_EXIT, NotFound, RunArg, fail, opened, print_json, refusals, stdout
from cuaderno.errors import quoted
from cuaderno.flow import queued_state
from cuaderno.journal import offloaded_payloads
from cuaderno.operations import STATUSES, run_state

__all__ = ["list_runs", "rebuild_summary", "show", "status_command"]


def list_runs(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option("--status", metavar="STATUS",
                                               help=f"Only runs in this status ({', '.join(STATUSES)}).")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many runs.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List runs, most recently updated first: status, model and tool calls, cost, pending approvals,
    uncertain effects."""
    if status is not None and status not in STATUSES:
        fail(f"--status {quoted(status)} is not a run status; use one of: {', '.join(STATUSES)}", USAGE_EXIT)
    with refusals(), opened(ctx, readonly=True) as store:
        rows = operations.list_runs(store, status=status, limit=limit)
    if as_json:
        print_json([render.run_summary(cp, state) for cp, state in rows])
        return
    console = stdout()
    if not rows:
        console.print("no runs" + (f" with status {render.clean(status)!r}" if status else ""), soft_wrap=True)
        return
    render.render_runs(console, [cp for cp, _ in rows], {cp.run_id: state for cp, state in rows})


def show(
    ctx: typer.Context,
    run: RunArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
    timeline: Annotated[bool, typer.Option("--timeline/--no-timeline",
                                           help="Show the journal's events in order, checked against the "
                                                "summary (--no-timeline: the stored summary as it is).")] = True,
) -> None:
    """Show one run: status, versions, counters, cost, pending approvals, uncertain effects, outcome, timeline."""
    with refusals(), opened(ctx, readonly=True) as store:
        cp = store.checkpoint(run)
        if cp is None:
            raise NotFound(f"no run {quoted(run)} in {quoted(str(ctx.obj.db))}")
        events = None
        if timeline:
            # Read (and hash-check) the whole journal before printing anything, and the summary
            # against it: no half output, and no pending arguments other than the journal's.
            # --no-timeline prints the stored summary as it is (for a journal that no longer
            # checks out); approve and deny check it again before anything is written.
            cp, events = operations.shown(store, run)  # verified, or an erased run's structure
        state = queued_state(store, run_state(store, cp, events), cp.run_id)
        offloaded = offloaded_payloads(store, run)  # their references: no blob is read again
    if as_json:
        print_json(render.run_detail(cp, events, state, offloaded=offloaded))
    else:
        render.render_show(stdout(), cp, events, db=ctx.obj.db, state=state, offloaded=offloaded)


def rebuild_summary(
    ctx: typer.Context,
    run: RunArg,
    trust_journal: Annotated[bool, typer.Option(
        "--trust-journal", help="Rebuild even if the summary names events the journal does not hold (rows "
        "removed from its end look like that), ends before the journal's last row (nothing proves who wrote the "
        "rows after it) or cannot be read: only for a journal known to be complete and the run's own.")] = False,
) -> None:
    """Rewrite a run's summary from its hash-chained journal, when it no longer matches it."""
    with refusals(), opened(ctx) as store:
        cp, differed = operations.rebuild_summary(store, run, trust_journal=trust_journal)
    if not differed:
        typer.echo(f"run {run}: its summary matches its journal ({render.counted(cp.last_seq, 'event')}); "
                   "nothing was written")
    else:
        typer.echo(f"run {run}: summary rebuilt from its {render.counted(cp.last_seq, 'journaled event')} "
                   f"({', '.join(differed)} differed); status {cp.status}")


def status_command(
    ctx: typer.Context,
    run: RunArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a line.")] = False,
) -> None:
    """Say what a run is doing now: running (and who holds it), or what it waits for (a worker, an approval, a person)."""
    with refusals(), opened(ctx, readonly=True) as store:
        cp = store.checkpoint(run)
        if cp is None:
            raise NotFound(f"no run {quoted(run)} in {quoted(str(ctx.obj.db))}")
        state = queued_state(store, run_state(store, cp), cp.run_id)  # a queued run says what holds it back
    if as_json:
        typer.echo(json.dumps({"run_id": cp.run_id, "status": cp.status, **state}, indent=2, ensure_ascii=True))
        return
    typer.echo(render.clean(f"run {cp.run_id}: {state['summary']}"))

