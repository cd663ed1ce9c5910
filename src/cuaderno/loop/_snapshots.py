"""Snapshots: a resume reads the latest snapshot and the rows after it, not the whole journal.

Every :data:`EVERY` journal rows the loop writes one more row, a *snapshot* (step id
:data:`STEP`, kind ``snapshot``, phase ``base.N``), in the same transaction as the first send of a
model turn's intent, just before it. It holds what a resume needs to go on from that turn without
replaying the turns before it; it is a row of the hash chain like any other, so it is checked
like any other. Its payload, and what replay needs from each field:

- ``turn``: the model turn whose intent follows it; every turn before it has ended (its
  response and every tool result are journaled), so the loop starts there.
- ``chain``: that turn's request fingerprint, the hash chain over the configuration and every
  message of the conversation so far (the intent's own fingerprint). The next request is
  fingerprinted from it, and the conversation rebuilt for it must hash to it.
- ``first``: turn 0's recorded request fingerprint: a resume under other instructions is refused
  before the takeover, as :meth:`Runner._check_first_request` does from the whole journal.
- ``base``: the run's summary (checkpoint) as stored just before the transaction, at seq ``N``
  (the phase's number). Folding the rows after ``N`` into it must give the stored summary, as
  :func:`~cuaderno.checkpoint.verified` checks a summary against the whole journal.

Nothing in a snapshot is trusted blindly. A resume reads the summary, the latest snapshot and
every row after its base in one read (:class:`~cuaderno.journal.base.SupportsTail`), and uses it
only if the rows chain from the base's head to the summary's head (with the snapshot among them,
so its payload is the one written) and the base plus those rows is the stored summary. Anything
else (no snapshot, a damaged one, a run that is not simply ``running``: waiting for a person, a
cancellation, an uncertain effect, a migration, ``verify_replay``, a live trace) takes the whole
journal, as before; a damaged row then fails that read's chain check (JournalCorrupt).

What a snapshot does not hold is the conversation (that would make each snapshot as large as the
run). The first model call after a resume rebuilds it from the whole journal, once, and checks it
against ``chain`` (:func:`conversation_before`): a resume is ready for its next step in a time
that does not grow with the run's length, and its first model call pays for reading the run, as
sending a request that holds the whole conversation does anyway.

These functions receive the run's state (:class:`~._state.RunState`, a plain record) and write
only ``snaps`` (the :class:`~._state.Cursor`) and, when a resume goes on from a snapshot
(:func:`opened`), ``unvisited``, ``chain``, ``unhashed`` and ``messages``: the state a whole
replay of the turns before the snapshot would have left.
"""

from __future__ import annotations

from collections.abc import Mapping

from cuaderno.checkpoint import Checkpoint, differing, project
from cuaderno.durable.model_call import accepted
from cuaderno.errors import JournalCorrupt, JournalError, RunNotFound
from cuaderno.events import Kind, Phase, StepEvent, model_step_id, row_hash, tool_step_id
from cuaderno.events.payloads import ModelIntent, ModelResult, SnapshotBase, ToolResult, view
from cuaderno.fingerprint import chain, fingerprint
from cuaderno.gateway.base import Message, ToolCall, assistant_message
from cuaderno.gateway.structured import feedback_messages
from cuaderno.journal import decode_small_payloads
from cuaderno.journal.base import SupportsTail, Tail, tail_base
from cuaderno.loop._state import Cursor, Restored, RunState, journalable_call, tool_message
from cuaderno.telemetry import AgentPassSpan

__all__ = ["EVERY", "STEP", "Cursor", "Restored", "conversation_before", "opened", "snapshot_event", "tail_open"]

STEP = "snapshot"
EVERY = 256
"""Journal rows between two snapshots (about 64 turns of one tool call each): a resume reads at
most about this many rows besides the snapshot, and a snapshot costs one summary read and one row
of a few hundred bytes per that many."""
FORMAT = 1


