"""Record the golden journals: ``python tests/golden/make_golden.py [--check | --force]``.

Writes, for the current journal schema version N (``cuaderno.journal.base.SCHEMA_VERSION``):

- ``journals/<program>.vN.jsonl``: each program of ``golden_programs.py`` run to completion on a fresh
  SQLite journal, exported as JSON lines: a header line (cuaderno version, schema version, the
  agent's versions, the final answer, the final checkpoint without its fencing epoch), then one
  line per event with every :class:`~cuaderno.events.StepEvent` field, the payload as JSON;
- ``journals/schema_vN.sqlite``: one whole SQLite journal file as this version writes it, with a
  run suspended waiting for a person (payments), a run stopped mid-way by a permanent model error
  (research) and a completed run (support); checkpointed into a single self-contained file
  (``journal_mode=DELETE``, no ``-wal``).

Everything is deterministic except the ``created_at`` timestamps (and, in the SQLite file, the
``updated_at`` column). Files of other schema versions are never touched: they are the histories
older releases wrote. Existing files of the current version are not overwritten without
``--force``, because re-recording a fixture hides a replay break instead of reporting it.
``--check`` records into a temporary directory and compares with the committed files.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from golden_programs import PROGRAM_BY_RUN_ID, PROGRAMS, Program, World, checkpoint_json, drive  # noqa: E402

from cuaderno import (  # noqa: E402
    ErrorClass,
    FinalStep,
    GatewayError,
    ModelGateway,
    ModelRequest,
    ModelResponse,
    SqliteCheckpointer,
    StepEvent,
    __version__,
)
from cuaderno.journal.base import SCHEMA_VERSION  # noqa: E402

JOURNALS = HERE / "journals"
FORMAT = "cuaderno-golden-journal"


def jsonl_name(program: Program, schema: int = SCHEMA_VERSION) -> str:
    return f"{program.name}.v{schema}.jsonl"


def sqlite_name(schema: int = SCHEMA_VERSION) -> str:
    return f"schema_v{schema}.sqlite"


def event_record(ev: StepEvent) -> dict[str, Any]:
    """Every field of one event, the payload as a JSON object."""
    return {"seq": ev.seq, "run_id": ev.run_id, "step_id": ev.step_id, "phase": ev.phase, "kind": ev.kind,
            "name": ev.name, "decision": ev.decision, "fingerprint": ev.fingerprint, "codec": ev.codec,
            "row_hash": ev.row_hash, "created_at": ev.created_at, "payload": ev.payload,
            "salt": ev.salt.hex() if ev.salt is not None else None}


def event_from_record(rec: dict[str, Any]) -> StepEvent:
    """The event as it was appended (``seq``, ``created_at`` and ``row_hash`` are assigned on write),
    with its recorded digest key, so that an import reproduces the recorded chain: a record
    without one (schemas 1 and 2) is stamped as version 1 (``b""``)."""
    ev = StepEvent(run_id=rec["run_id"], step_id=rec["step_id"], phase=rec["phase"], kind=rec["kind"],
                   name=rec["name"], decision=rec["decision"], fingerprint=rec["fingerprint"],
                   payload=rec["payload"], codec=rec["codec"])
    ev.salt = bytes.fromhex(rec["salt"]) if rec.get("salt") else b""
    return ev


def read_jsonl(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(header, event records)`` of a golden journal file."""
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    header, events = lines[0], lines[1:]
    if header.get("format") != FORMAT:
        raise ValueError(f"{path} is not a golden journal (no {FORMAT!r} header)")
    return header, events


async def record_program(program: Program, path: Path) -> str:
    """Run ``program`` to completion on a fresh journal at ``path``; its golden JSON lines."""
    world = World()
    agent = program.agent(world)
    with SqliteCheckpointer(path) as store:
        steps = await drive(program, agent, store, program.gateway())
        events = store.load(program.run_id)
        cp = store.checkpoint(program.run_id)
    final = steps[-1]
    assert isinstance(final, FinalStep) and final.output == program.final_text
    header = {"format": FORMAT, "cuaderno": __version__, "schema_version": SCHEMA_VERSION, "program": program.name,
              "run_id": program.run_id, "task": program.task, "versions": agent.versions(),
              "covers": list(program.covers), "events": len(events), "final_output": final.output,
              "tool_executions": world.steps, "checkpoint": checkpoint_json(cp)}
    lines = [header, *(event_record(ev) for ev in events)]
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)


class _FailsPermanentlyAt:
    """Wraps a gateway; every request at one position fails with a permanent error (a revoked key)."""

    def __init__(self, inner: ModelGateway, position: int) -> None:
        self.inner, self.position = inner, position

    async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
        if sum(1 for m in request.messages if m.get("role") == "assistant") == self.position:
            raise GatewayError("401: the API key was revoked", error_class=ErrorClass.PERMANENT, sent=True,
                               status=401)
        return await self.inner.complete(request, idempotency_key=idempotency_key)


