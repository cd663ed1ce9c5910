"""The journal's unit: :class:`StepEvent`.

The journal records *which steps happened*, not the conversation. Each event sits under the key
``(run_id, step_id, phase)``, which is the primary key in every backend: appending the same event
twice is a no-op, appending a different one under the same key is a
:class:`~cuaderno.errors.JournalConflict`.

Step ids are deterministic positions in the loop, so a resumed process asks for exactly the same
ids in the same order:

- ``run``                 the run itself (phase ``start``; ``end`` when it fails or is cancelled)
- ``t0003.model``         the model call of turn 3
- ``t0003.tool01``        the second tool call the model asked for in turn 3
- ``t0003.tool01.approval`` the human approval that tool call waits for
- ``final``               the final answer
- ``cancel``              a cancellation request written by the harness
- ``cleanup00``           the first compensation a cancellation scheduled

The numbers are zero-padded so that ids sort in loop order, which keeps B-tree inserts
sequential and the journal file dense.

Every ``kind`` and ``phase`` a row can carry is named in :mod:`cuaderno.events.names`
(:class:`Kind`, :class:`Phase`); the payload of each ``(kind, phase)`` has its type, the JSON form
read-only, in :mod:`cuaderno.events.payloads`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, Final, Literal, Protocol, TypedDict

from cuaderno.events.names import KINDS, PHASES, Kind, Phase, family
from cuaderno.plainjson import JSONObject, loads_object, sorted_compact, sorted_compact_ascii

__all__ = [
    "CODEC_ERASED",
    "CODEC_JSON",
    "HMAC_SALT_BYTES",
    "SALT_BYTES",
    "Decision",
    "EventHeader",
    "KINDS",
    "PHASES",
    "Kind",
    "RESTORE_STEP",
    "Phase",
    "StepEvent",
    "approval_step_id",
    "call_arguments",
    "cleanup_step_id",
    "family",
    "starts_a_step",
    "model_step_id",
    "not_happened_since_sent",
    "numbered",
    "tool_step_id",
]

CODEC_JSON: Final = "json"
"""The only payload codec so far: UTF-8 JSON with sorted keys. Never pickle: the CLI and later
versions must be able to read every journal."""

CODEC_ERASED: Final = "erased"
"""The codec of an event whose content was erased (:func:`cuaderno.operations.erase`): the row
keeps its header and, in place of its payload, the keyed digest its hash chain links over (empty
for a row written before digests, see :func:`row_hash`). Reading its payload raises
:class:`~cuaderno.errors.RunErased`."""

SALT_BYTES: Final = 32
"""Bytes of the random digest key a row is written with (see :func:`content_digest`): a key of
this length names keyed BLAKE2b as the row's digest."""

HMAC_SALT_BYTES: Final = 16
"""Bytes of the digest key of a row written with HMAC-SHA256 (journal schema 4 to 7 on SQLite,
3 to 6 on PostgreSQL): such rows are still read and verified, never written any more."""

Decision = Literal["allow", "deny", "require_approval", "approved", "rejected"]


def model_step_id(turn: int) -> str:
    """The step id of turn ``turn``'s model call."""
    return f"t{turn:04d}.model"


def tool_step_id(turn: int, index: int) -> str:
    """The step id of the ``index``-th tool call asked for in turn ``turn``."""
    return f"t{turn:04d}.tool{index:02d}"


def starts_a_step(ev: StepEvent) -> bool:
    """Whether the event admits new work: an intent (a send, a tool body), asking a person, or the
    final answer. A cancellation refuses exactly these, except a compensation's intent (the work
    a cancellation schedules); results are always admitted, so an effect already in flight ends
    journaled."""
    if ev.phase.startswith("intent"):
        return not ev.step_id.startswith(_CLEANUP)
    return ev.kind == "final" or (ev.kind == "approval" and ev.phase == "request")


_CLEANUP = "cleanup"


def cleanup_step_id(index: int) -> str:
    """The step id of a cancelled run's ``index``-th compensation."""
    return f"{_CLEANUP}{index:02d}"


def call_arguments(events: list[StepEvent], step_id: str) -> JSONObject | None:
    """The arguments the model gave the tool call at ``step_id`` (``tNNNN.toolMM``), from the
    journaled response of that turn; ``None`` if the journal does not hold them."""
    turn, _, index = step_id.partition(".tool")
    model = next((e for e in events if e.step_id == f"{turn}.model" and e.phase == "result"), None)
    try:
        call = (model.payload["response"]["tool_calls"] if model is not None else [])[int(index)]
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    arguments = call.get("arguments") if isinstance(call, dict) else None
    return arguments if isinstance(arguments, dict) else None


