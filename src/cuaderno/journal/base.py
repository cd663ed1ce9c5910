"""The journal contract: :class:`Checkpointer`.

Four required operations (``append``, ``load``, ``checkpoint``, ``list_runs``) plus ``acquire``
for fencing and ``close``. The loop calls them, and so does the harness: approvals and
cancellations are appended while no loop is running, so the checkpointer is the run's diary, not a
private store of the framework.

What a backend may offer beyond that is an *optional capability*: a small protocol of its own
(:class:`SupportsRebuild`), declared by implementing it and detected with ``isinstance``, never a
method the base grows (LangGraph's checkpoint-conformance splits its base and extended
capabilities the same way). Callers that need one refuse a store without it with a
:class:`~cuaderno.errors.UsageError`, and the conformance suite runs its cases only where it is
declared.

The calls are synchronous, and stay so: decided by measurement (``benchmarks/bench_sync_contract.py``,
M runs on one event loop, 50 appends each, one INSERT and one synced COMMIT per append; this
machine: 2 cores shared with other work, fsync of a few ms; durable steps/s, medians of 3, two
runs of the benchmark a few minutes apart, as ``first / second``):

==========================  =========  ===========  ============
                            M=1        M=8          M=32
==========================  =========  ===========  ============
SQLite (this store) sync    127 / 223  180 / 241    183 / 308
SQLite (this store) thread  107 / 179  639 / 940    772 / 1,420
PostgreSQL sync             90 / 223   144 / 463    187 / 236
PostgreSQL thread           112 / 114  770 / 1,213  1,995 / 2,053
PostgreSQL async (psycopg)  124 / 116  548 / 780    935 / 1,065
PG + 0.5 ms RTT sync        163 / 124  102 / 155    137 / 212
PG + 0.5 ms RTT thread      123 / 96   777 / 1,000  1,757 / 2,101
PG + 0.5 ms RTT async       83 / 81    413 / 677    885 / 1,016
==========================  =========  ===========  ============

What the figures say:

- A blocking append *on the event loop* serialises every run sharing it: one commit at a time,
  about flat in M (90-460 steps/s here whatever M is). For PostgreSQL that wastes the server's
  own group commit of concurrent transactions: the same appends from M threads, one connection
  each, reach 2,000 steps/s at M=32, 9-11x the loop's.
- An async contract would not buy more than threads do: psycopg's ``AsyncConnection`` reached
  about half the threads' figure at M=32 (its per-statement work runs on the one loop), with or
  without a simulated round trip. At M=1 the three are within this machine's noise, so the
  embedded default's inline commit loses nothing against a hop there.
- For SQLite, one writer, threads cannot overlap two commits (the store holds one connection
  under a lock), yet they measured 4-5x at M=32. Much of that is this machine rather than
  concurrency: the same strictly serial commits ran 246-274/s issued from the main thread, 424/s
  from one worker thread and 800/s from eight taking turns (an idle virtual CPU wakes late from
  each fsync). Either way, what raises SQLite's ceiling for real is putting several runs' events
  in one commit.

So the contract stays a small synchronous protocol (what the harness, the CLI and a Temporal
activity call, with no loop of their own), and what changes is *how* it is called when runs share
a loop: through a group commit (:mod:`cuaderno.journal._group`) that writes the appends the
loop's runs make in one turn of the loop in one transaction and one sync, and resolves each run's
future once its events are durable. The group is written on the loop itself,
at the end of that turn: the first version wrote it from a thread off the loop, which measured
~20% slower at SQLite M=32 (GIL hand-offs; the figures are in :mod:`cuaderno.journal._group`).
It needs one more optional capability from a backend (the events of several runs in one
transaction, ``SupportsGroupAppend``), not a second, async contract that every backend would
have to implement twice.

Backends: :class:`~cuaderno.journal.memory.MemoryCheckpointer` (tests),
:class:`~cuaderno.journal.sqlite.SqliteCheckpointer` (the embedded default) and
:class:`~cuaderno.journal.postgres.PostgresCheckpointer` (a journal shared by workers on several
hosts). Every backend passes the conformance suite in ``cuaderno.testing.conformance``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import PayloadTooLarge, UsageError
from cuaderno.events import CODEC_JSON, StepEvent

__all__ = ["CLOSED_STATUSES", "DEFAULT_MAX_PAYLOAD", "EVENT_SCHEMA_VERSION", "SCHEMA_VERSION", "Checkpointer", "CommitsInGroups",
           "ConfirmsHold", "KnowsEarlierHolders", "SupportsClaims", "SupportsRebuild", "SupportsTail", "Tail", "tail_base",
           "byte_setting", "payload_limit", "validate_event"]

CLOSED_STATUSES = frozenset({"completed", "failed", "cancelled"})
"""Statuses of a run that ended: nothing it records changes any more, and a loop never takes it
over (``acquire(open_only=True)``)."""

SCHEMA_VERSION = 8
"""The journal file schema this cuaderno writes: its tables and how rows are stored (schema 2
added compressed payloads, schema 3 the queue's tables, schema 4 keyed content digests and erased
rows, schema 5 the wrapped data keys of encryption at rest, schema 6 large payloads offloaded to
blob tables, schema 7 an encrypted run's blobs, keyed and sealed, schema 8 content digests by
keyed BLAKE2b). A journal with a higher number is refused
(:class:`~cuaderno.errors.SchemaTooNew`); a lower one is migrated by numbered steps."""

EVENT_SCHEMA_VERSION = 1
"""What the events mean: their kinds, phases and the payload fields replay reads. Recorded as
``schema`` in every run's versions, so resuming a run under another one needs an explicit choice
(``on_version_mismatch``). How rows are stored is :data:`SCHEMA_VERSION`'s business: a run
started before schema 2 resumes after it as it is."""

DEFAULT_MAX_PAYLOAD = 16 * 1024 * 1024
"""The largest payload (JSON bytes, before compression) a journal stores unless its store says
otherwise (``store.max_payload = N``): far below what a row can hold
(:data:`cuaderno.journal._compress.MAX_PAYLOAD`, about 1 GB), because every payload is read whole
on a resume and held in memory with the rest of the run (a 180 MB step row took DBOS's recovery
down, dbos-transact-py#138). 16 MB is some 4 million tokens of text: no model answer comes near it,
and a tool result that does is data to keep elsewhere and refer to. Payloads over
``store.offload_above`` (1 MB) are kept apart, once per content, and read back in chunks (see
:mod:`cuaderno.journal._offload`), but still read whole on a resume: the memory bound stated in the
docs is in multiples of this limit. Refused with :class:`~cuaderno.errors.PayloadTooLarge` before
anything is written; a tool's result over it is journaled as a small error record instead (see
:func:`cuaderno.durable.effect.result_payload`), a model's answer as a failed send
(:class:`~cuaderno.errors.ResponseTooLarge`)."""

MAX_ID_CHARS = 1024
_MAX_DECISION_CHARS = 64
_MAX_FINGERPRINT_CHARS = 128
_ONLY_STR = {str}


@runtime_checkable
class Checkpointer(Protocol):
    """Where a run's journal and its checkpoint live."""

    def append(self, events: Sequence[StepEvent], *, epoch: int | None = None,
               expect_seq: int | None = None) -> list[StepEvent]:
        """Append events atomically, in order, and fold them into the run's checkpoint.

        All the events and the checkpoint update commit in one transaction, or none do. An event
        equal to the one already stored under its key is a no-op (the stored one is returned); a
        different one raises :class:`~cuaderno.errors.JournalConflict` and nothing is written.

        Args:
            events: events of one run; ``seq``, ``created_at`` and ``row_hash`` are assigned here.
            epoch: the caller's fencing epoch. When given, the transaction checks it against the
                run's current epoch and raises :class:`~cuaderno.errors.FencedOut` on a mismatch.
                The harness passes ``None`` (approvals and cancellations are not step execution).
            expect_seq: compare-and-set. When given, the transaction raises
                :class:`~cuaderno.errors.RunChanged` unless the run's last event still has this
                ``seq``: for a writer whose events were computed from what it read.

        Decisions the run's state no longer admits at commit time (an approval for a call that
        is not waiting, a second end of a run, settling an effect that is not uncertain) raise
        their typed error from inside the transaction; nothing is written.

        Returns:
            The stored events, stamped.
        """
        ...

    def load(self, run_id: str) -> list[StepEvent]:
        """All events of a run in ``seq`` order, with the hash chain checked.

        Raises:
            RunNotFound: no such run.
            JournalCorrupt: a row was changed, removed or reordered.
        """
        ...

    def checkpoint(self, run_id: str) -> Checkpoint | None:
        """The run's stored checkpoint, or ``None`` when the run does not exist."""
        ...

    def list_runs(self, *, status: str | None = None, limit: int = 100) -> list[Checkpoint]:
        """Checkpoints of the most recently updated runs, optionally of one status."""
        ...

    def acquire(self, run_id: str, owner: str, *, force: bool = False, open_only: bool = False) -> int:
        """Take the run over: bump and return its fencing epoch.

        Any process still holding an older epoch is refused at its next intent or result write.
        A backend shared by several processes refuses the takeover with
        :class:`~cuaderno.errors.RunBusy` while the holder is alive and has not released the run
        (its step in flight would otherwise run twice); ``force`` takes it over anyway.
        ``open_only`` (the loop's): a run that ended (:data:`CLOSED_STATUSES`) is refused with
        :class:`~cuaderno.errors.RunClosed`, checked in the same transaction as the bump, so a
        run another process closed after the caller read it is never taken over; nothing is
        written, and the run's lock is not taken.
        """
        ...

    def release(self, run_id: str, epoch: int) -> None:
        """The holder of ``epoch`` stops running the run (its loop ended, for any reason), so
        another process may take it over at once. A stale epoch changes nothing."""
        ...

    def close(self) -> None:
        """Release connections. The store must not be used afterwards."""
        ...


