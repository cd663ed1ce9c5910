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

import json
import os
import re
from collections.abc import Sequence
from typing import Generic

from pydantic import BaseModel, ValidationError

from cuaderno.budgets import Budgets
from cuaderno.episodes._children import ChildOutcome, ChildPass, ChildRunner, LocalChildRunner, run_child_pass
from cuaderno.episodes._parent import _ParentRun
from cuaderno.episodes._records import Apply, Decide, Decision, EpisodeResult, Lookup, PassRecord, T
from cuaderno.episodes.budgets import EpisodeBudgets
from cuaderno.errors import UsageError
from cuaderno.fingerprint import fingerprint
from cuaderno.journal.base import EVENT_SCHEMA_VERSION
from cuaderno.loop import Agent, Session
from cuaderno.tools.definition import Tool
from cuaderno.tools.sandbox import ReadOnlyRoot

__all__ = ["EPISODE_VERSION", "ChildOutcome", "ChildPass", "ChildRunner", "Decision", "Episode", "EpisodeResult",
           "LocalChildRunner", "PassRecord", "run_child_pass"]

EPISODE_VERSION = "1"
"""Version of the rules that turn a parent's journal back into its next step (step ids, how a
child's task is derived from it). Bump it when they change."""

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_FEEDBACK_LIMIT = 4000
"""Characters of feedback carried into the next pass's task (a test's whole output would be a
context bill, not a hint)."""


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

    def versions(self) -> dict[str, str | int]:
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


def _json_object(text: str) -> str | None:
    """The JSON object in a final answer: the whole text, or inside a code fence, or from the
    first ``{`` to the last ``}`` (small models wrap their JSON in prose)."""
    fenced = re.search(r"```(?:json)?\s*(\{.*\})\s*```", text, re.DOTALL)
    if fenced:
        return fenced.group(1)
    start, end = text.find("{"), text.rfind("}")
    return text[start:end + 1] if 0 <= start < end else None
