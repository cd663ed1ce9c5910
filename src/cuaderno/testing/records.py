"""The name tests and examples have always read records with: the fsynced JSON-lines records of
the "outside world" live in :mod:`cuaderno.records` (production code, the scripted gateway's
billing log, writes them, and production code does not import the test machinery)."""

from cuaderno.records import append_synced, read_records

__all__ = ["append_synced", "read_records"]
