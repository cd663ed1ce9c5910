"""``cuaderno worker`` (see :mod:`cuaderno.worker`) and ``cuaderno status``.

::

    cuaderno worker --journal URL --agent module:attr [--gateway module:attr] [--concurrency N]
                    [--poll-interval S] [--until-idle] [--name NAME]
    cuaderno [--db URL] status RUN [--json]

``--agent`` names an :class:`~cuaderno.Agent`. The model gateway comes from ``--gateway``, a
function of no arguments that returns a gateway (or a gateway object), and by default from the
agent module's own ``gateway_factory``. SIGTERM (or Ctrl-C) stops the worker as
:meth:`Worker.stop <cuaderno.worker.Worker.stop>` does: each run in flight finishes its step,
commits and is released; the command then exits 0.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated, Any, NoReturn

import typer

__all__ = ["status_command", "worker_command"]


def _fail(message: str, exc: BaseException | None = None) -> NoReturn:
    from cuaderno.cli import ERROR_EXIT, NOT_FOUND_EXIT, USAGE_EXIT, _say_error
    from cuaderno.errors import RunNotFound, UsageError

    _say_error(message)
    code = NOT_FOUND_EXIT if isinstance(exc, RunNotFound) else USAGE_EXIT if isinstance(exc, UsageError) else ERROR_EXIT
    raise typer.Exit(code)


def _gateway_factory(agent_ref: str, gateway_ref: str | None) -> Callable[[], Any]:
    from cuaderno.errors import UsageError
    from cuaderno.gateway.base import ModelGateway
    from cuaderno.worker import load_agent

    ref = gateway_ref or f"{agent_ref.partition(':')[0]}:gateway_factory"
    try:
        value = load_agent(ref)
    except UsageError:
        if gateway_ref is not None:
            raise
        raise UsageError(f"no gateway for agent {agent_ref!r}: pass --gateway module:attr (a function returning a "
                         "ModelGateway), or define gateway_factory in the agent's module") from None
    if isinstance(value, ModelGateway):
        return lambda: value
    if not callable(value):
        raise UsageError(f"{ref!r} is neither a ModelGateway nor a function returning one")
    return value  # type: ignore[no-any-return]


def worker_command(
    ctx: typer.Context,
    agent_ref: Annotated[str, typer.Option("--agent", metavar="MODULE:ATTR",
                                           help="The Agent whose runs this worker drives (myapp.agents:agent).")],
    journal: Annotated[str | None, typer.Option("--journal", metavar="URL",
                                                help="The journal URL (default: --db / CUADERNO_DB).")] = None,
    gateway_ref: Annotated[str | None, typer.Option(
        "--gateway", metavar="MODULE:ATTR", help="A function returning the model gateway (default: the agent "
        "module's gateway_factory).")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Runs driven at once.")] = 4,
    poll_interval: Annotated[float, typer.Option("--poll-interval", min=0.01, metavar="S",
                                                 help="Seconds between looks at the journal when idle.")] = 0.5,
    until_idle: Annotated[bool, typer.Option("--until-idle", help="Exit once nothing is left that this worker "
                                                                  "can move on (for a cron job or a test).")] = False,
    name: Annotated[str | None, typer.Option("--name", metavar="NAME",
                                             help="Names this worker in each run's holder record.")] = None,
) -> None:
    """Claim runs that need progress (a dead holder, a decided approval, a cancellation to close,
    compensations to run) and drive them; SIGTERM finishes each step in flight, releases, exits 0."""
    from cuaderno.cli import _check_sqlite_file, _refusals
    from cuaderno.errors import UsageError
    from cuaderno.journal import parse_journal_url
    from cuaderno.loop.agent import Agent
    from cuaderno.worker import Worker, load_agent

    url = journal or ctx.obj.db
    try:
        # The CLI's own refusals (a directory, an empty file, a missing journal) and cuaderno's errors
        # become one ``error:`` line with their exit status, as in every other command.
        with _refusals():
            target = parse_journal_url(url)
            if target.scheme == "sqlite" and target.path != ":memory:":
                from pathlib import Path

                _check_sqlite_file(Path(target.path))
            agent = load_agent(agent_ref)
            if not isinstance(agent, Agent):
                raise UsageError(f"{agent_ref!r} is a {type(agent).__name__}, not a cuaderno Agent")
            factory = _gateway_factory(agent_ref, gateway_ref)
            worker = Worker(url, agent, factory, concurrency=concurrency, poll_interval=poll_interval, name=name,
                            log=lambda line: print(line, file=sys.stderr, flush=True))
            stats = worker.run_sync(until_idle=until_idle, handle_signals=True)
    except typer.Exit:
        raise
    except Exception as exc:  # what a driver library raised while opening (psycopg's OperationalError, ...)
        _fail(f"{type(exc).__name__}: {exc}")
    counts = {k: v for k, v in (("claimed", stats.claimed), ("completed", stats.completed),
                                ("suspended", stats.suspended), ("needs_human", stats.needs_human),
                                ("failed", stats.failed), ("cancelled", stats.cancelled),
                                ("compensated", stats.compensated), ("released", stats.released),
                                ("busy", stats.busy), ("errors", stats.errors))}
    print(json.dumps({"worker": worker.name, "stopped": True, **counts}), file=sys.stderr, flush=True)


def status_command(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN", help="The run id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a line.")] = False,
) -> None:
    """Say what a run is doing now: running (and who holds it), or what it waits for (a worker, an approval, a person)."""
    from cuaderno._cli_render import clean
    from cuaderno.cli import _NotFound, _refusals, _store
    from cuaderno.errors import quoted

    with _refusals(), _store(ctx, readonly=True) as store:
        cp = store.checkpoint(run)
        if cp is None:
            raise _NotFound(f"no run {quoted(run)} in {quoted(str(ctx.obj.db))}")
        state = run_state(store, cp)
    if as_json:
        typer.echo(json.dumps({"run_id": cp.run_id, "status": cp.status, **state}, indent=2, ensure_ascii=True))
        return
    typer.echo(clean(f"run {cp.run_id}: {state['summary']}"))


def run_state(store: Any, cp: Any, events: Any = None) -> dict[str, Any]:
    """``state``, ``waiting_for``, ``held_by`` and ``summary`` of a run (see
    :func:`cuaderno.journal.state_of`); a store without SupportsClaims cannot say who holds
    a run, and its runs are described from their status alone."""
    from cuaderno.journal import state_of
    from cuaderno.journal.base import SupportsClaims

    holder = None
    if isinstance(store, SupportsClaims):
        holder = store.holders([cp.run_id]).get(cp.run_id)
    left = None
    if events is not None and cp.status == "cancelled":
        from cuaderno.worker import _cleanup_left

        left = _cleanup_left(cp, list(events))
    return state_of(cp, holder, cleanup_left=left)