class Keyed(Protocol):
    """A run's events by ``(step_id, phase)``, probed key by key (a dict of them, a step log)."""

    def get(self, key: tuple[str, str], /) -> StepEvent | None: ...


def numbered(journal: Keyed, step_id: str, phase: str) -> list[StepEvent]:
    """A step's numbered events in order: ``phase``, ``phase.2``, ``phase.3``... (``journal`` is
    keyed by ``(step_id, phase)``). Probes keys, never scans the journal."""
    out: list[StepEvent] = []
    while (ev := journal.get((step_id, phase if not out else f"{phase}.{len(out) + 1}"))) is not None:
        out.append(ev)
    return out


def not_happened_since_sent(journal: Keyed, step_id: str) -> bool:
    """Whether a person established that the step's effect did not happen (``resolve(happened=
    False)``) and nothing was sent since: the one case a re-send needs no lookup. A resolution
    older than the last send says nothing about that send."""
    resolutions = numbered(journal, step_id, "resolution")
    sends = numbered(journal, step_id, "intent")
    return (bool(resolutions) and resolutions[-1].decision == "not_happened"
            and resolutions[-1].seq > (sends[-1].seq if sends else 0))


RESTORE_STEP: Final = "restore"
"""The step id of the ``uncertain`` record a restore gives a run that may have moved past the backup
(:func:`cuaderno.operations.restore`). It stands outside the run's turns: a replay never reaches
it, and once a person settles it (the run did not go on past the backup) it is passed over."""


def approval_step_id(tool_step: str) -> str:
    """The step id of the approval a tool step waits for."""
    return f"{tool_step}.approval"


class EventHeader(TypedDict):
    """The header of one journal row as it leaves the journal in JSON (a ``show --json`` timeline
    row, an event crossing Temporal's data converter): what identifies the step and what was
    decided, never the payload. Each carrier adds its own fields (a row's seq and time, an
    event's payload)."""

    step_id: str
    phase: str
    kind: str
    name: str | None
    decision: str | None
    fingerprint: str | None


