"""The append algorithm every backend shares: validate, deduplicate, stamp, fold.

Backends differ in how they store rows and how they make a transaction atomic; what an append
*means* lives here once, so the backends cannot drift apart.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from cuaderno.checkpoint import OPEN_STATUSES, Checkpoint, differing, project, rebuild
from cuaderno.errors import (
    ApprovalMismatch,
    FencedOut,
    JournalConflict,
    JournalCorrupt,
    NotUncertain,
    NotWaitingForApproval,
    RunCancelled,
    RunChanged,
    RunClosed,
    RunErased,
    UsageError,
)
from cuaderno.events import (
    CODEC_ERASED,
    CODEC_JSON,
    HMAC_SALT_BYTES,
    SALT_BYTES,
    StepEvent,
    row_hash,
    starts_a_step,
    verifiable,
)
from cuaderno.journal._compress import CODEC_JSON_ZSTD, unpack
from cuaderno.journal._offload import CODEC_JSON_BLOB, fetched
from cuaderno.journal._rows import no_existing
from cuaderno.journal._sealing import RunKeys, opened
from cuaderno.journal.base import DEFAULT_MAX_PAYLOAD, validate_event

__all__ = ["RawRow", "check_chain", "decode_row", "plan_append", "plan_rebuild"]


def plan_append(
    cp: Checkpoint,
    events: Sequence[StepEvent],
    existing: Callable[[StepEvent], StepEvent | None],
    epoch: int | None,
    expect_seq: int | None = None,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    keyed: bool = False,
) -> tuple[list[tuple[StepEvent, bytes]], list[StepEvent]]:
    """Decide what an append writes, folding new events into ``cp`` (in place).

    Args:
        cp: the run's current checkpoint; updated for every new event.
        events: the events to append, all of ``cp``'s run.
        existing: returns the stored event under an event's key, or ``None``.
        epoch: the writer's fencing epoch, or ``None`` for harness writes.
        expect_seq: when given, the append is refused unless the run's last event is still this
            one (compare-and-set, for a writer that decided from what it read).
        keyed: chain the new rows over keyed content digests (row hash version 2, see
            :func:`~cuaderno.events.row_hash`), each row with a fresh random key: what a store
            that can erase a run writes. An event that carries its key (``salt``, set by an
            importer reproducing a recorded chain) keeps it in any store.

    Returns:
        ``(rows to insert with their encoded payloads, the stored events to return)``.

    Raises:
        FencedOut: ``epoch`` is not the run's current epoch.
        JournalConflict: a different event already sits under one of the keys.
        RunChanged: ``expect_seq`` is not the run's last event any more.
        RunErased: the run's content was erased: nothing is appended to it.
        RunClosed, NotWaitingForApproval, ApprovalMismatch, NotUncertain: a decision that the run's
            state at commit time no longer admits (see :func:`_admit`).
    """
    outcome = cp.outcome
    if outcome is not None and isinstance(outcome.get("erased"), dict):  # is_erased(cp), inline: every append
        raise RunErased(cp.run_id, "append")
    if epoch is not None and epoch != cp.epoch:
        raise FencedOut(cp.run_id, epoch, cp.epoch)
    if expect_seq is not None and expect_seq != cp.last_seq:
        raise RunChanged(cp.run_id, expect_seq, cp.last_seq)
    if epoch is not None and (cp.cancel_requested is not None or cp.status == "cancelled") and any(
            starts_a_step(ev) for ev in events):
        # Checked in the same transaction as the intent: once a cancellation has committed, no
        # new step is admitted. Results are still admitted, so an effect in flight is journaled.
        raise RunCancelled(cp.run_id, cp.outcome or {"reason": (cp.cancel_requested or {}).get("reason")})
    now = time.time()
    new: list[tuple[StepEvent, bytes]] = []
    out: list[StepEvent] = []
    seen: dict[tuple[str, str, str], StepEvent] = {}
    lookups = existing is not no_existing  # an optimistic append looks nothing up: no call per event
    for ev in events:
        validate_event(ev, max_payload)
        if ev.run_id != cp.run_id:
            raise UsageError("one append must hold the events of one run")
        key = (ev.run_id, ev.step_id, ev.phase)  # ev.key, inline: per event
        prior = seen.get(key)
        if prior is None and lookups:
            prior = existing(ev)
        if prior is not None:
            if not prior.same_as(ev):
                raise JournalConflict(*ev.key)
            out.append(prior)
            continue
        if ev.phase in _GUARDED_PHASES or ev.decision in _SETTLING:
            _admit(cp, ev)
        payload_bytes = ev.encoded_payload()
        if ev.salt is not None:
            salt = _salt_for(ev, keyed)
        elif keyed and ev.codec == CODEC_JSON:
            try:
                salt = _SALTS.pop()
            except IndexError:
                salt = _fresh_salts()
        else:
            salt = None
        stamped = ev.stamped(seq=cp.last_seq + 1, created_at=now, prev_hash=cp.last_hash,
                             payload_bytes=payload_bytes, salt=salt)
        project(cp, stamped)
        seen[key] = stamped
        new.append((stamped, payload_bytes))
        out.append(stamped)
    return new, out


_urandom = os.urandom

_SALTS: list[bytes] = []
"""Fresh random digest keys, drawn from one ``os.urandom`` call of :data:`_SALTS_AT_ONCE` keys
(:func:`_fresh_salts`), each taken once (``pop``, atomic under the GIL, so two threads never
take the same one): a ``getrandom`` system call per row cost more than the row's HMAC. The keys
are as random as ``os.urandom``'s, and a key that was never taken is never written anywhere."""
_SALTS_AT_ONCE = 256