def snapshot_event(state: RunState, intent: StepEvent) -> StepEvent | None:
    """The snapshot to commit just before ``intent`` (a model turn's first send), or ``None``."""
    turn = view(intent, ModelIntent).get("turn")
    if type(turn) is not int or turn < 1 or intent.fingerprint is None:
        return None
    # Turn 0's request, as this loop sent or replayed it: a run that was never migrated (the only
    # kind that gets snapshots) was checked to have sent exactly this one.
    first = first_request(state)
    store = state.store
    if not isinstance(store, SupportsTail):
        return None  # a store that cannot read a tail would never use it
    if not state.snaps.prepared:
        store.prepare_tail()
        state.snaps.prepared = True
    cp = store.checkpoint(state.run_id)
    if cp is None:
        return None
    base = cp.to_json()
    base.pop("epoch", None)  # the epoch column moves with takeovers, outside the chain
    payload: SnapshotBase = {"format": FORMAT, "turn": turn, "chain": intent.fingerprint, "first": first,
                             "base": base}
    return StepEvent(run_id=state.run_id, step_id=STEP, phase=f"{Phase.BASE}.{cp.last_seq}", kind=Kind.SNAPSHOT,
                     payload=dict(payload))


def first_request(state: RunState) -> str:
    """Turn 0's request fingerprint for this agent and task (the configuration, then the task)."""
    return chain(state.config_fp, fingerprint({"role": "user", "content": state.task}))


def _simple(cp: Checkpoint, versions: Mapping[str, object]) -> bool:
    """A run a snapshot may open: running, nothing waiting, uncertain or cancelled, same versions."""
    return (cp.status == "running" and cp.cancel_requested is None and not cp.uncertain and not cp.pending
            and cp.versions == versions)


def tail_open(state: RunState, cp: Checkpoint, versions: Mapping[str, object]) -> tuple[Checkpoint, list[StepEvent]] | None:
    """The run's checked summary and its events after its latest snapshot's base (see the
    module), with the snapshot kept on ``state`` (``snaps.restored``); ``None``: open it from the whole
    journal. ``cp`` (the summary as read before, unchecked) only saves a read that cannot help."""
    store = state.store
    if (not isinstance(store, SupportsTail) or state.s.verify_replay or type(state.pass_span) is not AgentPassSpan
            or not _simple(cp, versions)):
        return None
    try:
        tail = store.load_tail(state.run_id, STEP)
        if tail is None or not _simple(tail.summary, versions):
            return None
        found = _checked(state.run_id, tail)
    except (JournalError, RunNotFound, KeyError, ValueError, TypeError, AttributeError):
        return None  # the whole journal's read says what is wrong, if anything is
    if found is None:
        return None
    restored, events = found
    if restored.turn > state.agent.max_turns or any(ev.kind == "run" and ev.phase.startswith("migrate")
                                                    for ev in events):
        return None  # the whole read refuses (or migrates) it, as it does for any run
    # Turn 0's request must be the recorded one (the configuration and task it hashes are this
    # agent's): otherwise the whole read's check refuses the resume, with its error.
    if first_request(state) != restored.first:
        return None
    beyond = model_step_id(state.agent.max_turns)
    if any(ev.step_id == beyond for ev in events):
        return None
    state.snaps.restored = restored
    return tail.summary, events


def _checked(run_id: str, tail: Tail) -> tuple[Restored, list[StepEvent]] | None:
    """The snapshot and the events after its base, if the rows chain from the base's head to the
    summary's and the base folded with them is the stored summary; ``None`` otherwise."""
    mark, events, summary = tail.mark, tail.events, tail.summary
    base_seq = tail_base(mark.phase)
    data = view(mark, SnapshotBase)
    if mark.kind != Kind.SNAPSHOT or base_seq is None or data.get("format") != FORMAT:
        return None
    turn, chain_fp, first = data.get("turn"), data.get("chain"), data.get("first")
    if type(turn) is not int or not isinstance(chain_fp, str) or not isinstance(first, str):
        return None
    base = Checkpoint.from_json({**data["base"], "epoch": summary.epoch})
    if base.run_id != run_id or base.last_seq != base_seq:
        return None
    prev, seq, seen = base.last_hash, base_seq, False
    for ev in events:
        seq += 1
        if ev.seq != seq or ev.run_id != run_id or row_hash(prev, ev, seq, ev.encoded_payload()) != ev.row_hash:
            return None
        seen = seen or (ev.seq == mark.seq and ev.row_hash == mark.row_hash)
        prev = ev.row_hash
        project(base, ev)
    if not seen or (seq, prev) != (summary.last_seq, summary.last_hash) or differing(summary, base):
        return None
    decode_small_payloads(events)
    return Restored(mark.seq, turn, chain_fp, first), events


