"""The old name of forking a run and exporting its journal: both now live in
:mod:`cuaderno.operations` (see :func:`~cuaderno.operations.fork` for what a fork copies and
which points it refuses); this module re-exports them for code that imports them from here."""

from cuaderno.operations import export_lines, fork

__all__ = ["export_lines", "fork"]