# A forked child starts with a copy of its parent's memory, this list included: both would then
# stamp their next rows with the same "random" keys. The child drops its copy at once, so every
# key it uses comes from its own os.urandom call. (Registered once, at import: every process that
# can append has imported this module before it forks, or imports it after.)
if hasattr(os, "register_at_fork"):  # POSIX; where there is no fork there is no copy to drop
    os.register_at_fork(after_in_child=_SALTS.clear)


_KEY_LENGTHS = frozenset({SALT_BYTES, HMAC_SALT_BYTES})
"""The lengths a stored digest key may have: each names the keyed hash of the row's digest (see
:func:`~cuaderno.events.content_digest`)."""


def _fresh_salts() -> bytes:
    """One fresh digest key, the list refilled with the next ones."""
    block = _urandom(SALT_BYTES * _SALTS_AT_ONCE)
    _SALTS.extend([block[i:i + SALT_BYTES] for i in range(SALT_BYTES, len(block), SALT_BYTES)])
    return block[:SALT_BYTES]


def _salt_for(ev: StepEvent, keyed: bool) -> bytes | None:
    """The digest key a new row is stamped with: the one the event carries, when an importer
    reproduces a recorded chain (``b""``: a row recorded before keyed digests, stamped as version
    1), else a fresh random one where the store keys rows."""
    if ev.salt is not None:
        if ev.salt and len(ev.salt) not in _KEY_LENGTHS:
            raise UsageError(f"a digest key is {SALT_BYTES} bytes, or {HMAC_SALT_BYTES} for a row recorded with "
                             "HMAC-SHA256 (or empty for a version-1 row)")
        return ev.salt or None
    if not keyed or ev.codec != CODEC_JSON:
        return None
    try:
        return _SALTS.pop()
    except IndexError:
        return _fresh_salts()


def is_erased(cp: Checkpoint) -> bool:
    """Whether the run's summary records that its content was erased (see
    :mod:`cuaderno.journal._erase`)."""
    return cp.outcome is not None and isinstance(cp.outcome.get("erased"), dict)


