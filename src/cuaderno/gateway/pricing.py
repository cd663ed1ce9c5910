"""Per-model token prices, for endpoints that do not report a cost themselves.

A model missing from the table is *unpriced*: :meth:`PriceTable.cost` returns ``None``, never 0,
so the loss is visible in the journal (seed 002: 97 of 167 turns came back without a price and
looked free). An explicit zero price in the table is trusted: that is how a genuinely free local
model is declared.

Token accounting follows :class:`~cuaderno.gateway.base.Usage` as the gateways fill it:
``input_tokens`` counts every prompt token *including* the cached ones, ``cached_tokens`` is the
part read from the provider's prompt cache, and ``output_tokens`` already includes
``reasoning_tokens``. So::

    cost = (input - cached) * input_price + cached * cached_price + output * output_price

(per million tokens). Prompt-cache *writes* (Anthropic bills them at a premium) are counted at
the plain input price: ``Usage`` does not carry them separately, so such costs are an estimate
from below.

Default prices: where the user gives no table, the gateways price calls from the maintained
``genai-prices`` table (:class:`MaintainedPrices`, the ``cuaderno[prices]`` extra). A model that
table does not know is still unpriced (``None``), and so is every call to an endpoint it does not
know (a local llama.cpp or vLLM server: a model there named like a hosted one is not the hosted
one's bill). Without the extra installed there are no default prices: calls are unpriced, as
before. An explicit table always wins; ``prices=PriceTable()`` turns the defaults off.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from cuaderno.gateway.base import Usage

__all__ = ["MaintainedPrices", "ModelPrice", "PriceTable", "Prices", "default_prices"]

_PER = 1_000_000


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelPrice:
    """USD per million tokens for one model."""

    input: float
    output: float
    cached_input: float | None = None
    """Price of prompt tokens read from cache; ``None`` means the plain input price."""

    def __post_init__(self) -> None:
        for name in ("input", "output", "cached_input"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} price must not be negative, got {value}")

    def cost(self, usage: Usage) -> float:
        """The cost of ``usage`` at these prices, in USD."""
        cached = min(max(usage.cached_tokens, 0), max(usage.input_tokens, 0))
        fresh = max(usage.input_tokens, 0) - cached
        cached_price = self.input if self.cached_input is None else self.cached_input
        total = fresh * self.input + cached * cached_price + max(usage.output_tokens, 0) * self.output
        return total / _PER


class PriceTable(Mapping[str, ModelPrice]):
    """Model name → :class:`ModelPrice`, matched exactly (case-sensitive).

    No prefix or alias matching on purpose: ``gpt-4o`` must not price ``gpt-4o-mini``. Gateways
    look up the model the provider says answered, then the model they asked for, so a table keyed
    by the alias you request still prices a dated snapshot in the answer.

    Args:
        prices: ``{model: ModelPrice}``, or ``{model: {"input": .., "output": .., "cached_input": ..}}``.
    """

    def __init__(self, prices: Mapping[str, ModelPrice | Mapping[str, float]] | None = None) -> None:
        self._prices: dict[str, ModelPrice] = {}
        for model, price in (prices or {}).items():
            self._prices[model] = price if isinstance(price, ModelPrice) else ModelPrice(**dict(price))

    def __getitem__(self, model: str) -> ModelPrice:
        return self._prices[model]

    def __iter__(self) -> Iterator[str]:
        return iter(self._prices)

    def __len__(self) -> int:
        return len(self._prices)

    def price(self, *models: str | None) -> ModelPrice | None:
        """The price of the first of ``models`` that is in the table, or ``None``."""
        for model in models:
            if model is not None and model in self._prices:
                return self._prices[model]
        return None

    def cost(self, usage: Usage, *models: str | None) -> float | None:
        """The cost of ``usage`` for the first known of ``models``; ``None`` (unpriced) if none is known."""
        price = self.price(*models)
        return None if price is None else price.cost(usage)


@runtime_checkable
class Prices(Protocol):
    """Anything that prices a call: :class:`PriceTable`, :class:`MaintainedPrices`, or your own."""

    def cost(self, usage: Usage, *models: str | None) -> float | None:
        """USD for ``usage`` on the first of ``models`` it knows; ``None`` (unpriced) if it knows none."""
        ...


class MaintainedPrices:
    """Prices from the ``genai-prices`` package's bundled table (no network: its snapshot only).

    The endpoint decides the provider whose prices apply: ``api_url`` is matched against the
    providers that table knows (``https://api.openai.com/v1`` is OpenAI's, OpenRouter's, Groq's...).
    An endpoint it does not know (loopback, a private vLLM) prices nothing. With no ``api_url``
    the provider is inferred from the model's name (``claude-*`` is Anthropic's).

    The cost journaled is the one computed at the call, with the prices in force then; replay
    reads it from the journal, so a later update of the table never changes a past run's figure.
    """

    def __init__(self, api_url: str | None = None) -> None:
        import genai_prices  # the [prices] extra; default_prices() checks it is installed

        self._genai_prices = genai_prices
        self.api_url = api_url

    def cost(self, usage: Usage, *models: str | None) -> float | None:
        """The cost of ``usage`` for the first of ``models`` the table knows; ``None`` if none."""
        g = self._genai_prices
        fresh_and_cached = max(usage.input_tokens, 0)
        priced = g.Usage(input_tokens=fresh_and_cached,
                         cache_read_tokens=min(max(usage.cached_tokens, 0), fresh_and_cached),
                         output_tokens=max(usage.output_tokens, 0))
        for model in models:
            if not model:
                continue
            try:
                if self.api_url is None:
                    result = g.calc_price(priced, model)
                else:
                    result = g.calc_price(priced, model, provider_api_url=self.api_url)
            except LookupError:  # an unknown provider or model: unpriced, never free
                continue
            # Pricing runs after a paid answer arrived: a failure of the table must never turn that
            # answer into a failed step. Unpriced is the honest figure then.
            except Exception:
                return None
            return float(result.total_price)
        return None


def default_prices(api_url: str | None = None) -> Prices | None:
    """The prices a gateway uses when it was given none: :class:`MaintainedPrices` for ``api_url``
    when ``genai-prices`` is installed (``pip install 'cuaderno[prices]'``), else ``None`` (every
    call unpriced, counted as such)."""
    return _maintained(api_url) if _HAVE_GENAI_PRICES else None


@functools.lru_cache(maxsize=32)
def _maintained(api_url: str | None) -> MaintainedPrices:
    return MaintainedPrices(api_url)


_HAVE_GENAI_PRICES = importlib.util.find_spec("genai_prices") is not None
