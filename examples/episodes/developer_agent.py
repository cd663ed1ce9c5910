"""The seed's developer agent (seed 002): a child episode proposes a patch, the parent decides.

A small repository (``calc.py`` with a bug, ``test_calc.py`` that shows it) is copied to a
temporary directory. A *child pass* reads a snapshot of it with ``read_file``/``list_dir`` only
(no write tool, no shell, nothing outside the snapshot) and answers with a typed
:class:`Patch` (file, old text, new text, rationale). The *parent* validates it: it applies the
patch to a copy of the repository and runs the test there; a patch that passes is applied to the
repository (an effect: journaled intent, receipt, lookup), one that fails is sent back for
another pass with the test's output as feedback. Everything is bounded by constants in code:
turns per pass, passes, rejected responses, all counted per episode.

Scripted (default): two episodes with ``ScriptedGateway``, each pass of them in its own process.

- ``fix``: pass 1 answers in prose (rejected: not a Patch), pass 2 tries ``../secret.txt``
  (refused by the sandbox) and proposes a wrong patch (the test fails on the copy: another
  pass), pass 3 proposes the right one (applied). The first process is SIGKILLed in the middle of
  pass 2 (``tool.K7:4``); a second resumes it; a third finds it closed.
- ``loop``: a model that re-reads ``calc.py`` forever runs out of turns, and the episode ends
  with that reason.

Local model: ``python examples/episodes/developer_agent.py --local`` runs ``fix`` on
SmolLM2-135M (llama.cpp on loopback, ``make install-local``). So small a model mostly fails: the
episode ends on a budget, bounded, and prints what it spent.

Every count is read from records cuaderno does not write: the fake provider's billing log and
the apply callback's receipt file (fsynced lines, with the pid that wrote them).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "propiedades"))

from _comun import check, died, entry, per_pid, pid_of, read_lines, run_pass
from pydantic import BaseModel, Field

from cuaderno import (
    ErrorClass,
    ModelGateway,
    ModelRequest,
    ModelResponse,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    ToolError,
)
from cuaderno.episodes import Decision, Episode, EpisodeBudgets, EpisodeResult
from cuaderno.testing.records import append_synced
from cuaderno.tools.sandbox import ReadOnlyRoot

CALC = 'def add(a, b):\n    """Return the sum of a and b."""\n    return a - b\n'
TEST = 'from calc import add\n\nassert add(2, 3) == 5, f"add(2, 3) == {add(2, 3)}, expected 5"\nassert add(-1, 1) == 0\nprint("ok")\n'
BUDGETS = EpisodeBudgets(turns_per_pass=4, passes=3, rejected_responses=1)
LOCAL_BUDGETS = EpisodeBudgets(turns_per_pass=3, passes=2, rejected_responses=1)
TASK = "The test test_calc.py fails. Find the bug and propose a patch that makes it pass."
INSTRUCTIONS = ("You are a careful developer. Read the repository with read_file and list_dir, find the bug, "
                "and propose the smallest patch: the file, the exact old text, the new text, and why.")


class Patch(BaseModel):
    """The child's proposal: replace ``old`` (which must occur exactly once) by ``new`` in ``file``."""

    file: str = Field(description="path of the file, relative to the repository's root")
    old: str = Field(min_length=1, description="the exact text to replace (it must occur once)")
    new: str = Field(description="the text to put in its place")
    rationale: str = Field(min_length=1, description="why this fixes the bug")


def episode(budgets: EpisodeBudgets = BUDGETS, **kw: Any) -> Episode[Patch]:
    return Episode(name="fix", instructions=INSTRUCTIONS, output=Patch, budgets=budgets, **kw)


def make_repo(workdir: Path) -> None:
    """The repository (where a patch is applied) and the snapshot the child reads."""
    for d in ("repo", "snapshot"):
        (workdir / d).mkdir()
        (workdir / d / "calc.py").write_text(CALC)
        (workdir / d / "test_calc.py").write_text(TEST)
    (workdir / "secret.txt").write_text("outside the snapshot\n")


# -- the parent's side: validate on a copy, apply once ---------------------------------------------

