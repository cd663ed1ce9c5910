"""The commands that decide for a run: ``approve``, ``deny``, ``cancel`` and ``resolve``, on the
journal or (``--temporal``) on a Temporal workflow (:mod:`cuaderno.cli._temporal`).

::

    cuaderno [--db runs.db] approve RUN STEP [--fingerprint FP] [--by NAME] [--reason TEXT]
    cuaderno [--db runs.db] deny RUN STEP [--fingerprint FP] [--by NAME] [--reason TEXT]
    cuaderno [--db runs.db] cancel RUN [--reason TEXT] [--by NAME]
    cuaderno [--db runs.db] resolve RUN STEP --happened|--not-happened [--result JSON] [--by NAME] [--note TEXT]

They write nothing but what :mod:`cuaderno.operations` appends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from cuaderno import operations, render
from cuaderno.cli._common import (
    USAGE_EXIT,
    ByOption,
    ReasonOption,
    RunArg,
    fail,
    normal_fingerprint,
    opened,
    refusals,
    stdout,
)
from cuaderno.cli._temporal import TemporalOption, cancel_on_temporal, decide_on_temporal
from cuaderno.errors import UsageError

__all__ = ["approve", "cancel", "deny", "resolve"]


_FINGERPRINT_HELP = ("The fingerprint of the arguments you were shown (from `cuaderno show`). The decision is "
                     "refused if the pending call has other arguments. Without it, the call printed here is bound.")
_StepArg = Annotated[str, typer.Argument(metavar="STEP", help="The approval step id (t0000.tool00.approval) "
                                                              "or its tool step id (t0000.tool00).")]
_FingerprintOption = Annotated[str | None, typer.Option("--fingerprint", metavar="FP", help=_FINGERPRINT_HELP)]


def _decide(ctx: typer.Context, run: str, step: str, fingerprint: str | None, by: str | None, reason: str | None,
            *, approved: bool) -> None:
    verb = "approving" if approved else "denying"
    if fingerprint is not None:
        fingerprint = normal_fingerprint(fingerprint)
        if not fingerprint:  # every fingerprint starts with "": it would be refused as a 0-character prefix
            fail("--fingerprint is empty: pass the full fingerprint shown by `cuaderno show`, or leave the option "
                 "out to bind the call printed here; nothing was written", USAGE_EXIT)
    console = stdout()
    with refusals(), opened(ctx) as store:
        pending = operations.pending_approvals(store, run)  # RunNotFound, RunClosed: nothing written
        step_id = render.approval_step(step)
        entry = pending.get(step_id)
        if entry is not None:
            render.render_pending_call(console, run, step_id, entry, verb)
            if fingerprint is None:
                # Bind the decision to exactly what was just printed.
                fingerprint = entry.get("fingerprint")
        decide = operations.approve if approved else operations.deny
        event = decide(store, run, step, fingerprint=fingerprint, approver=by, reason=reason)
    render.render_decision(console, event)


def _decision_command(name: str, approved: bool, doc: str) -> Callable[..., None]:
    """``approve`` or ``deny``: the same arguments, the same path, the other decision."""
    def command(ctx: typer.Context, run: RunArg, step: _StepArg, fingerprint: _FingerprintOption = None,
                by: ByOption = None, reason: ReasonOption = None, temporal: TemporalOption = None) -> None:
        if temporal is not None:
            return decide_on_temporal(temporal, run, step, fingerprint, by, reason, approved=approved)
        _decide(ctx, run, step, fingerprint, by, reason, approved=approved)

    command.__name__ = command.__qualname__ = name
    command.__doc__ = doc
    return command


approve = _decision_command("approve", True,
                            "Approve a pending tool call; a worker (or the next resume) runs it exactly once.")
deny = _decision_command("deny", False, "Reject a pending tool call; the next resume tells the model it was rejected.")


def cancel(
    ctx: typer.Context,
    run: RunArg,
    reason: Annotated[str, typer.Option("--reason", metavar="TEXT", help="Why, for the record.")] = "",
    by: Annotated[str | None, typer.Option("--by", metavar="NAME", help="Who cancels, for the record.")] = None,
    temporal: TemporalOption = None,
) -> None:
    """Cancel a run: no new step is admitted; what completed and what is uncertain are kept."""
    if temporal is not None:
        return cancel_on_temporal(temporal, run, reason, by)
    with refusals(), opened(ctx) as store:
        cp, already = operations.cancel_run(store, run, reason, by=by)
    if cp.status == "cancelled":
        record = cp.outcome or {}
        done = "was already cancelled (nothing was written)" if already else "cancelled"
        typer.echo(f"run {run} {done}: {render.counted(len(record.get('completed') or []), 'effect')} completed, "
                   f"{len(record.get('uncertain') or [])} uncertain, "
                   f"{render.counted(len(record.get('cleanup') or []), 'cleanup action')} scheduled")
    else:
        asked = "was already requested" if already else "requested"
        typer.echo(f"run {run}: cancellation {asked}; the process running it stops before its next step "
                   "(or its next resume finalizes it)")


def resolve(
    ctx: typer.Context,
    run: RunArg,
    step: Annotated[str, typer.Argument(metavar="STEP", help="The uncertain tool step (see `cuaderno show`).")],
    happened: Annotated[bool, typer.Option("--happened/--not-happened",
                                           help="What a person established in the receiving system.")],
    result: Annotated[str | None, typer.Option("--result", metavar="JSON",
                                               help="With --happened: the receipt found, as JSON.")] = None,
    by: Annotated[str | None, typer.Option("--by", metavar="NAME", help="Who checked, for the record.")] = None,
    note: Annotated[str | None, typer.Option("--note", metavar="TEXT", help="What was checked.")] = None,
) -> None:
    """Settle an uncertain effect after checking the receiving system; the next resume goes on."""
    value: Any = None
    if result is not None and not happened:
        fail("--result goes only with --happened: --not-happened makes the next resume send the effect again; "
             "nothing was written", USAGE_EXIT)
    if result is not None:
        try:
            value = operations.read_receipt(result, what="--result")
        except UsageError as exc:
            fail(str(exc), USAGE_EXIT)
    with refusals(), opened(ctx) as store:
        event = operations.resolve(store, run, step, happened=happened, result=value, by=by, note=note)
        cp = store.checkpoint(run)
    if cp is not None and cp.status in ("completed", "failed", "cancelled"):
        after = f"the run already ended ({cp.status}): nothing is sent"
    else:
        after = "the next resume " + ("goes on" if happened else "sends it again, same effect key")
    typer.echo(f"run {run} step {step}: recorded as {'happened' if happened else 'not happened'} "
               f"(seq {event.seq}); {after}")

