"""PriceTable: exact model match, None for unknown models, cached tokens priced apart."""

from __future__ import annotations

import pytest

from cuaderno.gateway.base import Usage
from cuaderno.gateway.pricing import ModelPrice, PriceTable


def test_unknown_model_is_unpriced_not_free() -> None:
    table = PriceTable({"gpt-4o": {"input": 2.5, "output": 10.0}})
    assert table.cost(Usage(input_tokens=100, output_tokens=100), "gpt-4o-mini") is None
    assert table.cost(Usage(input_tokens=100), None) is None
    assert PriceTable().cost(Usage(input_tokens=1), "anything") is None


def test_cost_with_cached_tokens() -> None:
    table = PriceTable({"m": ModelPrice(input=3.0, output=15.0, cached_input=0.3)})
    usage = Usage(input_tokens=2_000_000, cached_tokens=1_000_000, output_tokens=100_000, reasoning_tokens=50_000)
    # reasoning tokens are already inside output_tokens: not billed twice
    assert table.cost(usage, "m") == pytest.approx(3.0 + 0.3 + 1.5)


def test_cached_defaults_to_input_price_and_first_known_model_wins() -> None:
    table = PriceTable({"alias": {"input": 1.0, "output": 2.0}})
    usage = Usage(input_tokens=1_000_000, cached_tokens=500_000, output_tokens=1_000_000)
    assert table.cost(usage, "dated-snapshot", "alias") == pytest.approx(3.0)
    assert "alias" in table and len(table) == 1 and list(table) == ["alias"]


def test_explicit_zero_price_is_free() -> None:
    assert PriceTable({"local": {"input": 0.0, "output": 0.0}}).cost(Usage(input_tokens=5), "local") == 0.0


def test_negative_prices_are_rejected() -> None:
    with pytest.raises(ValueError):
        ModelPrice(input=-1.0, output=1.0)
