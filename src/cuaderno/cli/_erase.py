"""``cuaderno erase RUN``: make a run's content unreadable in every file the journal owns, its
structure and hash chain kept (see :func:`cuaderno.operations.erase`)."""

from __future__ import annotations

from typing import Annotated

import typer

from cuaderno import operations
from cuaderno.cli._common import RunArg, opened, refusals

__all__ = ["erase_command"]


def erase_command(
    ctx: typer.Context,
    run: RunArg,
    reason: Annotated[str, typer.Option("--reason", help="Kept in the erasure's record (a ticket, a request id); "
                                                          "at most 500 characters.")] = "",
    thorough: Annotated[bool, typer.Option(
        "--thorough", help="Rewrite the whole journal afterwards (SQLite: VACUUM; PostgreSQL: VACUUM FULL, "
        "which holds the tables' exclusive lock meanwhile), not only the pages the erasure changed.")] = False,
) -> None:
    """Erase an ended run's content (task, messages, tool arguments and results, answers); its steps,
    statuses, counters, cost and who approved stay, and its hash chain still verifies. It cannot be
    resumed, forked or exported afterwards. Running it again finishes an erasure a kill interrupted."""
    with refusals(), opened(ctx) as store:
        done = operations.erase(store, run, reason=reason, thorough=thorough)
    if done.already:
        typer.echo(f"run {run}: its content was already erased; {done.detail}")
    else:
        typer.echo(f"run {run}: the content of its {done.rows} journaled event(s) was erased; {done.detail}")
    if not done.scrubbed:
        raise typer.Exit(1)
