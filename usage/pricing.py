"""The cost of model tokens, from ``ModelPrice``: per operator, the platform default otherwise, never a guess.

Decimal arithmetic only (a price is USD per million tokens with six decimals; tokens are integers), so a cost is
exact: 1,234 input tokens at $3 per million is $0.003702, not a float near it. Reads only: staff set the defaults
in the Django admin, operators their own rows in the portal (``usage.price_services``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db.models import Q

from tenants.models import Operator

from .models import ModelPrice

__all__ = ["MILLION", "PriceBook", "TokenPrice", "format_usd", "price_book"]

MILLION = Decimal(1_000_000)


@dataclass(frozen=True)
class TokenPrice:
    model: str
    input_usd_per_mtok: Decimal
    output_usd_per_mtok: Decimal
    source: str  # "operator" or "default": whose row it is, for the hint next to a cost

    def cost(self, input_tokens: int, output_tokens: int) -> Decimal:
        return (Decimal(int(input_tokens)) * self.input_usd_per_mtok
                + Decimal(int(output_tokens)) * self.output_usd_per_mtok) / MILLION


@dataclass(frozen=True)
class PriceBook:
    """One operator's prices: its own rows over the platform's defaults."""

    prices: Mapping[str, TokenPrice]

    def price(self, *models: Any) -> TokenPrice | None:
        """The first of ``models`` (a span's response model, then its request model) that has a price."""
        for model in models:
            if model and str(model) in self.prices:
                return self.prices[str(model)]
        return None

    def cost(self, models: tuple[Any, ...], input_tokens: int, output_tokens: int) -> Decimal | None:
        price = self.price(*models)
        return price.cost(input_tokens, output_tokens) if price is not None else None

    def day_cost(self, tokens_by_model: Mapping[str, Mapping[str, Any]]) -> Decimal | None:
        """A ``UsageDay``'s model cost (``{"model": {"input": n, "output": n}}``); None when a model that used
        tokens that day has no price: a partial sum on a bill would be a wrong number, not a smaller one."""
        total = Decimal(0)
        for model, tokens in tokens_by_model.items():
            n_in, n_out = int(tokens.get("input") or 0), int(tokens.get("output") or 0)
            if not (n_in or n_out):
                continue
            cost = self.cost((model,), n_in, n_out)
            if cost is None:
                return None
            total += cost
        return total


def price_book(operator: Operator | int | None) -> PriceBook:
    """The prices that apply to ``operator``'s customers, in one query: its own rows win over the defaults
    (``operator=None``: the defaults only). Another operator's rows are never read."""
    operator_id = operator.pk if isinstance(operator, Operator) else operator
    match = Q(operator__isnull=True) | Q(operator_id=operator_id) if operator_id is not None else Q(
        operator__isnull=True)
    prices: dict[str, TokenPrice] = {}
    # Defaults first, the operator's own after, so its row replaces the default of the same model.
    for row in sorted(ModelPrice.objects.filter(match), key=lambda r: r.operator_id is not None):
        prices[row.model] = TokenPrice(row.model, row.input_usd_per_mtok, row.output_usd_per_mtok,
                                       "operator" if row.operator_id is not None else "default")
    return PriceBook(prices)


def format_usd(amount: Decimal) -> str:
    """An exact amount as people read it: every significant decimal, at least two ("$0.003702", "$1.50")."""
    text = format(amount.normalize(), "f")
    whole, _, frac = text.partition(".")
    return f"${whole}.{frac.ljust(2, '0')}"
