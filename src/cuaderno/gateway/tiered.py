"""Escalate an empty cheap-tier answer to the strong tier, within the same turn.

Seed 002: on the cheap tier, re-sending an empty generation to the *same* model saved 0 of 36;
the strong tier answered all 36. So a rejected cheap answer is never re-sent to the cheap model:
the same turn goes once to the strong tier, and the cheap call stays on record as evidence (it
was made and maybe billed) in ``ModelResponse.escalations``.

HTTP errors are *not* escalated: a :class:`~cuaderno.errors.GatewayError` from either tier
propagates, because the loop is the only retry layer and it must see the error's class.
Refusals are not escalated by default either (a policy decision, not a capacity one); pass
``escalate_on`` to change that.

Under cuaderno's loop the gateway's ``ladder`` (:mod:`cuaderno.gateway.ladder`, by default
:data:`~cuaderno.gateway.ladder.DEFAULT_LADDER`) takes over: each rung — the original request, a
changed request, the escalation — is a journaled step of its own, and the loop tells this gateway
which tier each step goes to (:func:`~cuaderno.gateway.ladder.current_route`). A call without a route
(a Temporal activity, a direct call) gets the in-step escalation above. ``ladder=None`` turns the
ladder off: the loop then sees only the in-step escalation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from cuaderno.errors import GatewayError, UsageError
from cuaderno.gateway.base import ModelGateway, ModelRequest, ModelResponse
from cuaderno.gateway.empty import Outcome, ResponseOutcome, classify_response
from cuaderno.gateway.ladder import DEFAULT_LADDER, Ladder, current_route

if TYPE_CHECKING:
    from cuaderno.events.payloads import Escalation

__all__ = ["DEFAULT_ESCALATE_ON", "TieredGateway", "escalation_evidence", "strong_key"]

DEFAULT_ESCALATE_ON = frozenset({Outcome.EMPTY, Outcome.NO_TOOL_CALL})


class TieredGateway:
    """A :class:`~cuaderno.gateway.base.ModelGateway` over a cheap and a strong gateway.

    Each :meth:`complete` calls the cheap tier exactly once. If :func:`classify_response` (with the
    request's ``require_tool``) puts the answer in ``escalate_on``, the same request goes once to
    the strong tier with ``model=None`` (each tier answers with its own default model) and the
    idempotency key ``f"{key}:{names[1]}"``: the strong call has another body, and reusing a key
    for another body is a rejection, not a replay. The key is derived, so a re-send of the step
    after a crash reuses it.

    The returned response has ``tier`` set to the name of the tier that answered. An escalated one
    carries one evidence dict per rejected answer in ``escalations`` (see
    :func:`escalation_evidence`). Replay needs nothing else: the response, with its escalations, is
    what gets journaled, and the counters here are only this process's metrics.

    Args:
        cheap: the first tier.
        strong: the tier a rejected cheap answer escalates to.
        names: the tiers' names, as written in ``tier`` and in the evidence.
        escalate_on: the outcomes that escalate (in-step, without a route from the loop).
        ladder: the rungs the loop climbs after a rejected answer (``None``: none, in-step
            escalation only).

    Attributes:
        escalations: how many turns escalated since construction.
        calls: calls made per tier name since construction.
    """

    def __init__(self, cheap: ModelGateway, strong: ModelGateway, *, names: tuple[str, str] = ("cheap", "strong"),
                 escalate_on: Iterable[Outcome] = DEFAULT_ESCALATE_ON, ladder: Ladder | None = DEFAULT_LADDER) -> None:
        if cheap is strong:
            raise UsageError("TieredGateway needs two different gateways: re-sending to the same model does not help")
        cheap_model, strong_model = getattr(cheap, "model", None), getattr(strong, "model", None)
        if cheap_model is not None and cheap_model == strong_model:
            raise UsageError(f"both tiers use model {cheap_model!r}; escalation must reach another model")
        if len(names) != 2 or names[0] == names[1] or not all(names):
            raise UsageError(f"names must be two different non-empty tier names, got {names!r}")
        self.cheap, self.strong = cheap, strong
        self.names = names
        self.escalate_on = frozenset(Outcome(o) for o in escalate_on)
        if ladder is not None and not isinstance(ladder, Ladder):
            raise UsageError(f"ladder must be a Ladder or None, got {type(ladder).__name__}")
        self.ladder = ladder
        self.escalations = 0
        self.calls: dict[str, int] = {names[0]: 0, names[1]: 0}
        self._rejected: dict[str, Escalation] = {}
        """Rejected cheap answers by key, until the strong tier answers for that key."""

    async def preflight(self) -> None:
        """Check both tiers' endpoints where they can be checked."""
        for tier in (self.cheap, self.strong):
            check = getattr(tier, "preflight", None)
            if check is not None:
                await check()

    async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
        """Answer from the cheap tier, or from the strong tier when the cheap answer is rejected.

        A retry of the same step (same key) after the strong tier failed goes straight to the
        strong tier: the cheap answer was already rejected and is not asked for again. When the
        strong tier fails, the rejected cheap call's evidence rides on the error
        (``GatewayError.escalations``), so the loop can journal and count it.
        """
        route = current_route()
        if route is not None and self.ladder is not None:
            return await self._routed(route, request, idempotency_key)
        cheap_name, strong_name = self.names
        evidence = self._rejected.get(idempotency_key)
        prior: tuple[Escalation, ...] = ()
        if evidence is None:
            self.calls[cheap_name] += 1
            first = await self.cheap.complete(request, idempotency_key=idempotency_key)
            verdict = classify_response(first, require_tool=request.require_tool)
            if verdict.outcome not in self.escalate_on:
                return dataclasses.replace(first, tier=cheap_name)
            evidence = escalation_evidence(first, verdict, from_tier=cheap_name, to_tier=strong_name)
            prior = first.escalations
            self.escalations += 1
            self._rejected[idempotency_key] = evidence
        self.calls[strong_name] += 1
        try:
            second = await self.strong.complete(dataclasses.replace(request, model=None),
                                                idempotency_key=strong_key(idempotency_key, strong_name))
        except GatewayError as err:
            if prior or idempotency_key in self._rejected:
                err.escalations = (*prior, evidence) if not getattr(err, "escalations", ()) else err.escalations
            raise
        self._rejected.pop(idempotency_key, None)
        return dataclasses.replace(second, tier=strong_name, escalations=(*prior, evidence, *second.escalations))


    async def _routed(self, tier: str, request: ModelRequest, idempotency_key: str) -> ModelResponse:
        """One call to the tier the loop's ladder chose, with the step's own key (a rung is a step
        of its own: its key already differs from every other rung's). A rejected answer comes back
        as it is: the loop journals it and climbs the next rung."""
        if tier not in self.names:
            raise UsageError(f"the ladder routed a request to tier {tier!r}; the tiers are {self.names!r}")
        self.calls[tier] += 1
        if tier == self.names[0]:
            answer = await self.cheap.complete(request, idempotency_key=idempotency_key)
        else:
            self.escalations += 1
            answer = await self.strong.complete(dataclasses.replace(request, model=None),
                                                idempotency_key=idempotency_key)
        return dataclasses.replace(answer, tier=tier)


def strong_key(idempotency_key: str, tier: str) -> str:
    """The idempotency key for ``tier``: deterministic, and different from the cheap call's."""
    return f"{idempotency_key}:{tier}"


def escalation_evidence(response: ModelResponse, verdict: ResponseOutcome, *, from_tier: str,
                        to_tier: str) -> Escalation:
    """The journaled record of a rejected answer: what it cost, why it was rejected, how to find it.

    Keys: ``from_tier``, ``to_tier``, ``reason`` (a :class:`~cuaderno.gateway.empty.Reason` value),
    ``outcome``, ``detail``, ``usage``, ``cost`` (``None``: unpriced), ``finish_reason``,
    ``body_sha256``, ``model``, ``provider_request_id``. All plain JSON.
    """
    return {"from_tier": from_tier, "to_tier": to_tier, "reason": verdict.reason.value,
            "outcome": verdict.outcome.value, "detail": verdict.detail, "usage": response.usage.to_json(),
            "cost": response.cost, "finish_reason": response.finish_reason, "body_sha256": response.body_sha256,
            "model": response.model, "provider_request_id": response.provider_request_id}
