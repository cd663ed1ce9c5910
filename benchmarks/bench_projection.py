"""The checkpoint projection's cost per event: a 1000-turn journal's events folded by ``rebuild``.

Usage: ``python benchmarks/bench_projection.py JOURNAL.sqlite [--turns 1000] [--repeats 15]
[--against OTHER/checkpoint.py]``

Builds the journal at ``JOURNAL.sqlite`` if it does not exist (a run of ``--turns`` turns, one tool
call each, as ``bench_journal.py``), loads its events once, decodes every payload (so the figure is
the projection's own work, not JSON decoding), then times :func:`cuaderno.checkpoint.rebuild` over
them ``--repeats`` times and prints the median in microseconds per event.

``--against`` loads another version of ``checkpoint.py`` (say, ``git show HEAD~1:src/cuaderno/
checkpoint.py > /tmp/before.py``) beside this one, in the same process, and times the two in
turns over the same event objects (``before, after, before, after...``): on a shared machine,
load that comes and goes then falls on both alike, which two separate runs do not ensure.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuaderno import SqliteCheckpointer
from cuaderno.checkpoint import rebuild


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("journal")
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--against", help="another checkpoint.py to time in turns with this one")
    args = parser.parse_args()
    if not os.path.exists(args.journal):
        from bench_journal import run_agent

        store = SqliteCheckpointer(args.journal, synchronous="NORMAL")
        asyncio.run(run_agent(store, args.turns))
        store.close()
    store = SqliteCheckpointer(args.journal)
    events = store.load("bench")
    store.close()
    for ev in events:
        ev.payload  # noqa: B018 - decode once, outside the timed part
    folds = {"this": rebuild}
    if args.against:
        spec = importlib.util.spec_from_file_location("checkpoint_against", args.against)
        assert spec is not None and spec.loader is not None
        other = sys.modules["checkpoint_against"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
        folds = {"against": other.rebuild, "this": rebuild}
    for fold in folds.values():  # both must fold to the same summary
        assert fold("bench", events).to_json() == rebuild("bench", events).to_json()
    times: dict[str, list[float]] = {name: [] for name in folds}
    for _ in range(args.repeats):
        for name, fold in folds.items():
            t0 = time.perf_counter()
            fold("bench", events)
            times[name].append(time.perf_counter() - t0)
    for name, took in times.items():
        print(f"{name}: {len(events)} events, median of {args.repeats}: "
              f"{statistics.median(took) / len(events) * 1e6:.3f} us/event (min {min(took) / len(events) * 1e6:.3f})")
    if args.against:
        ratio = statistics.median(times["this"]) / statistics.median(times["against"])
        print(f"this / against (medians): {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
