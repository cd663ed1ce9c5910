"""Multi-turn conversations: a chat that goes on across user messages, in one journal.

``agent.conversation(session=..., id="chat-42")`` returns a :class:`Conversation`. Each user
message is a run of its own, ``chat-42/m0001``, ``chat-42/m0002``..., with every rule of a run
(intents before sends, effect keys, approvals, budgets, fencing); the conversation's *head* run,
``chat-42``, records the messages in order. Nothing else is stored: what the model is told is
derived from the journal, the same way in every process.

Journaled, and what replay needs from it:

- the head's ``run``/``start`` (kind ``run``, the agent's name and versions, the tenant): the
  conversation exists;
- one ``mNNNN``/``message`` event per user message (kind ``conversation``): ``payload.text`` is
  the message, compared with what is sent at that position (another text is
  :class:`~cuaderno.errors.ConversationDivergence`, nothing written), ``payload.run_id`` the
  message's run; its fingerprint is the message's. Written before the message's run starts,
  compare-and-set on the head's last row, so two processes cannot record two messages at one
  position;
- ``run``/``end`` with ``reason: closed``: :meth:`Conversation.close`; later messages are
  :class:`~cuaderno.errors.ConversationClosed`.

A message's requests start with the conversation so far: each earlier message whose run
completed, as a user message, followed by its final answer as an assistant message (tool calls
and their results stay inside their own message's run; a message whose run failed or was
cancelled is left out, question and all). Those are the first messages of the run's request
fingerprint, so a journal whose earlier answers changed is refused as a divergence.

Replay: sending the recorded messages again, in order, answers each from its run's journal (a
completed run's recorded answer: no model call, nothing re-paid); a message whose run was
interrupted (a crash, a kill) is resumed there, re-sending only what had no response.
:meth:`Conversation.resume` does the same for a process that does not know the messages: it
finishes the last recorded message and places the next :meth:`~Conversation.send` after it.
A new message while the last one waits for a person (or was interrupted and not resumed) is
:class:`~cuaderno.errors.MessageUnfinished`.

Crash point: ``conversation.M1``, after a message's head event commits and before its run
starts (the resumed send finds the message recorded and starts its run).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from cuaderno import faults
from cuaderno.errors import (
    ConversationClosed,
    ConversationDivergence,
    JournalConflict,
    MessageUnfinished,
    RunChanged,
    RunNotFound,
    UsageError,
)
from cuaderno.events import StepEvent
from cuaderno.events.payloads import ConversationMessage, RunEnd, RunStart, view
from cuaderno.fingerprint import fingerprint
from cuaderno.gateway.base import Message
from cuaderno.loop.result import run_sync
from cuaderno.loop.runner import Runner
from cuaderno.loop.streaming import Emit, TokenStream, drive, run_streaming

if TYPE_CHECKING:
    from cuaderno.loop.agent import Agent, Session
    from cuaderno.loop.result import RunResult

__all__ = ["Conversation", "message_run_id"]

_KIND = "conversation"
_CLOSED = ("completed", "failed", "cancelled")
_APPEND_TRIES = 5


def message_run_id(conversation_id: str, number: int) -> str:
    """The run id of a conversation's ``number``-th message (1-based): ``<id>/m0001``."""
    return f"{conversation_id}/m{number:04d}"


class _MessageRunner(Runner):
    """A message's run: its requests start with the conversation so far (``history``)."""

    def __init__(self, agent: Agent, task: str, session: Session, history: list[Message]) -> None:
        super().__init__(agent, task, session)
        self.history = history

    def _add_task(self) -> None:
        # The run's first message (its task) follows the earlier exchanges: they enter the
        # request fingerprint first, on every path that adds it (opening and replay).
        for earlier in self.history:
            self.log.add_message(earlier)
        super()._add_task()


