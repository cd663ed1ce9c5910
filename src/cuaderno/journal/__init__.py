"""Journals: the contract and its backends."""

from typing import TYPE_CHECKING, Any

from cuaderno.journal._anchor import JournalRolledBack
from cuaderno.journal._open import open_journal
from cuaderno.journal.base import EVENT_SCHEMA_VERSION, SCHEMA_VERSION, Checkpointer, SupportsRebuild
from cuaderno.journal.memory import MemoryCheckpointer
from cuaderno.journal.sqlite import SqliteCheckpointer

if TYPE_CHECKING:
    from cuaderno.journal.postgres import PostgresCheckpointer

__all__ = ["EVENT_SCHEMA_VERSION", "SCHEMA_VERSION", "Checkpointer", "JournalRolledBack", "MemoryCheckpointer",
           "PostgresCheckpointer", "SqliteCheckpointer", "SupportsRebuild", "open_journal"]


def __getattr__(name: str) -> Any:
    # Imported when asked for: a program that uses SQLite never imports a Postgres driver.
    if name == "PostgresCheckpointer":
        from cuaderno.journal.postgres import PostgresCheckpointer

        return PostgresCheckpointer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
