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

The numbers are zero-padded so that ids sort in loop order, which keeps B-tree inserts
sequential and the journal file dense.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

__all__ = [
    "CODEC_JSON",
    "Decision",
    "Kind",
    "Phase",
    "StepEvent",
    "approval_step_id",
    "model_step_id",
    "tool_step_id",
]

CODEC_JSON: Final = "json"
"""The only payload codec so far: UTF-8 JSON with sorted keys. Never pickle: the CLI and later
versions must be able to read every journal."""

Kind = Literal["run", "model", "tool", "approval", "final", "cancel"]
Phase = Literal["start", "end", "intent", "result", "decision", "request", "uncertain", "resolution"]
Decision = Literal["allow", "deny", "require_approval", "approved", "rejected"]


def model_step_id(turn: int) -> str:
    """The step id of turn ``turn``'s model call."""
    return f"t{turn:04d}.model"


def tool_step_id(turn: int, index: int) -> str:
    """The step id of the ``index``-th tool call asked for in turn ``turn``."""
    return f"t{turn:04d}.tool{index:02d}"


def approval_step_id(tool_step: str) -> str:
    """The step id of the approval a tool step waits for."""
    return f"{tool_step}.approval"


@dataclass(frozen=True, kw_only=True, slots=True)
class StepEvent:
    """One journaled fact about one step of a run.

    Equality for deduplication ignores ``seq``, ``created_at`` and ``row_hash`` (they are
    assigned on write): two events are "the same" when their key, kind, name, decision,
    fingerprint and payload agree.
    """

    run_id: str
    """The run this event belongs to. Chosen by the caller; any string up to 1024 characters."""
    step_id: str
    """The deterministic position in the loop (see the module docstring). Replay asks for the
    same ids in the same order; a different kind or name at an id is a replay divergence."""
    phase: str
    """What this event says about the step: ``intent`` (about to act, committed before acting),
    ``result`` (how it ended), ``decision``/``request`` (policy and approval), ``uncertain``..."""
    kind: str
    """``run``, ``model``, ``tool``, ``approval``, ``final`` or ``cancel``. Checked on replay."""
    name: str | None = None
    """The tool name for tool and approval steps; checked on replay."""
    decision: str | None = None
    """The policy decision or human decision, so replay tells "not executed because denied or
    waiting" apart from "unknown"."""
    fingerprint: str | None = None
    """sha256 of what was asked (request body chain for model steps, canonical arguments for tool
    steps). Replay compares it with what the code asks now; a mismatch is a divergence."""
    payload: dict[str, Any] = field(default_factory=dict[str, Any])
    """The step's data as plain JSON: a model response, a tool result or error, an approval."""
    codec: str = CODEC_JSON
    """How ``payload`` is encoded on disk. Stored beside every blob."""
    seq: int = 0
    """Position in the run's journal (1-based), assigned by the backend on write."""
    created_at: float = 0.0
    """Wall-clock seconds when written. Informational only: order comes from ``seq``."""
    row_hash: str = ""
    """sha256 chaining this row to the one before it; assigned on write, checked on load, so a
    rewritten or removed row is detected (the journal is append-only)."""

    @property
    def key(self) -> tuple[str, str, str]:
        """The deduplication key ``(run_id, step_id, phase)``."""
        return (self.run_id, self.step_id, self.phase)

    def encoded_payload(self) -> bytes:
        """The payload bytes as stored (sorted keys, compact, UTF-8)."""
        return encode_payload(self.payload)

    def same_as(self, other: StepEvent) -> bool:
        """Whether ``other`` records the same fact (ignoring write-time fields)."""
        return (self.key == other.key and self.kind == other.kind and self.name == other.name
                and self.decision == other.decision and self.fingerprint == other.fingerprint
                and self.codec == other.codec and self.encoded_payload() == other.encoded_payload())

    def stamped(self, *, seq: int, created_at: float, prev_hash: str, payload_bytes: bytes) -> StepEvent:
        """This event with its write-time fields assigned."""
        return replace(self, seq=seq, created_at=created_at,
                       row_hash=row_hash(prev_hash, self, seq, payload_bytes))


def encode_payload(payload: dict[str, Any]) -> bytes:
    """Encode a payload for storage. Deterministic for equal payloads; rejects NaN and non-JSON."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


def decode_payload(codec: str, data: bytes | str) -> dict[str, Any]:
    """Decode a stored payload; unknown codecs are an error, never a guess."""
    if codec != CODEC_JSON:
        from cuaderno.errors import JournalCorrupt

        raise JournalCorrupt(f"unknown payload codec {codec!r}; this journal needs a newer cuaderno")
    value = json.loads(data)
    if not isinstance(value, dict):
        from cuaderno.errors import JournalCorrupt

        raise JournalCorrupt("a journal payload is not a JSON object")
    return value


def row_hash(prev_hash: str, event: StepEvent, seq: int, payload_bytes: bytes) -> str:
    """The hash chain link for one row (hex, 32 chars: a tamper check, not a signature)."""
    h = hashlib.sha256()
    h.update(prev_hash.encode())
    h.update(b"\x00".join(
        s.encode("utf-8", "surrogatepass")
        for s in (event.run_id, event.step_id, event.phase, event.kind, event.name or "",
                  event.decision or "", event.fingerprint or "", event.codec, str(seq))
    ))
    h.update(b"\x01")
    h.update(payload_bytes)
    return h.hexdigest()[:32]
