"""Journals: the contract and its backends."""

from cuaderno.journal._anchor import JournalRolledBack
from cuaderno.journal._open import open_journal
from cuaderno.journal.base import EVENT_SCHEMA_VERSION, SCHEMA_VERSION, Checkpointer, SupportsRebuild
from cuaderno.journal.memory import MemoryCheckpointer
from cuaderno.journal.sqlite import SqliteCheckpointer

__all__ = ["EVENT_SCHEMA_VERSION", "SCHEMA_VERSION", "Checkpointer", "JournalRolledBack", "MemoryCheckpointer",
           "SqliteCheckpointer", "SupportsRebuild", "open_journal"]