_GUARDED_PHASES = frozenset({"decision", "request", "end", "resolution"})
"""Phases of the events :func:`_admit` checks (with results a person settled); a step's own
intents and results never need it, so the per-step path pays one set lookup."""
_SETTLING = frozenset({"resolved", "not_happened"})
"""Decisions of the events a person settled an uncertain step with, which :func:`_admit` checks too."""
_CLOSED = frozenset({"completed", "failed", "cancelled"})


def _admit(cp: Checkpoint, ev: StepEvent) -> None:
    """Refuse a decision the run's state at commit time no longer admits.

    The harness decides from a checkpoint it read earlier, while a loop in another process may be
    moving the run on. Checked here, inside the transaction that writes the decision, two racing
    writers cannot both win: an approval lands only while its call is still waiting, a run ends
    (or is asked to cancel) only once, an uncertain effect is settled only while still uncertain.
    """
    kind, phase = ev.kind, ev.phase
    if kind == "approval" and phase == "decision":
        if cp.status not in OPEN_STATUSES:
            raise RunClosed(cp.run_id, cp.status)
        if cp.cancel_requested is not None:
            raise NotWaitingForApproval(f"run {cp.run_id!r}: a cancellation was requested; step {ev.step_id!r} "
                                        "will not run")
        pending = cp.pending.get(ev.step_id)
        if pending is None:
            raise NotWaitingForApproval(f"run {cp.run_id!r}: step {ev.step_id!r} is not waiting for a decision")
        if ev.fingerprint != pending.get("fingerprint"):
            raise ApprovalMismatch(f"run {cp.run_id!r} step {ev.step_id!r}: the decision names other arguments "
                                   "than the pending call")
    elif (kind == "cancel" and phase == "request") or (kind == "run" and phase == "end"):
        if cp.status in _CLOSED:
            raise RunClosed(cp.run_id, cp.status)
    elif kind == "tool" and (phase.startswith("resolution") or (phase == "result" and ev.decision == "resolved")):
        if ev.step_id not in cp.uncertain:
            raise NotUncertain(f"run {cp.run_id!r}: step {ev.step_id!r} is not uncertain (any more)")


_REBUILD = "`cuaderno rebuild-summary RUN` rebuilds it from the journal"
"""The way forward a refusal names when only the summary is wrong (see :func:`plan_rebuild`)."""


def _past_head(n: int) -> str:
    """Why rows past a summary's head are refused, and what a person who knows better can do."""
    rows = "1 row" if n == 1 else f"{n} rows"
    return (f"{rows} past the end of its summary, which every cuaderno write updates in the same transaction; "
            "nothing proves who wrote them (the hash chain is a check, not a signature: anyone who can write the "
            "file can append rows that chain). If you know they are the run's own (an older copy of the summary "
            "was restored), `cuaderno rebuild-summary RUN --trust-journal` (trust_journal=True) counts them; "
            "nothing was written")

RawRow = tuple[str, str, str, int, str, "str | None", "str | None", "str | None", str, "bytes | str", float, str,
               "bytes | None"]
"""(run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, created_at, row_hash,
salt): ``salt`` is the row's digest key (:attr:`~cuaderno.events.StepEvent.salt`), ``None`` for a row
of the first chain version and for an erased row."""