def patched(repo: Path, patch: Patch) -> str:
    """The file's text with the patch applied; ToolError when it does not apply."""
    with ReadOnlyRoot(repo) as root:
        text = root.read_file(patch.file)["text"]  # the sandbox's rules: no path outside the repository
    if text.count(patch.old) != 1:
        raise ToolError(f"the old text occurs {text.count(patch.old)} times in {patch.file}, not once",
                        error_class=ErrorClass.INVALID_INPUT)
    return str(text.replace(patch.old, patch.new))


def decide_for(repo: Path) -> Any:
    def decide(patch: Patch) -> Decision:
        try:
            new_text = patched(repo, patch)
        except ToolError as exc:
            return Decision.another_pass(str(exc))
        with tempfile.TemporaryDirectory(prefix="cuaderno-check-") as d:
            copy = Path(d) / "repo"
            shutil.copytree(repo, copy)
            (copy / patch.file).write_text(new_text)
            proc = subprocess.run([sys.executable, "test_calc.py"], cwd=copy, capture_output=True, text=True,
                                  timeout=60)
        if proc.returncode == 0:
            return Decision.apply("test_calc.py passes on a copy")
        return Decision.another_pass(f"test_calc.py fails with this patch:\n{proc.stderr.strip()[-600:]}")
    return decide


def apply_for(repo: Path, receipts: Path) -> Any:
    def apply(patch: Patch, key: str) -> dict[str, Any]:
        new_text = patched(repo, patch)
        target = repo / patch.file
        tmp = target.with_suffix(".tmp")
        tmp.write_text(new_text)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
        receipt = {"key": key, "file": patch.file, "sha256": hashlib.sha256(new_text.encode()).hexdigest()[:16]}
        append_synced(receipts, receipt)  # the world's record: one line per applied patch
        return receipt
    return apply


def lookup_for(repo: Path, receipts: Path) -> Any:
    def lookup(patch: Patch, key: str) -> dict[str, Any] | None:
        for r in read_lines(receipts):
            if r["key"] == key:
                return {k: r[k] for k in ("key", "file", "sha256")}
        text = (repo / patch.file).read_text()
        if patch.old in text:
            return None  # provably not applied: the old text is still there
        raise RuntimeError(f"{patch.file} changed, and no receipt says by whom")
    return lookup


# -- the scripted model ----------------------------------------------------------------------------

def _patch(old: str, new: str, why: str) -> ModelResponse:
    return ScriptedGateway.text(json.dumps({"file": "calc.py", "old": old, "new": new, "rationale": why}))


SCRIPTS: dict[str, dict[int, list[ModelResponse]]] = {
    "fix": {
        1: [ScriptedGateway.call("list_dir", path="."), ScriptedGateway.call("read_file", path="calc.py"),
            ScriptedGateway.text("The bug is in calc.py: add subtracts instead of adding.")],
        2: [ScriptedGateway.call("read_file", path="../secret.txt"), ScriptedGateway.call("read_file", path="calc.py"),
            _patch("return a - b", "return a * b", "add should combine a and b")],
        3: [ScriptedGateway.call("read_file", path="test_calc.py"),
            _patch("return a - b", "return a + b", "add must return the sum, as its docstring and the test say")],
    },
    "loop": {n: [ScriptedGateway.call("read_file", path="calc.py")] for n in (1, 2, 3)},
}


def scripted(scenario: str, billing: Path, *, stripe: bool = True) -> ScriptedGateway:
    """The scripted model of ``scenario``; ``stripe=False`` bills every request (its key ignored)."""
    script = SCRIPTS["fix" if scenario.startswith("fix") else scenario]

    def answer(request: ModelRequest) -> ModelResponse:
        first = next(m["content"] for m in request.messages if m.get("role") == "user")
        found = re.search(r"\(pass (\d+) of", first)
        responses = script[int(found.group(1)) if found else 1]
        turn = sum(1 for m in request.messages if m.get("role") == "assistant")
        return responses[min(turn, len(responses) - 1)]

    return ScriptedGateway(answer, stripe=stripe, billing_log=billing)


# -- one process -----------------------------------------------------------------------------------

def _short(reason: str) -> str:
    lines = [ln.strip() for ln in reason.strip().splitlines() if ln.strip()]
    text = lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"
    return text if len(text) <= 120 else f"{text[:117]}..."


