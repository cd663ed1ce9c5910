"""The random-kill loop, the same for cuaderno's wrapper and for the peer: runs of N transfers,
each SIGKILLed from outside at a random moment of a run, again and again, until it completes;
then the outside truth is counted (receipts per transfer, billed requests per conversation
position, keys sent)."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _pyd_runs import Runner
from _servers import Provider, Receipts

from cuaderno import SqliteCheckpointer


def outside_truth(billed: list[dict[str, Any]], paid: list[dict[str, Any]]) -> dict[str, int]:
    """What the fake services saw, whoever the client: transfers made more than once (same key),
    model requests billed more than once for one position of the conversation (the number of tool
    results it held: the scripted agent asks one question per position), requests that carried an
    idempotency key."""
    keys = Counter(r["key"] for r in paid)
    positions = Counter(b["tool_results"] for b in billed)
    return {"duplicated": sum(n - 1 for n in keys.values()),
            "duplicated_runs": int(any(n > 1 for n in keys.values())),
            "rebilled": sum(n - 1 for n in positions.values()),
            "billed": len(billed), "keyed": sum(1 for b in billed if b.get("key")), "transfers": len(keys)}


def soak(runner: Runner, provider: Provider, receipts: Receipts, tmp: Path, *, program: str, label: str, runs: int,
         transfers: int, seed: int, max_kills: int = 8, kind: str = "lookup") -> dict[str, Any]:
    """``runs`` runs of ``transfers`` transfers each under ``program`` (``cuaderno`` or ``dbos``;
    ``kind``: how ``_program.py`` runs it, ``run_stream`` or ``iter`` for those shapes), each killed at random moments up to ``max_kills`` times, then let run to its end. For cuaderno
    the journal is read too: every request billed more than once must be one it counted
    (``unknowingly`` stays 0)."""
    rng = random.Random(seed)
    prompt = "PAY: " + json.dumps([["transfer", f"p{i}", i + 1] for i in range(transfers)])
    totals: dict[str, Any] = {"program": program, "ack_delay": receipts.ack_delay, "runs": runs, "kills": 0,
                              "needs_human": 0, "unfinished": 0, "duplicated": 0, "duplicated_runs": 0,
                              "rebilled": 0, "billed": 0, "keyed": 0, "counted": 0, "unknowingly": 0}
    spans = []
    for i in range(3):  # how long a whole run takes here (the quickest of three): the kills land inside it
        probe = f"{label}-probe{i}"
        t0 = time.monotonic()
        clean = runner.run(tmp / f"{probe}.db", provider.base_url(probe), receipts.base_url(probe), "probe", prompt,
                           program=program, kind=kind)
        spans.append(time.monotonic() - t0)
        assert clean.status == "completed", clean
    span = min(spans)
    for n in range(runs):
        name = f"{label}-{n}"
        db = tmp / f"{name}.db"
        for attempt in range(max_kills + 1):
            ran = runner.run(db, provider.base_url(name), receipts.base_url(name), f"pay-{n}", prompt,
                             program=program, kind=kind,
                             kill_after=rng.uniform(0.0, span) if attempt < max_kills else None)
            if ran.killed:
                totals["kills"] += 1
                continue
            if ran.status == "needs_human":
                totals["needs_human"] += 1
            break
        else:
            totals["unfinished"] += 1
        truth = outside_truth(provider.billing(name), receipts.receipts(name))
        for k in ("duplicated", "duplicated_runs", "rebilled", "billed", "keyed"):
            totals[k] += truth[k]
        if program == "cuaderno":
            with SqliteCheckpointer(db, readonly=True) as store:
                events = store.load(f"pay-{n}")
            sends = {e.payload["key"]: e.payload["sends"] for e in events if e.kind == "model" and e.phase == "result"}
            per_key = Counter(b["key"] for b in provider.billing(name))
            totals["counted"] += sum(s - 1 for s in sends.values())
            totals["unknowingly"] += sum(max(0, c - sends.get(k, 1)) for k, c in per_key.items())
    return totals
