"""``cuaderno schedule add|list|remove`` (see :mod:`cuaderno.flow.schedules`).

::

    cuaderno schedule add NAME --cron EXPR --agent NAME --task TEXT [--tenant T] [--priority N]
                          [--concurrency-key K] [--catch-up N]
    cuaderno schedule list [--json]
    cuaderno schedule remove NAME

The workers of the agent named fire the schedule (``cuaderno worker --agent``): one run per fire
time.
"""

from __future__ import annotations

from typing import Annotated

import typer

from cuaderno.cli._common import LinesJsonOption, opened, print_listing, refusals, stdout

__all__ = ["schedule_app"]

schedule_app = typer.Typer(help="Cron schedules: each fire time starts one run (fired by the agent's workers).",
                           no_args_is_help=True)


@schedule_app.command("add")
def add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The schedule's name (letters, digits, _ . -).")],
    cron: Annotated[str, typer.Option("--cron", metavar="EXPR", help="Cron: five fields, or six with seconds last.")],
    agent: Annotated[str, typer.Option("--agent", metavar="NAME", help="The name of the agent whose workers fire it.")],
    task: Annotated[str, typer.Option("--task", metavar="TEXT", help="The task of each run.")],
    tenant: Annotated[str, typer.Option("--tenant", help="The runs' tenant.")] = "default",
    priority: Annotated[int, typer.Option("--priority", help="The runs' priority (higher first).")] = 0,
    concurrency_key: Annotated[str | None, typer.Option("--concurrency-key", metavar="KEY",
                                                        help="Counted against this key's limit.")] = None,
    catch_up: Annotated[int, typer.Option("--catch-up", metavar="N", help="After an outage, start at most the "
                                          "latest N missed fire times (1: only the latest).")] = 1,
) -> None:
    """Add a schedule."""
    from cuaderno.flow.schedules import add_schedule

    with refusals(), opened(ctx) as store:
        made = add_schedule(store, name, cron, agent, task, tenant=tenant, priority=priority,
                            concurrency_key=concurrency_key, catch_up=catch_up)
    stdout().print(f"schedule {made.name}: {made.cron} starts a run of agent {made.agent}", soft_wrap=True)


@schedule_app.command("list")
def list_command(ctx: typer.Context, as_json: LinesJsonOption = False) -> None:
    """List the schedules."""
    from cuaderno.flow.schedules import list_schedules

    print_listing(ctx, list_schedules, as_json=as_json,
                  jsonable=lambda found: [{"name": s.name, "cron": s.cron, "agent": s.agent, "task": s.task,
                                           "tenant": s.tenant, "priority": s.priority,
                                           "concurrency_key": s.concurrency_key, "catch_up": s.catch_up,
                                           "last_fire": s.last_fire} for s in found],
                  lines=lambda found: (f"{s.name}  {s.cron}  agent {s.agent}  catch-up {s.catch_up}  "
                                       f"task {s.task[:60]!r}" for s in found))


@schedule_app.command("remove")
def remove(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The schedule to remove (its runs stay).")],
) -> None:
    """Remove a schedule."""
    from cuaderno.flow.schedules import remove_schedule

    with refusals(), opened(ctx) as store:
        remove_schedule(store, name)
    stdout().print(f"schedule {name} removed", soft_wrap=True)