class Conversation:
    """A chat that continues across user messages, durable like any run (see the module docs).

    Use :meth:`~cuaderno.loop.agent.Agent.conversation` to make one.

    Args:
        agent: answers every message.
        session: the gateway, journal, tenant and settings every message's run uses; its
            ``run_id`` is the conversation id unless ``conversation_id`` is given.
        conversation_id: the conversation's id (its head run's id).
    """

    def __init__(self, agent: Agent, session: Session, conversation_id: str | None = None) -> None:
        cid = session.run_id if conversation_id is None else conversation_id
        if not isinstance(cid, str) or not cid:
            raise UsageError("a conversation id must be a non-empty string")
        self.agent = agent
        self.session = session
        self.id = cid
        self.store = session.store
        self.position = 0
        """How many messages this object has sent or replayed: the next :meth:`send` is number
        ``position + 1``."""

    # -- reading the head ---------------------------------------------------------------------------

    def _head(self) -> tuple[int, bool, list[StepEvent]]:
        """The head's last seq, whether it is closed, and its message events in order."""
        cp = self.store.checkpoint(self.id)
        if cp is None:
            return 0, False, []
        try:
            events = self.store.load(self.id)
        except RunNotFound:
            return 0, False, []
        recorded = [e for e in events if e.kind == _KIND and e.phase == "message"]
        if any(e.kind != _KIND and e.step_id not in ("run", "cancel") for e in events):
            raise UsageError(f"run {self.id!r} is not a conversation: it has agent steps; "
                             "choose another conversation id")
        return len(events), cp.status in _CLOSED, recorded

    def _status(self, run_id: str) -> str | None:
        cp = self.store.checkpoint(run_id)
        return None if cp is None else cp.status

    def _history(self, recorded: list[StepEvent], upto: int) -> list[Message]:
        """The conversation before message ``upto + 1``: each completed exchange, oldest first."""
        history: list[Message] = []
        for ev in recorded[:upto]:
            cp = self.store.checkpoint(str(view(ev, ConversationMessage)["run_id"]))
            if cp is None or cp.status != "completed":
                continue  # failed or cancelled: the model never answered it
            history.append({"role": "user", "content": view(ev, ConversationMessage)["text"]})
            history.append({"role": "assistant", "content": str((cp.outcome or {}).get("output", ""))})
        return history

    @property
    def messages(self) -> list[dict[str, str]]:
        """The conversation as recorded: each user message and, when its run completed, the
        answer; ``run_id`` and ``status`` name the message's run and how it stands."""
        _, _, recorded = self._head()
        out: list[dict[str, str]] = []
        for ev in recorded:
            run_id = str(view(ev, ConversationMessage)["run_id"])
            cp = self.store.checkpoint(run_id)
            status = "not started" if cp is None else cp.status
            out.append({"role": "user", "content": view(ev, ConversationMessage)["text"], "run_id": run_id, "status": status})
            if cp is not None and cp.status == "completed":
                out.append({"role": "assistant", "content": str((cp.outcome or {}).get("output", "")),
                            "run_id": run_id})
        return out

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (in any process)."""
        return self._head()[1]

    # -- sending ----------------------------------------------------------------------------------

    def _place(self, text: str) -> tuple[str, list[Message]]:
        """Record message ``position + 1`` (or check it against the recorded one); return its run
        id and the conversation before it. Writes at most the head's message event."""
        if not isinstance(text, str) or not text:
            raise UsageError("a message must be a non-empty string")
        number = self.position + 1
        for _ in range(_APPEND_TRIES):
            last_seq, closed, recorded = self._head()
            if self.position < len(recorded):
                ev = recorded[self.position]
                if view(ev, ConversationMessage).get("text") != text:
                    raise ConversationDivergence(self.id, number, str(view(ev, ConversationMessage).get("text")), text)
                return str(view(ev, ConversationMessage)["run_id"]), self._history(recorded, self.position)
            if closed:
                raise ConversationClosed(self.id)
            if recorded:
                previous = str(view(recorded[-1], ConversationMessage)["run_id"])
                status = self._status(previous)
                if status not in _CLOSED:
                    raise MessageUnfinished(self.id, previous, status or "not started")
            run_id = message_run_id(self.id, number)
            events = [] if last_seq else [self._start_event()]
            events.append(StepEvent(run_id=self.id, step_id=f"m{number:04d}", phase="message", kind=_KIND,
                                    fingerprint=fingerprint({"message": text}),
                                    payload=dict(ConversationMessage(text=text, run_id=run_id))))
            try:
                self.store.append(events, expect_seq=last_seq)
            except (RunChanged, JournalConflict):
                continue  # another process wrote to the head meanwhile: read it again
            faults.point("conversation.M1")  # the message is recorded, its run not started
            return run_id, self._history(recorded, self.position)
        raise RunChanged(self.id, 0, 0)  # pragma: no cover - five writers in a row beat this one

    def _start_event(self) -> StepEvent:
        start: RunStart = {"task": f"conversation {self.id}", "conversation": True,
                           "versions": self.agent.versions(), "tenant": self.session.tenant}
        return StepEvent(run_id=self.id, step_id="run", phase="start", kind="run", name=self.agent.name,
                         fingerprint=fingerprint({"conversation": self.id}), payload=dict(start))

    def _message_session(self, run_id: str) -> Session:
        session = copy.copy(self.session)  # every setting of the caller's session, another run id
        session.run_id = run_id
        return session

    async def send(self, text: str) -> RunResult:
        """Send the next user message and run it to its end; return its :class:`RunResult`.

        At a recorded position the text must be the recorded one, and its answer comes from the
        journal (an interrupted run is resumed). Raises as ``run_to_end`` does, and
        :class:`~cuaderno.errors.ConversationDivergence`,
        :class:`~cuaderno.errors.MessageUnfinished`, :class:`~cuaderno.errors.ConversationClosed`
        (nothing written for any of them)."""
        run_id, history = self._place(text)
        session = self._message_session(run_id)
        result = await drive(_MessageRunner(self.agent, text, session, history).steps(), self.agent, session)
        self.position += 1
        return result

    def send_sync(self, text: str) -> RunResult:
        """:meth:`send` for synchronous code (raises :class:`~cuaderno.errors.UsageError` inside a
        running event loop)."""
        return run_sync(self.send(text))

    def stream(self, text: str, *, on_token: Emit | None = None) -> TokenStream:
        """:meth:`send`, with the answer streamed (:mod:`cuaderno.loop.streaming`): iterate the
        stream for tokens, or await it for the :class:`RunResult`."""

        async def start(emit: Emit) -> RunResult:
            run_id, history = self._place(text)
            session = self._message_session(run_id)
            result = await run_streaming(self.agent, session, emit,
                                         lambda s: _MessageRunner(self.agent, text, s, history))
            self.position += 1
            return result

        return TokenStream(start, on_token)

    async def resume(self) -> RunResult | None:
        """Finish the last recorded message (replayed if it completed, resumed if it was
        interrupted) and place the next :meth:`send` after it. ``None`` when no message was
        recorded. For a process that picks the conversation up without its messages."""
        _, _, recorded = self._head()
        if not recorded:
            return None
        self.position = len(recorded) - 1
        return await self.send(str(view(recorded[-1], ConversationMessage)["text"]))

    def close(self) -> None:
        """Close the conversation: it takes no new message (in any process). Idempotent.

        Raises:
            MessageUnfinished: the last message's run has not ended; finish it first.
        """
        for _ in range(_APPEND_TRIES):
            last_seq, closed, recorded = self._head()
            if closed:
                return
            if recorded:
                last = str(view(recorded[-1], ConversationMessage)["run_id"])
                status = self._status(last)
                if status not in _CLOSED:
                    raise MessageUnfinished(self.id, last, status or "not started")
            events = [] if last_seq else [self._start_event()]
            end: RunEnd = {"status": "completed", "reason": "closed", "messages": len(recorded)}
            events.append(StepEvent(run_id=self.id, step_id="run", phase="end", kind="run", payload=dict(end)))
            try:
                self.store.append(events, expect_seq=last_seq)
            except (RunChanged, JournalConflict):
                continue
            return
        raise RunChanged(self.id, 0, 0)  # pragma: no cover
