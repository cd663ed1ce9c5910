"""``cuaderno worker`` (see :mod:`cuaderno.worker`).

::

    cuaderno worker --journal URL --agent module:attr [--gateway module:attr] [--concurrency N]
                    [--poll-interval S] [--until-idle] [--name NAME]
                    [--prune-older-than AGE [--prune-every S]]

``--agent`` names an :class:`~cuaderno.Agent`, or a wrapped agent of :mod:`cuaderno.integrations`
(a :class:`~cuaderno.integrations.Resumable`: it resumes its runs on its own journal). The model gateway comes from ``--gateway``, a
function of no arguments that returns a gateway (or a gateway object), and by default from the
agent module's own ``gateway_factory``. SIGTERM (or Ctrl-C) stops the worker as
:meth:`Worker.stop <cuaderno.worker.Worker.stop>` does: each run in flight finishes its step,
commits and is released; the command then exits 0.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from cuaderno.cli._common import check_sqlite_file, fail, refusals

__all__ = ["worker_command"]


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
    prune_older_than: Annotated[str | None, typer.Option(
        "--prune-older-than", metavar="AGE", help="Also remove closed runs older than this (30d), on a schedule "
        "(see cuaderno prune).")] = None,
    prune_every: Annotated[float, typer.Option("--prune-every", min=0.01, metavar="S",
                                               help="Seconds between two prunes.")] = 600.0,
) -> None:
    """Claim runs that need progress (a dead holder, a decided approval, a cancellation to close,
    compensations to run) and drive them; SIGTERM finishes each step in flight, releases, exits 0."""
    from cuaderno.errors import UsageError
    from cuaderno.integrations import IntegrationWorker, Resumable
    from cuaderno.journal import parse_journal_url
    from cuaderno.loop.agent import Agent
    from cuaderno.worker import Worker, load_agent

    url = journal or ctx.obj.db
    try:
        # The CLI's own refusals (a directory, an empty file, a missing journal) and cuaderno's errors
        # become one ``error:`` line with their exit status, as in every other command.
        with refusals():
            target = parse_journal_url(url)
            if target.scheme == "sqlite" and target.path != ":memory:":
                from pathlib import Path

                check_sqlite_file(Path(target.path))
            if ctx.obj.key_file:
                # The worker opens the journal by its URL (and so do the stores of the processes it
                # may start): they read the key from the environment, which --key-file now names.
                ctx.obj.keys()  # a missing or readable-by-others key file refused here, before anything runs
                os.environ["CUADERNO_KEY_FILE"] = ctx.obj.key_file
                for name_ in ("CUADERNO_KEY", "CUADERNO_OLD_KEYS"):
                    os.environ.pop(name_, None)
            agent = load_agent(agent_ref)
            worker: Worker | IntegrationWorker
            if isinstance(agent, Resumable):  # a wrapped agent: it resumes its runs on its own journal
                worker = IntegrationWorker(agent, concurrency=concurrency, poll_interval=poll_interval, name=name,
                                           log=lambda line: print(line, file=sys.stderr, flush=True))
            else:
                if not isinstance(agent, Agent):
                    raise UsageError(f"{agent_ref!r} is a {type(agent).__name__}, not a cuaderno Agent nor a "
                                     "wrapped agent (cuaderno.integrations.Resumable)")
                factory = _gateway_factory(agent_ref, gateway_ref)
                worker = Worker(url, agent, factory, concurrency=concurrency, poll_interval=poll_interval, name=name,
                                log=lambda line: print(line, file=sys.stderr, flush=True),
                                prune_older_than=prune_older_than, prune_every=prune_every)
            stats = worker.run_sync(until_idle=until_idle, handle_signals=True)
    except typer.Exit:
        raise
    except Exception as exc:  # what a driver library raised while opening (psycopg's OperationalError, ...)
        fail(f"{type(exc).__name__}: {exc}")
    counts = {k: v for k, v in (("claimed", stats.claimed), ("completed", stats.completed),
                                ("suspended", stats.suspended), ("needs_human", stats.needs_human),
                                ("failed", stats.failed), ("cancelled", stats.cancelled),
                                ("compensated", stats.compensated), ("released", stats.released),
                                ("busy", stats.busy), ("errors", stats.errors),
                                ("pruned", stats.pruned))}
    print(json.dumps({"worker": worker.name, "stopped": True, **counts}), file=sys.stderr, flush=True)