class StepEvent:
    """One journaled fact about one step of a run.

    Attributes:
        run_id: the run this event belongs to. Chosen by the caller; at most 1024 characters.
        step_id: the deterministic position in the loop (see the module docstring). Replay asks
            for the same ids in the same order; another kind or name at an id is a divergence.
        phase: what this event says about the step: ``intent`` (about to act, committed before
            acting), ``result`` (how it ended), ``decision``/``request`` (policy, approval),
            ``uncertain``, ``error.N``, ``intent.N`` (a re-send)...: a :class:`Phase`, numbered or
            not (:data:`PHASES`, :func:`family`).
        kind: one of :data:`KINDS` (:class:`Kind`: ``run``, ``model``, ``tool``, ``approval``...).
            Checked on replay.
        name: the tool name for tool and approval steps; checked on replay.
        decision: the policy or human decision, so replay tells "not executed because denied or
            waiting" apart from "unknown".
        fingerprint: what was asked (the request chain for model steps, canonical arguments for
            tool steps). Replay compares it with what the code asks now.
        payload: the step's data as plain JSON (a response, a result, an error, an approval).
            Decoded lazily from the stored bytes: resuming a long run only decodes what it reads.
        codec: how the payload is encoded on disk; stored beside every blob.
        seq: position in the run's journal (1-based), assigned by the backend on write.
        created_at: wall-clock seconds when written. Informational only: order comes from ``seq``.
        row_hash: chains this row to the one before it; assigned on write and checked on load, so
            a rewritten or removed row is detected (the journal is append-only).
        salt: the row's random digest key (:data:`SALT_BYTES`), assigned on write by a store
            that chains over content digests (:func:`row_hash`, version 2); ``None`` for rows of
            the first chain version, and for erased rows (their key is destroyed with their
            content). Replay never reads it; the chain check does.

    Treat events as immutable values. Deduplication (:meth:`same_as`) ignores ``seq``,
    ``created_at`` and ``row_hash``, which are assigned on write.
    """

    __slots__ = ("_payload", "_raw", "codec", "created_at", "decision", "fingerprint", "kind", "name", "phase",
                 "row_hash", "run_id", "salt", "seq", "step_id")
    # The slots' types, in their order: _filled (below the class) sets them all, and so do
    # new_event and stamped (inline, for the per-step paths).
    _payload: dict[str, Any] | None
    _raw: bytes | None
    codec: str
    created_at: float
    decision: str | None
    fingerprint: str | None
    kind: str
    name: str | None
    phase: str
    row_hash: str
    run_id: str
    salt: bytes | None
    seq: int
    step_id: str

    def __init__(self, *, run_id: str, step_id: str, phase: str, kind: str, name: str | None = None,
                 decision: str | None = None, fingerprint: str | None = None,
                 payload: dict[str, Any] | None = None, codec: str = CODEC_JSON, seq: int = 0,
                 created_at: float = 0.0, row_hash: str = "", raw: bytes | None = None) -> None:
        # The slots are set in one place, _filled, which the journal's positional path (_stored)
        # calls too.
        _filled(self, run_id, step_id, phase, kind, name, decision, fingerprint, codec,
                payload if payload is not None or raw is not None else {}, raw, seq, created_at, row_hash, None)

    @classmethod
    def _stored(cls, run_id: str, step_id: str, phase: str, kind: str, name: str | None, decision: str | None,
                fingerprint: str | None, codec: str, payload: dict[str, Any] | None, raw: bytes | None, seq: int,
                created_at: float, row_hash: str, salt: bytes | None = None) -> StepEvent:
        """An event as the journal holds it, from positional fields (``raw`` is the stored payload;
        ``None`` only from the keyword constructor, whose payload is then given).

        The journal's own paths build events this way: stamping on append, and every row of a load.
        Keyword parsing costs more than setting thirteen slots, and a resume of a 1000-turn run
        builds over 4,000 events. ``payload`` may be ``None``: it is then decoded from ``raw`` on
        first use.
        """
        return _filled(_new_event(cls), run_id, step_id, phase, kind, name, decision, fingerprint, codec, payload,
                       raw, seq, created_at, row_hash, salt)

    @property
    def payload(self) -> dict[str, Any]:
        """The step's data (decoded from the stored bytes on first access)."""
        if self._payload is None:
            assert self._raw is not None
            if self.codec == CODEC_ERASED:
                from cuaderno.errors import RunErased

                raise RunErased(self.run_id, f"{self.step_id}:{self.phase}")
            self._payload = decode_payload(self.codec, self._raw)
        return self._payload

    @property
    def key(self) -> tuple[str, str, str]:
        """The deduplication key ``(run_id, step_id, phase)``."""
        return (self.run_id, self.step_id, self.phase)

    def encoded_payload(self) -> bytes:
        """The payload bytes as stored (sorted keys, compact, UTF-8)."""
        if self._raw is None:
            self._raw = encode_payload(self.payload)
        return self._raw

    def same_as(self, other: StepEvent) -> bool:
        """Whether ``other`` records the same fact (ignoring write-time fields)."""
        return (self.key == other.key and self.kind == other.kind and self.name == other.name
                and self.decision == other.decision and self.fingerprint == other.fingerprint
                and self.codec == other.codec and self.encoded_payload() == other.encoded_payload())

    @property
    def erased(self) -> bool:
        """Whether the event's content was erased (only its header and digest are left)."""
        return self.codec == CODEC_ERASED

    def stamped(self, *, seq: int, created_at: float, prev_hash: str, payload_bytes: bytes,
                salt: bytes | None = None) -> StepEvent:
        """This event with its write-time fields assigned (``salt``: its digest key, see
        :func:`row_hash`; ``None``: the first chain version, over the payload bytes)."""
        # The slots set here, not through _stored and _filled: two calls fewer on the append
        # path, which stamps every event of every step (the same fourteen slots, see _filled).
        ev = _new_event(StepEvent)
        ev.run_id, ev.step_id, ev.phase, ev.kind = self.run_id, self.step_id, self.phase, self.kind
        ev.name, ev.decision, ev.fingerprint, ev.codec = self.name, self.decision, self.fingerprint, self.codec
        ev._payload, ev._raw, ev.seq, ev.created_at, ev.salt = self._payload, payload_bytes, seq, created_at, salt
        ev.row_hash = row_hash(prev_hash, ev, seq, payload_bytes)
        return ev

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepEvent):
            return NotImplemented
        return (self.same_as(other) and self.seq == other.seq and self.created_at == other.created_at
                and self.row_hash == other.row_hash)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"StepEvent(run_id={self.run_id!r}, step_id={self.step_id!r}, phase={self.phase!r}, "
                f"kind={self.kind!r}, name={self.name!r}, decision={self.decision!r}, seq={self.seq})")


