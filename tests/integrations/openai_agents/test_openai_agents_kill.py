"""Kill tests of ``DurableRunner`` under a real OpenAI Agents SDK agent, with the truth outside
cuaderno: the fake provider's billing file (every request it answered, with the key it carried)
and the receipts server's database (every transfer and notification it recorded; it never
deduplicates).

Each case runs the agent (``_oai_agent.py``: five transfers in four model turns, parallel tool
calls, an effect-free read, a notification with no lookup, a structured final answer) in a child
process that SIGKILLs itself at a named point, then resumes it in new processes until it ends.
``needs_human`` is settled the way a person would, from the receipts server, with ``resolve``.
Then, against the outside records: 0 duplicated receipts, every model request keyed, 0 re-billed
journaled calls (a step billed again only after a kill in flight, and then counted by the journal
as possibly billed twice), and ``needs_human`` only for the notification (the one effect whose
fate nothing can tell).

Default: a kill in flight of a model call, of a transfer and of the notification, and one inside
a journal write, plus the late-ack server (6 cases, ~25 s of CPU). ``CUADERNO_SOAK=1``: every hit of every named
point, and random-moment kills, also with a receipts server that acks 250 ms after recording.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _oai_harness import HERE, SRC, ProviderProcess, outcome, run_agent, truth
from _report import record

from cuaderno import SqliteCheckpointer, harness
from cuaderno.testing.ledger import LedgerProcess, read_receipts

SOAK = bool(os.environ.get("CUADERNO_SOAK"))
FINAL = {"transfers": 5, "total": 150}
FIGURES = Path(os.environ.get("CUADERNO_OAI_FIGURES", HERE.parents[2] / ".pytest_cache" / "oai-kill-figures.jsonl"))

# One hit of each kind of point, chosen to land on each kind of step: a transfer (lookup), the
# effect-free read, the notification (no lookup), the model calls, the final record and journal
# writes. Hits count per process from 1 (tool.K2:4 is the balance read, tool.K2:7 the notify).
# K1 and K6 are inside the journal's transaction of an intent or a result (the journal log passes
# them as the runner's does).
DEFAULT_POINTS = ["model.K2:2", "tool.K4:5", "tool.K2:7", "append.W1:9", "model.K1:3", "model.K6:2", "tool.K1:5",
                  "tool.K6:5"]
SOAK_POINTS = ([f"model.K{k}:{n}" for k in (0, 1, 2, 5, 6, 7) for n in range(1, 6)]
               + [f"tool.K{k}:{n}" for k in (0, 1, 2, 5, 6, 7) for n in range(1, 8)]
               + [f"tool.K{k}:{n}" for k in (3, 4) for n in range(1, 7)]
               + ["final.K0", "final.K7"] + [f"append.W{w}:{n}" for w in (1, 2) for n in range(1, 25)])


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("oai-kill")
    with ProviderProcess(d / "billing.jsonl") as provider, LedgerProcess(d / "ledger.db", mode="nodedup") as ledger, \
            LedgerProcess(d / "slow.db", mode="nodedup", delay_reply=0.25) as slow:
        yield {"dir": d, "provider": provider, "ledger": ledger, "slow": slow}


def _settle_by_hand(journal: Path, run_id: str, step: str, ledger_db: Path) -> bool:
    """What a person does with ``needs_human``: look in the receiving system, then resolve."""
    store = SqliteCheckpointer(journal)
    try:
        cp = store.checkpoint(run_id)
        assert cp is not None and step in cp.uncertain, (step, cp and cp.uncertain)
        key = cp.uncertain[step]["effect_key"]
        found = [r for r in read_receipts(ledger_db) if r["key"] == key]
        harness.resolve(store, run_id, step, happened=bool(found), result=found[0] if found else None,
                        by="test", note="checked the receipts server")
        return bool(found)
    finally:
        store.close()


def play(world: dict[str, Any], ledger: LedgerProcess, name: str, crash_at: str | None,
         kill_after: float | None = None, model_turn: int | None = None, stream: str = "") -> dict[str, Any]:
    """One case: a kill (at ``crash_at``, or by the parent after ``kill_after`` seconds), then
    resumes until the run ends; returns its figures after checking them against the truth.
    ``model_turn``: the fake provider kills the first process in that model call's flight.
    ``stream``: ``"first"`` runs the killed process through ``run_streamed``, ``"resume"`` the
    resumes (a run may be driven either way, step by step)."""
    first_env = {"OAI_STREAM": "1"} if stream == "first" else {}
    resume_env = {"OAI_STREAM": "1"} if stream == "resume" else None
    d: Path = world["dir"]
    provider: ProviderProcess = world["provider"]
    journal, run_id = d / f"{name}.db", f"run-{name}"
    kills = 0
    if kill_after is not None:
        env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{HERE}"}
        env.pop("CUADERNO_CRASH_AT", None)
        child = subprocess.Popen([sys.executable, str(HERE / "_oai_agent.py"), str(journal), provider.url, ledger.url,
                                  run_id], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        time.sleep(kill_after)
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            kills += 1
        out_s, err_s = child.communicate(timeout=60)
        first = outcome(subprocess.CompletedProcess(child.args, child.returncode, out_s, err_s))
    else:
        kill_env = {"OAI_KILL_AT_TURN": str(model_turn)} if model_turn is not None else {}
        first = outcome(run_agent(journal, provider.url, ledger.url, run_id, crash_at=crash_at,
                                  extra_env={**kill_env, **first_env}))
        kills += first["status"] == "killed"
    out, uncertain = first, []
    for _ in range(6):
        if out["status"] == "completed":
            break
        if out["status"] == "needs_human":
            uncertain.append(out["step"])
            _settle_by_hand(journal, run_id, out["step"], ledger.db_path)
        assert out["status"] in ("killed", "needs_human"), out
        out = outcome(run_agent(journal, provider.url, ledger.url, run_id, extra_env=resume_env))
    assert out == {"status": "completed", "final": FINAL, "replayed": False} or \
        (out["status"] == "completed" and out["final"] == FINAL), out
    t = truth(journal, run_id, ledger.db_path, provider.bills())
    point = crash_at or (f"provider kills in model turn {model_turn}" if model_turn is not None
                         else f"random {kill_after or 0:.2f}s")
    figures = {"test": "openai_agents_kill", "case": name, "point": point,
               "kind": (crash_at or ("provider" if model_turn is not None else "random")).split(".")[0], "kills": kills, "duplicated": t.duplicated,
               "receipts": t.receipts, "billed": t.billed, "rebilled_journaled": t.rebilled_journaled,
               "rebilled_in_flight": t.rebilled_in_flight, "counted_twice": t.counted_twice, "unkeyed": t.unkeyed,
               "status": "needs_human" if uncertain else "completed", "uncertain": uncertain,
               "not_reached": int(kills == 0), "violations": 0, "slow_ack": ledger is world["slow"],
               "stream": stream}
    violations = []
    if t.duplicated:
        violations.append("duplicated receipts")
    if dict(t.effects) != {"transfer": 5, "notify": 1}:
        violations.append(f"receipts {dict(t.effects)}")
    if t.rebilled_journaled or t.unkeyed:
        violations.append("re-billed journaled call or unkeyed request")
    if t.rebilled_in_flight > kills:
        violations.append("more re-billed calls than kills")
    if any(".tool.call_3_1" not in step for step in uncertain):  # only notify (turn 3, second call) may be
        violations.append(f"needs_human on {uncertain}")
    figures["violations"] = len(violations)
    record(figures)
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    with FIGURES.open("a") as f:
        f.write(json.dumps(figures) + "\n")
    assert not violations, (violations, figures)
    return figures


def _safe(spec: str) -> str:
    return spec.replace(".", "-").replace(":", "-")


@pytest.mark.parametrize("crash_at", SOAK_POINTS if SOAK else DEFAULT_POINTS)
def test_kill_at_named_point_then_resume(world: dict[str, Any], crash_at: str) -> None:
    figures = play(world, world["ledger"], _safe(crash_at), crash_at)
    assert figures["kills"] == 1 or SOAK, f"{crash_at} was not reached"


@pytest.mark.parametrize("crash_at", ["tool.K3:1"] if not SOAK else
                         [f"tool.K{k}:{n}" for k in (2, 3, 4, 5) for n in range(1, 8)])
def test_kill_with_a_receipts_server_that_acks_late(world: dict[str, Any], crash_at: str) -> None:
    """The receipts server records, then answers 250 ms later (a remote API): a kill in that
    window leaves a recorded effect the journal never heard of; the lookup finds it (transfer) or
    the run stops needs_human (notify), never a second receipt."""
    play(world, world["slow"], "slow-" + _safe(crash_at), crash_at)


@pytest.mark.parametrize("turn", range(5) if SOAK else [2])
def test_provider_kills_the_client_in_a_model_calls_flight(world: dict[str, Any], turn: int) -> None:
    """The provider bills the call, then SIGKILLs the client before it reads the answer: the
    resume re-sends it with the same key, and the journal counts it possibly billed twice."""
    figures = play(world, world["ledger"], f"provider-turn-{turn}", None, model_turn=turn)
    assert figures["kills"] == 1 and figures["rebilled_in_flight"] == 1 and figures["counted_twice"] == 1


@pytest.mark.skipif(not SOAK, reason="the random-moment soak runs with CUADERNO_SOAK=1")
@pytest.mark.parametrize("seed", range(int(os.environ.get("CUADERNO_OAI_RANDOM", "30")) if SOAK else 1))
@pytest.mark.parametrize("slow", [False, True], ids=["ack-now", "ack-250ms"])
def test_kill_at_a_random_moment(world: dict[str, Any], seed: int, slow: bool) -> None:
    rng = random.Random(seed)
    play(world, world["slow"] if slow else world["ledger"], f"random-{int(slow)}-{seed}", None,
         kill_after=rng.uniform(1.5, 8.0 if slow else 6.5))  # the child takes seconds to import on a busy machine


@pytest.mark.parametrize(("crash_at", "stream"), [("model.K2:2", "first"), ("model.K6:2", "first"),
                                                   ("tool.K4:5", "first"), ("model.K7:3", "resume")])
def test_a_streamed_run_killed_at_a_named_point_resumes(world: dict[str, Any], crash_at: str, stream: str) -> None:
    """``run_streamed``: killed while streaming (or killed unstreamed and resumed streaming), the
    same truth: no receipt twice, no journaled call billed again, every request keyed."""
    figures = play(world, world["ledger"], f"stream-{stream}-{_safe(crash_at)}", crash_at, stream=stream)
    assert figures["kills"] == 1, f"{crash_at} was not reached"


def test_a_streamed_run_killed_in_a_model_calls_flight(world: dict[str, Any]) -> None:
    figures = play(world, world["ledger"], "stream-provider-turn-2", None, model_turn=2, stream="first")
    assert figures["kills"] == 1 and figures["rebilled_in_flight"] == 1 and figures["counted_twice"] == 1


def test_a_streamed_run_hands_on_the_providers_events_and_bills_each_step_once(world: dict[str, Any]) -> None:
    """Unkilled, streamed: the provider's chunks reach the caller as the SDK's raw events, each
    step is billed once with its key; streamed again, the ended run answers from its journal."""
    d, provider, ledger = world["dir"], world["provider"], world["ledger"]
    journal, env = d / "streamed.db", {"OAI_STREAM": "1"}
    first = outcome(run_agent(journal, provider.url, ledger.url, "run-streamed", extra_env=env))
    assert first["status"] == "completed" and first["final"] == FINAL and not first["replayed"], first
    # Five steps of chunks: well past one completed event per step (what a replay hands on).
    assert first["raw_events"] > 5 * 4, first
    t = truth(journal, "run-streamed", ledger.db_path, provider.bills())
    assert (t.billed, t.receipts, t.duplicated, t.unkeyed) == (5, 6, 0, 0)
    again = outcome(run_agent(journal, provider.url, ledger.url, "run-streamed", extra_env=env))
    assert again == {"status": "completed", "final": FINAL, "replayed": True, "raw_events": 0}
    assert truth(journal, "run-streamed", ledger.db_path, provider.bills()).billed == 5


def test_an_unkilled_run_bills_each_step_once_and_answers_from_the_journal_after(world: dict[str, Any]) -> None:
    """No kill: 5 model requests, each keyed, 6 receipts; calling again pays and sends nothing."""
    d, provider, ledger = world["dir"], world["provider"], world["ledger"]
    journal = d / "plain.db"
    first = outcome(run_agent(journal, provider.url, ledger.url, "run-plain"))
    assert first == {"status": "completed", "final": FINAL, "replayed": False}
    t = truth(journal, "run-plain", ledger.db_path, provider.bills())
    assert (t.billed, t.receipts, t.duplicated, t.unkeyed) == (5, 6, 0, 0)
    again = outcome(run_agent(journal, provider.url, ledger.url, "run-plain"))
    assert again == {"status": "completed", "final": FINAL, "replayed": True}
    t2 = truth(journal, "run-plain", ledger.db_path, provider.bills())
    assert (t2.billed, t2.receipts) == (5, 6)
