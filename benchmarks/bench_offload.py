"""Large payloads: what writing and reading a run with one large tool result costs with the payload
offloaded to the blob table (``json+blob``) against kept in its row (the threshold raised past it),
and offloaded in a journal encrypted at rest (``offload+sealed``: the run's blob keyed and sealed
chunk by chunk under its data key, ``json+blob+aesgcm``).

Usage: ``python benchmarks/bench_offload.py [--size 20000000] [--repeats 5] [--pg URL] [--processes]``

``--processes``: each mode once more in a child process of its own (one append and one load of
the payload, nothing else), reporting the kernel's figures for it (``os.wait4``): CPU seconds
(user + system) and peak RSS, so plain and encrypted offload are compared in the same run.

Each repeat, on a fresh journal per mode: one ``append`` of a run start, one of a tool result of
``--size`` characters of hex text (it compresses to about half, as real data would), then one
``load`` of the run (the chain checked, the blob read back chunk by chunk). The floor, in the
same run: encoding the same payload to its JSON bytes once (what every mode must do anyway).
Reported: medians in milliseconds, and the journal's size on disk (SQLite) per mode.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cuaderno import open_journal
from cuaderno.events import StepEvent, encode_payload
from cuaderno.journal.keys import StaticKeys, master_key

MODES = ("inline", "offload", "offload+sealed")
_KEY = master_key(os.urandom(32))


def _events(run_id: str, data: str) -> tuple[StepEvent, StepEvent]:
    start = StepEvent(run_id=run_id, step_id="run", phase="start", kind="run", payload={"task": "bench"})
    result = StepEvent(run_id=run_id, step_id="t0000.tool00", phase="result", kind="tool", name="fetch",
                       fingerprint="f", payload={"outcome": "ok", "result": {"data": data}})
    return start, result


def _once(url: str, data: str, mode: str) -> tuple[float, float]:
    store: Any = open_journal(url, keys=StaticKeys(_KEY) if mode == "offload+sealed" else None)
    store.max_payload = 2 * len(data) + 1_000_000
    store.offload_above = 1024 * 1024 if mode != "inline" else 10 * len(data)
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
    parser.add_argument("--pg", default=None, help="a PostgreSQL URL with ?schema=NAME (NAME_<mode> schemas, dropped by you)")
    parser.add_argument("--processes", action="store_true", help="CPU and peak RSS per mode, a child each")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "URL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    data = os.urandom(args.size // 2).hex()
    if args.child:
        global _KEY
        _KEY = master_key(base64.b64decode(os.environ["BENCH_KEY"]))
        print(*_once(args.child[1], data, args.child[0]))
        return
    floor = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        encode_payload({"outcome": "ok", "result": {"data": data}})
        floor.append((time.perf_counter() - t) * 1000)
    print(f"payload {len(data):,} chars; floor (encode once): {statistics.median(floor):.1f} ms")
    with tempfile.TemporaryDirectory() as tmp:
        backends = [("sqlite", lambda mode, i: str(Path(tmp) / f"{mode}-{i}.db"))]
        if args.pg:
            # A schema per mode: an encrypted journal refuses a store without its key.
            backends.append(("postgres", lambda mode, i: args.pg + "_" + mode.replace("+", "_").replace("-", "_")))
        for name, url_of in backends:
            for mode in MODES:
                appends, loads = [], []
                for i in range(args.repeats):
                    a, b = _once(url_of(f"{mode}-r", i), data, mode)
                    appends.append(a)
                    loads.append(b)
                size = ""
                if name == "sqlite":
                    path = url_of(f"{mode}-r", 0)
                    size = f", file {sum(os.path.getsize(path + s) for s in ('', '-wal') if os.path.exists(path + s)) / 1e6:.1f} MB"
                print(f"{name:8} {mode:14} append {statistics.median(appends):7.1f} ms, "
                      f"load {statistics.median(loads):7.1f} ms{size}")
            if args.processes:
                for mode in MODES:
                    print(f"{name:8} {mode:14} {_in_child(mode, url_of(f'{mode}-p', 0), args.size)}")


def _in_child(mode: str, url: str, size: int) -> str:
    """One append and one load of the payload in a child process: its CPU and peak RSS."""
    env = {**os.environ, "BENCH_KEY": base64.b64encode(_KEY.secret).decode()}
    proc = subprocess.Popen([sys.executable, __file__, "--size", str(size), "--child", mode, url], env=env,
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    out = proc.stdout.read().decode().split()
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    assert status == 0, status
    return (f"child: append {float(out[0]):7.1f} ms, load {float(out[1]):7.1f} ms, "
            f"CPU {usage.ru_utime + usage.ru_stime:5.2f} s, peak RSS {usage.ru_maxrss / 1024:6.1f} MB")


if __name__ == "__main__":
    main()