def check_chain(run_id: str, rows: Sequence[RawRow], head: str | None, head_seq: int | None = None,
                keys: RunKeys | None = None) -> list[StepEvent]:
    """Rebuild events from stored rows in seq order, checking the hash chain and its head.

    Payloads decode on first use; sealed ones are opened with ``keys`` (see :func:`decode_row`).

    Raises:
        JournalCorrupt: a gap in ``seq``, a row whose hash does not chain, or a chain head that
            is not the one the checkpoint recorded (a removed tail), or a checkpoint that counts
            another number of events than the chain holds (``head_seq``).
    """
    prev = ""
    out: list[StepEvent] = []
    for expected_seq, row in enumerate(rows, start=1):
        ev = decode_row(row, keys)
        if ev.seq != expected_seq or ev.run_id != run_id:
            raise JournalCorrupt(f"run {run_id!r}: journal row {expected_seq} is missing or out of order")
        if verifiable(ev) and row_hash(prev, ev, ev.seq, ev.encoded_payload()) != ev.row_hash:
            raise JournalCorrupt(f"run {run_id!r}: journal row {ev.seq} ({ev.step_id}:{ev.phase}) was altered")
        prev = ev.row_hash
        out.append(ev)
    if head is not None and prev != head:
        behind = _seq_of(out, head)
        if behind is not None:  # rows past the summary's head: an older summary, or rows added since
            raise JournalCorrupt(f"run {run_id!r}: its stored summary (checkpoint) ends at event {behind}, the journal "
                                 f"holds {len(out)}: {_past_head(len(out) - behind)}")
        raise JournalCorrupt(f"run {run_id!r}: the journal ends before the checkpoint's last event (rows removed, "
                             "or the summary altered)")
    if head_seq is not None and len(out) != head_seq:
        # The chain checks out but the summary counts other rows: the next append would number
        # its row after the summary's count and break the journal it was asked to extend.
        raise JournalCorrupt(f"run {run_id!r}: its stored summary (checkpoint) says {head_seq} events, the journal "
                             f"holds {len(out)}; it was altered or damaged. {_REBUILD}")
    return out


def _seq_of(events: Sequence[StepEvent], row_hash: str) -> int | None:
    """The seq of the event whose row hash is ``row_hash`` (where a summary's head sits), or ``None``."""
    return next((ev.seq for ev in events if ev.row_hash == row_hash), None)


def decode_row(row: RawRow, keys: RunKeys | None = None) -> StepEvent:
    """One stored row as a :class:`StepEvent` (no chain check; the payload decodes on first use).

    A sealed row is opened (with its run's data key from ``keys``), then a compressed one
    decompressed or an offloaded one's blob read back (in the store's transaction,
    :func:`~cuaderno.journal._offload.reading`), so the event holds its JSON bytes and codec as
    written.

    Raises:
        JournalCorrupt: a compressed payload that does not decompress, an offloaded one whose blob
            is missing or altered, a seal that does not open, a codec no journal stores.
        KeyMissing, KeyInvalid: a sealed row and no key, or not the key that sealed it.
    """
    run_id, step_id, phase, seq, kind, name, decision, fp, codec, payload, created_at, rhash, salt = row
    raw = payload if type(payload) is bytes else str(payload).encode()
    codec, raw = opened(keys, run_id, step_id, phase, codec, raw)
    if codec == CODEC_JSON_ZSTD:  # tested here too, so that plain rows do not build the message
        codec, raw = unpack(codec, raw, f"run {run_id!r}: journal row {seq} ({step_id}:{phase})")
    elif codec == CODEC_JSON_BLOB:  # offloaded: its JSON read back from the blob, chunk by chunk
        codec, raw = CODEC_JSON, fetched(raw, f"run {run_id!r}: journal row {seq} ({step_id}:{phase})", keys, run_id)
    if codec != CODEC_JSON and codec != CODEC_ERASED:
        # Appends store no other codec, and the chain does not cover the column: a damaged one
        # is refused here, not when (or whether) the payload is first decoded.
        raise JournalCorrupt(f"run {run_id!r}: journal row {seq} ({step_id}:{phase}): its codec {codec!r:.40} is "
                             "not one a journal stores; the row was altered or damaged")
    if salt is not None and (type(salt) is not bytes or len(salt) not in _KEY_LENGTHS):
        raise JournalCorrupt(f"run {run_id!r}: journal row {seq} ({step_id}:{phase}): its digest key is neither "
                             f"{SALT_BYTES} nor {HMAC_SALT_BYTES} bytes; the row was altered or damaged")
    return StepEvent._stored(run_id, step_id, phase, kind, name, decision, fp, codec, None, raw, seq, created_at,
                             rhash, salt)


