"""Python bytecodes per durable step, by function, this checkout against another tree.

Usage: ``python benchmarks/bench_bytecodes.py --base REV|--base-src PATH [--runs 32] [--turns 10,30] [--top 30]
[--by path|name]``

Why: two trees can execute the same number of machine instructions per step (callgrind,
``bench_instructions.py``) and still differ in CPU time, when one runs more bytecode and less C:
the interpreter's loop misses the L1 data cache and mispredicts its indirect dispatch far more
often per instruction than C code that hashes or copies bytes. A count of the bytecodes each
Python function executes per step shows where the interpreted part of a step grew, and it hardly
moves with the load (nothing is timed): at M=2 and 1 -> 3 turns, ten of eleven counts of one tree were
6,332 bytecodes per step and one 6,442 (not explained yet: branches of the loop that read the
clock are candidates); at M=32, two runs gave 5,739 and 5,741.

How: the runs of ``bench_throughput.py`` (this checkout's driver) on a SQLite journal through
group commit, in a process with the tree's ``src`` on ``PYTHONPATH``; after a warm-up cell,
``sys.settrace`` with ``f_trace_opcodes`` counts every opcode by function (``file:function``)
over two run lengths, and the figure per step is their difference divided by the steps between
them (what one more step costs; a run's fixed cost is reported apart, per run). The tracing
makes the cells some 30 times slower; a cell of 32 runs x 30 turns takes about half a minute.

Measured, ``--base 6c4f382`` against 558e759 (M=32, 10 and 30 turns): 5,123 -> 5,741 bytecodes
per step (+12%), 13,303 -> 17,101 per run; the interpreter's loop accordingly executed 12,300
more instructions per step under callgrind, which fewer instructions of C elsewhere cancelled.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent


def _child(runs: int, turns: list[int]) -> None:
    """Count opcodes by function in one cell per run length; one JSON line on stdout."""
    import asyncio

    sys.path.insert(0, str(BENCH))
    from bench_throughput import drive_runs, open_store

    def cell(n_turns: int, counts: Counter[str] | None) -> int:
        folder = tempfile.mkdtemp(prefix="bench-bytecodes-")
        store = open_store(f"sqlite:///{folder}/j.db", "group")
        cleanup.append(folder)

        def tracer(frame: Any, event: str, arg: Any) -> Any:
            frame.f_trace_opcodes, frame.f_trace_lines = True, False
            code = frame.f_code
            name = code.co_filename.split("/src/")[-1] if "/src/" in code.co_filename else os.path.basename(
                code.co_filename)
            key = f"{name}:{code.co_name}"

            def local(frame: Any, event: str, arg: Any) -> Any:
                if event == "opcode":
                    counts[key] += 1  # type: ignore[index]
                return local

            return local

        if counts is not None:
            sys.settrace(tracer)
        try:
            return asyncio.run(drive_runs(store, [f"r{i}" for i in range(runs)], n_turns))
        finally:
            sys.settrace(None)
            store.close()

    cleanup: list[str] = []
    try:
        cell(5, None)  # imports and first calls
        out = []
        for n_turns in turns:
            counts: Counter[str] = Counter()
            steps = cell(n_turns, counts)
            out.append({"steps": steps, "counts": dict(counts)})
    finally:
        for folder in cleanup:
            shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(out))


def count(src: Path, runs: int, turns: list[int]) -> dict[str, Any]:
    """Per function, bytecodes per step (marginal) of the tree at ``src``; the totals per step and per run."""
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}
    done = subprocess.run([sys.executable, __file__, "--child", "--runs", str(runs), "--turns",
                           ",".join(map(str, turns))], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the tree at {src} failed:\n{done.stderr[-2000:]}")
    short, long = json.loads(done.stdout.splitlines()[-1])
    between = long["steps"] - short["steps"]
    names = set(short["counts"]) | set(long["counts"])
    per_step = {k: (long["counts"].get(k, 0) - short["counts"].get(k, 0)) / between for k in names}
    total = sum(per_step.values())
    fixed = (sum(short["counts"].values()) - total * short["steps"]) / runs
    return {"per_step": total, "per_run": fixed, "functions": per_step}


def _keyed(functions: dict[str, float], by: str) -> dict[str, float]:
    if by == "path":
        return functions
    out: dict[str, float] = {}
    for key, n in functions.items():
        name = key.rsplit(":", 1)[1]
        out[name] = out.get(name, 0.0) + n
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", help="a git revision to compare against")
    ap.add_argument("--base-src", help="or the base tree's src folder itself")
    ap.add_argument("--runs", type=int, default=32)
    ap.add_argument("--turns", default="10,30", help="the two run lengths, comma-separated")
    ap.add_argument("--top", type=int, default=30, help="functions listed, by the size of their difference")
    ap.add_argument("--by", default="path", choices=("path", "name"),
                    help="name: functions of one name summed, so that a function moved to another module cancels")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    turns = [int(t) for t in args.turns.split(",")]
    if args.child:
        _child(args.runs, turns)
        return 0
    report: dict[str, Any] = {"runs": args.runs, "turns": turns, "head": count(ROOT / "src", args.runs, turns)}
    if args.base_src:
        report["base"] = {"rev": args.base_src, **count(Path(args.base_src).resolve(), args.runs, turns)}
    elif args.base:
        with tempfile.TemporaryDirectory() as tree:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", tree, args.base],
                           check=True, capture_output=True)
            try:
                report["base"] = {"rev": args.base, **count(Path(tree) / "src", args.runs, turns)}
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", tree], check=False,
                               capture_output=True)
    head = report["head"]
    print(f"M={args.runs}, {turns[0]} -> {turns[1]} turns: head {head['per_step']:,.0f} bytecodes/step, "
          f"{head['per_run']:,.0f} per run")
    if "base" in report:
        base = report["base"]
        print(f"base {base['rev']}: {base['per_step']:,.0f} bytecodes/step, {base['per_run']:,.0f} per run; "
              f"head/base per step {head['per_step'] / base['per_step']:.3f}")
        b, h = _keyed(base["functions"], args.by), _keyed(head["functions"], args.by)
        print("| base | head | difference | function |\n|---|---|---|---|")
        for k in sorted(set(b) | set(h), key=lambda k: -abs(h.get(k, 0.0) - b.get(k, 0.0)))[:args.top]:
            print(f"| {b.get(k, 0.0):.1f} | {h.get(k, 0.0):.1f} | {h.get(k, 0.0) - b.get(k, 0.0):+.1f} | {k} |")
    else:
        for k, v in sorted(head["functions"].items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"{v:8.1f}  {k}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
