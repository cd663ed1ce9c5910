"""Large payloads: what writing and reading a run with one large tool result costs with the payload
offloaded to the blob table (``json+blob``) against kept in its row (the threshold raised past it).

Usage: ``python benchmarks/bench_offload.py [--size 20000000] [--repeats 5] [--pg URL]``

Each repeat, on a fresh journal per mode: one ``append`` of a run start, one of a tool result of
``--size`` characters of hex text (it compresses to about half, as real data would), then one
``load`` of the run (the chain checked, the blob read back chunk by chunk). The floor, in the
same run: encoding the same payload to its JSON bytes once (what every mode must do anyway).
Reported: medians in milliseconds, and the journal's size on disk (SQLite) per mode.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cuaderno import open_journal
from cuaderno.events import StepEvent, encode_payload


def _events(run_id: str, data: str) -> tuple[StepEvent, StepEvent]:
    start = StepEvent(run_id=run_id, step_id="run", phase="start", kind="run", payload={"task": "bench"})
    result = StepEvent(run_id=run_id, step_id="t0000.tool00", phase="result", kind="tool", name="fetch",
                       fingerprint="f", payload={"outcome": "ok", "result": {"data": data}})
    return start, result


def _once(url: str, data: str, offload: bool) -> tuple[float, float]:
    store: Any = open_journal(url)
    store.max_payload = 2 * len(data) + 1_000_000
    store.offload_above = 1024 * 1024 if offload else 10 * len(data)
    try:
        run_id = f"bench-{uuid.uuid4().hex[:8]}"
        start, result = _events(run_id, data)
        store.append([start])
        t0 = time.perf_counter()
        store.append([result])
        t1 = time.perf_counter()
        events = store.load(run_id)
        assert len(events[1].encoded_payload()) > len(data)
        t2 = time.perf_counter()
        return (t1 - t0) * 1000, (t2 - t1) * 1000
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=20_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pg", default=None, help="a PostgreSQL URL with ?schema=... (dropped by you)")
    args = parser.parse_args()
    data = os.urandom(args.size // 2).hex()
    floor = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        encode_payload({"outcome": "ok", "result": {"data": data}})
        floor.append((time.perf_counter() - t) * 1000)
    print(f"payload {len(data):,} chars; floor (encode once): {statistics.median(floor):.1f} ms")
    with tempfile.TemporaryDirectory() as tmp:
        backends = [("sqlite", lambda mode, i: str(Path(tmp) / f"{mode}-{i}.db"))]
        if args.pg:
            backends.append(("postgres", lambda mode, i: args.pg))
        for name, url_of in backends:
            for mode in ("inline", "offload"):
                appends, loads = [], []
                for i in range(args.repeats):
                    a, b = _once(url_of(mode, i), data, mode == "offload")
                    appends.append(a)
                    loads.append(b)
                size = ""
                if name == "sqlite":
                    path = url_of(mode, 0)
                    size = f", file {sum(os.path.getsize(path + s) for s in ('', '-wal') if os.path.exists(path + s)) / 1e6:.1f} MB"
                print(f"{name:8} {mode:7} append {statistics.median(appends):7.1f} ms, "
                      f"load {statistics.median(loads):7.1f} ms{size}")


if __name__ == "__main__":
    main()
