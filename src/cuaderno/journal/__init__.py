"""Journals: the contract and its backends."""

from cuaderno.journal.base import SCHEMA_VERSION, Checkpointer
from cuaderno.journal.memory import MemoryCheckpointer
from cuaderno.journal.sqlite import SqliteCheckpointer

__all__ = ["SCHEMA_VERSION", "Checkpointer", "MemoryCheckpointer", "SqliteCheckpointer"]
