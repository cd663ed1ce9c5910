"""The commands that keep a journal's size and copies: ``prune``, ``backup`` and ``restore``.

::

    cuaderno [--db URL] prune --older-than 7d [--batch N] [--dry-run] [--vacuum] [--json]
    cuaderno backup JOURNAL DEST
    cuaderno restore BACKUP JOURNAL --runs-after-backup needs-human|accept
    cuaderno [--db URL] mark-restored --runs-after-backup needs-human|accept [--from NAME]

``prune`` removes closed runs past the bound, whole, a batch per transaction, while workers keep
running (see :mod:`cuaderno.journal.retention`). ``backup`` copies a SQLite journal with SQLite's
online backup API while it is written, and checks every run of the copy; ``restore`` puts a copy
back at a journal's path so that the rollback check knows it for a restore (see
:mod:`cuaderno.journal.backups`).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from cuaderno.cli._common import USAGE_EXIT, fail, opened, refusals
from cuaderno.errors import UsageError

__all__ = ["backup_command", "mark_restored_command", "prune_command", "restore_command"]


def prune_command(
    ctx: typer.Context,
    older_than: Annotated[str, typer.Option("--older-than", metavar="AGE",
                                            help="Remove closed runs last updated longer ago than this "
                                                 "(45s, 90m, 12h, 7d, 2w).")],
    batch: Annotated[int, typer.Option("--batch", min=1, metavar="N", help="Runs removed per transaction.")] = 200,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only say what would be removed.")] = False,
    vacuum: Annotated[bool, typer.Option("--vacuum", help="Then give the space back to the file system (SQLite: a "
                                                          "full VACUUM, which also switches the file to incremental "
                                                          "vacuum for later prunes).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Remove closed runs (completed, failed, cancelled) older than --older-than, whole; never a run that
    is open, held, or has compensations left."""
    from cuaderno.journal.retention import parse_duration
    from cuaderno.operations import prune

    try:
        seconds = parse_duration(older_than)
    except UsageError as exc:
        fail(f"--older-than: {exc}", USAGE_EXIT)
    with refusals(), opened(ctx, readonly=dry_run) as store:
        report = prune(store, seconds, batch=batch, dry_run=dry_run, vacuum=True if vacuum else None)
    if as_json:
        typer.echo(json.dumps({**report.as_json(), "runs": report.runs}, indent=2, ensure_ascii=True))
        return
    verb = "would remove" if dry_run else "removed"
    typer.echo(f"{verb} {len(report.runs):,} closed run{'s' if len(report.runs) != 1 else ''} "
               f"({report.events:,} events, {report.batches:,} batch{'es' if report.batches != 1 else ''})"
               if not dry_run else f"{verb} {len(report.runs):,} closed run{'s' if len(report.runs) != 1 else ''}")
    if report.kept:
        typer.echo(f"kept {len(report.kept):,} closed run{'s' if len(report.kept) != 1 else ''} older than the bound:")
        for run_id, why in sorted(report.kept.items())[:20]:
            typer.echo(f"  {run_id}: {why}")
        if len(report.kept) > 20:
            typer.echo(f"  ... and {len(report.kept) - 20:,} more (--json lists them all)")
    if report.vacuum is not None:
        v = report.vacuum
        typer.echo(f"vacuum: {v['how']}; {v['bytes_before']:,} -> {v['bytes_after']:,} bytes")


def backup_command(
    journal: Annotated[str, typer.Argument(metavar="JOURNAL", help="The SQLite journal to copy (workers may be "
                                                                     "writing to it).")],
    dest: Annotated[str, typer.Argument(metavar="DEST", help="The copy to make (must not exist).")],
    ctx: typer.Context,
) -> None:
    """Copy a SQLite journal while it is written (SQLite's online backup), then check every run of the copy."""
    from cuaderno.operations import backup

    with refusals():
        report = backup(journal, dest, keys=ctx.obj.keys())
    typer.echo(f"backed up {report.runs:,} run{'s' if report.runs != 1 else ''} ({report.events:,} events, "
               f"{report.bytes:,} bytes) to {report.dest}; every run's journal verified")


def restore_command(
    backup_file: Annotated[str, typer.Argument(metavar="BACKUP", help="A copy made by cuaderno backup.")],
    journal: Annotated[str, typer.Argument(metavar="JOURNAL", help="The journal path to restore it at (the "
                                                                     "journal there is kept, renamed aside).")],
    runs_after_backup: Annotated[str, typer.Option(
        "--runs-after-backup", metavar="needs-human|accept",
        help="What happens to runs that may have gone on after the backup: needs-human (each is marked, with "
             "the evidence, for a person to settle) or accept (they go on from the backup; effects done after it "
             "may be done again).")],
    ctx: typer.Context,
) -> None:
    """Put a backup back at a journal's path, as a restore the rollback check knows; stop the workers first."""
    from cuaderno.operations import restore

    if runs_after_backup not in ("needs-human", "accept"):
        fail(f"--runs-after-backup must be needs-human or accept, got {runs_after_backup!r:.40}", USAGE_EXIT)
    with refusals():
        report = restore(backup_file, journal, runs_after_backup=runs_after_backup,  # type: ignore[arg-type]
                         keys=ctx.obj.keys())
    typer.echo(f"restored {report.backup} at {report.journal}"
               + (f"; the journal it replaced is kept as {report.kept_aside}" if report.kept_aside else ""))
    if report.marked:
        typer.echo(f"{len(report.marked):,} run(s) may have gone on after the backup and now wait for a person "
                   f"(step restore): {', '.join(report.marked[:20])}{' ...' if len(report.marked) > 20 else ''}")
    if report.lost:
        typer.echo(f"{len(report.lost):,} run(s) started after the backup are not in it (they stay in the kept "
                   f"journal): {', '.join(report.lost[:20])}{' ...' if len(report.lost) > 20 else ''}")


def mark_restored_command(
    ctx: typer.Context,
    runs_after_backup: Annotated[str, typer.Option(
        "--runs-after-backup", metavar="needs-human|accept",
        help="What happens to the open runs of a journal just restored by other means (pg_restore): needs-human "
             "(each is marked, with the evidence, for a person to settle) or accept (they go on from the dump).")],
    source: Annotated[str, typer.Option("--from", metavar="NAME", help="The dump restored, for the record.")]
    = "a restore",
) -> None:
    """After pg_restore (before starting workers): mark the restored journal's open runs for a person, and
    record the restore."""
    from cuaderno.operations import mark_restored

    if runs_after_backup not in ("needs-human", "accept"):
        fail(f"--runs-after-backup must be needs-human or accept, got {runs_after_backup!r:.40}", USAGE_EXIT)
    with refusals(), opened(ctx, accept_rollback=True) as store:
        report = mark_restored(store, runs_after_backup=runs_after_backup, source=source)  # type: ignore[arg-type]
    typer.echo(f"recorded the restore from {report.backup}; {len(report.marked):,} open run(s) now wait for a "
               f"person (step restore){': ' + ', '.join(report.marked[:20]) if report.marked else ''}")
