"""Peak memory of ``cuaderno ui`` while several people open a long run's whole timeline.

Usage: ``python benchmarks/ui_show_all.py [--steps 10000] [--clients 8] [--query steps=all]``

Builds a journal holding one run of ``--steps`` tool steps (an intent and a result each, as a
real tool call journals them), starts ``cuaderno ui`` on it in a subprocess (as a person starts
it), sends ``--clients`` GETs of ``/run?id=long&QUERY`` at once, and prints the server's peak
resident memory (``VmHWM`` of ``/proc/PID/status``: the kernel's own high-water mark, so no
sampling can miss the peak), its memory before the requests, the bytes of each page and the
wall time. Run it on a quiet machine; the figures are one machine's, not a promise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from cuaderno import SqliteCheckpointer, StepEvent


def build(db: Path, steps: int) -> None:
    """One run, ``long``, of ``steps`` tool steps, appended in batches (one transaction each)."""
    with SqliteCheckpointer(db) as store:
        store.append([StepEvent(run_id="long", step_id="run", phase="start", kind="run", fingerprint="f",
                                payload={"task": "read every invoice", "versions": {"schema": 1, "loop": "1"}})])
        batch: list[StepEvent] = []
        for i in range(steps):
            step = f"t{i:05d}.tool00"
            args = {"path": f"invoices/2026/{i:05d}.txt", "note": "x" * 200}
            batch += [StepEvent(run_id="long", step_id=step, phase="intent", kind="tool", name="read_file",
                                decision="allow", fingerprint=f"fp{i}", payload={"effect_key": f"k{i}", "arguments": args}),
                      StepEvent(run_id="long", step_id=step, phase="result", kind="tool", name="read_file",
                                decision="allow", fingerprint=f"fp{i}",
                                payload={"effect_key": f"k{i}", "result": "contents " * 40})]
            if len(batch) >= 2000:
                store.append(batch)
                batch = []
        if batch:
            store.append(batch)


def memory_kb(pid: int, field: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) if match else 0


def fetch(url: str) -> tuple[int, int, float]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as reply:
        body = reply.read()
        return reply.status, len(body), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--query", default="steps=all")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "runs.db"
        started = time.perf_counter()
        build(db, args.steps)
        print(f"journal: {args.steps} steps, {db.stat().st_size / 1e6:.1f} MB, built in "
              f"{time.perf_counter() - started:.1f} s")
        proc = subprocess.Popen([sys.executable, "-m", "cuaderno", "--db", str(db), "ui", "--port", "0"],
                                stderr=subprocess.PIPE, text=True, env=os.environ.copy())
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline()
            match = re.search(r"http://127\.0\.0\.1:\d+/", line)
            assert match, line
            base = match.group(0)
            idle = memory_kb(proc.pid, "VmRSS")
            url = f"{base}run?id=long&{args.query}"
            started = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
                replies = list(pool.map(fetch, [url] * args.clients))
            wall = time.perf_counter() - started
            peak = memory_kb(proc.pid, "VmHWM")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    sizes = sorted({size for _, size, _ in replies})
    print(f"{args.clients} concurrent GET /run?id=long&{args.query}: statuses {sorted({s for s, _, _ in replies})}, "
          f"page bytes {sizes}, slowest {max(t for _, _, t in replies):.1f} s, wall {wall:.1f} s")
    print(f"server RSS before: {idle / 1024:.0f} MB; peak (VmHWM): {peak / 1024:.0f} MB")


if __name__ == "__main__":
    main()
