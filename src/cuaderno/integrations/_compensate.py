"""Compensations of a cancelled wrapped run: declared per tool, scheduled by the cancellation,
each run once as an effect.

A tool declared with a :class:`Compensation` (``compensations={"transfer": Compensation(refund,
lookup=find_refund)}`` on either integration) journals, with each result that happened, what
undoes it: the compensation's tool name and arguments (``{"arguments": the call's arguments,
"value": its journaled result}``), the record a cancellation reads. When the run is cancelled
(``cuaderno cancel``: the next intent is refused, and the wrapper that meets the refusal, or the
next call of the run id, writes the ``cancelled`` record), the record schedules one cleanup entry
per effect that happened. :func:`compensate_run` then runs them, each as step ``cleanupNN`` of
the cancelled run through the effect protocol (:class:`cuaderno.durable.Effect`): its own effect
key (``compensation:<tool>``, never the original's), a write-ahead intent, and the declared
settlement when a crash leaves its fate unknown (a lookup by key, a re-send for an idempotent
one, else ``needs_human`` evidence and :class:`~cuaderno.errors.UncertainEffect`). Running it
twice, or again after a crash, runs each compensation at most once.

What replay needs from the journaled fields: the original result's ``compensation`` (``tool``:
whose declaration undoes it; ``arguments``: what it is called with); each cleanup step's result
(a compensation already run is never run again). An effect a person confirmed
(``cuaderno resolve --happened``) has no such field: the record names the call (``derive_from``)
and its compensation is worked out from the declaration here, as cuaderno's own ``compensate``
does.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

from cuaderno.cancellation import confirmed_since, finalize
from cuaderno.durable import Effect, JournalLog, Opened
from cuaderno.durable.effect import effect_key, result_payload, stage_result
from cuaderno.durable.model_call import Retrying
from cuaderno.errors import CuadernoError, RunCancelled, RunClosed, RunNotFound, UsageError, quoted
from cuaderno.events import cleanup_step_id
from cuaderno.fingerprint import fingerprint
from cuaderno.journal.base import Checkpointer

__all__ = ["COMPENSATION_VERSION", "Compensation", "check_compensations", "close_cancelled", "compensate_run",
           "reopened", "scheduled"]

COMPENSATION_VERSION = "integrations-compensation/1"
"""The rules a compensation's effect key is derived under (the ``policy_version`` part of the key)."""


@dataclass(frozen=True, slots=True)
class Compensation:
    """What undoes a tool's effect when its run is cancelled.

    ``undo(key, arguments, value)``: makes the compensation (a refund, a release) with ``key``,
    the compensation's own effect key (give it to the receiver), ``arguments``, the original
    call's, and ``value``, its journaled result; what it returns (JSON) is journaled. ``lookup(key,
    arguments)``: asks the receiver whether the compensation with that key happened (its receipt,
    or ``None`` when it proves there is none); ``idempotent``: the receiver deduplicates by the key.
    With neither, a compensation cut off by a crash is ``needs_human``.
    """

    undo: Callable[[str, dict[str, Any], Any], Awaitable[Any]]
    lookup: Callable[[str, dict[str, Any]], Awaitable[Any]] | None = None
    idempotent: bool = False


def check_compensations(compensations: object) -> dict[str, Compensation]:
    """Refuse a declaration that is not ``{tool name: Compensation}``, before anything runs."""
    if compensations is None:
        return {}
    if not isinstance(compensations, Mapping):
        raise UsageError(f"compensations must be a mapping of tool name to Compensation, "
                         f"got {type(compensations).__name__}")
    out: dict[str, Compensation] = {}
    for name, declared in compensations.items():
        if not isinstance(name, str) or not name:
            raise UsageError(f"compensations: tool names must be non-empty strings, got {name!r}")
        if not isinstance(declared, Compensation) or not callable(declared.undo):
            raise UsageError(f"compensations[{name!r}] must be a Compensation, got {type(declared).__name__}")
        out[name] = declared
    return out


def close_cancelled(opened: Opened) -> NoReturn:
    """Close a run whose cancellation committed, held by this caller: write its ``cancelled``
    record (or find the one another process wrote first) and raise
    :class:`~cuaderno.errors.RunCancelled` with it. Called when the journal refuses a step's intent
    (the cancellation committed while the run ran), and when an opening finds a request no holder
    met (the process that held the run died)."""
    assert opened.epoch is not None
    opened.log.commit()  # results in flight are admitted after a cancellation: journaled first
    finalize(opened.store, opened.run_id, opened.epoch)


@contextmanager
def reopened(store: Checkpointer, run_id: str) -> Iterator[None]:
    """Around an opening: a run already cancelled raises :class:`~cuaderno.errors.RunCancelled`
    with its record (what completed, what is uncertain, the cleanup), as the run that met the
    cancellation did, instead of the opening's bare ``RunClosed``."""
    try:
        yield
    except RunClosed as exc:
        cp = store.checkpoint(run_id) if exc.status == "cancelled" else None
        if cp is None:
            raise
        raise RunCancelled(run_id, cp.outcome or {}) from None


