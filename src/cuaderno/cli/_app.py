"""The ``cuaderno`` command group: its own options, its one-line usage errors, the commands of
each module registered in the order ``--help`` lists them, and :func:`main`, the console script."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.metadata import version as _package_version
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

# typer 0.29 carries its own copy of click, whose exceptions are not click's; older typers use
# click itself. Either way these are the classes the command group raises.
try:
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
    from typer._click.exceptions import UsageError as ClickUsageError
except ImportError:  # pragma: no cover - typer without a bundled click
    from click.exceptions import ClickException, NoArgsIsHelpError  # type: ignore[assignment]
    from click.exceptions import UsageError as ClickUsageError  # type: ignore[assignment]


from cuaderno.cli._common import DEFAULT_DB, ERROR_EXIT, USAGE_EXIT, Options, say_error
from cuaderno.cli._decide import approve, cancel, deny, resolve
from cuaderno.cli._erase import erase_command
from cuaderno.cli._flow import flow_app
from cuaderno.cli._fork import export_command, fork_command
from cuaderno.cli._prune import backup_command, mark_restored_command, prune_command, restore_command
from cuaderno.cli._rekey import rekey_command
from cuaderno.cli._runs import list_runs, rebuild_summary, show, status_command
from cuaderno.cli._schedule import schedule_app
from cuaderno.cli._ui import ui_command, ui_passwd_command
from cuaderno.cli._worker import worker_command

__all__ = ["app", "main"]


class _OneLineUsageErrors(TyperGroup):
    """The command group, printing a usage error as the one ``error:`` line every refusal is.

    In standalone mode click prints a usage error as three lines (``Usage:``, ``Try ...``,
    ``Error: ...``); the command is run here in non-standalone mode and its exceptions are
    turned into what standalone mode does, except that line. ``cuaderno`` alone still prints
    the help (click raises that as a usage error too).
    """

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, windows_expand_args: bool = True,
             **extra: Any) -> Any:
        args = _db_first(list(sys.argv[1:] if args is None else args))
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except NoArgsIsHelpError as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except ClickUsageError as exc:
            command = exc.ctx.command_path if exc.ctx is not None else "cuaderno"
            say_error(f"{exc.format_message()} (see `{command} --help`)")
            sys.exit(USAGE_EXIT)
        except ClickException as exc:
            say_error(exc.format_message())
            sys.exit(exc.exit_code)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        # Non-standalone, click returns the code of a typer.Exit, or the command's value (None).
        sys.exit(code if isinstance(code, int) else 0)


def _db_first(args: list[str]) -> list[str]:
    """``--db`` and ``--key-file`` where the group reads them, wherever they were typed: ``cuaderno show run-1 --db x.db``
    is ``cuaderno --db x.db show run-1`` (the option belongs to the group, so click would refuse it
    after the command). What follows ``--`` is left alone."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest.extend(args[i:])
            break
        if arg in ("--db", "--key-file") and i + 1 < len(args):
            front += args[i:i + 2]
            i += 2
            continue
        (front if arg.startswith(("--db=", "--key-file=")) else rest).append(arg)
        i += 1
    return front + rest


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cuaderno {_package_version('cuaderno')}")
        raise typer.Exit()


app = typer.Typer(
    name="cuaderno",
    cls=_OneLineUsageErrors,
    help="Inspect durable agent runs and decide their pending approvals.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _root(
    ctx: typer.Context,
    db: Annotated[str, typer.Option("--db", envvar="CUADERNO_DB", metavar="URL",
                                    help="The run journal: a path to an existing SQLite file, or a URL "
                                    "(sqlite:///runs.db, sqlite:////abs/runs.db); never created by this command.")]
    = DEFAULT_DB,
    key_file: Annotated[str | None, typer.Option(
        "--key-file", metavar="FILE",
        help="The master key(s) of a journal encrypted at rest: one base64 key a line, the current one first "
        "(chmod 600). Without it, CUADERNO_KEY or CUADERNO_KEY_FILE from the environment.")] = None,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print cuaderno's version and exit.")] = False,
) -> None:
    ctx.obj = Options(db=db, key_file=key_file)


# In the order `cuaderno --help` lists them.
for _name, _command in (("list", list_runs), ("show", show), ("approve", approve), ("deny", deny),
                        ("cancel", cancel), ("resolve", resolve), ("rebuild-summary", rebuild_summary),
                        ("ui", ui_command), ("ui-passwd", ui_passwd_command), ("worker", worker_command),
                        ("status", status_command), ("fork", fork_command), ("export", export_command),
                        ("prune", prune_command), ("backup", backup_command), ("restore", restore_command),
                        ("mark-restored", mark_restored_command), ("erase", erase_command),
                        ("rekey", rekey_command)):
    app.command(_name)(_command)
app.add_typer(schedule_app, name="schedule")
app.add_typer(flow_app, name="flow")


def _discard_stdout() -> None:
    """Point stdout at the null device once writing to it failed: the interpreter flushes it at
    exit, and the output still buffered would fail again there, reported as an ignored exception."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real stdout (a test runner's, a closed one)
        pass


def _escape_what_cannot_be_encoded() -> None:
    """Write characters the output's encoding lacks as backslash escapes (``\\xe9``), not fail.

    Under ``PYTHONIOENCODING=ascii`` (or a C locale), printing a run id with an accent raised
    ``UnicodeEncodeError`` out of rich: a traceback instead of the run. The escape is visible
    and unambiguous; the JSON output is ASCII already.
    """
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is None:  # not a text file (replaced by an embedding program)
            continue
        try:
            reconfigure(errors="backslashreplace")
        except (ValueError, OSError):  # closed, or already written to in a way that forbids it
            pass


def main() -> None:
    """The ``cuaderno`` console script.

    Output that cannot be written (a full disk, a terminal gone) ends the command with one
    ``error:`` line and status 2, not a traceback. A reader that went away (``cuaderno list |
    head``) ends it quietly with status 1, as Python's documentation advises for a broken pipe
    (typer does the same for a pipe that breaks while a command writes).
    """
    _escape_what_cannot_be_encoded()
    try:
        try:
            app(prog_name="cuaderno")
        finally:
            sys.stdout.flush()  # what is still buffered fails here, not in the interpreter's shutdown
    except BrokenPipeError:
        _discard_stdout()
        sys.exit(1)
    except OSError as exc:
        _discard_stdout()
        say_error(f"could not write the output: {exc}")
        sys.exit(ERROR_EXIT)

