"""``Agent`` (what the agent is) and ``Session`` (where and as which run it runs).

An ``Agent`` is data: instructions, tools, policy, model, budgets. A ``Session`` binds one run id
to a gateway and a journal. ``agent.run(task, session=...)`` drives the loop in
:mod:`cuaderno.loop.runner`; calling it again with the same run id in any process resumes the run
and only what had not happened yet happens.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pydantic

from cuaderno.budgets import Budgets
from cuaderno.errors import UsageError
from cuaderno.fingerprint import fingerprint
from cuaderno.gateway.base import ModelGateway
from cuaderno.journal.base import EVENT_SCHEMA_VERSION, Checkpointer
from cuaderno.loop.executor import ToolExecutor
from cuaderno.loop.model_calls import ModelCaller
from cuaderno.loop.ownership import Ownership, ProcessOwnership
from cuaderno.loop.runtime import Runtime
from cuaderno.loop.steps import Step
from cuaderno.loop.versions import Migration
from cuaderno.tools.definition import Tool
from cuaderno.tools.policy import ALLOW_ALL, Policy

if TYPE_CHECKING:
    from cuaderno.loop.conversation import Conversation
    from cuaderno.loop.result import RunResult
    from cuaderno.loop.streaming import Emit, TokenStream

__all__ = ["LOOP_VERSION", "Agent", "RetryPolicy", "Session"]

LOOP_VERSION = "1"
"""Version of the rules that turn journaled results back into a conversation. Bump it when they
change: a run started under another loop version must be resumed by an explicit choice."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """The one retry layer (gateways and SDKs never retry on their own).

    Attributes:
        max_retries: retries of a request that provably did not reach the provider or that the
            provider refused (``transient``): same key, same body.
        max_resends: re-sends after a timeout *after* sending (``ambiguous``): same key; each one
            is journaled and counted as possibly billed twice.
        base_delay: first backoff in seconds; doubles per attempt, with full jitter.
        max_delay: cap for one wait, ``retry-after`` included (a longer ask fails the step).
    """

    max_retries: int = 3
    max_resends: int = 1
    base_delay: float = 0.5
    max_delay: float = 30.0

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float | None:
        """Seconds to wait before retry number ``attempt`` (1-based), or ``None`` to give up."""
        if retry_after is not None:
            return retry_after if retry_after <= self.max_delay else None
        ceiling = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
        return rng.uniform(0, ceiling)


class Session:
    """One run of an agent: its id, the gateway to call, and the journal to write.

    Args:
        run_id: the run's identity. Reusing it resumes the run.
        gateway: answers model requests. A resume may use another gateway object.
        store: the journal.
        tenant: part of every effect key, so two tenants never share an effect identity.
        owner: names this process in the fencing record (default: the runtime's, host and pid).
        on_version_mismatch: what to do when the run was started under other versions (see
            :mod:`cuaderno.loop.versions`): ``"refuse"`` (default), ``"resume"``, ``"drain"``,
            ``"cancel"`` or a :class:`~cuaderno.loop.versions.Migration`. A completed run follows
            the same rule: refused by default; an explicit choice replays its answer with
            ``FinalStep.version_mismatch`` set.
        retry: the retry layer's bounds.
        sleep: how to wait between retries (injectable for tests; ignored with ``runtime``).
        seed: seeds the retry jitter (ignored with ``runtime``).
        verify_replay: re-derive and check the request fingerprint of every replayed turn, not
            only of turn 0 (slower on long runs; the later turns depend only on what turn 0
            checks and on hash-chained journal rows).
        force_takeover: take the run over even while another live process holds it
            (:class:`~cuaderno.errors.RunBusy` otherwise). Its step in flight may then run twice:
            for a holder you know is stuck.
        runtime: the clock, random source, sleep and owner name the loop uses
            (:mod:`cuaderno.loop.runtime`; default: the process's, with ``seed`` and ``sleep``).
        ownership: how the run is held (:mod:`cuaderno.loop.ownership`; default: by this process).
        tools: runs the agent's tools by name (:mod:`cuaderno.loop.executor`; default: the agent's
            own functions, in this process, each run in an ``execute_tool`` span).
        model_caller: sends each model request (:mod:`cuaderno.loop.model_calls`; default: through
            ``gateway``, each send in a ``chat`` span).
    """

    def __init__(self, run_id: str, gateway: ModelGateway, store: Checkpointer, *, tenant: str = "default",
                 owner: str | None = None,
                 on_version_mismatch: Literal["refuse", "resume", "drain", "cancel"] | Migration = "refuse",
                 retry: RetryPolicy | None = None, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 seed: int | None = None, verify_replay: bool = False, force_takeover: bool = False,
                 runtime: Runtime | None = None, ownership: Ownership | None = None,
                 tools: ToolExecutor | None = None, model_caller: ModelCaller | None = None) -> None:
        if not isinstance(run_id, str) or not run_id:
            raise UsageError("run_id must be a non-empty string")
        if not isinstance(on_version_mismatch, Migration) and on_version_mismatch not in (
                "refuse", "resume", "drain", "cancel"):
            raise UsageError("on_version_mismatch must be 'refuse', 'resume', 'drain', 'cancel' or a Migration")
        self.run_id = run_id
        if not isinstance(store, Checkpointer):
            raise UsageError(f"store must be a Checkpointer (SqliteCheckpointer, ...), got {type(store).__name__}")
        self.gateway = gateway
        self.store = store
        self.tenant = tenant
        self.runtime = runtime or Runtime(seed=seed, sleep=sleep)
        self.ownership: Ownership = ownership or ProcessOwnership(self.runtime)
        self.owner = owner or self.runtime.owner()
        self.on_version_mismatch = on_version_mismatch
        self.retry = retry or RetryPolicy()
        self.tools = tools
        self.model_caller = model_caller
        self.verify_replay = verify_replay
        self.force_takeover = force_takeover


class Agent:
    """An agent: instructions, tools, a policy, a model, and budgets.

    Args:
        instructions: the system prompt. Part of every request fingerprint: changing it makes
            an old run's recorded requests diverge, which resume reports instead of hiding.
        tools: the tools the model may call.
        policy: decides each tool call (default: allow everything).
        model: the model name passed to the gateway.
        name: names the agent in the journal.
        max_turns: model calls per run before the run stops.
        require_tool: every turn must call a tool (``tool_choice=required``).
        budgets: per-run bounds on retries, repairs, replans, reflects, escalations and
            rejected responses (see :class:`~cuaderno.budgets.Budgets`).
        output_type: a pydantic model the final answer must validate against (JSON in the
            final text, a ```json fence tolerated). An answer that fails is a rejected response:
            journaled, counted, sent back with the errors, within ``budgets.rejected_responses``
            (see :mod:`cuaderno.gateway.structured`).
    """

    def __init__(self, *, instructions: str, tools: Sequence[Tool] = (), policy: Policy | None = None,
                 model: str | None = None, name: str = "agent", max_turns: int = 32, require_tool: bool = False,
                 max_output_tokens: int | None = None, temperature: float | None = None,
                 budgets: Budgets | None = None, output_type: type[pydantic.BaseModel] | None = None) -> None:
        if not isinstance(instructions, str):
            raise UsageError("instructions must be a string")
        if isinstance(tools, (str, bytes)) or not isinstance(tools, Iterable):
            raise UsageError("tools must be a list of @tool functions")
        tools = list(tools)
        for t in tools:
            if not isinstance(t, Tool):
                raise UsageError(f"{t!r:.80} is not a Tool: declare it with @tool")
        self.instructions = instructions
        self.tools = {t.name: t for t in tools}
        if len(self.tools) != len(tools):
            raise UsageError("two tools share a name")
        if policy is not None and not isinstance(policy, Policy):
            raise UsageError("policy must be a Policy")
        self.policy = policy or ALLOW_ALL
        unknown = sorted(set(self.policy.rules) - set(self.tools))
        if unknown:
            # A misspelt rule would let the tool it meant run without its decision (an approval).
            raise UsageError(f"the policy has rules for tools this agent does not have: {unknown}; "
                             f"its tools are {sorted(self.tools)}")
        self.model = model
        self.name = name
        if type(max_turns) is not int or max_turns < 1:
            raise UsageError("max_turns must be an integer of at least 1")
        self.max_turns = max_turns
        self.require_tool = require_tool
        self.max_output_tokens = max_output_tokens
        self.temperature = temperature
        self.tool_schemas = tuple(t.schema() for t in tools)
        self.budgets = budgets or Budgets()
        if output_type is not None and not (isinstance(output_type, type)
                                            and issubclass(output_type, pydantic.BaseModel)):
            raise UsageError(f"output_type must be a pydantic model class, got {output_type!r:.80}")
        self.output_type = output_type

    def config(self) -> dict[str, object]:
        """The parts of every request that do not depend on the conversation."""
        config: dict[str, object] = {"instructions": self.instructions, "tools": list(self.tool_schemas),
                                     "model": self.model, "require_tool": self.require_tool}
        if self.max_output_tokens is not None:
            config["max_output_tokens"] = self.max_output_tokens
        if self.temperature is not None:
            config["temperature"] = self.temperature
        if self.output_type is not None:  # only when set: the fingerprints of other agents stay as they were
            config["output_schema"] = self.output_type.model_json_schema()
        return config

    def versions(self) -> dict[str, str | int]:
        """Event schema, loop, policy, capability and agent versions, recorded when a run starts."""
        return {
            "schema": EVENT_SCHEMA_VERSION,
            "loop": LOOP_VERSION,
            "policy": self.policy.version,
            "capabilities": fingerprint(sorted(t.schema_fingerprint() for t in self.tools.values()))[:16],
            "agent": fingerprint(self.config())[:16],
        }

    def run(self, task: str, *, session: Session) -> AsyncIterator[Step]:
        """Run (or resume) ``session.run_id`` on ``task``; yield each step as it is journaled."""
        from cuaderno.loop.runner import Runner

        if not isinstance(task, str):
            raise UsageError(f"the task must be a string, got {type(task).__name__}")
        if not isinstance(session, Session):
            raise UsageError("session must be a Session")

        return Runner(self, task, session).steps()

    async def run_to_end(self, task: str, *, session: Session) -> RunResult:
        """Run (or resume) the run until it stops; return how it stopped (:mod:`cuaderno.loop.result`).

        A suspended run (waiting for an approval), one that needs a person, a failed or a
        cancelled one is returned with its status, not raised."""
        from cuaderno.loop.result import run_to_end

        return await run_to_end(self, task, session=session)

    def run_sync(self, task: str, *, session: Session) -> RunResult:
        """:meth:`run_to_end` for synchronous code (scripts, sync web frameworks).

        Raises:
            UsageError: called inside a running event loop (there, ``await run_to_end``).
        """
        from cuaderno.loop.result import run_sync

        return run_sync(self.run_to_end(task, session=session))

    def stream(self, task: str, *, session: Session, on_token: Emit | None = None) -> TokenStream:
        """:meth:`run_to_end` with the model's answers streamed to the caller as they are
        generated, while the journal records each complete response (see
        :mod:`cuaderno.loop.streaming`). Iterate the returned stream for
        :class:`~cuaderno.loop.streaming.Token` objects (its ``result`` is set at the end), or
        ``await`` it for the :class:`~cuaderno.loop.result.RunResult`; ``on_token`` sees every token."""
        from cuaderno.loop.runner import Runner
        from cuaderno.loop.streaming import TokenStream, run_streaming

        if not isinstance(task, str):
            raise UsageError(f"the task must be a string, got {type(task).__name__}")
        if not isinstance(session, Session):
            raise UsageError("session must be a Session")
        return TokenStream(lambda emit: run_streaming(self, session, emit, lambda s: Runner(self, task, s)),
                           on_token)

    def conversation(self, *, session: Session, id: str | None = None) -> Conversation:
        """A multi-turn conversation with this agent (:mod:`cuaderno.loop.conversation`): each
        user message a run ``<id>/m0001``, ``<id>/m0002``... of the same journal, earlier answers
        replayed from it, never paid again. ``id`` defaults to ``session.run_id``; the session's
        gateway, journal and settings serve every message."""
        from cuaderno.loop.conversation import Conversation

        if not isinstance(session, Session):
            raise UsageError("session must be a Session")
        return Conversation(self, session, id)

    def output_of(self, record: Mapping[str, Any]) -> Any:
        """The final answer of a journaled final record: its text, or for an ``output_type``
        the model instance rebuilt from the JSON journaled when the answer was accepted (never
        re-parsed from the text: the journal says what was accepted)."""
        if self.output_type is None or "data" not in record:
            return record.get("output")
        return self.output_type.model_validate(record["data"])