def scheduled(compensations: Mapping[str, Compensation], tool: str,
              arguments: Mapping[str, Any]) -> Callable[[Any], Mapping[str, Any] | None]:
    """What the effect protocol journals with ``tool``'s result (``None``: nothing to undo)."""
    if tool not in compensations:
        return lambda value: None
    return lambda value: {"tool": tool, "arguments": {"arguments": dict(arguments), "value": value}}


async def compensate_run(store: Checkpointer, run_id: str, compensations: Mapping[str, Compensation], *,
                         owner: str, retry: Retrying) -> list[dict[str, Any]]:
    """Run the compensations a cancelled run scheduled (module docstring); return each one's
    journaled result, in order.

    Raises:
        RunNotFound: no such run.
        CuadernoError: the run is not cancelled.
        UsageError: an entry's tool has no declared compensation here; nothing was written.
        RunBusy: another live process holds the run (compensating it).
        UncertainEffect: a compensation's fate is unknown and nothing can tell; ``cuaderno
            resolve`` settles its step, and the next call goes on.
    """
    cp = store.checkpoint(run_id)
    if cp is None:
        raise RunNotFound(run_id)
    if cp.status != "cancelled":
        raise CuadernoError(f"run {quoted(run_id)} is {cp.status}, not cancelled: it has no cleanup to run")
    tenant = cp.tenant or "default"
    epoch = store.acquire(run_id, owner, force=False)
    try:
        # Read after the takeover: whatever the previous holder committed is visible.
        events = store.load(run_id)
        entries = [*((cp.outcome or {}).get("cleanup") or []), *confirmed_since(events)]
        plans = [_plan(compensations, entry) for entry in entries]  # refused before anything is written
        log = JournalLog(store, run_id, epoch=epoch, index={(e.step_id, e.phase): e for e in events})
        results: list[dict[str, Any]] = []
        for index, (entry, plan) in enumerate(zip(entries, plans, strict=True)):
            step_id = cleanup_step_id(index)
            done = log.get(step_id, "result")
            if done is not None:
                results.append(done.payload)
                continue
            if plan is None:  # settled by a person, and the tool declares no compensation
                origin = str((entry.get("derive_from") or {}).get("tool"))
                event = stage_result(log, step_id, origin, result_payload(
                    "nothing_to_do", reason="the tool declares no compensation"), points=())
                log.commit()
                results.append(event.payload)
                continue
            results.append(await _run_one(log, step_id, entry, plan, tenant=tenant, retry=retry))
        return results
    finally:
        store.release(run_id, epoch)


async def _run_one(log: JournalLog, step_id: str, entry: Mapping[str, Any], plan: tuple[str, Compensation, dict[str, Any]],
                   *, tenant: str, retry: Retrying) -> dict[str, Any]:
    tool, declared, arguments = plan
    original = dict(arguments.get("arguments") or {})
    name = f"compensation:{tool}"
    key = effect_key(tenant, f"{log.run_id}/{step_id}", name, {"for": entry.get("for_step"), **arguments},
                     COMPENSATION_VERSION)

    async def body(attempt: int) -> Any:
        return await declared.undo(effect.key, original, arguments.get("value"))

    async def lookup(attempt: int) -> Any:
        assert declared.lookup is not None
        return await declared.lookup(effect.key, original)

    effect = Effect(log=log, step_id=step_id, tool=name, arguments=arguments,
                    fingerprint=fingerprint({"name": name, "arguments": arguments}), key=key, body=body,
                    lookup=lookup if declared.lookup is not None else None, idempotent=declared.idempotent,
                    policy_version=COMPENSATION_VERSION, retry=retry, sleep=asyncio.sleep, rng=random.Random(),
                    tells_the_model=False, unclassified="uncertain")
    settled = await effect.run()
    log.commit()  # tool.K6 inside its transaction, tool.K7 after (the journal log passes them)
    return dict(settled.payload)


def _plan(compensations: Mapping[str, Compensation], entry: Mapping[str, Any]) -> tuple[str, Compensation, dict[str, Any]] | None:
    """The tool whose compensation undoes ``entry``, its declaration and its arguments (``None``:
    a settled effect whose tool declares none)."""
    origin = entry.get("derive_from")
    if isinstance(origin, dict):
        tool = str(origin.get("tool"))
        if tool not in compensations:
            return None
        return tool, compensations[tool], {"arguments": origin.get("arguments") or {}, "value": origin.get("value")}
    tool = str(entry.get("tool"))
    arguments = entry.get("arguments")
    if tool not in compensations:
        raise UsageError(f"the compensation for {entry.get('for_step')!r} needs tool {tool!r}'s Compensation, which "
                         "is not declared here; nothing was written (declare it as when the run started)")
    if not isinstance(arguments, dict):
        raise UsageError(f"the compensation for {entry.get('for_step')!r} has no usable arguments; nothing was written")
    return tool, compensations[tool], dict(arguments)


