"""The ``gen_ai.provider.name`` of a gateway (:func:`provider_name`)."""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit

from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.gateway.tiered import TieredGateway

_KNOWN_HOSTS: Final = {
    "api.openai.com": "openai",
    "api.anthropic.com": "anthropic",
    "generativelanguage.googleapis.com": "gcp.gemini",
    "api.deepseek.com": "deepseek",
    "api.mistral.ai": "mistral_ai",
    "api.groq.com": "groq",
    "api.x.ai": "x_ai",
    "api.perplexity.ai": "perplexity",
    "api.cohere.com": "cohere",
}
_KNOWN_HOST_SUFFIXES: Final = ((".openai.azure.com", "azure.ai.openai"),)


def provider_name(gateway: object) -> str:
    """The ``gen_ai.provider.name`` of a gateway; never empty.

    An HTTP gateway (its ``endpoint`` is a URL) is named by the host it sends to: a provider the
    GenAI conventions list by its well-known name (``openai``, ``anthropic``, ``azure.ai.openai``...),
    any other (an OpenAI-compatible server, a proxy) by its host name, so two local servers stay
    apart. A :class:`~cuaderno.gateway.scripted.ScriptedGateway` is ``scripted``; a tiered
    gateway is its tiers' provider (``a+b`` when they differ); any other gateway is its own
    ``provider_name`` attribute, else its class name.

    Args:
        gateway: the session's gateway.

    Returns:
        The provider name.
    """
    if isinstance(gateway, ScriptedGateway):
        return "scripted"
    if isinstance(gateway, TieredGateway):
        names = dict.fromkeys((provider_name(gateway.cheap), provider_name(gateway.strong)))
        return "+".join(names)
    endpoint = getattr(gateway, "endpoint", None)
    if isinstance(endpoint, str) and endpoint:
        host = (urlsplit(endpoint).hostname or "").rstrip(".")
        if host:
            known = _KNOWN_HOSTS.get(host)
            if known is None:
                known = next((name for suffix, name in _KNOWN_HOST_SUFFIXES if host.endswith(suffix)), host)
            return known
    declared = getattr(gateway, "provider_name", None)
    if isinstance(declared, str) and declared:
        return declared
    return type(gateway).__name__
