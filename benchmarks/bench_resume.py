"""Resume cost against a run's length, and a recovery storm, side by side in one run.

Usage: ``python benchmarks/bench_resume.py [--sizes 100,1000,10000] [--repeats 7]
[--storm 1000] [--resumers 1,32] [--backends sqlite,postgres] [--json out.json]``

**Resume against length.** For each size N, a run of N turns (one tool call each, 400-byte
results, as ``bench_journal.py``) stopped after its last tool result, copied afresh before each
resume (so every resume starts from the same file), resumed in a fresh store object. Three times
per resume, all from the moment the store is opened:

- ``ready``: the loop is ready for its next step (opened, checked, taken over, the tail
  replayed), i.e. it is about to build the next model request;
- ``first call``: the next request is handed to the model, the conversation rebuilt for it (with
  a snapshot: the whole journal read once and checked against the snapshot's chain);
- the same two with snapshots not used (``_snapshots.tail_open`` answering ``None``): the resume
  of before, which reads, checks and replays the whole journal.

Medians over ``--repeats``; ratios against the 100-turn figure of the same mode in the same run.
``tail`` is the rows a resume from the snapshot reads and replays (at most about 256 plus the
rest of a turn, wherever the run stopped): ``ready`` follows it, not the run's length.
The file is built with ``synchronous=NORMAL`` (the bytes are the same, the build is faster); the
resumes use the default ``FULL``. The index a tail read uses was created before the run's first
snapshot; the template's first tail read (its cost reported) is made before the copies.

**Recovery storm** (``tests/crash/_storm.py``): ``--storm`` runs of 8 turns are started in a child
process, each frozen at its own point (a model call in flight, or a transfer applied whose result
is not journaled), and the child is SIGKILLed once every run is frozen. A recovery then resumes
all of them with M concurrent resumers in one process, and the world is checked from records
cuaderno did not write: the transfer service's receipts (one per effect key) and the provider's
billing log (a journaled response never billed again). Runs/s is the number of runs over the
recovery's wall time, from opening the journal to the last run completed; beside it the floor:
the recovery's own number of write transactions (appends, takeovers, releases) as raw synced
commits of one row each on one connection of the same backend, measured right after it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import aclosing
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "crash"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_journal import LoopModel, work_tool

from cuaderno import Agent, Session, SqliteCheckpointer
from cuaderno.loop import _snapshots
from cuaderno.loop._log import RunLog


class StopAfterFirst(Exception):
    pass


async def build(path: str, turns: int) -> None:
    """A run of ``turns`` turns stopped after its last tool result (committed, released)."""
    store = SqliteCheckpointer(path, synchronous="NORMAL")
    agent = Agent(instructions="benchmark", tools=[work_tool("x" * 400)], max_turns=turns + 5)
    model = LoopModel(turns + 5, fail_at=turns)
    try:
        async for _ in agent.run("go", session=Session("r", model, store)):
            pass
    except Exception:  # the model refuses turn ``turns``: everything before it is committed
        pass
    store.close()


async def resume_once(path: str, turns: int, use_snapshots: bool) -> dict[str, float]:
    agent = Agent(instructions="benchmark", tools=[work_tool("x" * 400)], max_turns=turns + 5)
    model = LoopModel(turns + 5)
    marks: dict[str, float] = {}
    saved_conv, saved_tail = RunLog.conversation, _snapshots.tail_open

    def conversation(self: RunLog) -> Any:
        marks.setdefault("ready", time.perf_counter())
        return saved_conv(self)

    RunLog.conversation = conversation  # type: ignore[method-assign]
    if not use_snapshots:
        _snapshots.tail_open = lambda *a, **k: None
    try:
        t0 = time.perf_counter()
        store = SqliteCheckpointer(path)
        try:
            async with aclosing(agent.run("go", session=Session("r", model, store))) as steps:
                async for _ in steps:
                    break  # the first step is the model call: stop there
        finally:
            store.close()
    finally:
        RunLog.conversation, _snapshots.tail_open = saved_conv, saved_tail  # type: ignore[method-assign]
    assert model.calls == 1 and model.first_call_at is not None
    return {"ready": marks["ready"] - t0, "first_call": model.first_call_at - t0}


def _synced(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def resume_table(sizes: list[int], repeats: int, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in sizes:
        template = str(tmp / f"template-{n}.db")
        t0 = time.perf_counter()
        asyncio.run(build(template, n))
        built = time.perf_counter() - t0
        t0 = time.perf_counter()
        with SqliteCheckpointer(template) as s:  # the first tail read of the file
            tail = s.load_tail("r", _snapshots.STEP)
        indexed = time.perf_counter() - t0
        rows = tail.summary.last_seq if tail is not None else 0
        tail_rows = len(tail.events) if tail is not None else rows  # what a resume from the snapshot reads
        figures: dict[str, list[float]] = {"snap_ready": [], "snap_first": [], "full_ready": [], "full_first": []}
        for rep in range(repeats):
            for mode in ("snap", "full"):
                path = str(tmp / f"copy-{n}-{rep}-{mode}.db")
                for suffix in ("", "-wal", "-shm"):
                    if Path(template + suffix).exists():
                        shutil.copyfile(template + suffix, path + suffix)
                        _synced(path + suffix)  # else the resume's first fsync may wait for the copy's pages
                got = asyncio.run(resume_once(path, n, use_snapshots=mode == "snap"))
                figures[f"{mode}_ready"].append(got["ready"])
                figures[f"{mode}_first"].append(got["first_call"])
                for suffix in ("", "-wal", "-shm"):
                    Path(path + suffix).unlink(missing_ok=True)
        out[str(n)] = {"rows": rows, "tail_rows": tail_rows, "build_s": built, "index_s": indexed,
                       **{k: statistics.median(v) for k, v in figures.items()}, "all": figures}
        print(f"  built {n} turns ({rows} rows) in {built:.1f} s; first tail read {indexed * 1e3:.1f} ms", flush=True)
    return out


def print_resume_table(table: dict[str, Any]) -> None:
    sizes = list(table)
    base = table[sizes[0]]
    print(f"\nresume of an N-turn run, medians (ms); x = / the {sizes[0]}-turn figure of the same column")
    print(f"  {'turns':>6} {'rows':>6} {'tail':>5} | {'ready (snapshot)':>18} {'first call':>16} | {'ready (whole)':>18} "
          f"{'first call':>16}")
    for n in sizes:
        r = table[n]
        cells = []
        for key in ("snap_ready", "snap_first", "full_ready", "full_first"):
            cells.append(f"{r[key] * 1e3:8.1f} ({r[key] / base[key]:5.2f}x)")
        print(f"  {n:>6} {r['rows']:>6} {r['tail_rows']:>5} | {cells[0]:>18} {cells[1]:>16} | {cells[2]:>18} {cells[3]:>16}")
    last = table[sizes[-1]]
    print(f"  ready, {sizes[-1]} turns from a snapshot / {sizes[0]} turns: {last['snap_ready'] / base['snap_ready']:.2f}x "
          f"(goal: within 2x); from the whole journal: {last['full_ready'] / base['full_ready']:.1f}x")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--storm", type=int, default=1000, help="runs in the recovery storm (0: no storm)")
    ap.add_argument("--resumers", default="1,32")
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.sizes:
            table = resume_table([int(s) for s in args.sizes.split(",")], args.repeats, Path(tmp))
            print_resume_table(table)
            result["resume"] = table
        if args.storm:
            import _storm

            result["storm"] = []
            print(f"\nrecovery storm: {args.storm} runs of {_storm.TURNS} turns frozen and SIGKILLed, then recovered")
            print(f"  {'backend':<9} {'M':>3} {'runs/s':>8} {'wall s':>7} {'commits':>8} {'floor runs/s':>12} "
                  f"{'x floor':>7} {'completed':>9} {'dup receipts':>12} {'rebilled journaled':>18} "
                  f"{'re-sent in flight':>17} {'reconciled':>10}")
            for backend in args.backends.split(","):
                for m in (int(x) for x in args.resumers.split(",")):
                    got = _storm.storm(Path(tmp) / f"storm-{backend}-{m}", backend, args.storm, m)
                    result["storm"].append(got)
                    print(f"  {backend:<9} {m:>3} {got['runs_per_s']:>8.1f} {got['wall_s']:>7.1f} "
                          f"{got['commits']:>8} {got['floor_runs_per_s']:>12.1f} {got['x_floor']:>7.2f} "
                          f"{got['completed']:>9} {got['duplicate_receipts']:>12} {got['rebilled_journaled']:>18} "
                          f"{got['resent_in_flight']:>17} {got['reconciled']:>10}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