def new_event(*, run_id: str, step_id: str, phase: str, kind: str, name: str | None = None,
              decision: str | None = None, fingerprint: str | None = None, payload: dict[str, Any] | None = None,
              raw: bytes | None = None) -> StepEvent:
    """``StepEvent(...)`` with these fields, as the per-step paths build their events (a step's
    intent and result). The same event, for about half the instructions: CPython (3.11) gathers
    the keywords of a call to a class into a dict before ``__init__`` reads them, and not those
    of a call to a function."""
    ev = _new_event(StepEvent)
    ev.run_id, ev.step_id, ev.phase, ev.kind, ev.name, ev.decision = run_id, step_id, phase, kind, name, decision
    ev.fingerprint, ev.codec, ev._raw = fingerprint, CODEC_JSON, raw
    ev._payload = payload if payload is not None or raw is not None else {}
    ev.seq, ev.created_at, ev.row_hash, ev.salt = 0, 0.0, "", None
    return ev


def encode_payload(payload: dict[str, Any]) -> bytes:
    """Encode a payload for storage. Deterministic for equal payloads; rejects NaN and non-JSON.

    UTF-8 as is, except when a string holds a lone surrogate (a model can emit ``"\\ud800"``):
    then the whole payload is written with ASCII escapes, which JSON reads back exactly.
    """
    text = sorted_compact(payload)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return sorted_compact_ascii(payload).encode()


def decode_payload(codec: str, data: bytes | str) -> dict[str, Any]:
    """Decode a stored payload; unknown codecs are an error, never a guess.

    Payloads in the exact form the journal writes take :func:`~cuaderno.plainjson.loads_object`,
    which skips ``json.loads``'s per-call set-up (it costs more than parsing a small payload, and
    resuming a long run decodes thousands); anything else goes through ``json.loads`` itself.
    """
    if codec != CODEC_JSON:
        from cuaderno.errors import JournalCorrupt, RunErased

        if codec == CODEC_ERASED:
            raise RunErased("", "a stored row")
        raise JournalCorrupt(f"unknown payload codec {codec!r}; this journal needs a newer cuaderno")
    if type(data) is bytes:
        fast = loads_object(data)
        if fast is not None:
            return fast
    value = json.loads(data)
    if not isinstance(value, dict):
        from cuaderno.errors import JournalCorrupt

        raise JournalCorrupt("a journal payload is not a JSON object")
    return value


def row_hash(prev_hash: str, event: StepEvent, seq: int, payload_bytes: bytes) -> str:
    """The hash chain link for one row (hex, 32 chars: a tamper check, not a signature).

    Part of the journal format: changing what goes in, or in which order, is a schema change.
    Two versions, told apart by the row itself:

    - version 1 (``event.salt`` is ``None``, the event not erased): over the header and the
      payload bytes. Rows written before schema 4 (SQLite) / 3 (PostgreSQL), and by stores that
      never erase (the in-memory one).
    - version 2: over the header without the fingerprint, and the row's *content digest*:
      :func:`content_digest` of the fingerprint and the payload bytes under the row's own random
      key (``event.salt``). The fingerprint goes with the content because it is a plain hash of
      it (of the arguments, of the request chain), which would confirm a guessed short value.
      Once a run is erased, its rows keep only the digest (``payload_bytes`` is then the stored
      digest, :data:`CODEC_ERASED`; the fingerprint is gone), so the chain still verifies link
      by link without the content, and the key is gone, so nothing can be confirmed by hashing
      guesses.

    An erased row of version 1 keeps no digest (``payload_bytes`` empty): its hash cannot be
    recomputed, see :func:`verifiable`.
    """
    salt = event.salt
    if event.codec == CODEC_ERASED:
        digest = payload_bytes
    elif salt is None:
        head = "\x00".join((prev_hash, event.run_id, event.step_id, event.phase, event.kind, event.name or "",
                            event.decision or "", event.fingerprint or "", event.codec, str(seq), "\x01"))
        return _sha256(head.encode("utf-8", "surrogatepass") + payload_bytes).hexdigest()[:32]
    elif len(salt) != HMAC_SALT_BYTES and len(payload_bytes) < _JOIN_BELOW:
        # content_digest's case of every row written since schema 8, inline: this runs for every row.
        fp = event.fingerprint
        digest = _blake2b(b"-" + payload_bytes if fp is None
                          else b"%d:%s%s" % (len(fp), fp.encode("utf-8", "surrogatepass"), payload_bytes),
                          key=salt, digest_size=32).digest()
    else:
        digest = content_digest(salt, event.fingerprint, payload_bytes)
    # The codec is the event's own (always json so far), never the storage state: erasing a row
    # must not change its link. ("\x01" and "\x02", after the last field, encode as those bytes.)
    head = "\x00".join((prev_hash, event.run_id, event.step_id, event.phase, event.kind, event.name or "",
                        event.decision or "", CODEC_JSON, str(seq), "2\x02"))
    return _sha256(head.encode("utf-8", "surrogatepass") + digest).hexdigest()[:32]


