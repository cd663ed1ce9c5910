"""The ``cuaderno`` command line: look at runs and decide pending approvals.

::

    cuaderno [--db runs.db] list [--status S] [--limit N] [--json]
    cuaderno [--db runs.db] show RUN [--json] [--no-timeline]
    cuaderno [--db runs.db] approve RUN STEP [--fingerprint FP] [--by NAME] [--reason TEXT]
    cuaderno [--db runs.db] deny RUN STEP [--fingerprint FP] [--by NAME] [--reason TEXT]
    cuaderno [--db runs.db] status RUN [--json]
    cuaderno worker --journal URL --agent module:attr [--concurrency N]

The command line is a client of the public API only: it reads through the
:class:`~cuaderno.journal.base.Checkpointer` (``list_runs``, ``checkpoint``, ``load``) and writes
nothing but what :func:`cuaderno.harness.approve` and :func:`cuaderno.harness.deny` append.

A journal that does not exist is never created: every command needs an existing file. Every
cuaderno error prints one ``error: ...`` line on stderr and exits with status 2, as do usage errors
(an unknown option, a missing argument, a mistyped command: click's three lines are one here). A
long value is cut in that line and its length given. Text the terminal's encoding cannot show
(``PYTHONIOENCODING=ascii``, a run id with an accent) is printed as backslash escapes, never as a
traceback.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version as _package_version
from pathlib import Path
from typing import Annotated, Any, Final, NoReturn

import typer
from rich.console import Console
from typer.core import TyperGroup

# typer 0.29 carries its own copy of click, whose exceptions are not click's; older typers use
# click itself. Either way these are the classes the command group raises.
try:
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
    from typer._click.exceptions import UsageError as ClickUsageError
except ImportError:  # pragma: no cover - typer without a bundled click
    from click.exceptions import ClickException, NoArgsIsHelpError  # type: ignore[assignment]
    from click.exceptions import UsageError as ClickUsageError  # type: ignore[assignment]

import cuaderno.harness as harness
from cuaderno import _cli_render as render
from cuaderno._cli_fork import export_command, fork_command
from cuaderno._cli_temporal import TemporalOption, cancel_on_temporal, decide_on_temporal
from cuaderno._cli_ui import ui_command, ui_passwd_command
from cuaderno._cli_worker import run_state, status_command, worker_command
from cuaderno._json import MAX_DEPTH
from cuaderno.checkpoint import verified
from cuaderno.errors import CuadernoError, RunNotFound, UsageError, clipped, quoted
from cuaderno.journal import open_journal, parse_journal_url
from cuaderno.journal.base import Checkpointer

__all__ = ["ERROR_EXIT", "NOT_FOUND_EXIT", "STATUSES", "USAGE_EXIT", "app", "main"]

USAGE_EXIT: Final = 2
"""The command line itself is wrong (an unknown option or command, a missing argument): click's code."""
NOT_FOUND_EXIT: Final = 3
"""The journal file or the run does not exist."""
ERROR_EXIT: Final = 4
"""The command was refused (a cuaderno error: a damaged journal, a stale decision, a busy run...);
nothing was written."""

DEFAULT_DB: Final = "runs.db"

STATUSES: Final = ("running", "suspended", "completed", "failed", "cancelled", "needs_human")
"""Every status a run can have (``--status`` accepts only these: a typo would list nothing, silently)."""

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
            _say_error(f"{exc.format_message()} (see `{command} --help`)")
            sys.exit(USAGE_EXIT)
        except ClickException as exc:
            _say_error(exc.format_message())
            sys.exit(exc.exit_code)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        # Non-standalone, click returns the code of a typer.Exit, or the command's value (None).
        sys.exit(code if isinstance(code, int) else 0)


