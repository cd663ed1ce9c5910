"""The provider's ``x-ratelimit-*`` headers of every answer, success included, reaching the shared
rate limit: what a wrapped agent's requests report (``rate_limit=`` on either integration).

cuaderno's own gateways read each answer's headers and report them (:func:`cuaderno.gateway.rate.report`)
to the send that is watching (the rate gate's ``sending()``): an answer that says the budget is
spent pauses every worker of the key before any of them meets a 429. A framework's model hands
back only the parsed answer, so the headers are read where the framework's own ``openai`` client
receives them: a response hook on that client's HTTP client, installed once per client. The hook
runs in the task that awaits the request, inside the send's watch; outside one (no limit, another
caller of the same client) the report is a no-op.

The ``openai`` client keeps its HTTP client as ``_client`` (no public name); a client without one
(another SDK, a test double) is left as it is and reports its 429s only, as before.
"""

from __future__ import annotations

from typing import Any

from cuaderno.gateway import rate

__all__ = ["watch_rate_headers"]


async def _report(response: Any) -> None:
    rate.report(response.headers, status=getattr(response, "status_code", None))


def watch_rate_headers(openai_client: object) -> None:
    """Make every answer ``openai_client`` receives report its rate headers (once per client)."""
    http = getattr(openai_client, "_client", None)
    hooks = getattr(http, "event_hooks", None)
    if not isinstance(hooks, dict):
        return
    responses = list(hooks.get("response") or [])
    if _report in responses:
        return
    # Assigned whole (the HTTP client's setter), not appended in place: a client whose getter
    # hands out a copy keeps the hook too.
    http.event_hooks = {**hooks, "response": [*responses, _report]}  # type: ignore[union-attr]