def summary(result: EpisodeResult[Patch]) -> dict[str, Any]:
    return {"status": result.status, "reason": result.reason, "passes": len(result.passes), "turns": result.turns,
            "rejected": result.rejected, "cost_usd": result.cost_usd, "unpriced_calls": result.unpriced_calls,
            "possibly_billed_twice": result.possibly_billed_twice,
            "replayed": result.replayed,
            "per_pass": [{"pass": p.number, "outcome": p.outcome, "turns": p.turns, "rejected": p.rejected,
                          "tool_errors": p.tool_errors,
                          "decision": p.decision, "reason": _short(p.reason)}
                         for p in result.passes]}


async def run_episode(workdir: Path, scenario: str, gateway: ModelGateway, budgets: EpisodeBudgets = BUDGETS,
                      **kw: Any) -> EpisodeResult[Patch]:
    store = SqliteCheckpointer(workdir / "runs.db")
    receipts = workdir / "receipts.jsonl"
    repo = workdir / "repo"
    lookup = None if scenario.endswith("-nolookup") else lookup_for(repo, receipts)
    try:
        return await episode(budgets, **kw).run(
            TASK, session=Session(f"dev-{scenario.removesuffix('-nolookup')}", gateway, store),
            snapshot=workdir / "snapshot", decide=decide_for(repo), apply=apply_for(repo, receipts), lookup=lookup)
    finally:
        store.close()


async def child(workdir: Path, scenario: str) -> None:
    print(f"pid={os.getpid()}", flush=True)
    try:
        result = await run_episode(workdir, scenario, scripted(scenario, workdir / "billing.jsonl"))
    except Exception as exc:  # the parent process reports and exits 2; the supervisor prints it
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
        raise SystemExit(2) from None
    print("RESULT " + json.dumps(summary(result)), flush=True)


def result_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any] | None:
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            parsed: dict[str, Any] = json.loads(line[len("RESULT "):])
            return parsed
    return None


def show(label: str, result: dict[str, Any]) -> None:
    unpriced = result["unpriced_calls"]
    cost = f"${result['cost_usd']:.4f}" + (f" + {unpriced} unpriced calls (no price: not free)" if unpriced else "")
    print(f"{label}: {result['status']} ({result['reason']}) · passes {result['passes']} · turns {result['turns']} "
          f"· rejected responses {result['rejected']} · cost {cost}"
          + (f" · re-sent after a crash {result['possibly_billed_twice']}" if result["possibly_billed_twice"] else "")
          + (" · (closed: read from the journal)" if result["replayed"] else ""))
    for p in result["per_pass"]:
        refused = f" ({p['tool_errors']} read refused)" if p["tool_errors"] else ""
        print(f"    pass {p['pass']}: {p['outcome']:<8} turns {p['turns']}{refused} rejected {p['rejected']} "
              f"-> {p['decision'] or '(ended)'}: {p['reason']}")


def main_scripted() -> int:
    script = str(Path(__file__).resolve())
    with tempfile.TemporaryDirectory(prefix="cuaderno-dev-") as d:
        workdir = Path(d)
        make_repo(workdir)
        fix = [run_pass(script, workdir, "fix", crash_at="tool.K7:4"), run_pass(script, workdir, "fix"),
               run_pass(script, workdir, "fix")]
        loop = run_pass(script, workdir, "loop")
        billed = per_pid(read_lines(workdir / "billing.jsonl"))
        keys = [r["key"] for r in read_lines(workdir / "billing.jsonl")]
        receipts = read_lines(workdir / "receipts.jsonl")
        final_calc = (workdir / "repo" / "calc.py").read_text()
    print("cuaderno: the developer agent (seed 002): freedom inside the episode, determinism between episodes.")
    print(f"budgets: {BUDGETS.turns_per_pass} turns per pass, {BUDGETS.passes} passes, "
          f"{BUDGETS.rejected_responses} rejected response(s) per episode\n")
    notes = ["<- killed in the middle of pass 2 (tool.K7:4)", "<- resumed: re-attaches to pass 2",
             "<- closed: answered from the journal"]
    for i, (proc, note) in enumerate(zip(fix, notes, strict=True), start=1):
        print(f"fix, process {i}: model ×{billed[pid_of(proc)]} · apply ×"
              f"{sum(1 for r in receipts if r['pid'] == pid_of(proc))}   {note}   [{died(proc)}]")
    results = [result_of(p) for p in fix]
    loop_result = result_of(loop)
    print(f"loop, process 1: model ×{billed[pid_of(loop)]}   <- re-reads calc.py until the turn limit\n")
    for label, res in (("fix", results[1]), ("fix (closed)", results[2]), ("loop", loop_result)):
        if res is not None:
            show(label, res)
    print(f"\nbilling log: {len(keys)} generations billed, {len(keys) - len(set(keys))} billed twice; "
          f"apply receipts: {len(receipts)}; calc.py now returns {final_calc.strip().splitlines()[-1].strip()!r}")
    check(fix[0].returncode == -9, "the first fix process must die by SIGKILL")
    check(all(p.returncode == 0 for p in (*fix[1:], loop)), "the resumed, closed and loop processes must exit 0:\n"
          + "\n".join(p.stdout + p.stderr for p in (*fix[1:], loop)))
    check(len(keys) == len(set(keys)), "a generation was billed twice")
    check(len(receipts) == 1, f"the patch must be applied exactly once, receipts: {receipts}")
    check(billed[pid_of(fix[2])] == 0 and billed[pid_of(fix[1])] > 0, "pass counts per process are off")
    r, lr = results[1], loop_result
    check(r is not None and (r["status"], r["passes"], r["rejected"]) == ("applied", 3, 1), f"fix ended {r}")
    check(lr is not None and (lr["status"], lr["reason"], lr["turns"]) == ("exhausted", "turns_per_pass",
                                                                            BUDGETS.turns_per_pass), f"loop ended {lr}")
    return 0