def content_digest(salt: bytes, fingerprint: str | None, payload_bytes: bytes) -> bytes:
    """The keyed digest, under a row's random key ``salt``, of its fingerprint and payload bytes
    (32 bytes): what a version-2 link hashes in their place, and all an erased row keeps of them.
    The fingerprint is length-prefixed (``-`` for none), so no split of the two gives another's.

    The key's length says which keyed hash made the digest, so a row names its own and nothing is
    tried in turn: :data:`SALT_BYTES` (32), keyed BLAKE2b with a 32-byte digest (RFC 7693's own
    MAC mode: one C call, about half an HMAC's CPU on a row of a few hundred bytes), what every row
    is written with since journal schema 8 (PostgreSQL version 7); :data:`HMAC_SALT_BYTES` (16),
    HMAC-SHA256, what rows of schema 4 to 7 hold. The link over the digest is the same for both,
    so an erased row (which keeps the digest and drops its key) verifies without knowing which.
    """
    fp = (b"-" if fingerprint is None
          else b"%d:%s" % (len(fingerprint), fingerprint.encode("utf-8", "surrogatepass")))  # one bytes built, not two
    if len(salt) != HMAC_SALT_BYTES:
        if len(payload_bytes) < _JOIN_BELOW:
            return _blake2b(fp + payload_bytes, key=salt, digest_size=32).digest()  # one call for small rows
        # A large payload is fed as it is: joining it to the fingerprint would copy it whole.
        keyed = _blake2b(fp, key=salt, digest_size=32)
        keyed.update(payload_bytes)
        return keyed.digest()
    if len(payload_bytes) < _JOIN_BELOW:
        return _hmac_digest(salt, fp + payload_bytes, "sha256")
    mac = _hmac_new(salt, fp, "sha256")
    mac.update(payload_bytes)
    return mac.digest()


def shown_payload(event: StepEvent) -> dict[str, Any]:
    """The payload as shown to people (``show``, the page): an erased event's reads as
    ``{"erased": true}`` instead of raising :class:`~cuaderno.errors.RunErased`. Never for replay,
    a fork or an export, which must refuse an erased run."""
    return {"erased": True} if event.codec == CODEC_ERASED else event.payload


def verifiable(event: StepEvent) -> bool:
    """Whether the event's row hash can be recomputed: every row except an erased row of the first
    chain version (its hash covered the payload bytes, which are gone). Erasure checks the run's
    whole chain before it erases; afterwards such a row's hash is taken as stored: a version-2
    row after it still links to it, and the last row's hash must still be the summary's head,
    but its own header fields are no longer checked (for a run of only such rows: its numbering
    and its head)."""
    return event.codec != CODEC_ERASED or bool(event._raw)


def _filled(ev: StepEvent, run_id: str, step_id: str, phase: str, kind: str, name: str | None,
            decision: str | None, fingerprint: str | None, codec: str, payload: dict[str, Any] | None,
            raw: bytes | None, seq: int, created_at: float, row_hash: str, salt: bytes | None) -> StepEvent:
    """Set all fourteen slots of ``ev`` (positional: keyword parsing costs more than the sets on a
    path that builds every row of a load) and return it."""
    ev.run_id, ev.step_id, ev.phase, ev.kind, ev.name, ev.decision = run_id, step_id, phase, kind, name, decision
    ev.fingerprint, ev.codec, ev._payload, ev._raw = fingerprint, codec, payload, raw
    ev.seq, ev.created_at, ev.row_hash, ev.salt = seq, created_at, row_hash, salt
    return ev


_sha256 = hashlib.sha256
_blake2b = hashlib.blake2b
_hmac_digest = hmac.digest
_hmac_new = hmac.new
_JOIN_BELOW = 64 * 1024
_new_event = object.__new__
