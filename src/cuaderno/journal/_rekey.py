"""Rotating the master key of a journal encrypted at rest: every run's data key re-wrapped under
the provider's current master key (:func:`~._crypto.rewrap`); no row is touched, nor any
offloaded blob's chunk (sealed with the run's data key, which re-wrapping does not change).

Resumable by construction: each batch is its own transaction and selects only the runs whose
key is still wrapped by another master key, so a kill at any point leaves every data key wrapped
by one key or the other (an ``UPDATE`` of one row is atomic, and both unwrap to the same data
key), and the next run goes on from what is left. Writers keep working meanwhile: a worker
given the new key as current and the old one as older (``CUADERNO_KEY``, ``CUADERNO_OLD_KEYS``)
reads a run's key in either form. The old master key can be dropped once ``rekey`` reports
nothing left.

Crash points (``cuaderno.faults``): ``rekey.K0`` before the first batch, ``rekey.K1`` a batch
re-wrapped and not committed, ``rekey.K2`` a batch committed, ``rekey.K3`` every key done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cuaderno import faults
from cuaderno.errors import UsageError
from cuaderno.journal._crypto import rewrap
from cuaderno.journal._sql_write import SqlWriter

__all__ = ["Rekeyed", "rekey_journal"]

# Whole statements per parameter style (no SQL built from strings, R12).
_STATEMENTS = {
    "?": ("SELECT run_id, key_id, wrapped FROM cuaderno_keys WHERE key_id <> ? ORDER BY run_id LIMIT ?",
          "UPDATE cuaderno_keys SET key_id=?, wrapped=? WHERE run_id=? AND key_id=?"),
    "%s": ("SELECT run_id, key_id, wrapped FROM cuaderno_keys WHERE key_id <> %s ORDER BY run_id LIMIT %s "
           "FOR UPDATE SKIP LOCKED",
           "UPDATE cuaderno_keys SET key_id=%s, wrapped=%s WHERE run_id=%s AND key_id=%s"),
}


@dataclass(frozen=True)
class Rekeyed:
    """What :func:`rekey_journal` did.

    Attributes:
        key_id: the master key every data key is now wrapped by.
        runs: data keys this call re-wrapped.
        batches: transactions it committed.
    """

    key_id: str
    runs: int
    batches: int


def rekey_journal(store: Any, *, batch: int = 200) -> Rekeyed:
    """Re-wrap every run's data key under the store's current master key (see the module).

    Raises:
        UsageError: a store not opened with keys, or a bad ``batch``.
        KeyInvalid: a data key wrapped by a master key the provider no longer holds (nothing of
            that batch was written; the batches before it stay done).
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise UsageError("batch must be a positive number of runs")
    if not isinstance(store, SqlWriter) or store._sealer is None:
        raise UsageError("rekey needs a SQLite or PostgreSQL journal opened with its keys (keys=, CUADERNO_KEY, "
                         "--key-file)")
    sealer = store._sealer
    current = sealer.keys.current()
    select, update = _STATEMENTS[sealer.paramstyle]
    runs = batches = 0
    faults.point("rekey.K0")
    while True:
        with store._reading("*"), store._txn() as db:
            store._schema_of(db)
            rows = db.execute(select, (current.key_id, batch)).fetchall()
            for run_id, key_id, wrapped in rows:
                new_id, new_blob = rewrap(sealer.keys, run_id, (str(key_id), bytes(wrapped)))
                db.execute(update, (new_id, new_blob, run_id, key_id))
            if rows:
                faults.point("rekey.K1")  # the batch re-wrapped, before COMMIT
        if not rows:
            break
        runs += len(rows)
        batches += 1
        faults.point("rekey.K2")  # the batch committed
    faults.point("rekey.K3")
    return Rekeyed(current.key_id, runs, batches)
