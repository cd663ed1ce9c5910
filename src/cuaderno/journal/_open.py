"""Open a journal from a URL: one string names the backend and where its journal lives.

Forms::

    runs.db, /abs/runs.db        a bare path: a SQLite file (what every release before URLs took)
    sqlite:///runs.db            a SQLite file, relative to the working directory
    sqlite:////abs/path/runs.db  a SQLite file, absolute (four slashes: "sqlite://" + "/" + "/abs/...")
    sqlite:///:memory:           a SQLite database in memory
    memory://                    a MemoryCheckpointer (tests; one process, gone when it ends)
    postgresql://USER@HOST/DB    PostgreSQL (also postgres://); libpq's parameters, plus schema=NAME
                                 and compress=on|off (see :class:`~cuaderno.journal.postgres.PostgresCheckpointer`)

The SQLite forms follow SQLAlchemy's, so a URL that works with other tools works here. A SQLite URL
may carry ``mode=ro`` (read only), ``mode=rw`` (an existing journal only) or ``mode=rwc`` (the
default: created if missing), ``synchronous=FULL|NORMAL`` and ``compress=on|off`` (see
:class:`~cuaderno.journal.sqlite.SqliteCheckpointer`); anything else is refused, because a
parameter that was silently ignored (a typo of ``synchronous``) would leave the journal with
durability settings nobody chose.

Backends are imported when a URL names them (DBOS ``SystemDatabase.create`` does the same), so a
program that uses SQLite never imports a Postgres driver.
"""

from __future__ import annotations

import importlib
import os
import re
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, unquote, urlsplit

from cuaderno.errors import JournalError, UsageError
from cuaderno.journal.base import Checkpointer
from cuaderno.journal.keys import KeyProvider, environment_keys

__all__ = ["JournalURL", "open_journal", "parse_journal_url"]

_SQLITE_PARAMS = {"mode": ("ro", "rw", "rwc"), "synchronous": ("FULL", "NORMAL"), "compress": ("on", "off")}
_POSTGRES_SCHEMES = ("postgresql", "postgres")
_LOOKS_LIKE_A_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")
"""Two characters at least, so that a Windows drive (``C:``) stays a path."""


class JournalURL(NamedTuple):
    """A journal URL taken apart (nothing opened yet)."""

    scheme: str
    """``sqlite``, ``memory`` or ``postgresql`` (``postgres`` is read as ``postgresql``)."""
    path: str
    """The SQLite file (or ``:memory:``); empty for the other schemes."""
    params: dict[str, str]
    """The SQLite query parameters, checked; empty for the other schemes."""
    url: str
    """What the caller gave, for messages (a password in it is masked)."""


def parse_journal_url(url: str | os.PathLike[str]) -> JournalURL:
    """Take a journal URL (or a bare SQLite path) apart, refusing anything this cuaderno cannot open.

    Raises:
        UsageError: an unknown scheme, an empty path, a host on a SQLite URL, a query parameter
            that is not one of the scheme's or has a value it does not take; nothing is opened.
    """
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str):
        raise UsageError(f"a journal is named by a URL or a path, got {type(url).__name__}")
    if not url.strip():
        raise UsageError("the journal URL is empty: give a path or a URL such as sqlite:///runs.db")
    if "://" not in url:
        if _LOOKS_LIKE_A_SCHEME.match(url) and url != ":memory:":
            # "sqlite:runs.db", "postgresql:x": a URL missing its "//", not a file anyone meant.
            raise UsageError(f"journal {url!r} looks like a URL without '//' (write sqlite:///runs.db, or ./{url} for "
                             "a file of that name)")
        return JournalURL("sqlite", url, {}, url)  # a bare path, as before URLs
    scheme = url.split("://", 1)[0].lower()
    shown = _masked(url)
    if scheme == "sqlite":
        return _parse_sqlite(url, shown)
    if scheme == "memory":
        if url.split("://", 1)[1]:
            raise UsageError(f"journal URL {shown!r}: memory:// takes no path or parameters (each one is a new, "
                             "empty journal)")
        return JournalURL("memory", "", {}, shown)
    if scheme in _POSTGRES_SCHEMES:
        return JournalURL("postgresql", "", {}, shown)
    raise UsageError(f"journal URL {shown!r}: unknown scheme {scheme + '://'!r}; this cuaderno opens sqlite:///PATH, "
                     "a bare path, memory:// and postgresql://")


