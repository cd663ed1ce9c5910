"""A recovery storm: N runs killed mid-flight in one process, recovered by M concurrent resumers.

``python _storm.py crash --url URL --dir DIR --runs N`` is the process that is killed: it starts
the N runs of :data:`TURNS` turns on one journal, each of which freezes at its own point, and
writes ``DIR/frozen`` once all of them are frozen; the supervisor (:func:`storm`) SIGKILLs it
then. The freeze points, by run number ``i``:

- ``sent``: a model request handed to the provider, not billed (the intent committed);
- ``billed``: a model request billed, its answer not returned (re-sent on resume with the same
  key: the provider here bills every request, so this one is billed twice, and the journal
  counts it as possibly billed twice);
- ``applied``: a transfer the service applied (its receipt written), its result not journaled:
  the resume must find it through the tool's lookup and not transfer again.

Ground truth comes from records cuaderno does not write: the transfer service's receipts
(``DIR/receipts.jsonl``, one line per applied transfer, keyed by effect key) and the provider's
billing log (``DIR/billing.jsonl``, one line per billed request, keyed by idempotency key).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from cuaderno import Agent, ScriptedGateway, Session, ToolContext, UncertainEffect, open_journal, tool
from cuaderno.gateway.base import ModelRequest, ModelResponse

TURNS = 8
"""Model turns of every run: TURNS - 1 transfers, then the answer."""
POINTS = ("sent", "billed", "applied")


def freeze_of(i: int) -> tuple[int, str]:
    """Run ``i``'s freeze point: the turn (1..TURNS-2) and what is in flight."""
    return 1 + i % (TURNS - 2), POINTS[(i // (TURNS - 2)) % len(POINTS)]


def run_id(i: int) -> str:
    return f"storm-{i:05d}"


def _append(path: Path, record: dict[str, Any]) -> None:
    """One line, one write(2) with O_APPEND: whole lines from any process, and on disk for every
    other process as soon as it returns (a killed process loses nothing it wrote)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class World:
    """The storm's agent, provider and transfer service, in the directory ``work``."""

    def __init__(self, work: Path, phase: str, runs: int) -> None:
        self.work = work
        self.phase = phase
        self.receipts = work / "receipts.jsonl"
        self.billing = work / "billing.jsonl"
        self.frozen = 0
        self.runs = runs
        self._seen: dict[str, Any] = {}
        self._offset = 0
        world = self

        def lookup(ctx: ToolContext, arguments: dict[str, Any]) -> Any:
            return world.receipt(ctx.effect_key)

        @tool(idempotent=False, lookup=lookup)
        async def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
            """Move money; the service keeps a receipt of every transfer it applies."""
            value = {"to": to, "amount": amount}
            _append(world.receipts, {"key": ctx.effect_key, "run": ctx.run_id, "value": value,
                                     "phase": world.phase})
            turn, point = world.point(ctx.run_id)
            if point == "applied" and to == f"acct{turn}":
                await world.freeze()
            return value

        self.agent = Agent(instructions="storm", tools=[transfer], max_turns=TURNS + 2)

    def point(self, rid: str) -> tuple[int, str | None]:
        if self.phase != "crash":
            return -1, None
        return freeze_of(int(rid.rsplit("-", 1)[1]))

    def receipt(self, key: str) -> Any:
        """The service's answer to "did you apply ``key``?" (reads receipts added since last time)."""
        with open(self.receipts, "rb") if self.receipts.exists() else open(os.devnull, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        whole = data[:data.rfind(b"\n") + 1]
        self._offset += len(whole)
        for line in whole.decode().splitlines():
            rec = json.loads(line)
            self._seen.setdefault(rec["key"], rec["value"])
        return self._seen.get(key)

    async def freeze(self) -> None:
        self.frozen += 1
        if self.frozen == self.runs:
            (self.work / "frozen").write_text("ok")
        await asyncio.Event().wait()  # until the process is killed

    async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
        """The provider: bills every request it answers (it ignores idempotency keys)."""
        rid = str(request.messages[0]["content"]).removeprefix("task ")
        turn = sum(1 for m in request.messages if m.get("role") == "assistant")
        at, point = self.point(rid)
        if turn == at and point == "sent":
            await self.freeze()
        _append(self.billing, {"key": idempotency_key, "run": rid, "turn": turn, "phase": self.phase,
                               "frozen": turn == at and point == "billed"})
        if turn == at and point == "billed":
            await self.freeze()
        if turn >= TURNS - 1:
            return ScriptedGateway.text(f"done {rid}")
        return ScriptedGateway.call("transfer", call_id=f"c{turn}", to=f"acct{turn}", amount=10 + turn)


async def _crash_phase(url: str, work: Path, runs: int) -> None:
    world = World(work, "crash", runs)
    store = open_journal(url)

    async def one(i: int) -> None:
        async for _ in world.agent.run(f"task {run_id(i)}", session=Session(run_id(i), world, store)):
            pass

    await asyncio.gather(*(one(i) for i in range(runs)))


async def recover(url: str, work: Path, runs: int, resumers: int) -> dict[str, Any]:
    """Resume every open run with ``resumers`` concurrent loops on one store; returns counts."""
    world = World(work, "recover", runs)
    t0 = time.perf_counter()
    store = open_journal(url)
    writes = Counter[str]()
    for name in ("append", "acquire", "release"):  # every write transaction of the recovery
        setattr(store, name, _counted(getattr(store, name), name, writes))
    todo = [cp.run_id for cp in store.list_runs(status="running", limit=runs * 2)]
    queue: asyncio.Queue[str] = asyncio.Queue()
    for rid in todo:
        queue.put_nowait(rid)
    outcomes: Counter[str] = Counter()

    async def resumer() -> None:
        while not queue.empty():
            rid = queue.get_nowait()
            try:
                async for _ in world.agent.run(f"task {rid}", session=Session(rid, world, store)):
                    pass
                outcomes["completed"] += 1
            except UncertainEffect:
                outcomes["needs_human"] += 1

    await asyncio.gather(*(resumer() for _ in range(resumers)))
    wall = time.perf_counter() - t0
    statuses: Counter[str] = Counter()
    reconciled = 0
    for i in range(runs):
        cp = store.checkpoint(run_id(i))
        assert cp is not None
        statuses[cp.status] += 1
        reconciled += cp.count("reconciled")  # transfers found applied by the lookup, not sent again
    store.close()
    return {"found": len(todo), "wall_s": wall, "runs_per_s": len(todo) / wall, "statuses": dict(statuses),
            "reconciled": reconciled, "commits": sum(writes.values()), **outcomes}


def _counted(fn: Any, name: str, writes: Counter[str]) -> Any:
    def counted(*args: Any, **kwargs: Any) -> Any:
        writes[name] += 1
        return fn(*args, **kwargs)

    return counted


def commit_floor(url: str, commits: int) -> float:
    """Seconds for ``commits`` raw synced commits of one 400-byte row each, on one connection of
    the same backend (plain ``sqlite3`` in WAL with ``synchronous=FULL``; ``psycopg`` with
    ``synchronous_commit=on``): what the recovery's write transactions cost at the least."""
    row = b"x" * 400
    if url.startswith("sqlite"):
        import sqlite3

        path = url.removeprefix("sqlite:///") + ".floor"
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("CREATE TABLE IF NOT EXISTS floor (x BLOB)")
            t0 = time.perf_counter()
            for _ in range(commits):
                db.execute("BEGIN IMMEDIATE")
                db.execute("INSERT INTO floor VALUES (?)", (row,))
                db.execute("COMMIT")
            return time.perf_counter() - t0
        finally:
            db.close()
    import psycopg
    from psycopg import sql

    base, _, schema = url.partition("?schema=")
    with psycopg.connect(base) as conn:
        # An ordinary table in the storm's schema: a temporary one is not WAL-logged, and its
        # commits would not wait for a flush.
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.execute("SET synchronous_commit TO on")
        conn.execute("CREATE TABLE floor (x bytea)")
        conn.commit()
        t0 = time.perf_counter()
        for _ in range(commits):
            conn.execute("INSERT INTO floor VALUES (%s)", (row,))
            conn.commit()
        return time.perf_counter() - t0


def check_world(work: Path, runs: int) -> dict[str, int]:
    """What the service and the provider recorded, against what must hold."""
    receipts = Counter(r["key"] for r in _lines(work / "receipts.jsonl"))
    bills = _lines(work / "billing.jsonl")
    by_key: dict[str, list[dict[str, Any]]] = {}
    for b in bills:
        by_key.setdefault(b["key"], []).append(b)
    rebilled_journaled = resent = 0
    for lines in by_key.values():
        if len(lines) > 1:
            # Billed more than once: allowed only for a request whose answer never reached the
            # journal (frozen after billing, the process killed), sent once more on resume.
            if len(lines) == 2 and lines[0]["frozen"] and lines[0]["phase"] == "crash":
                resent += 1
            else:
                rebilled_journaled += len(lines) - 1
    return {"receipt_keys": len(receipts), "duplicate_receipts": sum(n - 1 for n in receipts.values()),
            "transfers_expected": runs * (TURNS - 1), "billed_keys": len(by_key),
            "rebilled_journaled": rebilled_journaled, "resent_in_flight": resent}


def storm(work: Path, backend: str, runs: int, resumers: int, timeout: float = 1800,
          floor: bool = True) -> dict[str, Any]:
    """Kill ``runs`` frozen runs in a child process, recover them with ``resumers`` loops (and,
    with ``floor``, measure :func:`commit_floor` for as many commits as the recovery made)."""
    work.mkdir(parents=True, exist_ok=True)
    if backend == "sqlite":
        url = f"sqlite:///{(work / 'runs.db').resolve()}"
    else:
        import uuid

        from _pg import PG_URL

        url = f"{PG_URL}?schema=storm_{uuid.uuid4().hex[:12]}"
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    with open(work / "child.err", "wb") as err:
        child = subprocess.Popen([sys.executable, __file__, "crash", "--url", url, "--dir", str(work), "--runs",
                                  str(runs)], env=env, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + timeout
    try:
        while not (work / "frozen").exists():
            if child.poll() is not None:
                raise AssertionError(f"the storm's child exited ({child.returncode}): "
                                     f"{(work / 'child.err').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError("the storm's runs did not all freeze in time")
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    try:
        got = asyncio.run(recover(url, work, runs, resumers))
        if floor:
            spent = commit_floor(url, int(got["commits"]))  # measured right after, on the same machine
            got.update(floor_s=spent, floor_runs_per_s=runs / spent, x_floor=spent / got["wall_s"])
    finally:
        if backend != "sqlite":
            from _pg import drop_schemas

            drop_schemas([url.rsplit("=", 1)[1]])
    return {"backend": backend, "runs": runs, "resumers": resumers, **got, **check_world(work, runs)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=["crash"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--runs", type=int, required=True)
    args = ap.parse_args()
    asyncio.run(_crash_phase(args.url, Path(args.dir), args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