@runtime_checkable
class SupportsRebuild(Protocol):
    """Optional capability: rewrite a run's stored summary from its journal.

    ``cuaderno.rebuild_summary`` (and ``cuaderno rebuild-summary``) needs it; a store without it is
    refused with a :class:`~cuaderno.errors.UsageError`. Both embedded backends declare it.
    """

    def rebuild_checkpoint(self, run_id: str, *, trust_journal: bool = False) -> tuple[Checkpoint, list[str]]:
        """Rebuild the run's stored summary from its hash-chained journal, atomically with respect
        to appends (none lands between the read and the rewrite). The epoch and holder are kept.

        Args:
            trust_journal: rebuild even when the stored summary names events the journal does not
                hold, or cannot be read (see :func:`~cuaderno.journal._append.plan_rebuild`).

        Returns:
            The summary as now stored, and the fields in which the old one differed (none: it
            matched, and nothing was written).

        Raises:
            RunNotFound: no such run.
            JournalCorrupt: the rows do not chain, or (without ``trust_journal``) rows may be
                missing from the journal's end; nothing was written.
        """
        ...


@runtime_checkable
class SupportsClaims(Protocol):
    """Optional capability: what a worker (:mod:`cuaderno.worker`) polls to find runs that need
    progress, and what ``cuaderno show`` asks to say whether anything runs a run now.

    Both are reads: they write nothing and take no lock. Claiming a run is still ``acquire``, which
    refuses a run a live process holds (:class:`~cuaderno.errors.RunBusy`); a worker that read a run
    as free and lost the race to another is refused there, never let in. All three backends declare it.
    """

    def open_runs(self, *, limit: int = 1000) -> list[Checkpoint]:
        """Runs a worker may have to move on, least recently updated first (the longest waiting
        first): every ``running`` run, every run waiting for a person (``suspended``,
        ``needs_human``) whose cancellation was asked, and every cancelled run whose cancellation
        record schedules cleanup (compensations may remain to run); exactly the runs
        :func:`cuaderno.journal._claims.work_for` gives work. Held runs are listed too (``holders``
        tells them apart). Each checkpoint carries the run's current epoch."""
        ...

    def holders(self, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The live holder of each of ``run_ids`` that has one, as recorded by its ``acquire``
        (``{"owner": label, "process": {"host", "pid", ...}}``). A run missing from the answer is
        held by nobody alive: a takeover would not be refused as :class:`~cuaderno.errors.RunBusy`
        (unless someone takes it meanwhile). Unknown runs are left out."""
        ...


@runtime_checkable
class CommitsInGroups(Protocol):
    """Optional capability: a journal that groups the appends of concurrent runs into one
    transaction and one sync (:class:`cuaderno.journal.GroupCommit`). The loop gives it the crash
    points of each append (the group names them in its transaction), and, with ``share_loop``,
    commits a step's intent through :meth:`append_async` so the other runs of its event loop join
    the same group."""

    share_loop: bool

    def append(self, events: Sequence[StepEvent], *, epoch: int | None = None, expect_seq: int | None = None,
               points: tuple[str, ...] = ()) -> list[StepEvent]:
        """:meth:`Checkpointer.append`, in the next group; returns once its events are durable."""
        ...

    async def append_async(self, events: Sequence[StepEvent], *, epoch: int | None = None,
                           expect_seq: int | None = None, points: tuple[str, ...] = ()) -> list[StepEvent]:
        """The same, awaited: the group is written at the end of the event loop's iteration."""
        ...


@runtime_checkable
class ConfirmsHold(Protocol):
    """Optional capability of a store whose holder can lose the run while it lives (PostgreSQL:
    the server may end the session that holds the run's lock). The effect protocol asks it
    between an effect's durable intent and its body (:func:`cuaderno.durable.log.confirm_hold`).
    A kernel lock (SQLite) cannot be lost by a living process: such stores do not declare it."""

    def confirm_hold(self, run_id: str, epoch: int | None) -> None:
        """Raise :class:`~cuaderno.errors.FencedOut` unless this store still holds ``run_id`` at
        ``epoch`` (taking a lost lock back first when nobody else has the run)."""
        ...


@runtime_checkable
class KnowsEarlierHolders(Protocol):
    """Optional capability of a store whose takeover does not prove that the earlier holder
    stopped (PostgreSQL, see :class:`ConfirmsHold`). The effect protocol asks it before a lookup
    that found no effect is taken as proof of absence (R23)."""

    def earlier_holder(self, run_id: str, seq: int | None = None) -> dict[str, Any] | None:
        """An earlier holder that may still be executing the step whose first intent is row
        ``seq``, or ``None`` when none can be."""
        ...


class Tail(NamedTuple):
    """What :meth:`SupportsTail.load_tail` read, in one read transaction; nothing of it is checked."""

    summary: Checkpoint
    """The run's stored summary, its epoch column folded in (as :meth:`Checkpointer.checkpoint`)."""
    mark: StepEvent
    """The run's last event under the asked step id (the latest snapshot), by ``seq``."""
    events: list[StepEvent]
    """Every event of the run after seq ``base`` (the mark's phase is ``base.N``), in ``seq`` order:
    the mark itself among them. Not chain-checked: the caller checks them from the mark's base."""


@runtime_checkable
class SupportsTail(Protocol):
    """Optional capability: read a run's latest snapshot and the events after its base, not its
    whole journal (``cuaderno.loop._snapshots``: a resume that costs the same at 100 turns and
    at 10,000). A store without it, or one that answers ``None``, is resumed from the whole
    journal, as before.
    """

    def prepare_tail(self) -> None:
        """Create what :meth:`load_tail` needs (an index on ``(run_id, seq)``) if it is missing.
        The loop calls it before it commits the first snapshot of a run in a process, so that a
        journal with snapshots has it before any resume needs it (a store that opened on a
        crashed process's ``-wal`` reads on a connection that may not create it)."""
        ...

    def load_tail(self, run_id: str, step_id: str) -> Tail | None:
        """The run's summary, its last event under ``step_id`` and the events after that event's
        base (its phase is ``base.N``: the events with ``seq > N``), read in one transaction.

        ``None`` when the run has no such event, or the store cannot read a tail cheaply (no
        index on ``(run_id, seq)`` and it may not create one): the caller reads the whole
        journal instead. Nothing is verified here: the caller checks the chain from the mark's
        recorded base to the summary's head, and the summary against the events' projection.

        Raises:
            RunNotFound: no such run.
            JournalCorrupt: a row cannot be read.
        """
        ...


def tail_base(phase: str) -> int | None:
    """The base seq a tail mark's phase names (``base.N``), ``None`` if it names none."""
    head, _, n = phase.partition(".")
    return int(n) if head == "base" and n.isdigit() and len(n) < 19 else None


def payload_limit(store: object) -> int:
    """The per-payload limit of ``store`` (its ``max_payload`` attribute, else
    :data:`DEFAULT_MAX_PAYLOAD`).

    Raises:
        UsageError: a ``max_payload`` that is not a positive integer.
    """
    return byte_setting(store, "max_payload", DEFAULT_MAX_PAYLOAD)


def byte_setting(store: object, name: str, default: int) -> int:
    """A size in bytes ``store`` sets by its attribute ``name`` (``default`` when it sets none); a
    wrapper (GroupCommit) holds its store as ``store``, and its setting is the store's.

    Raises:
        UsageError: a setting that is not a positive integer.
    """
    value = getattr(store, name, None)
    while value is None:  # unset here: a wrapper's store's setting, else the default (a loop: read per step)
        inner = getattr(store, "store", None)
        if inner is None or inner is store:
            return default  # the callers' own constant, a positive int: nothing to check (per step)
        store = inner
        value = getattr(store, name, None)
    if type(value) is int and value > 0:  # a plain int, the setting as people set it: one test
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name} must be a positive number of bytes, got {value!r:.40}")
    return value