async def run_local(workdir: Path, base_url: str, alias: str) -> EpisodeResult[Patch]:
    import httpx2

    from cuaderno.gateway.openai import OpenAIGateway

    async with httpx2.AsyncClient(timeout=180.0, trust_env=False) as http:
        gateway = OpenAIGateway(alias, base_url=base_url, api_key="local", http_client=http)
        return await run_episode(workdir, "fix", gateway, LOCAL_BUDGETS, temperature=0.0, max_output_tokens=160)


def what_the_model_did(events: list[Any]) -> list[str]:
    """One line per journaled model response of a child pass: its tool calls, or its text."""
    out = []
    for ev in events:
        response = ev.payload.get("response") if ev.kind == "model" and ev.phase == "result" else None
        if response:
            calls = ", ".join(f"{c['name']}({json.dumps(c['arguments'])})" for c in response.get("tool_calls") or ())
            text = calls or repr((response.get("text") or "")[:100]) or "(empty)"
            out.append(f"{ev.step_id}: {text}")
    return out


def main_local() -> int:
    from cuaderno.testing.llama_server import LlamaServer

    threads = max(1, int(os.environ.get("CUADERNO_LLAMA_THREADS", "1") or 1))
    with tempfile.TemporaryDirectory(prefix="cuaderno-dev-local-") as d, \
            LlamaServer(n_threads=threads, extra_args=["--seed", "1234"]) as server:
        workdir = Path(d)
        make_repo(workdir)
        print(f"cuaderno: the developer agent on a local model ({server.model_alias}); budgets: "
              f"{LOCAL_BUDGETS.turns_per_pass} turns per pass, {LOCAL_BUDGETS.passes} passes, "
              f"{LOCAL_BUDGETS.rejected_responses} rejected response(s)\n")
        result = asyncio.run(run_local(workdir, server.base_url, server.model_alias))
        receipts = read_lines(workdir / "receipts.jsonl")
        with SqliteCheckpointer(workdir / "runs.db") as store:
            said = {p.child_run_id: what_the_model_did(store.load(p.child_run_id)) for p in result.passes}
    show("fix (local model)", summary(result))
    for run_id, lines in said.items():
        print(f"  {run_id}:")
        for line in lines:
            print(f"    {line}")
    print(f"apply receipts: {len(receipts)}")
    check(result.status in ("applied", "discarded", "exhausted", "failed"), "the episode must end bounded")
    check(len(result.passes) <= LOCAL_BUDGETS.passes, "more passes than the budget")
    check(all(p.turns <= LOCAL_BUDGETS.turns_per_pass for p in result.passes), "a pass exceeded its turns")
    return 0


if __name__ == "__main__":
    if "--local" in sys.argv[1:]:
        raise SystemExit(main_local())
    entry(main_scripted, child)
