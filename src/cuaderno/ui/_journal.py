"""The journal a ``--journal`` value names, opened only if it exists (no web stack needed: the
``fork`` and ``export`` commands open journals the same way)."""

from __future__ import annotations

from pathlib import Path

from cuaderno.errors import UsageError
from cuaderno.journal.keys import KeyProvider, environment_keys
from cuaderno.journal.sqlite import SqliteCheckpointer

__all__ = ["journal_path", "open_journal"]


def journal_path(url: str | Path) -> Path:
    """The SQLite file a ``--journal`` value names: a path, or ``sqlite:///relative/path`` and
    ``sqlite:////absolute/path`` (SQLAlchemy's spelling). Other schemes are refused for now.

    Raises:
        UsageError: a URL of another scheme, or an empty path.
    """
    text = str(url)
    if "://" in text:
        scheme, _, rest = text.partition("://")
        if scheme != "sqlite":
            raise UsageError(f"journal {text!r}: only SQLite journals (a path or sqlite:///path) are supported "
                             f"today, not {scheme!r}")
        if not rest.startswith("/") or rest == "/":
            raise UsageError(f"journal {text!r}: write sqlite:///relative/path or sqlite:////absolute/path")
        text = rest[1:]
    if not text:
        raise UsageError("the journal path is empty")
    return Path(text)


def open_journal(url: str | Path, *, readonly: bool, keys: KeyProvider | None = None) -> SqliteCheckpointer:
    """The journal, opened only if it already exists (opening a missing path would create one);
    with ``keys`` (else the environment's, :func:`~cuaderno.journal.keys.environment_keys`) when it
    is encrypted at rest.

    Raises:
        UsageError: no such file, a directory, an empty file; JournalError: not a journal;
        KeyMissing, KeyInvalid: an encrypted journal and no key, or a wrong one.
    """
    path = journal_path(url)
    if not path.exists():
        raise UsageError(f"no journal at {str(path)!r}: the file does not exist; nothing was created")
    if path.is_dir():
        raise UsageError(f"{str(path)!r} is a directory, not a journal file")
    if path.stat().st_size == 0:
        raise UsageError(f"{str(path)!r} is an empty file, not a cuaderno journal; nothing was written")
    return SqliteCheckpointer(path, create=False, readonly=readonly, keys=keys or environment_keys())
