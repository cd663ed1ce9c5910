"""``cuaderno rekey``: re-wrap every run's data key of a journal encrypted at rest under the
current master key (see :func:`cuaderno.operations.rekey`).

::

    CUADERNO_KEY=NEW CUADERNO_OLD_KEYS=OLD cuaderno --db runs.db rekey
    cuaderno --db runs.db --key-file keys rekey      # the file: the new key first, the old one after
"""

from __future__ import annotations

from typing import Annotated

import typer

from cuaderno import operations
from cuaderno.cli._common import opened, refusals

__all__ = ["rekey_command"]


def rekey_command(
    ctx: typer.Context,
    batch: Annotated[int, typer.Option("--batch", min=1, metavar="N",
                                       help="Runs re-wrapped per transaction.")] = 200,
) -> None:
    """Re-wrap every run's data key under the current master key (the first key of --key-file, or
    CUADERNO_KEY), older keys read from the same file's later lines or CUADERNO_OLD_KEYS. No row is
    rewritten; workers keep running. Killed, it is run again: it goes on from what is left. Drop
    the old key only once it reports nothing left to re-wrap."""
    with refusals(), opened(ctx) as store:
        done = operations.rekey(store, batch=batch)
    typer.echo(f"{done.runs} data key(s) re-wrapped under master key {done.key_id} in {done.batches} batch(es); "
               "every run's key is now wrapped by it")
