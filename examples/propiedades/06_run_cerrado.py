"""Un run cerrado no se reabre: resuming a finished run returns what happened, with no call.

A run finishes in one process; two more processes resume it with fresh gateway objects. Each
gets the final answer (``FinalStep(replayed=True)``) and makes zero model and zero tool calls;
the history is not re-emitted as if it were happening. Whoever wants the timeline reads it with
``Checkpointer.load`` (or ``cuaderno show``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _comun import append_receipt, check, cuaderno_cli, entry, example_dir, per_pid, pid_of, read_lines, run_pass

from cuaderno import Agent, FinalStep, ScriptedGateway, Session, SqliteCheckpointer, tool


async def child(workdir: Path) -> None:
    print(f"pid={os.getpid()}", flush=True)

    @tool(idempotent=True)
    def weather(city: str) -> str:
        """Today's weather."""
        append_receipt(workdir / "tool.jsonl", {"city": city})
        return "sol, 21 °C"

    gateway = ScriptedGateway([ScriptedGateway.call("weather", city="Quito"), ScriptedGateway.text("It is sunny.")],
                              billing_log=workdir / "billing.jsonl")
    store = SqliteCheckpointer(workdir / "runs.db")
    agent = Agent(instructions="Answer briefly.", tools=[weather])
    async for step in agent.run("weather in Quito?", session=Session("cerrado", gateway, store)):
        replayed = " (replayed)" if isinstance(step, FinalStep) and step.replayed else ""
        print(f"  {type(step).__name__}{replayed}", flush=True)
    store.close()


def main() -> int:
    script = str(Path(__file__).resolve())
    print("cuaderno: a closed run is not reopened (seed 000)\n")
    with example_dir("cuaderno-closed-") as workdir:
        passes = [run_pass(script, workdir) for _ in range(3)]
        billed = per_pid(read_lines(workdir / "billing.jsonl"))
        tools = per_pid(read_lines(workdir / "tool.jsonl"))
        counts = []
        for i, proc in enumerate(passes, start=1):
            pid = pid_of(proc)
            counts.append((billed[pid], tools[pid]))
            steps = ", ".join(line.strip() for line in proc.stdout.splitlines()[1:])
            print(f"pass {i}: model ×{billed[pid]} · tool ×{tools[pid]}   yields: {steps}")
        store = SqliteCheckpointer(workdir / "runs.db")
        timeline = store.load("cerrado")
        store.close()
        print("\ntimeline (Checkpointer.load):")
        for ev in timeline:
            print(f"  {ev.seq:>2} {ev.step_id:<14} {ev.phase:<7} {ev.kind:<6} {ev.name or ''}")
        check(counts == [(2, 1), (0, 0), (0, 0)], f"unexpected counts {counts}")
        kept = cuaderno_cli(workdir, "show", "cerrado")
        if kept:
            print(f"\njournal kept; the same timeline: {kept}")
    return 0


if __name__ == "__main__":
    entry(main, child)
