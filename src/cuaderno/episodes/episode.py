"""Child episodes: freedom inside the episode, determinism between episodes (seed 002).

The only place a model decides what to do next is a *child pass*: an ordinary cuaderno run of an
agent whose only tools read a snapshot (:class:`~cuaderno.tools.sandbox.ReadOnlyRoot`: no write
tool, no shell). It chooses which files to open and in what order, answers with one JSON object
that must validate against the episode's output type (a pydantic model), and ends. Everything
else belongs to the *parent*, whose code is deterministic: the snapshot, the budgets
(:class:`~cuaderno.episodes.budgets.EpisodeBudgets`), whether the proposal is applied, discarded
or sent back for another pass.

The parent is a run of its own (``session.run_id``), journaled like any other; its step ids:

==========================  =========  ===============================================================
step id                     phase      what it records (what replay reads from it)
==========================  =========  ===============================================================
``run``                     start      the task and the episode's versions (checked on resume)
``<name>.passNN``           intent     the child run about to start (``child_run_id``)
``<name>.passNN``           result     how the child ended: ``proposal`` (the validated object),
                                       ``rejected`` (validation errors), or ``ended`` (a child
                                       budget or failure); its turns, calls and cost
``<name>.passNN``           decision   ``apply``, ``discard`` or ``another_pass`` (+ feedback)
``<name>.passNN.apply``     intent     kind ``tool``: the apply effect is about to run (effect key)
``<name>.passNN.apply``     result     its receipt (``value``), as a tool result
``<name>.passNN.apply``     uncertain  nobody knows whether it happened: the run is ``needs_human``
``final``                   result     applied or discarded: the run is ``completed``
``run``                     end        a budget ran out or the child failed: the run is ``failed``
                                       (or a cancellation's record: ``cancelled``)
==========================  =========  ===============================================================

Budgets (:class:`~cuaderno.episodes.budgets.EpisodeBudgets`) are counted over the whole episode.
An answer that does not validate is a rejected response: it is asked again as a new pass whose
task carries the validation errors, so it spends a pass as well as a rejection (the child's run
has closed with its answer; continuing that run instead would need a change in the loop). The
empty or refused generations the child's loop rejects count against the same cap: each pass's
agent gets what is left of it. A pass whose child runs out of turns ends the episode
(``turns_per_pass``): a model that re-reads a file forever stops there, not in a hang.

Kind ``episode`` is not one the checkpoint projects (it only moves ``next_step``), so the
parent's status comes from the kinds that already mean something: ``final`` closes it
``completed``, ``run``/``end`` ``failed``, and the apply step is a ``tool`` step, so an apply of
unknown fate makes the run ``needs_human`` and ``cuaderno resolve`` settles it like any tool's.

Child passes run through a :class:`ChildRunner` (the parent asks it for a :class:`ChildPass` and
journals the :class:`ChildOutcome` it returns): :class:`LocalChildRunner` in this process by
default, a child workflow per pass under Temporal (:mod:`cuaderno.temporal._child`); both run
:func:`run_child_pass`, the same loop over the same agent.

Child pass ``n`` runs as ``f"{parent_run_id}/{name}.pass{n:02d}"``: a resumed parent re-attaches
to it. A finished child answers from its journal (0 model calls); one killed mid-way resumes
under the loop's rules (no journaled response is paid again). Its task is derived from the
parent's journal alone (the task, the pass number, the previous pass's feedback), so the child's
recorded requests match on resume. A decided pass is never decided again; an applied proposal is
never applied again: the apply callback is an effect, with its intent on disk before it runs,
and an intent without a result asks the caller's ``lookup`` or stops ``needs_human``
(:class:`~cuaderno.errors.UncertainEffect`).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, NoReturn, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from cuaderno import faults
from cuaderno._json import journalable
from cuaderno.budgets import Budgets
from cuaderno.cancellation import cancel, finalize
from cuaderno.checkpoint import Checkpoint, verified
from cuaderno.durable.effect import Effect, effect_key
from cuaderno.durable.log import JournalLog
from cuaderno.episodes.budgets import EpisodeBudgets
from cuaderno.errors import (
    BudgetExceeded,
    CuadernoError,
    DrainOnOldWorker,
    ReplayDivergence,
    RunCancelled,
    RunClosed,
    ToolResultInvalid,
    UsageError,
    VersionMismatch,
)
from cuaderno.events import StepEvent
from cuaderno.fingerprint import fingerprint
from cuaderno.journal.base import EVENT_SCHEMA_VERSION
from cuaderno.loop import Agent, FinalStep, Session
from cuaderno.loop.versions import Migration
from cuaderno.tools.definition import Tool
from cuaderno.tools.sandbox import ReadOnlyRoot

__all__ = ["EPISODE_VERSION", "ChildOutcome", "ChildPass", "ChildRunner", "Decision", "Episode", "EpisodeResult",
           "LocalChildRunner", "PassRecord", "run_child_pass"]

EPISODE_VERSION = "1"
"""Version of the rules that turn a parent's journal back into its next step (step ids, how a
child's task is derived from it). Bump it when they change."""