def validate_event(ev: StepEvent, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
    """Refuse events that could not be stored and read back byte-exact, or whose payload is larger
    than ``max_payload`` bytes of JSON.

    Raises:
        UsageError: naming the field and the event's key; nothing is written.
        PayloadTooLarge: naming the run, step, phase and size; nothing is written.
    """
    name, decision, fp = ev.name, ev.decision, ev.fingerprint
    ids = (ev.run_id, ev.step_id, ev.phase, ev.kind, "-" if name is None else name,
           "-" if decision is None else decision, "-" if fp is None else fp)
    # The common case (short ASCII ids, as the loop writes them: none over 64 characters, a
    # fingerprint is 64 hex digits) checked with a few calls into C, not an expression per field:
    # it runs for every event of every step, and this form executes about a third of the
    # bytecode. Stricter than the limits; anything it does not pass takes the field-by-field
    # road, which applies the exact limits and names the first bad field.
    if not (_ONLY_STR == set(map(type, ids)) and 0 < min(map(len, ids))
            and max(map(len, ids)) <= _MAX_DECISION_CHARS and (joined := "".join(ids)).isascii()
            and "\x00" not in joined):
        _check_fields(ev)
    if ev.codec != CODEC_JSON:
        raise UsageError(f"StepEvent.codec {ev.codec!r} is not one this cuaderno can write (only {CODEC_JSON!r})")
    if not isinstance(ev.payload, dict):
        raise UsageError(f"StepEvent.payload at {ev.step_id}:{ev.phase} must be a JSON object, "
                         f"got {type(ev.payload).__name__}")
    try:
        size = len(ev.encoded_payload())
    except (TypeError, ValueError) as exc:
        raise UsageError(f"StepEvent.payload at {ev.step_id}:{ev.phase} is not plain JSON: {exc}") from exc
    if size > max_payload:
        raise PayloadTooLarge(ev.run_id, ev.step_id, ev.phase, size, max_payload)


def _check_fields(ev: StepEvent) -> None:
    for name, value, limit, optional in (("run_id", ev.run_id, MAX_ID_CHARS, False),
                                         ("step_id", ev.step_id, MAX_ID_CHARS, False),
                                         ("phase", ev.phase, MAX_ID_CHARS, False), ("kind", ev.kind, MAX_ID_CHARS, False),
                                         ("name", ev.name, MAX_ID_CHARS, True), ("decision", ev.decision, _MAX_DECISION_CHARS, True),
                                         ("fingerprint", ev.fingerprint, _MAX_FINGERPRINT_CHARS, True)):
        if value is None and optional:
            continue
        if type(value) is not str or not value:
            raise UsageError(f"StepEvent.{name} must be a non-empty string{' or None' if optional else ''}, "
                             f"got {value!r:.80}")
        _check_text(name, value, limit)


def _check_text(name: str, value: str, limit: int) -> None:
    if len(value) > limit or "\x00" in value:
        raise UsageError(f"StepEvent.{name} must be at most {limit} characters without NUL, got {value!r:.80}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise UsageError(f"StepEvent.{name} is not valid Unicode (lone surrogate?)") from exc
