"""Durabilidad: resuming a run never pays an inference twice.

Seed 000's scenario, for real:

1. a child process runs ``lee /x``: one model call asks for ``read_file``, the tool runs, and
   the process is SIGKILLed right after the tool's result is committed (crash point ``tool.K7``);
2. a second process, with another gateway object and another connection, resumes the same
   run id: only the final model call happens;
3. a third process resumes the closed run: nothing happens, the final answer is returned.

The table is computed from the fake provider's billing log and the tool's receipt file, both
written by the "outside world", grouped by the pid that caused each line.

Run: ``python examples/propiedades/02_durabilidad.py`` (or ``make demo``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _comun import append_receipt, check, cuaderno_cli, died, entry, example_dir, per_pid, pid_of, read_lines, run_pass

from cuaderno import Agent, FinalStep, ScriptedGateway, Session, SqliteCheckpointer, tool

RUN_ID = "run-1"


def build(workdir: Path) -> tuple[Agent, ScriptedGateway]:
    @tool(idempotent=True)
    def read_file(path: str) -> str:
        """Read a file (here: a fake file system that keeps a receipt of every read)."""
        append_receipt(workdir / "tool_calls.jsonl", {"tool": "read_file", "path": path})
        return f"contents of {path}: 42"

    gateway = ScriptedGateway(
        [ScriptedGateway.call("read_file", path="/x"), ScriptedGateway.text("/x says 42.")],
        billing_log=workdir / "billing.jsonl",
    )
    agent = Agent(instructions="Answer in one sentence.", tools=[read_file])
    return agent, gateway


async def child(workdir: Path) -> None:
    print(f"pid={os.getpid()}", flush=True)
    agent, gateway = build(workdir)
    store = SqliteCheckpointer(workdir / "runs.db")
    async for step in agent.run("read /x", session=Session(RUN_ID, gateway, store)):
        label = "(already closed) " if isinstance(step, FinalStep) and step.replayed else ""
        print(f"  {label}{type(step).__name__} {getattr(step, 'step_id', '')}", flush=True)
        if isinstance(step, FinalStep):
            print(f"  answer: {step.output}", flush=True)
    store.close()


def main() -> int:
    script = str(Path(__file__).resolve())
    with example_dir("cuaderno-durabilidad-") as workdir:
        passes = [run_pass(script, workdir, crash_at="tool.K7:1"), run_pass(script, workdir),
                  run_pass(script, workdir)]
        billed = per_pid(read_lines(workdir / "billing.jsonl"))
        tools = per_pid(read_lines(workdir / "tool_calls.jsonl"))
        store = SqliteCheckpointer(workdir / "runs.db")
        cp = store.checkpoint(RUN_ID)
        store.close()

    print("cuaderno: durability (seed 000). Counts come from the provider's billing log and the tool's receipts.\n")
    notes = ["<- the process dies here", "<- only what had not happened yet happens", "<- a closed run is not reopened"]
    seed_notes = ["<- el proceso muere aquí", "<- solo ocurre lo que no llegó a ocurrir", "<- un run cerrado no se reabre"]
    rows, cells = [], []
    for i, (proc, note) in enumerate(zip(passes, notes, strict=True), start=1):
        pid = pid_of(proc)
        models, tool_calls = billed[pid], tools[pid]
        rows.append((models, tool_calls))
        cells.append((models, tool_calls if i < 3 else None))
        cell = f"model ×{models}" + (f" · tool ×{tool_calls}" if i < 3 else "")
        print(f"pass {i}  {cell:<22} {note}   [{died(proc)}]")
    # Seed 000 names this example and writes its table in Spanish: the same counts, in its words.
    print("\nseed 000's table, in its own words:")
    for i, ((models, tool_calls), note) in enumerate(zip(cells, seed_notes, strict=True), start=1):
        cell = f"modelo ×{models}" + (f" · herramienta ×{tool_calls}" if tool_calls is not None else "")
        print(f"{i}ª vuelta  {cell:<28} {note}")
    print()
    for i, proc in enumerate(passes, start=1):
        print(f"pass {i} output:\n{proc.stdout.rstrip()}")
    assert cp is not None
    print(f"\ncheckpoint: status={cp.status}, model calls journaled={cp.count('model_calls')}, "
          f"sends={cp.count('model_sends')}, possibly billed twice={cp.count('possibly_billed_twice')}, "
          f"tool calls={cp.count('tool_calls')}")
    print(f"provider billing log: {sum(billed.values())} generations billed in all; tool receipts: {sum(tools.values())}")
    if cp.count("possibly_billed_twice"):
        print("(the kill came after the intent of the next model call was committed, so cuaderno cannot know\n"
              " whether that request left: it re-sent it with the same key and counted it; the billing log\n"
              " shows it was in fact billed once.)")
    kept = cuaderno_cli(workdir, "show", RUN_ID)
    if kept:  # only with CUADERNO_KEEP: `make demo` prints exactly the table above
        print(f"\njournal kept; look at it with: {kept}")
    check(passes[0].returncode == -9, "the first pass must die by SIGKILL")
    check(rows == [(1, 1), (1, 0), (0, 0)], f"expected model x1 tool x1 / model x1 tool x0 / model x0, got {rows}")
    check(cp.status == "completed", "the run must end completed")
    return 0


if __name__ == "__main__":
    entry(main, child)