def plan_rebuild(run_id: str, rows: Sequence[RawRow], stored_text: str | bytes, epoch: int | None,
                 trust_journal: bool, keys: RunKeys | None = None) -> tuple[Checkpoint, list[str]]:
    """The summary to store for a run, rebuilt from its journal, and the fields in which the stored
    one differs (none: there is nothing to write).

    The journal is the record and the summary only its projection, so the summary is rebuilt from
    the rows, never the other way round, and only from rows whose hash chain checks out.

    What the chain proves, and so what is rebuilt without being told: the chain is unkeyed, so it
    shows that no row was changed, removed or reordered *by accident or by an edit that did not
    recompute the hashes after it*; it does not show who wrote a row. The summary is the second
    record every cuaderno write updates in the same transaction, and its head (``last_hash``,
    ``last_seq``) says which rows cuaderno wrote. So, without ``trust_journal``, only a summary
    whose head is the journal's last row is rebuilt (its other fields are rewritten from rows it
    already vouches for). Refused unless the caller says the journal is complete and its own:

    - a summary *behind* the journal: rows past its head may be an older summary restored, or rows
      appended by something else (a result forged for an effect that never ran chains as well as
      a real one), and nothing tells the two apart;
    - a summary *ahead* of it, naming an event the journal does not hold: exactly what removing
      rows from the journal's end looks like; rebuilding from what is left would hide that loss;
    - a summary too damaged to say where it ended.

    Rows added *and* the summary rewritten to match, or rows removed *and* the summary's head moved
    consistently, cannot be told from a journal cuaderno wrote: that needs a key kept outside the
    file, which this journal does not have.

    Args:
        rows: the run's stored rows in ``seq`` order.
        stored_text: the stored summary, as stored (its sealed content opened, see :mod:`._sealing`).
        keys: the data keys that open sealed rows (``None``: the store does not encrypt).
        epoch: the run's fencing epoch where the backend keeps it beside the summary (``None``:
            the summary's own); kept as it is.

    Raises:
        JournalCorrupt: the rows do not chain (nothing can be rebuilt from them), or, without
            ``trust_journal``, the stored summary names an event the journal does not hold or
            cannot be read.
    """
    stored: Checkpoint | None = None
    try:
        stored = Checkpoint.loads(stored_text)
        unreadable = ""
    except JournalCorrupt as exc:
        unreadable = str(exc)
    if epoch is None:
        epoch = stored.epoch if stored is not None else 0
    elif stored is not None:
        stored.epoch = epoch
    events = check_chain(run_id, rows, None, keys=keys)
    if not trust_journal:
        anyway = (f"; nothing was written. If the journal is complete, rebuild it from the {len(events)} events the "
                  "journal holds with `cuaderno rebuild-summary RUN --trust-journal` (trust_journal=True)")
        if stored is None:
            raise JournalCorrupt(f"run {run_id!r}: its stored summary cannot be read ({unreadable}), so whether rows "
                                 f"were removed from the end of its journal cannot be told{anyway}")
        # Its chain head says where the summary ended. It must be a row the journal holds, with the
        # count the summary gives it (otherwise it may name rows that are gone), and it must be the
        # journal's last row (otherwise nothing proves who wrote the rows after it).
        ended = _seq_of(events, stored.last_hash)
        if ended is None or stored.last_seq > ended:
            raise JournalCorrupt(f"run {run_id!r}: its stored summary ends at event {stored.last_seq}, which the "
                                 f"journal ({len(events)} events) does not hold as recorded (row hash "
                                 f"{stored.last_hash[:16]!r}): rows may have been removed from its end{anyway}")
        if ended < len(events):
            raise JournalCorrupt(f"run {run_id!r}: its stored summary ends at event {ended}, the journal holds "
                                 f"{len(events)}: {_past_head(len(events) - ended)}")
    rebuilt = rebuild(run_id, events, epoch=epoch)
    if stored is None:
        return rebuilt, ["the whole summary (unreadable)"]
    return rebuilt, differing(stored, rebuilt)