def _db_first(args: list[str]) -> list[str]:
    """``--db`` where the group reads it, wherever it was typed: ``cuaderno show run-1 --db x.db``
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
        if arg == "--db" and i + 1 < len(args):
            front += args[i:i + 2]
            i += 2
            continue
        (front if arg.startswith("--db=") else rest).append(arg)
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


@dataclass(frozen=True, slots=True)
class _Options:
    db: str


class _Refused(Exception):
    """A command refused before touching the journal (missing file and the like)."""


class _NotFound(_Refused):
    """The journal file or the run named does not exist."""


@app.callback()
def _root(
    ctx: typer.Context,
    db: Annotated[str, typer.Option("--db", envvar="CUADERNO_DB", metavar="URL",
                                    help="The run journal: a path to an existing SQLite file, or a URL "
                                    "(sqlite:///runs.db, sqlite:////abs/runs.db); never created by this command.")]
    = DEFAULT_DB,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print cuaderno's version and exit.")] = False,
) -> None:
    ctx.obj = _Options(db=db)


# -- plumbing -----------------------------------------------------------------------------------------


def _stdout() -> Console:
    # Built per command so it binds to the current sys.stdout (test runners swap it). No markup,
    # emoji codes or highlighting: journal text is shown as the characters it is.
    return Console(markup=False, emoji=False, highlight=False)


def _say_error(message: str) -> None:
    # One line, and a bounded one: a megabyte run id or option is cut, with its length.
    line = render.clean(clipped(" ".join(message.split())))
    Console(stderr=True, markup=False, emoji=False, highlight=False).print(f"error: {line}", soft_wrap=True)


def _fail(message: str, code: int = ERROR_EXIT) -> NoReturn:
    _say_error(message)
    raise typer.Exit(code)


def _discard_stdout() -> None:
    """Point stdout at the null device once writing to it failed: the interpreter flushes it at
    exit, and the output still buffered would fail again there, reported as an ignored exception."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real stdout (a test runner's, a closed one)
        pass


@contextmanager
def _refusals() -> Iterator[None]:
    """Turn every expected failure into one ``error:`` line (never a traceback) and its exit status:
    :data:`NOT_FOUND_EXIT` for a journal or run that does not exist, :data:`ERROR_EXIT` otherwise."""
    try:
        yield
    except RunNotFound as exc:
        _fail(str(exc) or type(exc).__name__, NOT_FOUND_EXIT)
    except UsageError as exc:  # a value the library refuses as a mistake: the command line's
        _fail(str(exc) or type(exc).__name__, USAGE_EXIT)
    except CuadernoError as exc:
        _fail(str(exc) or type(exc).__name__)
    except _NotFound as exc:
        _fail(str(exc), NOT_FOUND_EXIT)
    except _Refused as exc:
        _fail(str(exc))
    except sqlite3.Error as exc:
        _fail(f"the journal refused the operation: {exc}")
    except BrokenPipeError:
        raise
    except OSError as exc:
        _fail(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))


@contextmanager
def _store(ctx: typer.Context, *, readonly: bool = False) -> Iterator[Checkpointer]:
    """The journal, opened only if it already exists: opening a missing path would create one.
    Commands that only read open it read-only, so they never change the file (not even its
    journal mode)."""
    options: _Options = ctx.obj
    target = parse_journal_url(options.db)
    if target.scheme == "sqlite" and target.path != ":memory:":
        _check_sqlite_file(Path(target.path))
    store = open_journal(options.db, create=False, readonly=readonly)
    try:
        yield store
    finally:
        store.close()


def _check_sqlite_file(path: Path) -> None:
    """Refuse what is certainly not a journal before SQLite touches it."""
    if not path.exists():
        raise _NotFound(f"no journal at {quoted(str(path))}: the file does not exist "
                       "(pass --db PATH or set CUADERNO_DB); nothing was created")
    if path.is_dir():
        raise _Refused(f"{quoted(str(path))} is a directory, not a journal file")
    if path.stat().st_size == 0:
        raise _Refused(f"{quoted(str(path))} is an empty file, not a cuaderno journal; nothing was written")


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, ensure_ascii=True))


# -- commands -----------------------------------------------------------------------------------------


@app.command("list")
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
        _fail(f"--status {quoted(status)} is not a run status; use one of: {', '.join(STATUSES)}", USAGE_EXIT)
    with _refusals(), _store(ctx, readonly=True) as store:
        runs = store.list_runs(status=status, limit=limit)
        states = {cp.run_id: run_state(store, cp) for cp in runs}
    if as_json:
        _print_json([render.run_summary(cp, states.get(cp.run_id)) for cp in runs])
        return
    console = _stdout()
    if not runs:
        console.print("no runs" + (f" with status {render.clean(status)!r}" if status else ""), soft_wrap=True)
        return
    render.render_runs(console, runs, states)