T = TypeVar("T", bound=BaseModel)

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_KIND = "episode"
_EPISODE_BUDGET = {"max_turns": "turns_per_pass"}
"""A child loop's bound under the name of the episode's bound it comes from (the others keep
their loop names: a child that ran out of, say, ``repairs`` ended on its loop's budget)."""
_FEEDBACK_LIMIT = 4000
"""Characters of feedback carried into the next pass's task (a test's whole output would be a
context bill, not a hint)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What the parent does with a proposal. Build it with :meth:`apply`, :meth:`discard` or
    :meth:`another_pass`; it is journaled as the pass's ``decision`` step."""

    action: Literal["apply", "discard", "another_pass"]
    reason: str = ""
    """Why (journaled). For ``another_pass``, the feedback the next pass's task carries."""

    @classmethod
    def apply(cls, reason: str = "") -> Decision:
        """Apply the proposal (through the episode's ``apply`` callback) and close the episode."""
        return cls("apply", reason)

    @classmethod
    def discard(cls, reason: str = "") -> Decision:
        """Keep nothing and close the episode."""
        return cls("discard", reason)

    @classmethod
    def another_pass(cls, feedback: str) -> Decision:
        """Run another child pass whose task carries ``feedback`` (within the budgets)."""
        return cls("another_pass", feedback)


