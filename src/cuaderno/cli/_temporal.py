"""``cuaderno approve|deny|cancel RUN --temporal ADDR[/NAMESPACE]``: decide on a run under Temporal.

::

    cuaderno approve RUN STEP --temporal 127.0.0.1:7233[/NAMESPACE] [--fingerprint FP] [--by NAME] [--reason TEXT]
    cuaderno deny    RUN STEP --temporal 127.0.0.1:7233[/NAMESPACE] [--fingerprint FP] [--by NAME] [--reason TEXT]
    cuaderno cancel  RUN      --temporal 127.0.0.1:7233[/NAMESPACE] [--reason TEXT] [--by NAME]

RUN is the workflow id (cuaderno's run id under Temporal). A decision is the workflow's ``decide``
update, so the workflow's own validator refuses a stale fingerprint (``ApprovalMismatch``) or a
step that is not waiting (``NotWaitingForApproval``) and nothing is recorded; without
``--fingerprint`` the call printed here (read with the ``pending`` query) is the one bound, as
the local ``approve`` does. ``cancel`` is the workflow's ``cancel`` signal: the run writes the
local cancellation request and ends with the local ``cancelled`` record.

temporalio is imported only when ``--temporal`` is given (it is the ``cuaderno[temporal]`` extra).

**Exit.** A process whose Temporal client still lives when the interpreter finalizes crashes or
aborts there (``PyGILState_Release``..., temporalio/sdk-python#300): 12 of 40 short client
processes did on this machine, 5 of 40 with a runtime of their own kept to the end. Each command
here runs its client on a :class:`temporalio.runtime.Runtime` of its own and drops both (and
collects them) before returning, so the core's threads are gone before finalization: 0 of 40.
No ``os._exit``: the command returns like any other, and in-process callers (tests) are unharmed.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from cuaderno import render
from cuaderno.cli._common import ERROR_EXIT, NOT_FOUND_EXIT, USAGE_EXIT, fail, normal_fingerprint, stdout

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = ["TemporalOption", "cancel_on_temporal", "decide_on_temporal", "parse_target"]

TemporalOption = Annotated[str | None, typer.Option(
    "--temporal", metavar="ADDR[/NAMESPACE]",
    help="The run is a Temporal workflow (RUN is its workflow id): decide or cancel it through the Temporal "
         "server at ADDR (host:port), in NAMESPACE (default: default). --db is not read.")]

T = TypeVar("T")


def parse_target(text: str) -> tuple[str, str]:
    """``host:port[/namespace]`` -> (address, namespace). Raises :class:`UsageError` on anything else."""
    from cuaderno.errors import UsageError

    address, _, namespace = text.strip().partition("/")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--temporal {text!r} is not ADDR[/NAMESPACE] with ADDR as host:port "
                         "(e.g. 127.0.0.1:7233/default); nothing was sent")
    if "/" in namespace or (_ and not namespace):
        raise UsageError(f"--temporal {text!r}: the namespace after '/' must be one non-empty name; nothing was sent")
    return address, namespace or "default"


def _with_client(target: str, body: Callable[[Client], Awaitable[T]]) -> T:
    """Run ``body`` with a client on a runtime of its own; both are dropped before returning."""
    from temporalio.client import Client
    from temporalio.runtime import Runtime, TelemetryConfig

    address, namespace = parse_target(target)

    async def run(runtime: Runtime) -> T:
        try:
            client = await Client.connect(address, namespace=namespace, runtime=runtime)
        except RuntimeError as exc:  # the bridge's "Failed client connect: ..."
            raise _Unreachable(f"cannot reach the Temporal server at {address}: {exc}; nothing was sent") from None
        return await body(client)

    runtime = Runtime(telemetry=TelemetryConfig(metrics=None))
    try:
        return asyncio.run(run(runtime))
    finally:
        # The last reference to the runtime (the client died with run()): its threads stop now,
        # not during the interpreter's finalization (sdk-python#300, see the module docstring).
        del runtime
        gc.collect()


class _Unreachable(Exception):
    """The Temporal server could not be reached."""


def _refused(exc: BaseException, run: str) -> tuple[str, int] | None:
    """The one-line message and exit status for what the server or the workflow refused."""
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.exceptions import ApplicationError
    from temporalio.service import RPCError, RPCStatusCode

    if isinstance(exc, _Unreachable):
        return str(exc), ERROR_EXIT
    if isinstance(exc, WorkflowUpdateFailedError):
        cause = exc.cause
        kind = cause.type if isinstance(cause, ApplicationError) else type(cause).__name__
        message = cause.message if isinstance(cause, ApplicationError) else str(cause)
        return f"{kind}: {message}; nothing was recorded", ERROR_EXIT
    if isinstance(exc, RPCError):
        if exc.status == RPCStatusCode.NOT_FOUND:
            if "already completed" in exc.message or "closed" in exc.message:
                return f"run {run!r} already ended on Temporal: {exc.message}; nothing was sent", ERROR_EXIT
            return f"no workflow {run!r} on Temporal: {exc.message}; nothing was sent", NOT_FOUND_EXIT
        return f"Temporal refused the request: {exc.message}; nothing was sent", ERROR_EXIT
    return None


def _run(target: str, run: str, body: Callable[[Client], Awaitable[T]]) -> T:
    from cuaderno.errors import UsageError

    try:
        return _with_client(target, body)
    except UsageError as exc:
        fail(str(exc), USAGE_EXIT)
    except Exception as exc:
        refused = _refused(exc, run)
        if refused is None:
            raise
        fail(*refused)


def decide_on_temporal(target: str, run: str, step: str, fingerprint: str | None, by: str | None,
                       reason: str | None, *, approved: bool) -> None:
    """The ``decide`` update for ``step`` of the workflow ``run``: printed, bound, then sent."""
    from cuaderno.temporal import CuadernoWorkflow, Decision

    if fingerprint is not None:
        fingerprint = normal_fingerprint(fingerprint)  # spaces, a newline, upper-case hex: as locally
        if not fingerprint:
            fail("--fingerprint is empty: pass the full fingerprint shown, or leave the option out to bind "
                 "the call printed here; nothing was sent", USAGE_EXIT)
    verb = "approving" if approved else "denying"
    step_id = render.approval_step(step)
    console = stdout()

    async def body(client: Client) -> tuple[str, str | None]:
        handle = client.get_workflow_handle(run)
        pending: dict[str, Any] = await handle.query(CuadernoWorkflow.pending)
        entry = pending.get(step_id)
        bound = fingerprint
        if entry is not None:
            render.render_pending_call(console, run, step_id, entry, verb)
            if bound is None:
                bound = entry.get("fingerprint")  # bind the decision to exactly what was just printed
        elif not pending:
            fail(f"run {run!r} is not waiting for any approval on Temporal; nothing was recorded", ERROR_EXIT)
        accepted = await handle.execute_update(CuadernoWorkflow.decide, Decision(
            step_id, approved, fingerprint=bound, approver=by, reason=reason))
        return str(accepted), bound

    decided, bound = _run(target, run, body)
    who = f" by {render.clean(by)}" if by else ""
    typer.echo(render.clean(f"{'approved' if approved else 'denied'}{who}: accepted by workflow {run} "
                            f"({decided}, fingerprint {str(bound)[:12]}); it goes on now."))


def cancel_on_temporal(target: str, run: str, reason: str, by: str | None) -> None:
    """The ``cancel`` signal to the workflow ``run``."""
    from cuaderno.temporal import CuadernoWorkflow

    async def body(client: Client) -> None:
        handle = client.get_workflow_handle(run)
        description = await handle.describe()  # one that does not exist or ended is refused, not signalled
        if description.status is not None and description.status.name != "RUNNING":
            fail(f"run {run!r} already ended on Temporal ({description.status.name.lower()}); nothing was sent",
                 ERROR_EXIT)
        await handle.signal(CuadernoWorkflow.cancel, args=[reason, by])

    _run(target, run, body)
    typer.echo(render.clean(f"run {run}: cancellation sent to its Temporal workflow; a run waiting for a person "
                            "ends now, a running one before its next step, with the cancelled record"))