@app.command()
def show(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN", help="The run id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")] = False,
    timeline: Annotated[bool, typer.Option("--timeline/--no-timeline",
                                           help="Show the journal's events in order, checked against the "
                                                "summary (--no-timeline: the stored summary as it is).")] = True,
) -> None:
    """Show one run: status, versions, counters, cost, pending approvals, uncertain effects, outcome, timeline."""
    with _refusals(), _store(ctx, readonly=True) as store:
        cp = store.checkpoint(run)
        if cp is None:
            raise _NotFound(f"no run {quoted(run)} in {quoted(str(ctx.obj.db))}")
        events = None
        if timeline:
            # Read (and hash-check) the whole journal before printing anything, and the summary
            # against it: no half output, and no pending arguments other than the journal's.
            # --no-timeline prints the stored summary as it is (for a journal that no longer
            # checks out); approve and deny check it again before anything is written.
            cp, events = verified(store, run)
        state = run_state(store, cp, events)
    if as_json:
        _print_json(render.run_detail(cp, events, state))
    else:
        render.render_show(_stdout(), cp, events, db=ctx.obj.db, state=state)


_FINGERPRINT_HELP = ("The fingerprint of the arguments you were shown (from `cuaderno show`). The decision is "
                     "refused if the pending call has other arguments. Without it, the call printed here is bound.")


def _normal_fingerprint(fingerprint: str) -> str:
    """``fingerprint`` as the journal writes it: a copy-paste may bring spaces or a newline, and a
    terminal or a person may upper-case the hex. Only the spelling is normalised: a prefix stays a
    prefix, and is refused (the decision must bind exactly the arguments shown)."""
    text = fingerprint.strip()
    return text.lower() if all(ch in "0123456789abcdefABCDEF" for ch in text) else text


def _decide(ctx: typer.Context, run: str, step: str, fingerprint: str | None, by: str | None, reason: str | None,
            *, approved: bool) -> None:
    verb = "approving" if approved else "denying"
    if fingerprint is not None:
        fingerprint = _normal_fingerprint(fingerprint)
        if not fingerprint:  # every fingerprint starts with "": it would be refused as a 0-character prefix
            _fail("--fingerprint is empty: pass the full fingerprint shown by `cuaderno show`, or leave the option "
                  "out to bind the call printed here; nothing was written", USAGE_EXIT)
    console = _stdout()
    with _refusals(), _store(ctx) as store:
        pending = harness.pending_approvals(store, run)  # RunNotFound, RunClosed: nothing written
        step_id = render.approval_step(step)
        entry = pending.get(step_id)
        if entry is not None:
            render.render_pending_call(console, run, step_id, entry, verb)
            if fingerprint is None:
                # Bind the decision to exactly what was just printed.
                fingerprint = entry.get("fingerprint")
        decide = harness.approve if approved else harness.deny
        event = decide(store, run, step, fingerprint=fingerprint, approver=by, reason=reason)
    render.render_decision(console, event)


@app.command()
def approve(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN", help="The run id.")],
    step: Annotated[str, typer.Argument(metavar="STEP", help="The approval step id (t0000.tool00.approval) "
                                                             "or its tool step id (t0000.tool00).")],
    fingerprint: Annotated[str | None, typer.Option("--fingerprint", metavar="FP", help=_FINGERPRINT_HELP)] = None,
    by: Annotated[str | None, typer.Option("--by", metavar="NAME", help="Who decides, for the record.")] = None,
    reason: Annotated[str | None, typer.Option("--reason", metavar="TEXT", help="Why, for the record.")] = None,
    temporal: TemporalOption = None,
) -> None:
    """Approve a pending tool call; a worker (or the next resume) runs it exactly once."""
    if temporal is not None:
        return decide_on_temporal(temporal, run, step, fingerprint, by, reason, approved=True)
    _decide(ctx, run, step, fingerprint, by, reason, approved=True)


@app.command()
def deny(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN", help="The run id.")],
    step: Annotated[str, typer.Argument(metavar="STEP", help="The approval step id (t0000.tool00.approval) "
                                                             "or its tool step id (t0000.tool00).")],
    fingerprint: Annotated[str | None, typer.Option("--fingerprint", metavar="FP", help=_FINGERPRINT_HELP)] = None,
    by: Annotated[str | None, typer.Option("--by", metavar="NAME", help="Who decides, for the record.")] = None,
    reason: Annotated[str | None, typer.Option("--reason", metavar="TEXT", help="Why, for the record.")] = None,
    temporal: TemporalOption = None,
) -> None:
    """Reject a pending tool call; the next resume tells the model it was rejected."""
    if temporal is not None:
        return decide_on_temporal(temporal, run, step, fingerprint, by, reason, approved=False)
    _decide(ctx, run, step, fingerprint, by, reason, approved=False)