def _parse_sqlite(url: str, shown: str) -> JournalURL:
    parts = urlsplit(url)
    if parts.netloc:
        raise UsageError(f"journal URL {shown!r}: a SQLite journal has no host ({parts.netloc!r}); a relative file "
                         "is sqlite:///runs.db, an absolute one sqlite:////abs/path/runs.db")
    if parts.fragment:
        raise UsageError(f"journal URL {shown!r}: a journal URL has no fragment (#{parts.fragment})")
    # "sqlite:///runs.db" splits into path "/runs.db": the first slash ends the (empty) host.
    path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
    if not path:
        raise UsageError(f"journal URL {shown!r} names no file: a relative file is sqlite:///runs.db, an absolute "
                         "one sqlite:////abs/path/runs.db")
    params: dict[str, str] = {}
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise UsageError(f"journal URL {shown!r}: its query {parts.query!r} is not name=value pairs") from None
    for name, value in pairs:
        allowed = _SQLITE_PARAMS.get(name)
        if allowed is None:
            raise UsageError(f"journal URL {shown!r}: unknown parameter {name!r}; a SQLite journal takes "
                             f"{', '.join(sorted(_SQLITE_PARAMS))}")
        if name in params:
            raise UsageError(f"journal URL {shown!r}: parameter {name!r} is given twice")
        if value not in allowed:
            raise UsageError(f"journal URL {shown!r}: {name}={value!r} is not one of {', '.join(allowed)}")
        params[name] = value
    return JournalURL("sqlite", path, params, shown)


def open_journal(url: str | os.PathLike[str], *, create: bool = True, readonly: bool = False,
                 keys: KeyProvider | None = None, accept_rollback: bool = False) -> Checkpointer:
    """Open the journal a URL names (see the module docstring for the forms).

    Args:
        url: a journal URL, or a bare path to a SQLite file.
        create: ``False`` opens only an existing journal (the CLI never creates one).
        readonly: open for reading only; the journal is never changed. A SQLite URL's
            ``mode=ro`` says the same.
        keys: encrypt at rest with this key provider (see :mod:`cuaderno.journal.keys`);
            ``None``: the environment's (``CUADERNO_KEY``, ``CUADERNO_KEY_FILE``) when it names
            one, else none. A memory journal ignores it (nothing of it rests anywhere).
        accept_rollback: open a journal that was rolled back or restored (a SQLite file older than
            the last one this machine saw at its path; a PostgreSQL journal whose tables a
            ``pg_restore`` created anew), which is otherwise refused with
            :class:`~cuaderno.errors.JournalRolledBack`; for saying what happens to its runs
            (:func:`cuaderno.operations.mark_restored`).

    Raises:
        KeyMissing, KeyInvalid: an encrypted journal and no key, or a wrong one; nothing was
            read or written.
        UsageError: a URL this cuaderno cannot open (see :func:`parse_journal_url`), or one
            whose backend is not installed; nothing was opened.
        JournalError: the backend refused to open the journal (a missing file with
            ``create=False``, another application's database, ...); nothing was changed.
    """
    target = parse_journal_url(url)
    if target.scheme == "memory":
        if not create or readonly:  # nothing to read either: a memory journal starts empty every time
            raise JournalError(f"{target.url!r} is a new, empty journal in memory: there is no existing journal to "
                               "open there")
        from cuaderno.journal.memory import MemoryCheckpointer

        return MemoryCheckpointer()
    if keys is None:
        keys = environment_keys()
    if target.scheme == "postgresql":
        return _open_postgres(target, str(url), create=create, readonly=readonly, keys=keys,
                              accept_rollback=accept_rollback)
    from cuaderno.journal.sqlite import SqliteCheckpointer

    mode = target.params.get("mode", "rwc")
    create = create and mode == "rwc"
    if not create and target.path != ":memory:" and not os.path.lexists(target.path):
        # Checked here because sqlite3.connect would create the file before the store refuses it.
        raise JournalError(f"{target.path!r} does not exist: there is no journal there; nothing was created")
    options: dict[str, Any] = {}
    if "synchronous" in target.params:
        options["synchronous"] = target.params["synchronous"]
    if "compress" in target.params:
        options["compress"] = target.params["compress"] == "on"
    return SqliteCheckpointer(target.path, create=create, readonly=readonly or mode == "ro", keys=keys,
                              accept_rollback=accept_rollback, **options)


def _open_postgres(target: JournalURL, url: str, *, create: bool, readonly: bool,
                   keys: KeyProvider | None, accept_rollback: bool) -> Checkpointer:
    """The Postgres backend, imported only now; ``url`` is the caller's, password and all."""
    try:
        module = importlib.import_module("cuaderno.journal.postgres")
    except ModuleNotFoundError as exc:
        raise UsageError(f"journal URL {target.url!r}: the PostgreSQL backend needs {exc.name!r}, which is not "
                         "installed: pip install 'cuaderno[postgres]'") from None
    store: Checkpointer = module.PostgresCheckpointer.from_url(url, create=create, readonly=readonly, keys=keys,
                                                                        accept_rollback=accept_rollback)
    return store


def _masked(url: str) -> str:
    """``url`` with any password replaced by ``***``: URLs end up in error messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return parts._replace(netloc=f"{user}:***@{netloc[1]}").geturl()