def opened(state: RunState, events: list[StepEvent]) -> None:
    """After the loop indexed ``events``: go on from the snapshot when they are its tail (the
    whole journal starts at seq 1 and drops it), and count the rows since the last snapshot."""
    snap: Restored | None = state.snaps.restored
    if snap is not None and events and events[0].seq == 1:
        snap = state.snaps.restored = None  # read again whole after the takeover (the run changed meanwhile)
    last = events[-1].seq if events else 0
    if snap is None:
        state.snaps.since = last - max((ev.seq for ev in events if ev.kind == "snapshot"), default=0)
        return
    for step_id, seq in list(state.unvisited.items()):
        if seq < snap.seq:
            del state.unvisited[step_id]  # results of turns before the snapshot: not replayed
    state.snaps.since = last - snap.seq
    state.snaps.start_turn = snap.turn
    state.chain = snap.chain
    state.unhashed.clear()
    state.messages = [{"role": "user", "content": state.task}]  # hashed into the chain already


def conversation_before(state: RunState, snap: Restored) -> list[Message]:
    """The messages of the turns before the snapshot's (after the task), rebuilt from the whole
    journal (chain-checked) as replay would add them, and checked: the last turn's recorded
    request followed by that turn's messages must hash to the snapshot's chain.

    Raises:
        JournalCorrupt: they do not (the journal and its snapshot disagree).
    """
    events = state.store.load(state.run_id)  # the whole journal, chain-checked
    index = {(ev.step_id, ev.phase): ev for ev in events}
    out: list[Message] = []
    last_start, last_fp = 0, None
    for turn in range(snap.turn):
        rec = index.get((model_step_id(turn), "result"))
        answer = None if rec is None else view(rec, ModelResult)
        response = None if answer is None else answer.get("response")
        if rec is None or answer is None or response is None:
            raise JournalCorrupt(f"run {state.run_id!r}: turn {turn} has no response before its snapshot at turn "
                                 f"{snap.turn}; the conversation cannot be rebuilt")
        last_start, last_fp = len(out), rec.fingerprint
        if not accepted(answer):
            out.extend(feedback_messages(answer))
            continue
        out.append(assistant_message(response))
        for i, raw in enumerate(response.get("tool_calls") or ()):
            call = journalable_call(ToolCall.from_json(raw))
            result = index.get((tool_step_id(turn, i), "result"))
            if result is None:
                raise JournalCorrupt(f"run {state.run_id!r}: tool call {tool_step_id(turn, i)} has no result before "
                                     f"its snapshot at turn {snap.turn}; the conversation cannot be rebuilt")
            out.append(tool_message(call.id, call.name, view(result, ToolResult)))
    # The last turn's recorded request (hash-chained in the journal) extended by that turn's
    # messages must be the snapshot's request: the same trust a whole replay gives recorded
    # requests (it adopts them without hashing every message again; ``verify_replay`` does not,
    # and never opens from a snapshot). Without a recorded request, from the start.
    fp, tail = (last_fp, out[last_start:]) if last_fp else \
        (state.config_fp, [{"role": "user", "content": state.task}, *out])
    for message in tail:
        fp = chain(fp, fingerprint(message))
    if fp != snap.chain:
        raise JournalCorrupt(f"run {state.run_id!r}: the conversation rebuilt from its journal does not hash to the "
                             f"request of its snapshot at turn {snap.turn}; nothing was sent")
    return out