@dataclass(frozen=True, kw_only=True, slots=True)
class PassRecord:
    """One child pass as the parent's journal holds it."""

    number: int
    child_run_id: str
    outcome: str
    """``proposal``, ``rejected`` (the answer did not validate) or ``ended`` (a child budget or a
    failure ended it without an answer)."""
    turns: int
    """Model calls the child pass made (responses journaled in its run)."""
    rejected: int
    """Rejected responses in this pass: the invalid answer, and the empty generations the child's
    loop rejected."""
    cost_usd: float
    unpriced_calls: int
    tool_errors: int = 0
    """Tool calls of the pass that ended in an error told to the model (a path the snapshot
    refused, a file that does not exist)."""
    possibly_billed_twice: int = 0
    """Re-sends of a request whose first send's fate was unknown (a crash in flight), counted by
    the child's loop: visible, never silent."""
    decision: str | None = None
    """``apply``, ``discard``, ``another_pass``, or ``None`` when the episode ended on this pass
    without one (a budget)."""
    reason: str = ""
    """The decision's reason, the validation errors, or why the child ended."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EpisodeResult(Generic[T]):
    """How an episode ended, with everything it spent (all counted per episode)."""

    status: Literal["applied", "discarded", "exhausted", "failed"]
    reason: str
    """``applied``/``discarded``: the decision's reason; ``exhausted``: the budget that ran out
    (``turns_per_pass``, ``passes``, ``rejected_responses``, or a child loop's own bound);
    ``failed``: what failed (``child_failed``, ``apply_failed``)."""
    proposal: T | None
    """The last valid proposal (the applied one when ``status == "applied"``)."""
    receipt: Any = None
    """What the apply callback (or its lookup, or a person) returned."""
    passes: tuple[PassRecord, ...] = ()
    replayed: bool = False
    """The parent run was already closed: this is what happened, read from its journal."""

    @property
    def turns(self) -> int:
        """Model calls of every pass."""
        return sum(p.turns for p in self.passes)

    @property
    def rejected(self) -> int:
        """Rejected responses in the episode."""
        return sum(p.rejected for p in self.passes)

    @property
    def cost_usd(self) -> float:
        """Cost of the priced calls of every pass (unpriced ones are counted in :attr:`unpriced_calls`)."""
        return round(sum(p.cost_usd for p in self.passes), 10)

    @property
    def unpriced_calls(self) -> int:
        """Calls with no price: a loss made visible, not free."""
        return sum(p.unpriced_calls for p in self.passes)

    @property
    def possibly_billed_twice(self) -> int:
        """Re-sends after a crash in flight, in every pass."""
        return sum(p.possibly_billed_twice for p in self.passes)


Decide = Callable[[T], "Decision | Awaitable[Decision]"]
Apply = Callable[[T, str], "Any | Awaitable[Any]"]
Lookup = Callable[[T, str], "Any | Awaitable[Any]"]


class Episode(Generic[T]):
    """A child episode: instructions, an output type, read tools over a snapshot, and budgets.

    Args:
        name: names the episode's steps in the parent's journal (letters, digits, ``_``, ``-``).
        instructions: the child's system prompt. The output type's JSON schema is appended, with
            the rule that the final answer is one JSON object.
        output: the pydantic model the child's final answer must validate against.
        budgets: turns per pass, passes and rejected responses, per episode.
        model: the model name passed to the gateway.
        tools: extra read tools for the child, beside ``read_file``/``list_dir`` of the snapshot.
            Each must be declared idempotent (reading twice costs nothing): a child has no write
            tool.
        max_output_tokens, temperature: passed to every child request.
    """

    def __init__(self, *, name: str, instructions: str, output: type[T], budgets: EpisodeBudgets | None = None,
                 model: str | None = None, tools: Sequence[Tool] = (), max_output_tokens: int | None = None,
                 temperature: float | None = None) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise UsageError(f"an episode's name must be 1-64 letters, digits, '_' or '-', got {name!r:.80}")
        if not isinstance(instructions, str):
            raise UsageError("instructions must be a string")
        if not (isinstance(output, type) and issubclass(output, BaseModel)):
            raise UsageError(f"output must be a pydantic model class, got {output!r:.80}")
        if budgets is not None and not isinstance(budgets, EpisodeBudgets):
            raise UsageError("budgets must be an EpisodeBudgets")
        for t in tools:
            if not isinstance(t, Tool):
                raise UsageError(f"{t!r:.80} is not a Tool: declare it with @tool(idempotent=True)")
            if not t.idempotent:
                raise UsageError(f"tool {t.name!r} is not idempotent: a child episode only reads (no write tool)")
        self.name = name
        self.output = output
        self.budgets = budgets or EpisodeBudgets()
        self.model = model
        self.extra_tools = tuple(tools)
        self.max_output_tokens = max_output_tokens
        self.temperature = temperature
        schema = json.dumps(output.model_json_schema(), sort_keys=True, separators=(",", ":"))
        self.instructions = (f"{instructions}\n\nYou may only read. When you are done, answer with exactly one "
                             f"JSON object (no prose around it) that validates against this JSON schema:\n{schema}")

    # -- the public entry point ------------------------------------------------------------------

    async def run(self, task: str, *, session: Session, snapshot: str | os.PathLike[str] | None = None,
                  decide: Decide[T], apply: Apply[T] | None = None, lookup: Lookup[T] | None = None,
                  runner: ChildRunner | None = None) -> EpisodeResult[T]:
        """Run (or resume) the episode as the parent run ``session.run_id``.

        Args:
            task: what the child is asked to do (each pass's task adds its number and feedback).
            session: the parent's run id, gateway and journal; every child pass uses the same
                gateway and journal under its own derived run id. The parent is held through
                its ``ownership``; its ``retry`` bounds the apply's retries of an unsent
                transient error; of ``on_version_mismatch``, a parent supports ``"refuse"`` and
                ``"drain"`` (any other choice is a :class:`~cuaderno.errors.UsageError` when the
                versions differ).
            snapshot: the directory the child may read (read-only, nothing outside it). Required
                unless ``runner`` is given (a runner brings its own: under Temporal, the worker's).
            decide: given a valid proposal, returns a :class:`Decision` (may be async). It runs
                before the decision is journaled, so after a crash it may run again for the
                same proposal: a check on a copy, never an effect.
            apply: the effect ``apply(proposal, effect_key)``, returning a JSON-able receipt. Runs
                at most once per journaled intent. Required if ``decide`` may say ``apply``.
            lookup: ``lookup(proposal, effect_key)`` after a crash between the apply's intent
                and its result, or an ``apply`` that raised an ambiguous
                :class:`~cuaderno.errors.ToolError`: the receipt if the effect happened, ``None``
                if it provably did not (it is then applied again, same key), an exception if
                nobody can tell. Without it, that case stops the run ``needs_human``.
            runner: where child passes run (:class:`ChildRunner`). By default a
                :class:`LocalChildRunner` over ``snapshot``, in this process, in ``session``'s
                journal; :mod:`cuaderno.temporal._child` runs each pass as a child workflow.

        Raises:
            UsageError: bad arguments (nothing written).
            ReplayDivergence: the run id holds another task or another episode.
            UncertainEffect: an apply may or may not have happened (run left ``needs_human``).
            UncertainEffect, RunBusy, FencedOut, JournalError: from the journal, as for any run.
        """
        if not isinstance(task, str):
            raise UsageError(f"the task must be a string, got {type(task).__name__}")
        if not isinstance(session, Session):
            raise UsageError("session must be a Session")
        if not callable(decide) or (apply is not None and not callable(apply)) or (
                lookup is not None and not callable(lookup)):
            raise UsageError("decide, apply and lookup must be callables")
        if runner is not None:
            return await _ParentRun(self, task, session, runner, decide, apply, lookup).run()
        if snapshot is None:
            raise UsageError("an episode needs the snapshot its child passes read (or a runner that has one)")
        with ReadOnlyRoot(snapshot) as root:
            return await _ParentRun(self, task, session, LocalChildRunner(session, root), decide, apply,
                                    lookup).run()

    # -- what replay needs to derive again -------------------------------------------------------

    def child_agent(self, root: ReadOnlyRoot, rejected_left: int) -> Agent:
        """The child's agent. ``rejected_left`` bounds the empty generations its loop may reject,
        so the episode's cap holds across passes."""
        return Agent(instructions=self.instructions, tools=[*root.tools(), *self.extra_tools], model=self.model,
                     name=f"{self.name}.child", max_turns=self.budgets.turns_per_pass,
                     max_output_tokens=self.max_output_tokens, temperature=self.temperature,
                     budgets=Budgets(rejected_responses=max(rejected_left, 0)))

    def child_task(self, task: str, number: int, feedback: str) -> str:
        """Pass ``number``'s task: a function of the parent's journal only (replay derives it again)."""
        text = f"{task}\n\n(pass {number} of at most {self.budgets.passes})"
        if feedback:
            text += f"\n\nYour previous answer was not accepted:\n{feedback[:_FEEDBACK_LIMIT]}"
        return text

    def versions(self) -> dict[str, Any]:
        """Recorded when the parent run starts; a resume under others is refused."""
        return {"schema": EVENT_SCHEMA_VERSION, "episode": EPISODE_VERSION,
                "agent": fingerprint({"instructions": self.instructions, "model": self.model,
                                      "tools": sorted(t.name for t in self.extra_tools),
                                      "budgets": [self.budgets.turns_per_pass, self.budgets.passes,
                                                  self.budgets.rejected_responses]})[:16]}

    def validate(self, text: str) -> tuple[T | None, str]:
        """The proposal in a final answer, or ``None`` and why it is refused (for the model)."""
        body = _json_object(text)
        if body is None:
            return None, "the answer holds no JSON object; answer with exactly one JSON object"
        try:
            return self.output.model_validate_json(body), ""
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
                                 for e in exc.errors(include_url=False, include_input=False, include_context=False))
            return None, f"the JSON object does not validate: {problems}"


# -- where child passes run ---------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True, slots=True)
class ChildPass:
    """Child pass ``number`` as the parent asks for it: every field is derived from the parent's
    journal (run id, step id, task, what is left of the rejection cap), so a resumed parent asks
    for the same pass again, and a runner re-attaches to it by ``run_id``."""

    parent_run_id: str
    step_id: str
    """``<episode>.passNN``, the parent's step for this pass."""
    run_id: str
    """The child's run id: ``<parent_run_id>/<step_id>`` (under Temporal, its workflow id)."""
    number: int
    task: str
    rejected_left: int
    """Rejected responses the child's loop may still admit (the episode's cap, less what earlier
    passes spent)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ChildOutcome:
    """How a child pass's run ended, read from its journal (the parent journals it as the pass's
    ``result``). Plain JSON both ways: under Temporal it is a child workflow's result."""

    status: str
    """The child run's status: ``completed`` (``output`` holds its answer), ``failed``, ``cancelled``."""
    output: str | None
    """The final answer's text, or ``None`` when the child ended without one."""
    outcome: dict[str, Any] = field(default_factory=dict[str, Any])
    """The child checkpoint's outcome (why it ended: a budget, a bug, a cancellation)."""
    turns: int = 0
    rejected: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0
    possibly_billed_twice: int = 0
    tool_errors: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChildOutcome:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


class ChildRunner(Protocol):
    """Where a parent's child passes run: the seam between the episode's code and an engine.

    :class:`LocalChildRunner` runs them in this process (the default); under Temporal each pass is
    a child workflow (:mod:`cuaderno.temporal._child`). Both run :func:`run_child_pass`: the same
    loop over the same agent (:meth:`Episode.child_agent`)."""

    async def run(self, episode: Episode[Any], child: ChildPass) -> ChildOutcome:
        """Run child pass ``child`` (or re-attach to it: a finished one answers from its journal
        with no model call) and say how it ended."""
        ...

    def cancel(self, child_run_id: str, reason: str, *, by: str) -> None:
        """The parent was cancelled while this child pass was open: ask it to stop (best effort)."""
        ...


async def run_child_pass(agent: Agent, child: ChildPass, session: Session) -> ChildOutcome:
    """Run ``agent`` on the pass's task as run ``session.run_id`` (the same code in every runner)
    and read how it ended from ``session.store``."""
    final: FinalStep | None = None
    try:
        async for step in agent.run(child.task, session=session):
            if isinstance(step, FinalStep):
                final = step
    except (BudgetExceeded, RunClosed, RunCancelled):
        # The child run ended without an answer (a bound, or someone cancelled the child alone):
        # its checkpoint says why. Caught here, so a cancelled child is never taken for a
        # cancellation of the parent.
        pass
    except CuadernoError:
        raise  # the journal, a lease, a divergence: nothing is known about the pass yet
    except Exception:
        # A child tool raised an unclassified error: the loop journaled it as a bug and ended the
        # child failed. That is the pass's outcome; anything else is not known yet.
        cp = session.store.checkpoint(session.run_id)
        if cp is None or cp.status != "failed":
            raise
    cp = session.store.checkpoint(session.run_id)
    assert cp is not None
    output = final.output if final is not None else None
    if output is None and cp.status == "completed":
        output = str((cp.outcome or {}).get("output", ""))  # closed before: answered from its journal
    return ChildOutcome(status=cp.status, output=output, outcome=dict(cp.outcome or {}),
                        turns=cp.count("model_calls"), rejected=cp.count("rejected_responses"),
                        cost_usd=cp.cost_usd, unpriced_calls=cp.count("unpriced_calls"),
                        possibly_billed_twice=cp.count("possibly_billed_twice"), tool_errors=cp.count("tool_errors"))


class LocalChildRunner:
    """Child passes in this process, in the parent session's journal, over an open snapshot.

    Each pass is a run of its own (``child.run_id``) with the parent session's gateway, runtime,
    ownership and model caller. A finished child answers from its journal (0 model calls); one
    killed mid-way resumes under the loop's rules (no journaled response is paid again)."""

    def __init__(self, session: Session, root: ReadOnlyRoot) -> None:
        self.session, self.root = session, root

    async def run(self, episode: Episode[Any], child: ChildPass) -> ChildOutcome:
        s = self.session
        session = Session(child.run_id, s.gateway, s.store, tenant=s.tenant, owner=s.owner, retry=s.retry,
                          runtime=s.runtime, ownership=s.ownership, model_caller=s.model_caller)
        return await run_child_pass(episode.child_agent(self.root, child.rejected_left), child, session)

    def cancel(self, child_run_id: str, reason: str, *, by: str) -> None:
        store = self.session.store
        cp = store.checkpoint(child_run_id)
        if cp is not None and cp.is_open:
            try:
                cancel(store, child_run_id, reason, by=by)
            except CuadernoError:
                pass  # best effort: the child's next opener finds its parent closed anyway


def _json_object(text: str) -> str | None:
    """The JSON object in a final answer: the whole text, or inside a code fence, or from the
    first ``{`` to the last ``}`` (small models wrap their JSON in prose)."""
    fenced = re.search(r"```(?:json)?\s*(\{.*\})\s*```", text, re.DOTALL)
    if fenced:
        return fenced.group(1)
    start, end = text.find("{"), text.rfind("}")
    return text[start:end + 1] if 0 <= start < end else None


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


@dataclass(kw_only=True, slots=True)
class _Tally:
    passes: list[PassRecord] = field(default_factory=list[PassRecord])

    @property
    def rejected(self) -> int:
        return sum(p.rejected for p in self.passes)


class _ParentRun(Generic[T]):
    """One parent process's walk through the episode: replay what is journaled, do the rest."""

    def __init__(self, episode: Episode[T], task: str, session: Session, runner: ChildRunner, decide: Decide[T],
                 apply: Apply[T] | None, lookup: Lookup[T] | None) -> None:
        self.e, self.task, self.s, self.runner = episode, task, session, runner
        self.decide_fn, self.apply_fn, self.lookup_fn = decide, apply, lookup
        self.run_id = session.run_id
        self.store = session.store
        self.journal: dict[tuple[str, str], StepEvent] = {}
        self.epoch = 0
        self.tally = _Tally()
        self.proposal: T | None = None
        self.cancel_requested = False

    # -- opening ----------------------------------------------------------------------------------

    async def run(self) -> EpisodeResult[T]:
        closed = self._open()
        if closed is not None:
            return closed
        try:
            if self.cancel_requested:
                self._finalize_cancel()
            try:
                return await self._walk()
            except RunCancelled:  # refused at an intent or the final answer: close the run now
                self._finalize_cancel()
        finally:
            self.s.ownership.release(self.store, self.run_id, self.epoch)

    def _finalize_cancel(self) -> NoReturn:
        """A cancellation was asked: no new pass, decision or apply starts. Close the parent with
        the cancellation record (an apply in flight is listed in it, as the loop lists a tool),
        and ask the child pass in flight, if any, to stop too."""
        for n in range(1, self.e.budgets.passes + 1):
            if self._ev(self._pass_id(n), "intent") is None or self._ev(self._pass_id(n), "result") is not None:
                continue
            self.runner.cancel(self._child_id(n), f"its parent {self.run_id!r} was cancelled", by=self.s.owner)
        finalize(self.store, self.run_id, self.epoch)

    def _open(self) -> EpisodeResult[T] | None:
        task_fp = fingerprint({"task": self.task, "episode": self.e.name})
        versions = self.e.versions()
        cp = self.store.checkpoint(self.run_id)
        if cp is None:
            self.store.append([StepEvent(run_id=self.run_id, step_id="run", phase="start", kind="run",
                                         name=self.e.name, fingerprint=task_fp,
                                         payload={"task": self.task, "versions": versions,
                                                  "tenant": self.s.tenant, "episode": self.e.name})])
        else:
            cp, events = verified(self.store, self.run_id)
            if cp.task_fingerprint != task_fp:
                raise ReplayDivergence(self.run_id, "run", f"task {cp.task_fingerprint}", f"task {task_fp}")
            if cp.versions != versions:
                self._version_mismatch(cp.versions, versions)
            if cp.status in ("completed", "failed", "cancelled"):
                return self._closed(cp, events)
        try:
            # Through the session's ownership, as the runner takes a run over (under Temporal the
            # workflow owns it: no process holds).
            self.epoch = self.s.ownership.acquire(self.store, self.run_id, self.s.owner,
                                                  force=self.s.force_takeover, open_only=True)
        except RunClosed:
            cp, events = verified(self.store, self.run_id)
            return self._closed(cp, events)
        cp, events = verified(self.store, self.run_id)  # all that was committed before the takeover
        self.cancel_requested = cp.cancel_requested is not None
        self.journal = {(ev.step_id, ev.phase): ev for ev in events}
        return None

    def _version_mismatch(self, recorded: dict[str, Any], current: dict[str, Any]) -> NoReturn:
        """The parent was started under other versions: ``session.on_version_mismatch`` says what
        to do, before anything is written. An episode refuses (``"refuse"``) or leaves the run to
        a worker of its versions (``"drain"``); going on under other code (``"resume"``,
        ``"cancel"``, a migration) is not supported for an episode's parent and is refused as a
        usage error, never ignored."""
        choice = self.s.on_version_mismatch
        if choice == "refuse":
            raise VersionMismatch(self.run_id, recorded, current)
        if choice == "drain":
            raise DrainOnOldWorker(self.run_id, recorded, current)
        named = f"Migration {choice.name!r}" if isinstance(choice, Migration) else repr(choice)
        raise UsageError(f"run {self.run_id!r}: an episode's parent supports on_version_mismatch='refuse' or "
                         f"'drain', not {named}; it was started under {recorded}, this code is {current}; "
                         "nothing was written")

    def _closed(self, cp: Checkpoint, events: list[StepEvent]) -> EpisodeResult[T]:
        """A closed parent answers from its journal: nothing runs, nothing is written."""
        if cp.status == "cancelled":
            raise RunClosed(self.run_id, cp.status)
        self.journal = {(ev.step_id, ev.phase): ev for ev in events}
        outcome = cp.outcome or {}
        for n in range(1, self.e.budgets.passes + 1):
            if self._ev(self._pass_id(n), "result") is None:
                break
            self._record_pass(n)
        proposal = outcome.get("proposal")
        return EpisodeResult(status=outcome.get("episode_status", "failed"), reason=str(outcome.get("reason", "")),
                             proposal=self.e.output.model_validate(proposal) if proposal is not None else None,
                             receipt=outcome.get("receipt"), passes=tuple(self.tally.passes), replayed=True)

    # -- the walk ---------------------------------------------------------------------------------

    async def _walk(self) -> EpisodeResult[T]:
        feedback = ""
        budgets = self.e.budgets
        for n in range(1, budgets.passes + 1):
            result = self._ev(self._pass_id(n), "result") or await self._run_child(n, feedback)
            record = self._record_pass(n)
            faults.point("episode.P1")  # the child's outcome is journaled, the decision not yet
            payload = result.payload
            if record.outcome == "ended":
                budget = str(payload.get("budget") or "")
                if payload.get("reason") == "budget" and budget:
                    name = _EPISODE_BUDGET.get(budget, budget)
                    return self._end_exhausted(name, payload)
                why = "child_cancelled" if payload.get("child_status") == "cancelled" else "child_failed"
                return self._end("failed", why, {"child": payload.get("child_outcome")})
            if self.tally.rejected > budgets.rejected_responses:
                return self._end_exhausted("rejected_responses", payload)
            decision = self._decision_of(n)
            if decision is None:
                if record.outcome == "rejected":
                    decision = Decision.another_pass(str(payload.get("errors", "")))
                else:
                    assert self.proposal is not None
                    cp = self.store.checkpoint(self.run_id)
                    if cp is not None and cp.cancel_requested is not None:
                        raise RunCancelled(self.run_id, cp.cancel_requested)  # not even a check on a copy
                    decision = await self._decide(self.proposal)
                self._append(StepEvent(run_id=self.run_id, step_id=self._pass_id(n), phase="decision", kind=_KIND,
                                       decision=decision.action, payload={"reason": decision.reason}))
                self.tally.passes[-1] = _with_decision(record, decision)
                faults.point("episode.D1")  # decided, nothing applied yet
            if decision.action == "apply":
                assert self.proposal is not None
                try:
                    receipt = await self._apply(n, self.proposal)
                except _ApplyFailed as exc:  # refused, known not to have happened: nothing applied
                    return self._end("failed", "apply_failed", {"error": exc.args[0] if exc.args else None})
                return self._final("applied", decision.reason, receipt)
            if decision.action == "discard":
                return self._final("discarded", decision.reason, None)
            feedback = decision.reason
        return self._end_exhausted("passes", {"limit": budgets.passes})

    async def _decide(self, proposal: T) -> Decision:
        decision = await _maybe_await(self.decide_fn(proposal))
        if not isinstance(decision, Decision):
            raise UsageError(f"decide must return a Decision (Decision.apply/discard/another_pass), "
                             f"got {decision!r:.80}; nothing was journaled")
        if decision.action == "apply" and self.apply_fn is None:
            raise UsageError("decide chose to apply, but the episode was given no apply callback; nothing was journaled")
        return decision

    def _decision_of(self, n: int) -> Decision | None:
        ev = self._ev(self._pass_id(n), "decision")
        if ev is None:
            return None
        action = ev.decision
        if action not in ("apply", "discard", "another_pass"):
            raise ReplayDivergence(self.run_id, self._pass_id(n), f"decision {action!r}", "apply, discard or another_pass")
        return Decision(action, str(ev.payload.get("reason", "")))  # type: ignore[arg-type]

    # -- a child pass -----------------------------------------------------------------------------

    async def _run_child(self, n: int, feedback: str) -> StepEvent:
        """Run (or re-attach to) child pass ``n`` through the runner and journal how it ended."""
        step_id, child_id = self._pass_id(n), self._child_id(n)
        if self._ev(step_id, "intent") is None:
            self._append(StepEvent(run_id=self.run_id, step_id=step_id, phase="intent", kind=_KIND,
                                   payload={"child_run_id": child_id}))
        child = ChildPass(parent_run_id=self.run_id, step_id=step_id, run_id=child_id, number=n,
                          task=self.e.child_task(self.task, n, feedback),
                          rejected_left=max(self.e.budgets.rejected_responses - self.tally.rejected, 0))
        ended = await self.runner.run(self.e, child)
        counts = {"turns": ended.turns, "child_rejected": ended.rejected, "cost_usd": ended.cost_usd,
                  "unpriced_calls": ended.unpriced_calls, "possibly_billed_twice": ended.possibly_billed_twice,
                  "tool_errors": ended.tool_errors, "child_run_id": child_id}
        if ended.output is not None:
            proposal, errors = self.e.validate(ended.output)
            if proposal is not None:
                payload = {**counts, "outcome": "proposal", "proposal": proposal.model_dump(mode="json")}
            else:
                payload = {**counts, "outcome": "rejected", "errors": errors, "answer": ended.output[:2000]}
        else:
            outcome = ended.outcome
            payload = {**counts, "outcome": "ended", "reason": outcome.get("reason"), "budget": outcome.get("budget"),
                       "child_status": ended.status, "child_outcome": outcome}
        return self._append(StepEvent(run_id=self.run_id, step_id=step_id, phase="result", kind=_KIND,
                                      payload=payload))[0]

    def _record_pass(self, n: int) -> PassRecord:
        """Pass ``n`` as its journaled result (and decision, if any) say; sets the proposal."""
        ev = self._ev(self._pass_id(n), "result")
        assert ev is not None
        p = ev.payload
        outcome = str(p.get("outcome"))
        rejected = int(p.get("child_rejected", 0)) + (1 if outcome == "rejected" else 0)
        if outcome == "proposal":
            self.proposal = self.e.output.model_validate(p["proposal"])
        decided = self._decision_of(n)
        ended = f"{_EPISODE_BUDGET.get(p['budget'], p['budget'])} ran out" if p.get("budget") else str(p.get("reason") or "")
        reason = decided.reason if decided else str(p.get("errors") or ended)
        record = PassRecord(number=n, child_run_id=str(p.get("child_run_id")), outcome=outcome,
                            turns=int(p.get("turns", 0)), rejected=rejected, cost_usd=float(p.get("cost_usd", 0.0)),
                            unpriced_calls=int(p.get("unpriced_calls", 0)),
                            possibly_billed_twice=int(p.get("possibly_billed_twice", 0)),
                            tool_errors=int(p.get("tool_errors", 0)),
                            decision=decided.action if decided else None, reason=reason)
        self.tally.passes.append(record)
        return record

    # -- the apply effect -------------------------------------------------------------------------

    async def _apply(self, n: int, proposal: T) -> Any:
        """Apply at most once per journaled intent, through the effect protocol
        (:class:`~cuaderno.durable.effect.Effect`): its intent is durable before the callback runs,
        and an intent without a result is settled first (the lookup, or ``needs_human``)."""
        step_id = f"{self._pass_id(n)}.apply"
        done = self._ev(step_id, "result")
        if done is not None:  # applied, refused, or settled by a person: answered from the journal
            if done.payload.get("outcome") != "ok":
                raise _ApplyFailed(done.payload.get("error"))
            return done.payload.get("value")
        apply_fn, lookup_fn = self.apply_fn, self.lookup_fn
        assert apply_fn is not None
        args = proposal.model_dump(mode="json")
        # The log writes into the parent's own index: ``_append`` and the effect see every write.
        log = JournalLog(self.store, self.run_id, epoch=self.epoch, index=self.journal)

        async def body(attempt: int) -> Any:
            faults.point("episode.A2")  # the intent is on disk, the effect has not run
            receipt = await _maybe_await(apply_fn(proposal, effect.key))
            faults.point("episode.A4")  # the effect happened, its result is not journaled yet
            try:
                return journalable(receipt, run_id=self.run_id, step_id=step_id, tool="apply")
            except ToolResultInvalid as exc:
                # The effect happened: it is recorded as applied (never applied again), with why
                # its receipt could not be kept instead of the receipt.
                return {"receipt_not_journalable": str(exc)}

        async def lookup(attempt: int) -> Any:
            assert lookup_fn is not None
            found = await _maybe_await(lookup_fn(proposal, effect.key))
            return journalable(found, run_id=self.run_id, step_id=step_id, tool="apply")  # a receipt it can hold

        # A new apply's key is derived as every effect key is (a started one keeps the key its
        # first intent holds: the Effect reads it back).
        key = effect_key(self.s.tenant, self.run_id, "apply", args, str(self.e.versions()["episode"]))
        effect = Effect(log=log, step_id=step_id, tool="apply", arguments=args,
                        fingerprint=fingerprint({"name": "apply", "arguments": args}), key=key, body=body,
                        lookup=lookup if lookup_fn is not None else None, idempotent=False, decision=None,
                        policy_version=None, retry=self.s.retry, sleep=self.s.runtime.sleep,
                        rng=self.s.runtime.random, tells_the_model=False, unclassified="uncertain")
        settled = await effect.run()
        log.commit()
        if settled.payload.get("outcome") != "ok":  # refused, known not to have happened
            raise _ApplyFailed(settled.error)
        return settled.value

    # -- closing ----------------------------------------------------------------------------------

    def _final(self, status: Literal["applied", "discarded"], reason: str, receipt: Any) -> EpisodeResult[T]:
        proposal = self.proposal.model_dump(mode="json") if self.proposal is not None else None
        output = json.dumps(proposal, sort_keys=True) if status == "applied" else ""
        self._append(StepEvent(run_id=self.run_id, step_id="final", phase="result", kind="final",
                               payload={"output": output, "episode_status": status, "reason": reason,
                                        "proposal": proposal, "receipt": receipt, **self._totals()}))
        return EpisodeResult(status=status, reason=reason, proposal=self.proposal, receipt=receipt,
                             passes=tuple(self.tally.passes))

    def _end_exhausted(self, budget: str, payload: dict[str, Any]) -> EpisodeResult[T]:
        limits = {"turns_per_pass": self.e.budgets.turns_per_pass, "passes": self.e.budgets.passes,
                  "rejected_responses": self.e.budgets.rejected_responses}
        return self._end("exhausted", budget, {"reason": "budget", "budget": budget,
                                               "limit": limits.get(budget, payload.get("limit"))})

    def _end(self, status: Literal["exhausted", "failed"], reason: str, extra: dict[str, Any]) -> EpisodeResult[T]:
        proposal = self.proposal.model_dump(mode="json") if self.proposal is not None else None
        self._append(StepEvent(run_id=self.run_id, step_id="run", phase="end", kind="run",
                               payload={"reason": reason, **extra, "status": "failed", "episode_status": status,
                                        "proposal": proposal, **self._totals()}))
        return EpisodeResult(status=status, reason=reason, proposal=self.proposal, passes=tuple(self.tally.passes))

    def _totals(self) -> dict[str, Any]:
        t = self.tally
        return {"passes": len(t.passes), "turns": sum(p.turns for p in t.passes), "rejected": t.rejected,
                "cost_usd": round(sum(p.cost_usd for p in t.passes), 10)}

    # -- the journal ------------------------------------------------------------------------------

    def _append(self, ev: StepEvent) -> list[StepEvent]:
        stored = self.store.append([ev], epoch=self.epoch)
        for s in stored:
            self.journal[(s.step_id, s.phase)] = s
        return stored

    def _ev(self, step_id: str, phase: str) -> StepEvent | None:
        return self.journal.get((step_id, phase))

    def _pass_id(self, n: int) -> str:
        return f"{self.e.name}.pass{n:02d}"

    def _child_id(self, n: int) -> str:
        return f"{self.run_id}/{self._pass_id(n)}"


class _ApplyFailed(CuadernoError):
    """The apply callback refused (a classified, non-ambiguous ToolError): nothing was applied."""


def _with_decision(record: PassRecord, decision: Decision) -> PassRecord:
    return dataclasses.replace(record, decision=decision.action, reason=decision.reason)