@app.command()
def cancel(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN", help="The run id.")],
    reason: Annotated[str, typer.Option("--reason", metavar="TEXT", help="Why, for the record.")] = "",
    by: Annotated[str | None, typer.Option("--by", metavar="NAME", help="Who cancels, for the record.")] = None,
    temporal: TemporalOption = None,
) -> None:
    """Cancel a run: no new step is admitted; what completed and what is uncertain are kept."""
    if temporal is not None:
        return cancel_on_temporal(temporal, run, reason, by)
    from cuaderno.cancellation import cancel as cancel_run

    with _refusals(), _store(ctx) as store:
        # Read first only to word the answer: cancel() is idempotent and decides on its own read.
        before = store.checkpoint(run)
        cp = cancel_run(store, run, reason, by=by)
    if cp.status == "cancelled":
        record = cp.outcome or {}
        done = "was already cancelled (nothing was written)" if before is not None and before.status == "cancelled" \
            else "cancelled"
        typer.echo(f"run {run} {done}: {render.counted(len(record.get('completed') or []), 'effect')} completed, "
                   f"{len(record.get('uncertain') or [])} uncertain, "
                   f"{render.counted(len(record.get('cleanup') or []), 'cleanup action')} scheduled")
    else:
        asked = "was already requested" if before is not None and before.cancel_requested is not None \
            else "requested"
        typer.echo(f"run {run}: cancellation {asked}; the process running it stops before its next step "
                   "(or its next resume finalizes it)")


@app.command()
def resolve(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN", help="The run id.")],
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
        _fail("--result goes only with --happened: --not-happened makes the next resume send the effect again; "
              "nothing was written", USAGE_EXIT)
    if result is not None:
        try:
            value = json.loads(result)
        except json.JSONDecodeError as exc:
            _fail(f"--result is not JSON: {exc}", USAGE_EXIT)
        except RecursionError:  # the parser recurses once per level: a hostile depth overflows it
            _fail(f"--result is nested too deeply (a receipt may nest at most {MAX_DEPTH} levels); "
                  "nothing was written", USAGE_EXIT)
        except ValueError:  # Python refuses to read an integer of more than 4,300 digits
            _fail("--result holds an integer too long to read (more than 4,300 digits); nothing was written", USAGE_EXIT)
    with _refusals(), _store(ctx) as store:
        event = harness.resolve(store, run, step, happened=happened, result=value, by=by, note=note)
        cp = store.checkpoint(run)
    if cp is not None and cp.status in ("completed", "failed", "cancelled"):
        after = f"the run already ended ({cp.status}): nothing is sent"
    else:
        after = "the next resume " + ("goes on" if happened else "sends it again, same effect key")
    typer.echo(f"run {run} step {step}: recorded as {'happened' if happened else 'not happened'} "
               f"(seq {event.seq}); {after}")


@app.command("rebuild-summary")
def rebuild_summary(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(metavar="RUN", help="The run id.")],
    trust_journal: Annotated[bool, typer.Option(
        "--trust-journal", help="Rebuild even if the summary names events the journal does not hold (rows "
        "removed from its end look like that), ends before the journal's last row (nothing proves who wrote the "
        "rows after it) or cannot be read: only for a journal known to be complete and the run's own.")] = False,
) -> None:
    """Rewrite a run's summary from its hash-chained journal, when it no longer matches it."""
    with _refusals(), _store(ctx) as store:
        cp, differed = harness.rebuild_summary(store, run, trust_journal=trust_journal)
    if not differed:
        typer.echo(f"run {run}: its summary matches its journal ({render.counted(cp.last_seq, 'event')}); "
                   "nothing was written")
    else:
        typer.echo(f"run {run}: summary rebuilt from its {render.counted(cp.last_seq, 'journaled event')} "
                   f"({', '.join(differed)} differed); status {cp.status}")


app.command("ui")(ui_command)
app.command("ui-passwd")(ui_passwd_command)
app.command("worker")(worker_command)
app.command("status")(status_command)
app.command("fork")(fork_command)
app.command("export")(export_command)


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
        _say_error(f"could not write the output: {exc}")
        sys.exit(ERROR_EXIT)


if __name__ == "__main__":
    main()
