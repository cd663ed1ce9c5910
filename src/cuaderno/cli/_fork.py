"""``cuaderno fork`` and ``cuaderno export`` (see :func:`cuaderno.operations.fork`).

::

    cuaderno [--db runs.db] fork RUN --at STEP --as NEW_RUN
    cuaderno [--db runs.db] export RUN [--output FILE]
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from cuaderno.cli._common import exit_code, fail
from cuaderno.errors import CuadernoError
from cuaderno.journal.sqlite import SqliteCheckpointer
from cuaderno.operations import export_lines, fork
from cuaderno.render import clean, counted

__all__ = ["export_command", "fork_command"]


def _open(ctx: typer.Context, *, readonly: bool) -> SqliteCheckpointer:
    from cuaderno.ui import open_journal  # the same checks as `cuaderno ui`: never creates a file

    return open_journal(ctx.obj.db, readonly=readonly, keys=ctx.obj.keys())


def fork_command(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN", help="The run to fork.")],
    at: Annotated[str, typer.Option("--at", metavar="STEP", help="The step the fork does anew (e.g. t0002.model).")],
    new_run: Annotated[str, typer.Option("--as", metavar="NEW_RUN", help="The fork's run id (must not exist).")],
) -> None:
    """Start NEW_RUN as a copy of RUN's journal up to STEP: resumed with the same agent and task, it
    pays no call and runs no tool again up to STEP, and sends new effects under keys of its own."""
    try:
        with _open(ctx, readonly=False) as store:
            cp = fork(store, run, at=at, new_run_id=new_run)
    except CuadernoError as exc:
        fail(str(exc), exit_code(exc))
    except (sqlite3.Error, OSError) as exc:
        fail(f"the journal refused the operation: {exc}")
    typer.echo(clean(f"run {new_run} forked from {run} at {at}: {counted(cp.last_seq, 'event')} copied "
                     f"({counted(cp.count('model_calls'), 'model call')}, {counted(cp.count('tool_calls'), 'tool call')} "
                     f"journaled: none is paid or run again); resume it with the same agent and task under run id "
                     f"{new_run}"))


def export_command(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN", help="The run to export.")],
    output: Annotated[Path | None, typer.Option("--output", metavar="FILE",
                                                help="Write here (must not exist) instead of stdout.")] = None,
) -> None:
    """Write RUN's journal as JSON lines, one event per line, checked against its hash chain first."""
    if output is not None and output.exists():
        fail(f"{str(output)!r} exists; nothing was written (choose another --output)")
    try:
        with _open(ctx, readonly=True) as store:
            lines = list(export_lines(store, run))  # all read and checked before anything is written
    except CuadernoError as exc:
        fail(str(exc), exit_code(exc))
    except (sqlite3.Error, OSError) as exc:
        fail(f"the journal refused the operation: {exc}")
    text = "".join(line + "\n" for line in lines)
    if output is None:
        typer.echo(text, nl=False)
        return
    # Whole or not at all: written beside the target, then renamed onto it (never over a file).
    try:
        fd, tmp = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, output)  # fails if the target appeared meanwhile
        os.unlink(tmp)
    except OSError as exc:
        if "tmp" in locals():
            Path(tmp).unlink(missing_ok=True)
        fail(f"could not write {str(output)!r}: {exc.strerror or exc}; nothing was written")
    typer.echo(f"run {run}: {len(lines)} events written to {output}", err=True)
