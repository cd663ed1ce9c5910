"""A program that is not cuaderno's runner and keeps cuaderno's promises through the public
protocol alone (``cuaderno.durable``): it opens its run (``open_run``), makes one model call,
then one payment, on a SQLite journal.

Usage: ``python _caller.py JOURNAL BILLING RECEIPTS`` (``CUADERNO_CRASH_AT`` may kill it at a
named point). The fake provider appends one line per request it answers (with the key it was
sent) to BILLING; the fake payment service appends one line per payment it makes to RECEIPTS and
answers lookups from it. Both files are written and synced before the caller hears back: they are
the truth, independent of the journal.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from typing import Any

from cuaderno import RetryPolicy, SqliteCheckpointer
from cuaderno.durable import Effect, ModelCall, open_run
from cuaderno.gateway.base import ModelResponse

RUN = "outside"


def _append(path: str, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _lines(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


async def main(journal: str, billing: str, receipts: str) -> None:
    store = SqliteCheckpointer(journal)
    opened = open_run(store, RUN, task="pay the invoice", task_fingerprint="pay-the-invoice", versions={},
                      tenant="default", owner="outside-caller", start={"caller": "outside"})
    if opened.closed:  # a run that ended answers from its journal: nothing runs again
        store.close()
        return
    log = opened.log

    call = ModelCall(log, "t0000.model", key="req-outside-0", turn=0, fingerprint="request-0")
    answered = call.answered()
    if answered is None:
        async def provider() -> ModelResponse:
            _append(billing, {"key": call.key})  # billed: the provider answered
            return ModelResponse(text="pay 42 to ana")

        sent = await call.send(provider, retry=RetryPolicy(), sleep=asyncio.sleep, rng=random.Random(0))
        call.finish(sent)
        log.commit()

    async def pay(attempt: int) -> dict[str, Any]:
        _append(receipts, {"key": effect.key, "amount": 42})
        return {"paid": 42, "key": effect.key}

    async def lookup(attempt: int) -> dict[str, Any] | None:
        found = [r for r in _lines(receipts) if r["key"] == effect.key]
        return {"paid": found[0]["amount"], "key": effect.key} if found else None

    effect = Effect(log=log, step_id="t0000.tool00", tool="pay", arguments={"to": "ana", "amount": 42},
                    fingerprint=None, key="eff-outside-pay", body=pay, lookup=lookup,
                    retry=RetryPolicy(), sleep=asyncio.sleep)
    if log.get("t0000.tool00", "result") is None:
        await effect.run()
        log.commit()
    opened.finish("paid 42 to ana")
    opened.release()
    store.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