async def record_sqlite(path: Path) -> None:
    """One journal file holding a suspended run, a run stopped by an error, and a completed run."""
    payments, research, support = (PROGRAM_BY_RUN_ID[f"golden-{n}"] for n in ("payments", "research", "support"))
    with SqliteCheckpointer(path) as store:
        steps = [s async for s in payments.agent(World()).run(
            payments.task, session=payments.session(store, payments.gateway()))]
        assert store.checkpoint(payments.run_id).status == "suspended", steps  # type: ignore[union-attr]
        try:
            await drive(research, research.agent(World()), store, _FailsPermanentlyAt(research.gateway(), 3))
        except GatewayError:
            pass
        else:
            raise AssertionError("the research run was expected to stop on the permanent error")
        assert store.checkpoint(research.run_id).status == "running"  # type: ignore[union-attr]
        await drive(support, support.agent(World()), store, support.gateway())
    with closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        mode = db.execute("PRAGMA journal_mode=DELETE").fetchone()[0]
        assert mode == "delete", mode
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    for suffix in ("-wal", "-shm", "-journal"):
        assert not Path(f"{path}{suffix}").exists(), f"{path}{suffix} left behind"


def sqlite_content(path: Path) -> list[Any]:
    """A SQLite journal's rows without the wall-clock and process columns (for ``--check``), nor
    the rows' digest keys and hashes, random since schema 4 (the summaries without their head)."""
    uri = f"file:{path}?mode=ro&immutable=1"
    with closing(sqlite3.connect(uri, uri=True)) as db:
        meta = db.execute("SELECT key, value FROM cuaderno_meta ORDER BY key").fetchall()
        events = db.execute("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload "
                            "FROM cuaderno_events ORDER BY run_id, seq").fetchall()
        runs = db.execute("SELECT run_id, status, epoch, checkpoint FROM cuaderno_runs ORDER BY run_id").fetchall()
    return [meta, events, [(*r[:3], _headless(json.loads(r[3]))) for r in runs]]


def _headless(checkpoint: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in checkpoint.items() if k != "last_hash"}


def _strip_times(text: str) -> list[dict[str, Any]]:
    """A recording without its timestamps, nor (since schema 4) its random digest keys and the
    hashes that depend on them."""
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    for row in rows:
        row.pop("created_at", None)
        row.pop("salt", None)
        row.pop("row_hash", None)
        if isinstance(row.get("checkpoint"), dict):
            row["checkpoint"] = _headless(row["checkpoint"])
    return rows


async def record_all(out: Path) -> dict[str, Path]:
    """Record every fixture of the current schema version into ``out``; their paths by file name."""
    written: dict[str, Path] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for program in PROGRAMS:
            text = await record_program(program, Path(tmp) / f"{program.name}.sqlite")
            target = out / jsonl_name(program)
            target.write_text(text, encoding="utf-8")
            written[target.name] = target
        db = Path(tmp) / "journal.sqlite"
        await record_sqlite(db)
        target = out / sqlite_name()
        target.write_bytes(db.read_bytes())
        written[target.name] = target
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="re-record into a temporary directory and compare")
    mode.add_argument("--force", action="store_true", help="overwrite this schema version's committed fixtures")
    args = parser.parse_args(argv)
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            fresh = asyncio.run(record_all(Path(tmp)))
            problems = []
            for name, path in sorted(fresh.items()):
                committed = JOURNALS / name
                if not committed.exists():
                    problems.append(f"{name}: not committed")
                elif name.endswith(".jsonl"):
                    if _strip_times(committed.read_text("utf-8")) != _strip_times(path.read_text("utf-8")):
                        problems.append(f"{name}: differs from a fresh recording (timestamps ignored)")
                elif sqlite_content(committed) != sqlite_content(path):
                    problems.append(f"{name}: differs from a fresh recording (timestamps ignored)")
        for p in problems:
            print(p)
        print(f"{len(fresh) - len(problems)}/{len(fresh)} fixtures of schema v{SCHEMA_VERSION} are reproducible")
        return 1 if problems else 0
    JOURNALS.mkdir(exist_ok=True)
    targets = [JOURNALS / jsonl_name(p) for p in PROGRAMS] + [JOURNALS / sqlite_name()]
    existing = [t.name for t in targets if t.exists()]
    if existing and not args.force:
        print(f"refusing to overwrite committed fixtures {existing}: a golden journal is a history that the current "
              "code must keep replaying. Add a new program, or bump SCHEMA_VERSION; --force re-records them.",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        fresh = asyncio.run(record_all(Path(tmp)))
        for name, path in sorted(fresh.items()):
            (JOURNALS / name).write_bytes(path.read_bytes())
            print(f"wrote {JOURNALS / name} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
