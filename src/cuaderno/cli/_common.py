"""What every command of the command line shares: exit statuses, the one refusal helper, the
journal opened only if it exists, and the console.

Every refusal goes through :func:`fail`: one ``error: ...`` line on stderr (cut if long, control
characters escaped) and an exit status, :func:`exit_code` choosing it from the exception refused.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, NoReturn, TypeVar

import typer
from rich.console import Console

from cuaderno.errors import CuadernoError, RunNotFound, UsageError, clipped, quoted
from cuaderno.journal import open_journal, parse_journal_url
from cuaderno.journal.base import Checkpointer
from cuaderno.journal.keys import KeyProvider, environment_keys, file_keys
from cuaderno.operations import STATUSES
from cuaderno.render import clean

__all__ = ["DEFAULT_DB", "ERROR_EXIT", "NOT_FOUND_EXIT", "STATUSES", "USAGE_EXIT", "ByOption", "NotFound", "Options",
           "LinesJsonOption", "ReasonOption", "Refused", "RunArg",
           "check_sqlite_file", "exit_code", "fail", "normal_fingerprint", "opened", "print_json", "print_listing",
           "refusals",
           "say_error", "stdout"]

RunArg = Annotated[str, typer.Argument(metavar="RUN", help="The run id.")]
"""The run a command acts on (every command that takes one names it the same way)."""
ByOption = Annotated[str | None, typer.Option("--by", metavar="NAME", help="Who decides, for the record.")]
LinesJsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of lines.")]
ReasonOption = Annotated[str | None, typer.Option("--reason", metavar="TEXT", help="Why, for the record.")]

USAGE_EXIT: Final = 2
"""The command line itself is wrong (an unknown option or command, a missing argument): click's code."""
NOT_FOUND_EXIT: Final = 3
"""The journal file or the run does not exist."""
ERROR_EXIT: Final = 4
"""The command was refused (a cuaderno error: a damaged journal, a stale decision, a busy run...);
nothing was written."""

DEFAULT_DB: Final = "runs.db"



@dataclass(frozen=True, slots=True)
class Options:
    """What the command group's own options say (``ctx.obj``)."""

    db: str
    key_file: str | None = None
    """``--key-file``: the master keys of an encrypted journal (else the environment's)."""

    def keys(self) -> KeyProvider | None:
        """The key provider ``--key-file`` names, or the environment's (``None``: none).

        Raises:
            KeyMissing, KeyInvalid: the file is missing, holds no key, or others can read it.
        """
        return file_keys(self.key_file) if self.key_file else environment_keys()


class Refused(Exception):
    """A command refused before touching the journal (missing file and the like)."""


class NotFound(Refused):
    """The journal file or the run named does not exist."""


def stdout() -> Console:
    """The console for a command's output."""
    # Built per command so it binds to the current sys.stdout (test runners swap it). No markup,
    # emoji codes or highlighting: journal text is shown as the characters it is.
    return Console(markup=False, emoji=False, highlight=False)


def say_error(message: str) -> None:
    """Print ``message`` as the one ``error:`` line on stderr."""
    # One line, and a bounded one: a megabyte run id or option is cut, with its length.
    line = clean(clipped(" ".join(message.split())))
    Console(stderr=True, markup=False, emoji=False, highlight=False).print(f"error: {line}", soft_wrap=True)


def exit_code(exc: BaseException | None) -> int:
    """The exit status of a command refused for ``exc``: :data:`NOT_FOUND_EXIT` for a journal or run
    that does not exist, :data:`USAGE_EXIT` for a value the library refuses as a mistake
    (:class:`~cuaderno.errors.UsageError`), :data:`ERROR_EXIT` otherwise."""
    if isinstance(exc, (RunNotFound, NotFound)):
        return NOT_FOUND_EXIT
    if isinstance(exc, UsageError):
        return USAGE_EXIT
    return ERROR_EXIT


def fail(message: str, code: int = ERROR_EXIT) -> NoReturn:
    """Refuse: one ``error:`` line, then exit with ``code``."""
    say_error(message)
    raise typer.Exit(code)


@contextmanager
def refusals() -> Iterator[None]:
    """Turn every expected failure into one ``error:`` line (never a traceback) and its exit status
    (:func:`exit_code`)."""
    try:
        yield
    except (CuadernoError, Refused) as exc:
        fail(str(exc) or type(exc).__name__, exit_code(exc))
    except sqlite3.Error as exc:
        fail(f"the journal refused the operation: {exc}")
    except BrokenPipeError:
        raise
    except OSError as exc:
        fail(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))


@contextmanager
def opened(ctx: typer.Context, *, readonly: bool = False, accept_rollback: bool = False) -> Iterator[Checkpointer]:
    """The journal, opened only if it already exists: opening a missing path would create one.
    Commands that only read open it read-only, so they never change the file (not even its
    journal mode). ``accept_rollback``: a journal restored from a dump opens (for the command
    that says what happens to its runs)."""
    options: Options = ctx.obj
    target = parse_journal_url(options.db)
    if target.scheme == "sqlite" and target.path != ":memory:":
        check_sqlite_file(Path(target.path))
    journal = open_journal(options.db, create=False, readonly=readonly, keys=options.keys(),
                           accept_rollback=accept_rollback)
    try:
        yield journal
    finally:
        journal.close()


def check_sqlite_file(path: Path) -> None:
    """Refuse what is certainly not a journal before SQLite touches it."""
    if not path.exists():
        raise NotFound(f"no journal at {quoted(str(path))}: the file does not exist "
                       "(pass --db PATH or set CUADERNO_DB); nothing was created")
    if path.is_dir():
        raise Refused(f"{quoted(str(path))} is a directory, not a journal file")
    if path.stat().st_size == 0:
        raise Refused(f"{quoted(str(path))} is an empty file, not a cuaderno journal; nothing was written")


def print_json(value: Any) -> None:
    """``value`` as indented ASCII JSON on stdout."""
    typer.echo(json.dumps(value, indent=2, ensure_ascii=True))


_Found = TypeVar("_Found")


def print_listing(ctx: typer.Context, read: Callable[[Checkpointer], _Found], *, as_json: bool,
                  jsonable: Callable[[_Found], Any], lines: Callable[[_Found], Iterable[str]]) -> None:
    """A listing command's whole body: what ``read`` finds in the journal (opened read-only),
    printed as JSON (:func:`print_json` of ``jsonable(found)``) or one line an item."""
    with refusals(), opened(ctx, readonly=True) as store:
        found = read(store)
    if as_json:
        print_json(jsonable(found))
        return
    out = stdout()
    for line in lines(found):
        out.print(line, soft_wrap=True)


def normal_fingerprint(fingerprint: str) -> str:
    """``fingerprint`` as the journal writes it: a copy-paste may bring spaces or a newline, and a
    terminal or a person may upper-case the hex. Only the spelling is normalised: a prefix stays a
    prefix, and is refused (the decision must bind exactly the arguments shown)."""
    text = fingerprint.strip()
    return text.lower() if all(ch in "0123456789abcdefABCDEF" for ch in text) else text
