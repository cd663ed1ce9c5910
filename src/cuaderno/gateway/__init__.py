"""Model gateways: the contract, the scripted fake, real providers, tiers.

``OpenAIGateway`` and ``AnthropicGateway`` need the ``openai`` / ``anthropic`` extras; they are
imported on first use so that ``import cuaderno`` works without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cuaderno.gateway.base import Message, ModelGateway, ModelRequest, ModelResponse, ToolCall, ToolSchema, Usage
from cuaderno.gateway.empty import Outcome, Reason, ResponseOutcome, classify_response
from cuaderno.gateway.ladder import Escalate, FittingTools, Ladder, NamedTool, RelaxToolChoice, Resend
from cuaderno.gateway.pricing import ModelPrice, PriceTable
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.gateway.tiered import TieredGateway

if TYPE_CHECKING:
    from cuaderno.gateway.anthropic import AnthropicGateway
    from cuaderno.gateway.openai import OpenAIGateway

__all__ = [
    "AnthropicGateway",
    "Escalate",
    "FittingTools",
    "Ladder",
    "Message",
    "ModelGateway",
    "ModelPrice",
    "ModelRequest",
    "ModelResponse",
    "NamedTool",
    "OpenAIGateway",
    "Outcome",
    "PriceTable",
    "Reason",
    "RelaxToolChoice",
    "Resend",
    "ResponseOutcome",
    "ScriptedGateway",
    "TieredGateway",
    "ToolCall",
    "ToolSchema",
    "Usage",
    "classify_response",
]

_LAZY = {"OpenAIGateway": ("cuaderno.gateway.openai", "openai"),
         "AnthropicGateway": ("cuaderno.gateway.anthropic", "anthropic")}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, extra = _LAZY[name]
        try:
            import importlib

            return getattr(importlib.import_module(module), name)
        except ImportError as exc:
            raise ImportError(f"{name} needs the {extra!r} extra: pip install 'cuaderno[{extra}]'") from exc
    raise AttributeError(f"module 'cuaderno.gateway' has no attribute {name!r}")
