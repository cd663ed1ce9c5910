"""The loop: next step -> replay it from the journal, or execute it -> record it.

For every step the runner asks the journal first (the index loaded at start). Replay rules, seed
000's table:

=================================  ============================================================
in the journal                     what replay does
=================================  ============================================================
intent and result                  skip the step, use the recorded result
neither                            execute it
intent, no result, non-idempotent  reconcile through the tool's lookup, or ``UncertainEffect``
intent, no result, idempotent      execute it again (same effect key)
=================================  ============================================================

A model call is repeatable: an intent without a result is re-sent with the same idempotency key,
and the re-send is journaled (``intent.2``) so the checkpoint counts it as possibly billed twice.

Writes are batched without weakening any rule: a step's result waits in ``pending`` and commits
in the same transaction as the *next* intent, which must be on disk before the next action
anyway. So each step costs one synced commit, and nothing leaves the process (a request, a tool
body) before everything it depends on is durable. Steps are yielded only after their commit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import BudgetExceeded, ReplayDivergence, RunClosed, UncertainEffect, VersionMismatch
from cuaderno.events import StepEvent
from cuaderno.fingerprint import fingerprint
from cuaderno.loop._model_steps import ModelSteps
from cuaderno.loop._state import effect_key, tool_message
from cuaderno.loop._tool_steps import ToolSteps
from cuaderno.loop.steps import FinalStep, Step
from cuaderno.testing import crash

__all__ = ["Runner", "effect_key", "tool_message"]


class Runner(ModelSteps, ToolSteps):
    """Drives one run of one agent through one session."""

    # -- opening ----------------------------------------------------------------------------------

    def _open(self) -> FinalStep | None:
        crash.point("recovery.R0")
        task_fp = fingerprint({"task": self.task})
        versions = self.agent.versions()
        cp = self.store.checkpoint(self.run_id)
        if cp is None:
            self.store.append([StepEvent(run_id=self.run_id, step_id="run", phase="start", kind="run",
                                         name=self.agent.name, fingerprint=task_fp,
                                         payload={"task": self.task, "versions": versions})])
            cp = Checkpoint(run_id=self.run_id, task_fingerprint=task_fp, versions=versions)
        else:
            closed = self._check_resumable(cp, task_fp, versions)
            if closed is not None:
                return closed
        crash.point("recovery.R2")
        # Take the run over *before* reading it: anything the previous owner committed is then
        # visible, and anything it tries to commit afterwards is refused.
        self.epoch = self.store.acquire(self.run_id, self.s.owner)
        crash.point("recovery.R3")
        for ev in self.store.load(self.run_id):
            self.journal[(ev.step_id, ev.phase)] = ev
            if ev.kind in ("model", "tool", "final"):
                self.unvisited.setdefault(ev.step_id, ev.seq)
        self._add_message({"role": "user", "content": self.task})
        return None

    def _check_resumable(self, cp: Checkpoint, task_fp: str, versions: dict[str, Any]) -> FinalStep | None:
        if cp.task_fingerprint != task_fp:
            raise ReplayDivergence(self.run_id, "run", f"task {cp.task_fingerprint}", f"task {task_fp}")
        if cp.status == "completed":
            outcome = cp.outcome or {}
            return FinalStep(step_id="final", output=str(outcome.get("output", "")), replayed=True, data=outcome)
        if cp.status in ("failed", "cancelled"):
            raise RunClosed(self.run_id, cp.status)
        if cp.status == "needs_human" and cp.uncertain:
            step_id, evidence = next(iter(cp.uncertain.items()))
            raise UncertainEffect(self.run_id, step_id, evidence)
        if cp.versions != versions and self.s.on_version_mismatch == "refuse":
            raise VersionMismatch(self.run_id, cp.versions, versions)
        return None

    # -- the loop ---------------------------------------------------------------------------------

    async def steps(self) -> AsyncIterator[Step]:
        """The async iterator behind :meth:`Agent.run`."""
        closed = self._open()
        if closed is not None:
            yield closed
            return
        for turn in range(self.agent.max_turns):
            response = await self._model_turn(turn)
            for s in self._drain():
                yield s
            if not response.tool_calls:
                self._finish(turn, response)
                for s in self._drain():
                    yield s
                return
            for index, call in enumerate(response.tool_calls):
                suspended = await self._tool_call(turn, index, call)
                for s in self._drain():
                    yield s
                if suspended:
                    return
        self._flush()
        for s in self._drain():
            yield s
        self.store.append([StepEvent(run_id=self.run_id, step_id="run", phase="end", kind="run",
                                     payload={"status": "failed", "reason": "max_turns",
                                              "limit": self.agent.max_turns})], epoch=self.epoch)
        raise BudgetExceeded(self.run_id, "max_turns", self.agent.max_turns)
