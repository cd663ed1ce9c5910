"""CPU per journal row with encryption at rest on against off, 1 KB and 100 KB payloads.

Usage: ``python benchmarks/bench_encryption.py [--rounds 15] [--rows 500]``

What is timed, per row, for each payload size, in one process and in interleaved rounds (so
that load coming and going on a shared machine falls on every variant alike), medians over the
rounds:

- ``floor``: what every row costs anyway: the payload encoded as the journal stores it and the
  row stamped (its keyed digest and hash-chain link);
- ``off``: the floor, then the row packed as a store packs it (Zstandard when it pays), and read
  back (unpacked);
- ``on``: ``off`` plus sealing with the run's data key (AES-256-GCM, the row's identity as
  associated data) and opening it again.

Measured at the codec (``cuaderno.journal._crypto``): the stores do not call it yet, so a
step's journal I/O (the same with or without encryption) is not in these figures. The payloads
are English-like text, as a tool result or a model answer.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from cuaderno.events import StepEvent, encode_payload
from cuaderno.journal import _crypto
from cuaderno.journal._compress import pack, unpack

_PROSE = ("The customer asked whether the invoice of last month was paid twice; the ledger shows one "
          "payment and one refund, both on the 14th. ")


def _payload(size: int) -> dict[str, str]:
    text = (_PROSE * (size // len(_PROSE) + 1))[:size]
    return {"result": text}


def _variants(size: int) -> dict[str, Callable[[], object]]:
    payload = _payload(size)
    ev = StepEvent(run_id="bench", step_id="t0001.tool00", phase="result", kind="tool", name="lookup",
                   fingerprint="f" * 64, payload=payload)
    dek = _crypto.new_data_key()

    def floor() -> bytes:
        data = encode_payload(payload)
        ev.stamped(seq=7, created_at=1.0, prev_hash="0" * 32, payload_bytes=data, salt=b"s" * 16)
        return data

    def off() -> object:
        codec, stored = pack(floor())
        return unpack(codec, stored, "bench")

    def on() -> object:
        codec, stored = pack(floor())
        codec, sealed = _crypto.seal_row(dek, "bench", "t0001.tool00", "result", codec, stored)
        codec, stored = _crypto.open_row(dek, "bench", "t0001.tool00", "result", codec, sealed)
        return unpack(codec, stored, "bench")

    return {"floor": floor, "off": off, "on": on}


def _time(fn: Callable[[], object], rows: int) -> float:
    start = time.perf_counter()
    for _ in range(rows):
        fn()
    return (time.perf_counter() - start) / rows * 1e6


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--rows", type=int, default=500)
    args = parser.parse_args()
    print(f"CPU per row, microseconds, median of {args.rounds} interleaved rounds of {args.rows} rows")
    print(f"{'payload':>8}  {'floor':>8}  {'off':>8}  {'on':>8}  {'on/off':>7}  {'(on-off)/row':>12}")
    for size in (1_000, 100_000):
        variants = _variants(size)
        rows = max(20, args.rows if size <= 10_000 else args.rows // 20)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                times[name].append(_time(fn, rows))
        med = {name: statistics.median(values) for name, values in times.items()}
        print(f"{size // 1000:>6}KB  {med['floor']:8.1f}  {med['off']:8.1f}  {med['on']:8.1f}  "
              f"{med['on'] / med['off']:7.2f}  {med['on'] - med['off']:12.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
